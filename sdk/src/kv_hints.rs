//! The KV-hint decision point: how engines should treat a session's cached prefix over its life.

use crate::types::{Extensions, PolicyMetadata};

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
    /// The model started a thinking span.
    ThinkingStart,
    /// The thinking span ended after this many tokens.
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
}
