//! The per-session store of rendered prompts and their tokens: bounded, LRU, with an idle TTL, on
//! a clock passed in by the caller.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::CacheOutcome;
use super::seams::Anchor;

/// Bounds of a [`SessionCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionCacheConfig {
    /// Most sessions kept; past it the least recently used one is dropped. `0` turns the cache
    /// off: every request is a full pass. Default: 1,024.
    pub max_sessions: usize,
    /// Most memory kept over all sessions, counted as the session key and prompt text bytes plus
    /// 4 bytes per token and the cut points (a few per message). Past it the least recently used
    /// sessions are dropped; a single prompt larger than this is not kept. A 100K-token agent
    /// conversation takes about 0.8 MB. Default: 512 MiB.
    pub max_bytes: u64,
    /// A session not used for longer than this is dropped; the next request of that session is a
    /// full pass. Default: 10 minutes.
    pub idle_ttl: Duration,
    /// Most prompts kept per session. A harness's side requests (titles, summaries, a compaction)
    /// share the session id but not the conversation: each is kept beside the conversation
    /// rather than replacing it, and a request continues the prompt it shares most with.
    /// Default: 4.
    pub prompts_per_session: usize,
}

impl Default for SessionCacheConfig {
    fn default() -> Self {
        Self {
            max_sessions: 1024,
            max_bytes: 512 * 1024 * 1024,
            idle_ttl: Duration::from_secs(600),
            prompts_per_session: 4,
        }
    }
}

/// Counters and gauges of a [`SessionCache`], for metrics. Counters only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCacheStats {
    /// Requests that reused cached tokens ([`CacheOutcome::Hit`]).
    pub hits: u64,
    /// Requests of a session with nothing cached ([`CacheOutcome::Miss`]).
    pub misses: u64,
    /// Requests whose cached prompt diverged before any safe cut point, so they were encoded
    /// whole ([`CacheOutcome::Fallback`]).
    pub fallbacks: u64,
    /// Sessions dropped to stay within `max_sessions` or `max_bytes`.
    pub evictions: u64,
    /// Sessions dropped after `idle_ttl` without a request.
    pub expirations: u64,
    /// Tokens taken from the cache instead of being encoded again.
    pub reused_tokens: u64,
    /// Tokens the tokenizer produced (whole prompts on misses and fallbacks, suffixes on hits).
    pub encoded_tokens: u64,
    /// Sessions held now.
    pub entries: usize,
    /// Memory held now, counted as for `max_bytes`.
    pub bytes: u64,
}

/// What is kept of one of a session's recent prompts.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The model that encoded it: another model's tokens are of no use.
    pub(crate) model_id: u64,
    /// The rendered prompt.
    pub(crate) text: String,
    /// `encode(text, false)`.
    pub(crate) tokens: Vec<u32>,
    /// Where `text` can be cut, ascending.
    pub(crate) anchors: Vec<Anchor>,
}

