//! The built-in KV-hint strategies (agentic-serving.md section 5; kv-cache.md sections 3 and 6):
//! each turns the lifecycle of agent sessions into hints about the KV blocks they will, or will
//! never, reuse.
//!
//! - [`DemoteOnToolCall`] (`demote-on-tool-call`): a session waiting on a slow tool is demoted
//!   to host memory and prefetched back just before the tool is predicted to return.
//! - [`SubagentReclaim`] (`subagent-reclaim`): a finished subagent's KV is evicted.
//! - [`ShareToSubagent`] (`share-to-subagent`): a parent's prefix is shared with each subagent it
//!   spawns.
//! - [`CompactionEvict`] (`compaction-evict`): a compacted session's old prefix is evicted.
//!
//! Every one also evicts an ended session (share-to-subagent waits for its live subagents).
//! They are pure and deterministic: time comes from the events and `now`, and is read at whole
//! milliseconds (what the WIT carries), so a Wasm build of a strategy answers exactly as the
//! native one. Their state is bounded: at most `max_sessions` sessions (default
//! [`DEFAULT_MAX_SESSIONS`], like the session-prefix index) and, for tools, `max_tools`, the
//! least recently used entry going first.
//!
//! A strategy only hints sessions that the call's events or index name (the host refuses any
//! other answer), and never repeats a hint within one answer.

use super::{HintKind, HintTier, IndexState, KvHint, KvHintPolicy, LifecycleEvent, LifecycleKind};
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

/// Sessions a strategy remembers at most: the session-prefix index's cap.
pub const DEFAULT_MAX_SESSIONS: usize = 16_384;

/// `d` cut to whole milliseconds, the resolution the WIT carries.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sessions `hints` may name: those the events tag or spawn or end, and those the index holds.
fn known_sessions<'a>(events: &'a [LifecycleEvent], index: &'a IndexState) -> HashSet<&'a str> {
    let mut known: HashSet<&str> = index
        .residency
        .iter()
        .map(|r| r.session_id.as_str())
        .collect();
    for event in events {
        known.insert(&event.session_id);
        if let LifecycleKind::SubagentSpawn(child) | LifecycleKind::SubagentEnd(child) = &event.kind
        {
            known.insert(child);
        }
    }
    known
}

/// The answer: `hints` in order, without repeats and without hints about sessions the inputs do
/// not name (the host would refuse the whole answer for one of those).
fn answer(hints: Vec<KvHint>, events: &[LifecycleEvent], index: &IndexState) -> Vec<KvHint> {
    let known = known_sessions(events, index);
    let mut kept: Vec<KvHint> = Vec::with_capacity(hints.len());
    for hint in hints {
        let shared_with = match &hint.kind {
            HintKind::Share(other) => Some(other.as_str()),
            _ => None,
        };
        let named = std::iter::once(hint.session_id.as_str()).chain(shared_with);
        if named.into_iter().all(|s| known.contains(s)) && !kept.contains(&hint) {
            kept.push(hint);
        }
    }
    kept
}

/// Whether the index holds any block of `session`.
fn resident(index: &IndexState, session: &str) -> bool {
    index.residency.iter().any(|r| r.session_id == session)
}

// === Lru ===

/// A map of at most `capacity` entries; inserting into a full one drops the least recently
/// inserted or touched entry. Ordered maps only, so it behaves the same on every target.
#[derive(Debug, Clone)]
struct Lru<K, V> {
    capacity: usize,
    entries: BTreeMap<K, (V, u64)>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, K>,
    clock: u64,
}

impl<K: Ord + Clone, V> Lru<K, V> {
    /// Room for `capacity` entries (at least one).
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: BTreeMap::new(),
            by_use: BTreeMap::new(),
            clock: 0,
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The value of `key`, without counting as a use.
    fn peek<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key).map(|(value, _)| value)
    }

    /// The value of `key`, which now counts as the most recently used.
    fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let key = self.entries.get_key_value(key)?.0.clone();
        self.clock += 1;
        let (value, used) = self.entries.get_mut::<K>(&key)?;
        self.by_use.remove(used);
        *used = self.clock;
        self.by_use.insert(self.clock, key);
        Some(value)
    }

    /// Set `key` to `value` as the most recently used; the entry dropped to make room, if any.
    fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        self.remove(&key);
        let mut dropped = None;
        if self.entries.len() >= self.capacity
            && let Some((_, oldest)) = self.by_use.pop_first()
            && let Some((value, _)) = self.entries.remove(&oldest)
        {
            dropped = Some((oldest, value));
        }
        self.clock += 1;
        self.by_use.insert(self.clock, key.clone());
        self.entries.insert(key, (value, self.clock));
        dropped
    }

    fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let (value, used) = self.entries.remove(key)?;
        self.by_use.remove(&used);
        Some(value)
    }
}

