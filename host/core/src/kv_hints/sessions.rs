//! What the hint path knows about sessions, in one place for the gateway and the simulator:
//! the lifecycle events their traffic implies, and the session-prefix index that turns a
//! session-level [`KvHint`] into block ranges on the ranks that hold them.
//!
//! The index keeps, per (session, rank), the sequence hashes of the last prompt routed there
//! (the session's lineage on that rank, as Dynamo's session-prefix index keeps frontiers). How
//! much of a lineage each tier still holds comes from the residency index ([`KvIndex`]), which
//! the engines' own events keep current: this one only says which blocks are the session's.
//! Bounded: at most [`SessionTracker::capacity`] sessions, least recently seen dropped first;
//! ids longer than [`MAX_SESSION_ID_BYTES`] are not tracked.

use super::actions::{ActionType, BlockPayload, HintAction};
use super::{HintKind, HintTier, KvHint, LifecycleEvent, LifecycleKind, SessionResidency};
use crate::hash::SequenceHash;
use crate::index::{KvIndex, Overlap, RankStamp};
use crate::programs::TurnEnd;
use crate::worker::Rank;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Sessions tracked by default (Dynamo's session-prefix index cap).
pub const DEFAULT_SESSION_CAPACITY: usize = 16_384;

/// Longer session ids are not tracked (Dynamo's limit): a harness bug or an attack, not a session.
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// A new prompt that does not extend the session's last one and is at most this fraction of
/// its length is a compaction (the harness summarised the conversation).
const COMPACTION_RATIO: f64 = 0.5;

/// A request of a session, placed on a rank.
#[derive(Debug, Clone, Copy)]
pub struct RoutedTurn<'a> {
    /// The session (harness header).
    pub session_id: &'a str,
    /// Its parent, for a subagent.
    pub parent_session_id: Option<&'a str>,
    /// Where the router placed it.
    pub rank: Rank,
    /// The prompt's sequence hashes.
    pub hashes: &'a [SequenceHash],
    /// The prompt's tokens.
    pub prompt_tokens: u64,
}

#[derive(Debug)]
struct Session {
    parent: Option<String>,
    /// The last prompt routed to each rank, most recent last.
    lineage: Vec<Lineage>,
    prompt_tokens: u64,
    /// The turn that ended in a tool call, waiting for its result: tool name and when.
    waiting_tool: Option<(Option<String>, Duration)>,
    /// A turn of it thought: its answers' KV past the prompt is not reused (chat templates drop
    /// past turns' thinking, and every later block hashes after it).
    thinks: bool,
    /// Its place in the recency order.
    stamp: u64,
}

/// A session's last prompt on one rank.
#[derive(Debug)]
struct Lineage {
    rank: Rank,
    hashes: Arc<[SequenceHash]>,
    /// What the rank held of it at the last lookup, and the rank's stamp then
    /// ([`KvIndex::rank_stamp`]): the answer while the stamp has not moved. Sessions waiting on
    /// a tool are looked up every round, and most ranks change less often than that.
    seen: Cell<Option<(RankStamp, Option<Overlap>)>>,
}

impl Lineage {
    fn new(rank: Rank, hashes: &[SequenceHash]) -> Self {
        Self {
            rank,
            hashes: hashes.into(),
            seen: Cell::new(None),
        }
    }

    /// How much of it the rank holds, per tier (`None`: not even its first block).
    fn residency(&self, index: &KvIndex) -> Option<Overlap> {
        let stamp = index.rank_stamp(self.rank);
        if let Some((seen, overlap)) = self.seen.get()
            && seen == stamp
        {
            return overlap;
        }
        let matches = index.find_matches(&self.hashes);
        let overlap = matches
            .iter()
            .find(|(r, _)| *r == self.rank)
            .map(|(_, overlap)| *overlap);
        self.seen.set(Some((stamp, overlap)));
        overlap
    }
}

impl Session {
    fn latest(&self) -> Option<&Lineage> {
        self.lineage.last()
    }

    fn on(&self, rank: Rank) -> Option<&Arc<[SequenceHash]>> {
        self.lineage
            .iter()
            .find(|l| l.rank == rank)
            .map(|l| &l.hashes)
    }
}

/// Sessions' lifecycle and lineage (see the module docs).
#[derive(Debug)]
pub struct SessionTracker {
    sessions: HashMap<String, Session>,
    /// Stamp -> session id, oldest first.
    recency: BTreeMap<u64, String>,
    next_stamp: u64,
    capacity: usize,
}

