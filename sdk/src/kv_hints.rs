//! The KV-hint decision point: how engines should treat a session's cached prefix over its life.
//!
//! WIT 1.0 has no event case for a tool result (the session's next turn arriving after a tool
//! call), so the host sends tool results as extension columns of [`IndexState`] (the
//! `TOOL_RESULT_*` keys); [`IndexState::tool_results`] decodes them.

use crate::columns::{find_column, join_column, split_column};
use crate::types::{Extensions, PolicyMetadata, find_extension};

/// Index-state extension: the session of each tool result.
pub const TOOL_RESULT_SESSION_COLUMN: &str = "switchyard.tool-result.session-id";
/// Index-state extension: the tool each tool result answers (empty field: the call named no
/// tool).
pub const TOOL_RESULT_TOOL_COLUMN: &str = "switchyard.tool-result.tool-name";
/// Index-state extension: milliseconds between the end of the turn that called the tool and
/// the next turn (the tool's run time plus the harness's overhead).
pub const TOOL_RESULT_WAITED_COLUMN: &str = "switchyard.tool-result.waited-ms";
/// Index-state extension: when the next turn arrived, on the clock of events' `at-ms`.
pub const TOOL_RESULT_AT_COLUMN: &str = "switchyard.tool-result.at-ms";
/// Index-state extension: how many of the call's events came before each tool result.
pub const TOOL_RESULT_POSITION_COLUMN: &str = "switchyard.tool-result.position";
/// Lifecycle-event extension of `thinking-start` and `thinking-end`: where the thinking span
/// starts in the session's tokens (the turn's prompt and the answer's tokens before it), in
/// decimal
/// ([`LifecycleEvent::thinking_at_token`]).
pub const THINKING_AT_TOKEN_EXTENSION: &str = "switchyard.thinking.at-token";

/// A storage tier of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// GPU memory.
    Device,
    /// Host (CPU) memory.
    Host,
    /// Local disk.
    Disk,
    /// Storage shared between workers.
    Shared,
}

/// A turn ended with a tool call: the session comes back when the tool returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// Tool name, if known.
    pub tool_name: Option<String>,
    /// Prompt tokens the next turn is expected to reuse.
    pub context_tokens: u64,
}

/// The session's context was compacted: its old prefix will not be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Compaction {
    /// Context tokens before compaction.
    pub tokens_before: u64,
    /// Context tokens after compaction.
    pub tokens_after: u64,
}

/// What happened in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A turn ended with a tool call.
    TurnEndWithToolCall(ToolCall),
    /// The session spawned a subagent with this session id.
    SubagentSpawn(String),
    /// The subagent with this session id ended.
    SubagentEnd(String),
    /// The context was compacted.
    Compaction(Compaction),
    /// The model started a thinking span (where: [`LifecycleEvent::thinking_at_token`]).
    ThinkingStart,
    /// The thinking span ended after this many tokens (it started at
    /// [`LifecycleEvent::thinking_at_token`]).
    ThinkingEnd(u32),
    /// The session ended; its KV may go.
    SessionEnd,
}

/// A lifecycle event, tagged with its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// Session the event belongs to.
    pub session_id: String,
    /// Milliseconds on the host's monotonic clock.
    pub at_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// Extra signals.
    pub extensions: Extensions,
}

impl LifecycleEvent {
    /// Where a thinking span starts in the session's tokens (the turn's prompt and the answer's
    /// tokens before the span), so `at..at + tokens` are its tokens. `None` for other
    /// events, or from a host that does not say.
    pub fn thinking_at_token(&self) -> Option<u64> {
        match self.kind {
            EventKind::ThinkingStart | EventKind::ThinkingEnd(_) => {
                find_extension(&self.extensions, THINKING_AT_TOKEN_EXTENSION)?
                    .parse()
                    .ok()
            }
            _ => None,
        }
    }
}

/// Where sessions' prefixes are cached: one entry per (session, worker rank) pair.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Residency {
    /// Session ids.
    pub session_ids: Vec<String>,
    /// Engine server holding blocks of the session.
    pub worker_ids: Vec<u32>,
    /// Its data-parallel rank.
    pub dp_ranks: Vec<u32>,
    /// Session prefix blocks on the device.
    pub device_blocks: Vec<u32>,
    /// Further session prefix blocks in host memory.
    pub host_blocks: Vec<u32>,
    /// Further session prefix blocks on disk.
    pub disk_blocks: Vec<u32>,
}

