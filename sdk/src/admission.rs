//! The admission decision point: which agent programs (sessions) may send work now.

use crate::types::{Extensions, PolicyMetadata, Request};

/// Where a session is in its life, as the gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionPhase {
    /// Has requests waiting in the gateway queue, none running.
    Queued,
    /// Has requests running on an engine.
    Running,
    /// Its last turn ended with a tool call; the next request comes when the tool returns.
    ToolCall,
    /// Paused by an admission action; its requests wait.
    Paused,
    /// Nothing running or waiting.
    Idle,
}

/// Every known session as columns (one entry per session, same order in every `Vec`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sessions {
    /// Session ids.
    pub session_ids: Vec<String>,
    /// Parent session (for subagents), if any.
    pub parent_session_ids: Vec<Option<String>>,
    /// Phase of each session.
    pub phases: Vec<SessionPhase>,
    /// Current priority (after earlier adjustments); higher is more urgent.
    pub priorities: Vec<i32>,
    /// Requests running.
    pub active_requests: Vec<u32>,
    /// Requests waiting in the gateway queue.
    pub queued_requests: Vec<u32>,
    /// Tokens in the session's context (last prompt plus output).
    pub context_tokens: Vec<u64>,
    /// Milliseconds since the session's first request.
    pub age_ms: Vec<u64>,
    /// Milliseconds since the session last had a request running (0 while running).
    pub idle_ms: Vec<u64>,
    /// Extra session-set signals.
    pub extensions: Extensions,
}

impl Sessions {
    /// Number of sessions (the shortest column, so indexing below it never panics).
    pub fn len(&self) -> usize {
        [
            self.session_ids.len(),
            self.parent_session_ids.len(),
            self.phases.len(),
            self.priorities.len(),
            self.active_requests.len(),
            self.queued_requests.len(),
            self.context_tokens.len(),
            self.age_ms.len(),
            self.idle_ms.len(),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Whether no session is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index of session `session_id`, if known.
    pub fn position(&self, session_id: &str) -> Option<usize> {
        self.session_ids[..self.len()]
            .iter()
            .position(|s| s == session_id)
    }
}

/// Utilization of every worker rank as columns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Utilization {
    /// Engine server of each rank.
    pub worker_ids: Vec<u32>,
    /// Data-parallel rank within that server.
    pub dp_ranks: Vec<u32>,
    /// Fraction of KV capacity in use, 0.0 to 1.0.
    pub kv_usage: Vec<f32>,
    /// Requests in flight.
    pub active_requests: Vec<u32>,
    /// Requests waiting in the engine's queue.
    pub queue_depth: Vec<u32>,
    /// Whether the host routes to the rank.
    pub healthy: Vec<bool>,
    /// Extra pool-wide signals.
    pub extensions: Extensions,
}

/// A request that arrived and is not yet admitted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Incoming {
    /// The request as the router would see it (its `session_id` tags the actions).
    pub request: Request,
    /// Milliseconds it has waited so far (0 on first arrival).
    pub waited_ms: u64,
}

/// What to do with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionKind {
    /// Let its waiting requests go to the router.
    Admit,
    /// Keep its waiting requests queued for now; the string says why.
    Hold(String),
    /// Stop admitting its requests until `Resume`.
    Pause,
    /// Undo `Pause`.
    Resume,
    /// Add this delta to its priority (negative lowers it).
    AdjustPriority(i32),
}

/// One admission action, tagged with its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// Session the action applies to.
    pub session_id: String,
    /// The action.
    pub kind: ActionKind,
}

impl Action {
    /// `kind` for `session_id`.
    pub fn new(session_id: impl Into<String>, kind: ActionKind) -> Self {
        Self {
            session_id: session_id.into(),
            kind,
        }
    }
}

/// An admission policy. Export it with [`crate::export_admission!`]. Sessions without an action
/// keep their state; an arrival without an action is admitted.
pub trait AdmissionPolicy {
    /// Who the policy is; called once at load.
    fn metadata(&self) -> PolicyMetadata;

    /// Periodic review; `now_ms` is the host's monotonic clock.
    fn tick(&mut self, now_ms: u64, sessions: &Sessions, workers: &Utilization) -> Vec<Action>;

    /// A request arrived for a session. Default: no action, so it is admitted.
    fn arrival(
        &mut self,
        _now_ms: u64,
        _incoming: &Incoming,
        _sessions: &Sessions,
        _workers: &Utilization,
    ) -> Vec<Action> {
        Vec::new()
    }
}