impl Default for SessionTracker {
    fn default() -> Self {
        Self::new(DEFAULT_SESSION_CAPACITY)
    }
}

impl SessionTracker {
    /// A tracker of at most `capacity` sessions (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            sessions: HashMap::new(),
            recency: BTreeMap::new(),
            next_stamp: 0,
            capacity: capacity.max(1),
        }
    }

    /// The most sessions it tracks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sessions tracked now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether it tracks no session.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Whether `session_id` is tracked (a request of it was routed and it has not aged out).
    pub fn contains(&self, session_id: &str) -> bool {
        self.sessions.contains_key(session_id)
    }

    /// Whether some session waits on a tool (the hint policy then wants a periodic call).
    pub fn waiting_on_tools(&self) -> bool {
        self.waiting().next().is_some()
    }

    /// The sessions waiting on a tool.
    pub fn waiting(&self) -> impl Iterator<Item = &str> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.waiting_tool.is_some())
            .map(|(id, _)| id.as_str())
    }

    /// `turn` was routed at `now`: its lineage on that rank becomes this prompt, and the events
    /// its arrival implies come back (a tool's result, a subagent's spawn, a compaction).
    pub fn routed(&mut self, turn: RoutedTurn<'_>, now: Duration) -> Vec<LifecycleEvent> {
        let mut events = Vec::new();
        if turn.session_id.len() > MAX_SESSION_ID_BYTES {
            return events;
        }
        let event = |session: &str, kind| LifecycleEvent {
            session_id: session.to_owned(),
            at: now,
            kind,
        };
        let stamp = self.stamp();
        match self.sessions.get_mut(turn.session_id) {
            Some(session) => {
                self.recency.remove(&session.stamp);
                session.stamp = stamp;
                if let Some((tool_name, at)) = session.waiting_tool.take() {
                    let waited = now.saturating_sub(at);
                    events.push(event(
                        turn.session_id,
                        LifecycleKind::ToolResult { tool_name, waited },
                    ));
                }
                if let Some(Lineage {
                    hashes: previous, ..
                }) = session.latest()
                    && is_compaction(previous, session.prompt_tokens, &turn)
                {
                    events.push(event(
                        turn.session_id,
                        LifecycleKind::Compaction {
                            tokens_before: session.prompt_tokens,
                            tokens_after: turn.prompt_tokens,
                        },
                    ));
                }
                session.prompt_tokens = turn.prompt_tokens;
                session.lineage.retain(|l| l.rank != turn.rank);
                session.lineage.push(Lineage::new(turn.rank, turn.hashes));
            }
            None => {
                let parent = turn
                    .parent_session_id
                    .filter(|p| p.len() <= MAX_SESSION_ID_BYTES && *p != turn.session_id);
                if let Some(parent) = parent {
                    events.push(event(
                        parent,
                        LifecycleKind::SubagentSpawn(turn.session_id.to_owned()),
                    ));
                }
                self.sessions.insert(
                    turn.session_id.to_owned(),
                    Session {
                        parent: parent.map(str::to_owned),
                        lineage: vec![Lineage::new(turn.rank, turn.hashes)],
                        prompt_tokens: turn.prompt_tokens,
                        waiting_tool: None,
                        thinks: false,
                        stamp,
                    },
                );
            }
        }
        self.recency.insert(stamp, turn.session_id.to_owned());
        self.evict_beyond_capacity();
        events
    }

    /// A turn of `session_id` ended at `now`: each of its thinking spans, in order (reported
    /// whole when the turn ends: the gateway reads them from the finished answer), then, for a
    /// tool call, the start of the wait for its result.
    pub fn turn_ended(
        &mut self,
        session_id: &str,
        end: &TurnEnd,
        now: Duration,
    ) -> Vec<LifecycleEvent> {
        let Some(session) = self.sessions.get_mut(session_id) else {
            return Vec::new();
        };
        let event = |kind| LifecycleEvent {
            session_id: session_id.to_owned(),
            at: now,
            kind,
        };
        let mut events = Vec::new();
        for span in &end.thinking {
            session.thinks = true;
            // The answer follows the prompt in the session's tokens.
            let at_token = session.prompt_tokens + u64::from(span.offset);
            let tokens = span.tokens;
            events.push(event(LifecycleKind::ThinkingStart { at_token }));
            events.push(event(LifecycleKind::ThinkingEnd { at_token, tokens }));
        }
        if end.tool_call {
            let tool_name = end.tool_name.clone();
            let completion_tokens = end.usage.map_or(0, |u| u64::from(u.completion_tokens));
            session.waiting_tool = Some((tool_name.clone(), now));
            events.push(event(LifecycleKind::TurnEndWithToolCall {
                tool_name,
                context_tokens: session.prompt_tokens + completion_tokens,
            }));
        }
        events
    }

    /// Whether a turn of `session_id` thought: its next answers' KV past the prompt will not be
    /// reused, so it need not be offloaded.
    pub fn thinks(&self, session_id: &str) -> bool {
        self.sessions.get(session_id).is_some_and(|s| s.thinks)
    }

    /// The harness said `session_id` is over: its end, and a subagent's end on its parent. The
    /// session stays tracked, so hints about its blocks can still be resolved; it ages out.
    pub fn ended(&mut self, session_id: &str, now: Duration) -> Vec<LifecycleEvent> {
        let Some(session) = self.sessions.get_mut(session_id) else {
            return Vec::new();
        };
        session.waiting_tool = None;
        let mut events = vec![LifecycleEvent {
            session_id: session_id.to_owned(),
            at: now,
            kind: LifecycleKind::SessionEnd,
        }];
        if let Some(parent) = &session.parent {
            events.push(LifecycleEvent {
                session_id: parent.clone(),
                at: now,
                kind: LifecycleKind::SubagentEnd(session_id.to_owned()),
            });
        }
        events
    }

    /// The ranks `session_id` was routed to, with the blocks of the last prompt it sent each
    /// (its lineage), most recent last.
    pub fn lineage(&self, session_id: &str) -> impl Iterator<Item = (Rank, u32)> + '_ {
        self.sessions
            .get(session_id)
            .into_iter()
            .flat_map(|s| s.lineage.iter())
            .map(|l| (l.rank, u32::try_from(l.hashes.len()).unwrap_or(u32::MAX)))
    }

    /// The sessions a round of the hint path with `events` concerns: those the events name (a
    /// subagent's spawn or end names the child too) and every session waiting on a tool, whose
    /// planned prefetch a round without events must still see.
    pub fn round_sessions<'a>(&'a self, events: &'a [LifecycleEvent]) -> BTreeSet<&'a str> {
        let mut sessions: BTreeSet<&str> = self.waiting().collect();
        for event in events {
            sessions.insert(&event.session_id);
            if let LifecycleKind::SubagentSpawn(child) | LifecycleKind::SubagentEnd(child) =
                &event.kind
            {
                sessions.insert(child);
            }
        }
        sessions
    }

    /// `hints` [resolved](Self::resolve) into block actions per rank, in order, numbered per
    /// rank (`a1`, `a2`, ...).
    pub fn actions(&self, hints: &[KvHint]) -> BTreeMap<Rank, Vec<HintAction>> {
        let mut per_rank: BTreeMap<Rank, Vec<HintAction>> = BTreeMap::new();
        for hint in hints {
            for (rank, kind, payload) in self.resolve(hint) {
                let actions = per_rank.entry(rank).or_default();
                let id = format!("a{}", actions.len() + 1);
                actions.push(HintAction::new(id, kind, payload));
            }
        }
        per_rank
    }

    /// Where `sessions` are cached, per rank of their lineage, as `index` sees it now.
    pub fn residency<'a>(
        &self,
        sessions: impl IntoIterator<Item = &'a str>,
        index: &KvIndex,
    ) -> Vec<SessionResidency> {
        let mut out = Vec::new();
        for id in sessions {
            let Some(session) = self.sessions.get(id) else {
                continue;
            };
            for lineage in &session.lineage {
                let Some(overlap) = lineage.residency(index) else {
                    continue;
                };
                out.push(SessionResidency {
                    session_id: id.to_owned(),
                    rank: lineage.rank,
                    device_blocks: overlap.device,
                    host_blocks: overlap.host,
                    disk_blocks: overlap.disk,
                });
            }
        }
        out
    }

    /// `hint` as block actions, one per rank it concerns; none when the session (or the one it
    /// shares with) is unknown or was never routed to the targeted rank.
    ///
    /// - Demote, Pin, Retain: the session's lineage on each rank (or the target).
    /// - Prefetch: its lineage on the rank it was last routed to (or the target).
    /// - Evict: the blocks beyond what it shares with its parent (a subagent's private blocks),
    ///   on each rank; a top-level session's whole lineage.
    /// - Share(other): the session's lineage is retained where it is, and prefetched on the
    ///   other session's rank when that is elsewhere (it comes from a lower tier or the pool).
    pub fn resolve(&self, hint: &KvHint) -> Vec<(Rank, ActionType, BlockPayload)> {
        let Some(session) = self.sessions.get(&hint.session_id) else {
            return Vec::new();
        };
        let payload =
            |hashes: &[SequenceHash], tier: Option<HintTier>, ttl_ms: Option<u64>| BlockPayload {
                block_hashes: hashes.iter().map(|h| h.0).collect(),
                tier,
                ttl_ms,
                session_id: Some(hint.session_id.clone()),
            };
        let ranks: Vec<(Rank, &Arc<[SequenceHash]>)> = match hint.target {
            Some(rank) => session.on(rank).map(|h| (rank, h)).into_iter().collect(),
            None => session
                .lineage
                .iter()
                .map(|l| (l.rank, &l.hashes))
                .collect(),
        };
        let every = |kind: ActionType, tier: Option<HintTier>, ttl: Option<u64>| {
            ranks
                .iter()
                .filter(|(_, h)| !h.is_empty())
                .map(|(rank, hashes)| (*rank, kind, payload(hashes, tier, ttl)))
                .collect::<Vec<_>>()
        };
        match &hint.kind {
            HintKind::Demote(tier) => every(ActionType::Demote, Some(*tier), None),
            HintKind::Pin(ttl) => every(ActionType::Pin, None, Some(ttl.as_millis() as u64)),
            HintKind::Retain => every(ActionType::Retain, None, None),
            HintKind::Prefetch(tier) => {
                let chosen = match hint.target {
                    Some(_) => ranks.first().copied(),
                    None => session.latest().map(|l| (l.rank, &l.hashes)),
                };
                chosen
                    .filter(|(_, h)| !h.is_empty())
                    .map(|(rank, hashes)| {
                        (
                            rank,
                            ActionType::Prefetch,
                            payload(hashes, Some(*tier), None),
                        )
                    })
                    .into_iter()
                    .collect()
            }
            HintKind::Evict => {
                let parent = session.parent.as_ref().and_then(|p| self.sessions.get(p));
                ranks
                    .iter()
                    .filter_map(|(rank, hashes)| {
                        let shared = parent
                            .map(|p| {
                                p.lineage
                                    .iter()
                                    .map(|l| common_prefix(&l.hashes, hashes))
                                    .max()
                                    .unwrap_or(0)
                            })
                            .unwrap_or(0);
                        // Sequence hashes name their whole prefix, so a suffix is unambiguous.
                        let private = &hashes[shared..];
                        (!private.is_empty())
                            .then(|| (*rank, ActionType::Evict, payload(private, None, None)))
                    })
                    .collect()
            }
            HintKind::Share(other) => {
                let mut actions = every(ActionType::Retain, None, None);
                let theirs = self.sessions.get(other).and_then(Session::latest);
                if let (Some(theirs), Some(ours)) = (theirs, session.latest())
                    && session.on(theirs.rank).is_none()
                    && !ours.hashes.is_empty()
                {
                    let hashes = &ours.hashes;
                    actions.push((
                        theirs.rank,
                        ActionType::Prefetch,
                        payload(hashes, Some(HintTier::Device), None),
                    ));
                }
                actions
            }
        }
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn evict_beyond_capacity(&mut self) {
        while self.sessions.len() > self.capacity {
            let Some((_, oldest)) = self.recency.pop_first() else {
                return;
            };
            self.sessions.remove(&oldest);
        }
    }
}

/// Leading blocks `a` and `b` share.
fn common_prefix(a: &[SequenceHash], b: &[SequenceHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The new prompt drops what was cached (shares less than half of the last prompt) and is much
/// shorter: the harness compacted the conversation.
fn is_compaction(previous: &[SequenceHash], previous_tokens: u64, turn: &RoutedTurn<'_>) -> bool {
    previous_tokens > 0
        && (turn.prompt_tokens as f64) <= previous_tokens as f64 * COMPACTION_RATIO
        && common_prefix(previous, turn.hashes) * 2 < previous.len()
}

#[cfg(test)]
mod tests;