/// KV capacity and usage per worker rank.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierUsage {
    /// Engine server of each rank.
    pub worker_ids: Vec<u32>,
    /// Data-parallel rank within that server.
    pub dp_ranks: Vec<u32>,
    /// Device blocks in use.
    pub device_used_blocks: Vec<u64>,
    /// Device capacity in blocks (0 when unknown).
    pub device_capacity_blocks: Vec<u64>,
    /// Host-memory blocks in use.
    pub host_used_blocks: Vec<u64>,
    /// Host-memory capacity in blocks (0 when unknown or absent).
    pub host_capacity_blocks: Vec<u64>,
}

/// What the KV index knows right now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexState {
    /// Per-session residency.
    pub residency: Residency,
    /// Per-rank usage.
    pub usage: TierUsage,
    /// Extra signals.
    pub extensions: Extensions,
}

/// A tool result: a session's next turn arrived after a turn that ended in a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolResult {
    /// The session.
    pub session_id: String,
    /// Milliseconds on the host's monotonic clock (as [`LifecycleEvent::at_ms`]).
    pub at_ms: u64,
    /// The tool's name, if the call named one.
    pub tool_name: Option<String>,
    /// Milliseconds since the turn that called the tool ended.
    pub waited_ms: u64,
    /// How many of the call's `events` came before it: it happened after
    /// `events[position - 1]` and before `events[position]`.
    pub position: usize,
}

impl IndexState {
    /// The tool results the host sent with this call, in order. A row without a session or a
    /// wait is skipped; without a time it happened at 0; without a position, after every
    /// event. Empty from a host that sends none.
    pub fn tool_results(&self) -> Vec<ToolResult> {
        let Some(sessions) = find_extension(&self.extensions, TOOL_RESULT_SESSION_COLUMN) else {
            return Vec::new();
        };
        let sessions = split_column(sessions);
        let n = sessions.len();
        let column = |key| find_column(&self.extensions, key, n).unwrap_or_else(|| vec![None; n]);
        let (tools, waits, times, positions) = (
            column(TOOL_RESULT_TOOL_COLUMN),
            column(TOOL_RESULT_WAITED_COLUMN),
            column(TOOL_RESULT_AT_COLUMN),
            column(TOOL_RESULT_POSITION_COLUMN),
        );
        let number = |field: &Option<String>| field.as_deref().and_then(|v| v.parse::<u64>().ok());
        sessions
            .into_iter()
            .enumerate()
            .filter_map(|(i, session_id)| {
                Some(ToolResult {
                    session_id: session_id?,
                    at_ms: number(&times[i]).unwrap_or(0),
                    tool_name: tools[i].clone(),
                    waited_ms: number(&waits[i])?,
                    position: positions[i]
                        .as_deref()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(usize::MAX),
                })
            })
            .collect()
    }

    /// This index with `results` added as extension columns, the way the host sends them (for
    /// building inputs in tests).
    pub fn with_tool_results(mut self, results: &[ToolResult]) -> Self {
        if results.is_empty() {
            return self;
        }
        let mut add = |key: &str, values: Vec<Option<String>>| {
            if values.iter().any(Option::is_some) {
                self.extensions.push((key.to_owned(), join_column(values)));
            }
        };
        let text = |n: u64| Some(n.to_string());
        add(
            TOOL_RESULT_SESSION_COLUMN,
            results.iter().map(|r| Some(r.session_id.clone())).collect(),
        );
        add(
            TOOL_RESULT_TOOL_COLUMN,
            results.iter().map(|r| r.tool_name.clone()).collect(),
        );
        add(
            TOOL_RESULT_WAITED_COLUMN,
            results.iter().map(|r| text(r.waited_ms)).collect(),
        );
        add(
            TOOL_RESULT_AT_COLUMN,
            results.iter().map(|r| text(r.at_ms)).collect(),
        );
        add(
            TOOL_RESULT_POSITION_COLUMN,
            results
                .iter()
                .map(|r| Some(r.position.to_string()))
                .collect(),
        );
        self
    }
}

/// What a hint asks the engines to do with a session's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HintKind {
    /// Make the prefix reusable by this other session (e.g. a subagent).
    Share(String),
    /// Bring the prefix up to this tier before the next request.
    Prefetch(Tier),
    /// Move the prefix down to this tier (it will be idle for a while).
    Demote(Tier),
    /// Keep the prefix on the device for this many milliseconds.
    Pin(u64),
    /// Keep the prefix cached (any tier) until told otherwise.
    Retain,
    /// The prefix will not be reused: free it first.
    Evict,
}