impl Snapshot {
    fn bytes(&self, key: &str) -> u64 {
        let anchors = self.anchors.len() * std::mem::size_of::<Anchor>();
        let total = key.len() + self.text.len() + self.tokens.len() * 4 + anchors;
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

/// The last prompt text and token ids of each live session, so that the next turn of a session
/// tokenizes only what it added (see
/// [`ModelTokenizer::encode_chat_incremental`](crate::ModelTokenizer::encode_chat_incremental)).
///
/// Shared by all request handlers: one `Mutex` held only to look an entry up or to store one,
/// never while tokenizing. Time is passed in (`now`), never read, so behaviour is reproducible.
pub struct SessionCache {
    config: SessionCacheConfig,
    state: Mutex<State>,
}

struct State {
    entries: HashMap<Arc<str>, Entry>,
    /// Sessions by last use (a sequence number, so ties and callers' clock skew cannot reorder
    /// them): the first is the least recently used.
    lru: BTreeMap<u64, Arc<str>>,
    next_seq: u64,
    stats: SessionCacheStats,
}

struct Entry {
    /// The session's recent prompts, least recently used first.
    snapshots: Vec<Arc<Snapshot>>,
    last_used: Instant,
    seq: u64,
    bytes: u64,
}

// === impl SessionCache ===

impl SessionCache {
    /// An empty cache with these bounds.
    pub fn new(config: SessionCacheConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                entries: HashMap::new(),
                lru: BTreeMap::new(),
                next_seq: 0,
                stats: SessionCacheStats::default(),
            }),
        }
    }

    /// The bounds it was built with.
    pub fn config(&self) -> &SessionCacheConfig {
        &self.config
    }

    /// Current counters and gauges.
    pub fn stats(&self) -> SessionCacheStats {
        self.lock().stats
    }

    /// Drops `session`'s entry (the session ended); whether there was one.
    pub fn remove(&self, session: &str) -> bool {
        let removed = self.lock().remove(session);
        !removed.is_empty()
    }

    /// Drops every session idle for longer than `idle_ttl` at `now`, and returns how many. Lookups
    /// do this too; call it from a timer to free memory of sessions that never come back.
    pub fn evict_expired(&self, now: Instant) -> usize {
        let mut garbage = Vec::new();
        self.lock().expire(now, self.config.idle_ttl, &mut garbage);
        garbage.len()
    }

    /// Whether anything can be kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.config.max_sessions > 0 && self.config.max_bytes > 0
    }

    /// The prompts of `session` that model `model_id` encoded, if the session has not expired at
    /// `now`.
    pub(crate) fn lookup(&self, session: &str, model_id: u64, now: Instant) -> Vec<Arc<Snapshot>> {
        let mut garbage = Vec::new();
        let found = self.lookup_locked(&mut self.lock(), session, model_id, now, &mut garbage);
        // Prompts are freed after the lock is released: freeing megabytes takes a while.
        drop(garbage);
        found
    }

    fn lookup_locked(
        &self,
        state: &mut State,
        session: &str,
        model_id: u64,
        now: Instant,
        garbage: &mut Vec<Arc<Snapshot>>,
    ) -> Vec<Arc<Snapshot>> {
        let ttl = self.config.idle_ttl;
        state.expire(now, ttl, garbage);
        let Some(entry) = state.entries.get(session) else {
            return Vec::new();
        };
        if is_expired(entry.last_used, now, ttl) {
            // Out of LRU order (a caller's `now` ran behind another's): expire it here.
            garbage.extend(state.remove(session));
            state.stats.expirations += 1;
            return Vec::new();
        }
        entry
            .snapshots
            .iter()
            .filter(|s| s.model_id == model_id)
            .cloned()
            .collect()
    }

    /// Counts one request, and keeps `snapshot` as `session`'s most recent prompt if `snapshot`
    /// is given and fits, in place of `replaces` (the prompt it extends) if given, evicting the
    /// session's oldest prompts and least recently used sessions to make room.
    pub(crate) fn record(
        &self,
        session: &str,
        replaces: Option<&Arc<Snapshot>>,
        snapshot: Option<Arc<Snapshot>>,
        now: Instant,
        result: RecordedResult,
    ) {
        let mut garbage = Vec::new();
        self.record_locked(
            &mut self.lock(),
            session,
            (replaces, snapshot),
            now,
            result,
            &mut garbage,
        );
        // Freed after the lock is released, as in `lookup`.
        drop(garbage);
    }

    fn record_locked(
        &self,
        state: &mut State,
        session: &str,
        (replaces, snapshot): (Option<&Arc<Snapshot>>, Option<Arc<Snapshot>>),
        now: Instant,
        result: RecordedResult,
        garbage: &mut Vec<Arc<Snapshot>>,
    ) {
        let config = self.config;
        let stats = &mut state.stats;
        match result.outcome {
            CacheOutcome::Hit => stats.hits += 1,
            CacheOutcome::Miss => stats.misses += 1,
            CacheOutcome::Fallback => stats.fallbacks += 1,
        }
        stats.reused_tokens += result.reused_tokens as u64;
        stats.encoded_tokens += result.encoded_tokens as u64;

        let mut snapshots = state.remove(session);
        let Some(snapshot) = snapshot else {
            garbage.append(&mut snapshots);
            return;
        };
        if !self.enabled() || snapshot.bytes(session) > config.max_bytes {
            garbage.push(snapshot);
            garbage.append(&mut snapshots);
            return;
        }
        // The prompt this one extends is superseded; the session's other prompts stay.
        if let Some(old) = replaces
            && let Some(at) = snapshots.iter().position(|s| Arc::ptr_eq(s, old))
        {
            garbage.push(snapshots.remove(at));
        }
        snapshots.push(snapshot);
        let keep = config.prompts_per_session.max(1);
        let bytes_of = |s: &[Arc<Snapshot>]| s.iter().map(|p| p.bytes(session)).sum::<u64>();
        while snapshots.len() > keep || bytes_of(&snapshots) > config.max_bytes {
            garbage.push(snapshots.remove(0));
        }
        let bytes = bytes_of(&snapshots);
        let key: Arc<str> = Arc::from(session);
        let seq = state.next_seq;
        state.next_seq += 1;
        state.lru.insert(seq, Arc::clone(&key));
        state.entries.insert(
            key,
            Entry {
                snapshots,
                last_used: now,
                seq,
                bytes,
            },
        );
        state.stats.bytes += bytes;
        state.stats.entries = state.entries.len();
        // The new entry is the most recently used, and fits alone: it is never the one dropped.
        while state.entries.len() > config.max_sessions || state.stats.bytes > config.max_bytes {
            let Some((_, oldest)) = state.lru.pop_first() else {
                break;
            };
            let mut evicted = state.remove(&oldest);
            if !evicted.is_empty() {
                garbage.append(&mut evicted);
                state.stats.evictions += 1;
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent before the next, so even a lock poisoned by a
        // panicking thread holds a usable state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for SessionCache {
    fn default() -> Self {
        Self::new(SessionCacheConfig::default())
    }
}

impl fmt::Debug for SessionCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// What one request did, for the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedResult {
    pub(crate) outcome: CacheOutcome,
    pub(crate) reused_tokens: usize,
    pub(crate) encoded_tokens: usize,
}

impl RecordedResult {
    /// The same prompt again: all `tokens` reused, nothing encoded.
    pub(crate) fn hit(tokens: usize) -> Self {
        Self {
            outcome: CacheOutcome::Hit,
            reused_tokens: tokens,
            encoded_tokens: 0,
        }
    }
}

// === impl State ===

impl State {
    /// Takes `session`'s entry out; its snapshots are for the caller to drop, after the lock.
    fn remove(&mut self, session: &str) -> Vec<Arc<Snapshot>> {
        let Some(entry) = self.entries.remove(session) else {
            return Vec::new();
        };
        self.lru.remove(&entry.seq);
        self.stats.bytes = self.stats.bytes.saturating_sub(entry.bytes);
        self.stats.entries = self.entries.len();
        entry.snapshots
    }

    /// Takes expired sessions out from the least recently used end, up to the first live one,
    /// into `garbage`.
    fn expire(&mut self, now: Instant, ttl: Duration, garbage: &mut Vec<Arc<Snapshot>>) {
        while let Some((_, oldest)) = self.lru.first_key_value() {
            let expired = self
                .entries
                .get(oldest)
                .is_none_or(|entry| is_expired(entry.last_used, now, ttl));
            if !expired {
                break;
            }
            let oldest = Arc::clone(oldest);
            self.lru.pop_first();
            let mut expired = self.remove(&oldest);
            if !expired.is_empty() {
                garbage.append(&mut expired);
                self.stats.expirations += 1;
            }
        }
    }
}

fn is_expired(last_used: Instant, now: Instant, ttl: Duration) -> bool {
    now.saturating_duration_since(last_used) > ttl
}