// === DemoteOnToolCall ===

/// [`DemoteOnToolCall`]'s parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoteOnToolCallConfig {
    /// Predicted run time of a tool not seen yet. Below `demote_threshold`, a tool is demoted
    /// for only once it has been seen to be slow. Default: 1 s.
    pub unseen_tool_time: Duration,
    /// Weight of the newest observation in a tool's moving average (EWMA), 0 to 1; the first
    /// observation replaces `unseen_tool_time`. Default: 0.3.
    pub ewma_weight: f64,
    /// A session is demoted when its tool is predicted to return more than this after the
    /// call that learns of the tool call. Default: 2 s.
    pub demote_threshold: Duration,
    /// ... and only when the device is short: a rank holding the session's device blocks uses
    /// at least this fraction of its device blocks (the index's `usage`). A rank of unknown
    /// capacity (0) counts as short, as does a session the index holds on no device; 0
    /// demotes whatever the usage. Default: 0.9.
    pub demote_above_usage: f64,
    /// The prefetch is hinted this long before the predicted return (the host calls about
    /// every 100 ms while a session waits, so it needs to cover that and the copy). Default:
    /// 500 ms.
    pub prefetch_lead: Duration,
    /// The tier a waiting session's prefix is demoted to. Default: host memory.
    pub demote_to: HintTier,
    /// Tools whose times are remembered. Default: 1,024.
    pub max_tools: usize,
    /// Sessions with a prefetch pending. Default: [`DEFAULT_MAX_SESSIONS`].
    pub max_sessions: usize,
}