/// A hint for one session. Hints are advice: engines may ignore them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    /// Session the hint applies to.
    pub session_id: String,
    /// Target rank as `(worker_id, dp_rank)`; `None` means every rank holding the session.
    pub target: Option<(u32, u32)>,
    /// What to do.
    pub kind: HintKind,
}

impl Hint {
    /// `kind` for every rank holding `session_id`.
    pub fn new(session_id: impl Into<String>, kind: HintKind) -> Self {
        Self {
            session_id: session_id.into(),
            target: None,
            kind,
        }
    }
}

/// A KV-hint policy. Export it with [`crate::export_kv_hints!`].
pub trait KvHintPolicy {
    /// Who the policy is; called once at load.
    fn metadata(&self) -> PolicyMetadata;

    /// Events since the last call, in order, and the index as it stands; returns hints.
    fn on_events(
        &mut self,
        now_ms: u64,
        events: &[LifecycleEvent],
        index: &IndexState,
    ) -> Vec<Hint>;

    /// Since WIT 1.1: what became of the block actions the host made of earlier hints, as it
    /// learnt it (engines answer asynchronously), before the next `on_events`. Default: ignore.
    fn on_outcomes(&mut self, _now_ms: u64, _outcomes: &HintOutcomes) {}

    /// Since WIT 1.1: the parameters the configuration gives the policy; see
    /// [`RouterPolicy::configure`](crate::RouterPolicy::configure). Default: take none.
    fn configure(&mut self, params: &crate::Params) -> Result<(), String> {
        crate::no_params(&self.metadata().name, params)
    }
}

/// The block action the host made of a hint for one rank (WIT 1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HintAction {
    /// Move the blocks down a tier.
    Demote,
    /// Bring the blocks up to the device.
    Prefetch,
    /// Keep the blocks on the device for a while.
    Pin,
    /// Evict the blocks last.
    Retain,
    /// Free the blocks first.
    Evict,
    /// Never write the blocks to a lower tier (the host's own, for closed thinking spans).
    Ephemeral,
}

/// What became of a block action (WIT 1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HintOutcome {
    /// Done for every block.
    Accepted,
    /// Done for some blocks only.
    Clipped,
    /// Queued for later, or the engine cannot say.
    Deferred,
    /// Refused (the worker takes no hints, an unknown type, a tier the engine lacks, no answer).
    Rejected,
    /// None of the blocks is where the action needs them.
    Missing,
}

/// Outcomes of delivered block actions, as columns: one entry per action (WIT 1.1). Use
/// [`HintOutcomes::iter`] for rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HintOutcomes {
    /// Session of the hint the action came from (`None`: the host's own action).
    pub session_ids: Vec<Option<String>>,
    /// Engine server the action went to.
    pub worker_ids: Vec<u32>,
    /// Its data-parallel rank.
    pub dp_ranks: Vec<u32>,
    /// What the action asked.
    pub actions: Vec<HintAction>,
    /// What became of it.
    pub outcomes: Vec<HintOutcome>,
    /// Blocks the outcome covers.
    pub blocks: Vec<u32>,
}

/// One row of [`HintOutcomes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintOutcomeRow<'a> {
    /// Session of the hint (`None`: the host's own action).
    pub session_id: Option<&'a str>,
    /// Target rank as `(worker_id, dp_rank)`.
    pub rank: (u32, u32),
    /// What the action asked.
    pub action: HintAction,
    /// What became of it.
    pub outcome: HintOutcome,
    /// Blocks the outcome covers.
    pub blocks: u32,
}

impl HintOutcomes {
    /// Number of rows: the shortest column (a malformed input never indexes out of bounds).
    pub fn len(&self) -> usize {
        [
            self.session_ids.len(),
            self.worker_ids.len(),
            self.dp_ranks.len(),
            self.actions.len(),
            self.outcomes.len(),
            self.blocks.len(),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every row, in order.
    pub fn iter(&self) -> impl Iterator<Item = HintOutcomeRow<'_>> + '_ {
        (0..self.len()).map(|i| HintOutcomeRow {
            session_id: self.session_ids[i].as_deref(),
            rank: (self.worker_ids[i], self.dp_ranks[i]),
            action: self.actions[i],
            outcome: self.outcomes[i],
            blocks: self.blocks[i],
        })
    }

    /// Appends a row (for building inputs in tests).
    pub fn push(&mut self, row: HintOutcomeRow<'_>) {
        self.session_ids.push(row.session_id.map(str::to_owned));
        self.worker_ids.push(row.rank.0);
        self.dp_ranks.push(row.rank.1);
        self.actions.push(row.action);
        self.outcomes.push(row.outcome);
        self.blocks.push(row.blocks);
    }
}