impl Default for DemoteOnToolCallConfig {
    fn default() -> Self {
        Self {
            unseen_tool_time: Duration::from_secs(1),
            ewma_weight: 0.3,
            demote_threshold: Duration::from_secs(2),
            demote_above_usage: 0.9,
            prefetch_lead: Duration::from_millis(500),
            demote_to: HintTier::Host,
            max_tools: 1_024,
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// How long each tool takes, as an EWMA of the waits that followed its calls. Calls without a
/// tool name share one entry.
#[derive(Debug, Clone)]
pub struct ToolTimes {
    unseen: Duration,
    weight: f64,
    times: Lru<Option<String>, Duration>,
}

impl ToolTimes {
    /// Estimates for at most `max_tools` tools, `unseen` for the others, each new observation
    /// weighted `weight`.
    pub fn new(unseen: Duration, weight: f64, max_tools: usize) -> Self {
        Self {
            unseen,
            // Out of range or NaN: trust the newest observation only.
            weight: if (0.0..=1.0).contains(&weight) {
                weight
            } else {
                1.0
            },
            times: Lru::new(max_tools),
        }
    }

    /// The predicted run time of `tool`.
    pub fn predict(&self, tool: Option<&str>) -> Duration {
        self.times
            .peek(&tool.map(str::to_owned))
            .copied()
            .unwrap_or(self.unseen)
    }

    /// Record that a call of `tool` was followed by a wait of `waited`.
    pub fn observe(&mut self, tool: Option<&str>, waited: Duration) {
        let key = tool.map(str::to_owned);
        let estimate = match self.times.get_mut(&key) {
            Some(old) => {
                let blended =
                    old.as_secs_f64() * (1.0 - self.weight) + waited.as_secs_f64() * self.weight;
                Duration::try_from_secs_f64(blended).unwrap_or(waited)
            }
            None => waited,
        };
        self.times.insert(key, estimate);
    }

    /// Tools remembered.
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether no tool was observed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Demotes a session's prefix while it waits on a slow tool and prefetches it back before the
/// tool returns, so the device holds the sessions that are running.
///
/// On `TurnEndWithToolCall` at `at`, the tool is predicted to return at `at + predict(tool)`
/// ([`ToolTimes`]); if that is more than `demote_threshold` after `now` and the device is
/// short (a rank holding the session's device blocks is at least `demote_above_usage` full;
/// with room, ThunderAgent-style admission keeps it for the running programs and a demote
/// would only move hits from the device to the host), the session gets
/// `Demote(demote_to)` and a prefetch is planned `prefetch_lead` before the return. The first
/// call whose `now` reaches that time hints `Prefetch(Device)` (if the index still holds the
/// session), unless a `ToolResult` for the session came first: its request brings the blocks
/// back itself. Each `ToolResult` teaches the tool's time. `SessionEnd` drops the plan and
/// evicts the session.
#[derive(Debug, Clone)]
pub struct DemoteOnToolCall {
    config: DemoteOnToolCallConfig,
    tools: ToolTimes,
    /// Session -> (prefetch time, plan number): the planned prefetches.
    planned: Lru<String, (Duration, u64)>,
    /// The same plans by (prefetch time, plan number): the order they fall due in.
    due: BTreeMap<(Duration, u64), String>,
    plans: u64,
}

impl DemoteOnToolCall {
    /// The strategy with `config`.
    pub fn new(config: DemoteOnToolCallConfig) -> Self {
        Self {
            tools: ToolTimes::new(
                config.unseen_tool_time,
                config.ewma_weight,
                config.max_tools,
            ),
            planned: Lru::new(config.max_sessions),
            due: BTreeMap::new(),
            plans: 0,
            config,
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &DemoteOnToolCallConfig {
        &self.config
    }

    /// What was learnt about tools so far.
    pub fn tools(&self) -> &ToolTimes {
        &self.tools
    }

    /// When `session`'s prefetch is planned, if it is.
    pub fn planned_prefetch(&self, session: &str) -> Option<Duration> {
        self.planned.peek(session).map(|(at, _)| *at)
    }

    fn plan(&mut self, session: &str, at: Duration) {
        self.plans += 1;
        let plan = (at, self.plans);
        if let Some((_, dropped)) = self.planned.insert(session.to_owned(), plan) {
            self.due.remove(&dropped);
        }
        self.due.insert(plan, session.to_owned());
    }

    fn cancel(&mut self, session: &str) {
        if let Some(plan) = self.planned.remove(session) {
            self.due.remove(&plan);
        }
    }
}

impl Default for DemoteOnToolCall {
    fn default() -> Self {
        Self::new(DemoteOnToolCallConfig::default())
    }
}

impl KvHintPolicy for DemoteOnToolCall {
    fn name(&self) -> &str {
        "demote-on-tool-call"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint> {
        let now = whole_ms(now);
        // Plans due now; the events below may still cancel them.
        let falling_due: Vec<((Duration, u64), String)> = self
            .due
            .range(..=(now, u64::MAX))
            .map(|(plan, session)| (*plan, session.clone()))
            .collect();
        let mut hints = Vec::new();
        for event in events {
            let session = event.session_id.as_str();
            match &event.kind {
                LifecycleKind::TurnEndWithToolCall { tool_name, .. } => {
                    self.cancel(session);
                    let returns_at = whole_ms(event.at) + self.tools.predict(tool_name.as_deref());
                    if returns_at.saturating_sub(now) > self.config.demote_threshold
                        && device_short(index, session, self.config.demote_above_usage)
                    {
                        hints.push(KvHint::new(
                            session,
                            HintKind::Demote(self.config.demote_to),
                        ));
                        self.plan(
                            session,
                            returns_at.saturating_sub(self.config.prefetch_lead),
                        );
                    }
                }
                LifecycleKind::ToolResult { tool_name, waited } => {
                    self.tools.observe(tool_name.as_deref(), whole_ms(*waited));
                    self.cancel(session);
                }
                LifecycleKind::SessionEnd => {
                    self.cancel(session);
                    hints.push(KvHint::new(session, HintKind::Evict));
                }
                _ => {}
            }
        }
        for (plan, session) in falling_due {
            if self.due.remove(&plan).is_some() {
                self.planned.remove(session.as_str());
                if resident(index, &session) {
                    hints.push(KvHint::new(session, HintKind::Prefetch(HintTier::Device)));
                }
            }
        }
        answer(hints, events, index)
    }

    /// A session whose demote no rank carried out (every demote of it in `outcomes` was
    /// rejected or found no blocks) keeps its blocks on the device: its planned prefetch is
    /// cancelled, since bringing back blocks that never left costs a prefetch for nothing.
    fn on_outcomes(&mut self, outcomes: &[super::HintOutcome], _now: Duration) {
        use super::actions::{ActionType, Outcome};
        let mut failed: BTreeSet<&str> = BTreeSet::new();
        let mut carried: HashSet<&str> = HashSet::new();
        for o in outcomes {
            let Some(session) = o.session_id.as_deref() else {
                continue;
            };
            if o.action != ActionType::Demote {
                continue;
            }
            match o.outcome {
                Outcome::Rejected | Outcome::Missing => failed.insert(session),
                Outcome::Accepted | Outcome::Clipped | Outcome::Deferred => carried.insert(session),
            };
        }
        for session in failed {
            if !carried.contains(session) {
                self.cancel(session);
            }
        }
    }
}

/// Whether a rank holding `session`'s device blocks uses at least `above` of its device (one
/// of unknown capacity counts as short); also when the index holds the session on no device
/// (nothing to weigh: the engines say what they can do).
fn device_short(index: &IndexState, session: &str, above: f64) -> bool {
    let mut ranks = index
        .residency
        .iter()
        .filter(|r| r.session_id == session && r.device_blocks > 0)
        .map(|r| r.rank)
        .peekable();
    if ranks.peek().is_none() {
        return true;
    }
    ranks.any(|rank| {
        index.usage.iter().find(|u| u.rank == rank).is_none_or(|u| {
            u.device_capacity_blocks == 0
                || u.device_used_blocks as f64 >= above * u.device_capacity_blocks as f64
        })
    })
}

// === SubagentReclaim ===

/// [`SubagentReclaim`]'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentReclaimConfig {
    /// Evicted sessions remembered, so a subagent's own `SessionEnd` after its parent's
    /// `SubagentEnd` (or the other way round) does not evict it again. Default:
    /// [`DEFAULT_MAX_SESSIONS`].
    pub max_sessions: usize,
}

impl Default for SubagentReclaimConfig {
    fn default() -> Self {
        Self {
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// Evicts a subagent's KV when it ends (`SubagentEnd(child)` hints `Evict` for the child: a
/// finished subagent's blocks are worth about nothing, kv-cache.md section 3), and any session's
/// at `SessionEnd`. The host resolves which blocks are the child's own: the prefix it shares
/// with its parent belongs to the parent.
#[derive(Debug, Clone)]
pub struct SubagentReclaim {
    config: SubagentReclaimConfig,
    evicted: Lru<String, ()>,
}

impl SubagentReclaim {
    /// The strategy with `config`.
    pub fn new(config: SubagentReclaimConfig) -> Self {
        Self {
            evicted: Lru::new(config.max_sessions),
            config,
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &SubagentReclaimConfig {
        &self.config
    }

    /// An `Evict` for `session` unless it was evicted already.
    fn evict(&mut self, session: &str, hints: &mut Vec<KvHint>) {
        if self.evicted.get_mut(session).is_none() {
            self.evicted.insert(session.to_owned(), ());
            hints.push(KvHint::new(session, HintKind::Evict));
        }
    }
}

impl Default for SubagentReclaim {
    fn default() -> Self {
        Self::new(SubagentReclaimConfig::default())
    }
}

impl KvHintPolicy for SubagentReclaim {
    fn name(&self) -> &str {
        "subagent-reclaim"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        _now: Duration,
    ) -> Vec<KvHint> {
        let mut hints = Vec::new();
        for event in events {
            match &event.kind {
                LifecycleKind::SubagentEnd(child) => self.evict(child, &mut hints),
                LifecycleKind::SessionEnd => self.evict(&event.session_id, &mut hints),
                _ => {}
            }
        }
        answer(hints, events, index)
    }
}

// === ShareToSubagent ===

/// [`ShareToSubagent`]'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareToSubagentConfig {
    /// Parents, and subagents, remembered (each). Default: [`DEFAULT_MAX_SESSIONS`].
    pub max_sessions: usize,
}

impl Default for ShareToSubagentConfig {
    fn default() -> Self {
        Self {
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// A parent's subagents still running, and whether it ended itself.
#[derive(Debug, Clone, Default)]
struct Family {
    live: BTreeSet<String>,
    ended: bool,
}

/// Shares a parent's prefix with each subagent it spawns (`SubagentSpawn(child)` hints
/// `Share(child)` on the parent), so the child's first request finds the prefix wherever it
/// lands instead of recomputing it.
///
/// An ended session is evicted, but a parent that ends while subagents it shared with still run
/// is evicted only once the last of them ends (`SubagentEnd`, or the child's `SessionEnd`):
/// evicting a prefix just shared would undo the share.
#[derive(Debug, Clone)]
pub struct ShareToSubagent {
    config: ShareToSubagentConfig,
    families: Lru<String, Family>,
    parents: Lru<String, String>,
}

impl ShareToSubagent {
    /// The strategy with `config`.
    pub fn new(config: ShareToSubagentConfig) -> Self {
        Self {
            families: Lru::new(config.max_sessions),
            parents: Lru::new(config.max_sessions),
            config,
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &ShareToSubagentConfig {
        &self.config
    }

    /// Subagents of `parent` known to run.
    pub fn live_subagents(&self, parent: &str) -> usize {
        self.families.peek(parent).map_or(0, |f| f.live.len())
    }

    fn spawned(&mut self, parent: &str, child: &str, hints: &mut Vec<KvHint>) {
        // A child spawned again (a repeated event) leaves the family it was in.
        self.child_ended(child, hints);
        let mut family = self.families.remove(parent).unwrap_or_default();
        family.live.insert(child.to_owned());
        self.families.insert(parent.to_owned(), family);
        if let Some((forgotten, its_parent)) =
            self.parents.insert(child.to_owned(), parent.to_owned())
            && let Some(family) = self.families.get_mut(&its_parent)
        {
            family.live.remove(&forgotten);
        }
    }

    /// `child` stopped; its parent's deferred eviction, if this was the last subagent of an
    /// ended parent.
    fn child_ended(&mut self, child: &str, hints: &mut Vec<KvHint>) {
        let Some(parent) = self.parents.remove(child) else {
            return;
        };
        let orphaned = self.families.get_mut(&parent).is_some_and(|family| {
            family.live.remove(child);
            family.ended && family.live.is_empty()
        });
        if orphaned {
            self.families.remove(&parent);
            hints.push(KvHint::new(parent, HintKind::Evict));
        }
    }

    fn session_ended(&mut self, session: &str, hints: &mut Vec<KvHint>) {
        match self.families.get_mut(session) {
            Some(family) if !family.live.is_empty() => family.ended = true,
            _ => {
                self.families.remove(session);
                hints.push(KvHint::new(session, HintKind::Evict));
            }
        }
        self.child_ended(session, hints);
    }
}

impl Default for ShareToSubagent {
    fn default() -> Self {
        Self::new(ShareToSubagentConfig::default())
    }
}

impl KvHintPolicy for ShareToSubagent {
    fn name(&self) -> &str {
        "share-to-subagent"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        _now: Duration,
    ) -> Vec<KvHint> {
        let mut hints = Vec::new();
        for event in events {
            let session = event.session_id.as_str();
            match &event.kind {
                LifecycleKind::SubagentSpawn(child) if child != session => {
                    self.spawned(session, child, &mut hints);
                    hints.push(KvHint::new(session, HintKind::Share(child.clone())));
                }
                LifecycleKind::SubagentEnd(child) => self.child_ended(child, &mut hints),
                LifecycleKind::SessionEnd => self.session_ended(session, &mut hints),
                _ => {}
            }
        }
        answer(hints, events, index)
    }
}

// === CompactionEvict ===

/// Evicts a session's prefix when its context is compacted (the summary replaces the history,
/// so the old prefix is not reused), and at `SessionEnd`. Stateless. The host resolves the hint
/// against the blocks the index attributes to the session when the hint arrives: the old
/// prefix, if the compacted turn has not run yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct CompactionEvict;

impl KvHintPolicy for CompactionEvict {
    fn name(&self) -> &str {
        "compaction-evict"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        _now: Duration,
    ) -> Vec<KvHint> {
        let hints = events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    LifecycleKind::Compaction { .. } | LifecycleKind::SessionEnd
                )
            })
            .map(|e| KvHint::new(e.session_id.clone(), HintKind::Evict))
            .collect();
        answer(hints, events, index)
    }
}

// === AllOf ===

/// Several strategies at once (a `+`-joined spec, `kv_hints::params`): every call goes to each,
/// in order, and their hints are joined, each distinct hint once.
#[derive(Debug)]
pub struct AllOf {
    name: String,
    parts: Vec<Box<dyn KvHintPolicy>>,
}

impl AllOf {
    /// `parts`, reported under `name`.
    pub fn new(name: String, parts: Vec<Box<dyn KvHintPolicy>>) -> Self {
        Self { name, parts }
    }
}

impl KvHintPolicy for AllOf {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint> {
        let mut hints: Vec<KvHint> = Vec::new();
        for part in &mut self.parts {
            for hint in part.on_events(events, index, now) {
                if !hints.contains(&hint) {
                    hints.push(hint);
                }
            }
        }
        hints
    }

    fn on_outcomes(&mut self, outcomes: &[super::HintOutcome], now: Duration) {
        for part in &mut self.parts {
            part.on_outcomes(outcomes, now);
        }
    }
}

#[cfg(test)]
mod tests;
