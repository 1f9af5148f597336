//! Admission world: conversions and the calls `export_admission!` forwards to.

use super::admission_world::switchyard::policy::admission_types as wit;
use super::common;
pub use super::router_world::switchyard::policy::types::PolicyMetadata as WitMetadata;
use crate::admission::{
    Action, ActionKind, AdmissionPolicy, Incoming, SessionPhase, Sessions, Utilization,
};

pub use wit::{
    Action as WitAction, Incoming as WitIncoming, Sessions as WitSessions,
    Utilization as WitUtilization,
};

/// `metadata` export.
pub fn metadata<P: AdmissionPolicy>(policy: &P) -> WitMetadata {
    common::metadata(policy.metadata(), "admission")
}

/// `tick` export.
pub fn tick<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    state: WitSessions,
    workers: WitUtilization,
) -> Vec<WitAction> {
    let actions = policy.tick(now_ms, &sessions(state), &utilization(workers));
    actions.into_iter().map(action).collect()
}

/// `arrival` export.
pub fn arrival<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    req: WitIncoming,
    state: WitSessions,
    workers: WitUtilization,
) -> Vec<WitAction> {
    let incoming = Incoming {
        request: common::request(req.req),
        waited_ms: req.waited_ms,
    };
    let actions = policy.arrival(now_ms, &incoming, &sessions(state), &utilization(workers));
    actions.into_iter().map(action).collect()
}

/// `placement` export (1.1).
pub fn placement<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    session_id: String,
    state: WitSessions,
    workers: WitUtilization,
) -> Option<(u32, u32)> {
    policy
        .placement(now_ms, &session_id, &sessions(state), &utilization(workers))
        .map(|rank| (rank.worker_id, rank.dp_rank))
}

/// `configure` export (1.1).
pub fn configure<P: AdmissionPolicy>(
    policy: &mut P,
    params: Vec<(String, String)>,
) -> Result<(), String> {
    policy.configure(&params)
}

fn sessions(s: WitSessions) -> Sessions {
    Sessions {
        session_ids: s.session_ids,
        parent_session_ids: s.parent_session_ids,
        phases: s.phases.into_iter().map(phase).collect(),
        priorities: s.priorities,
        active_requests: s.active_requests,
        queued_requests: s.queued_requests,
        context_tokens: s.context_tokens,
        age_ms: s.age_ms,
        idle_ms: s.idle_ms,
        extensions: s.extensions,
    }
}

fn phase(p: wit::SessionPhase) -> SessionPhase {
    match p {
        wit::SessionPhase::Queued => SessionPhase::Queued,
        wit::SessionPhase::Running => SessionPhase::Running,
        wit::SessionPhase::ToolCall => SessionPhase::ToolCall,
        wit::SessionPhase::Paused => SessionPhase::Paused,
        wit::SessionPhase::Idle => SessionPhase::Idle,
    }
}

fn utilization(u: WitUtilization) -> Utilization {
    Utilization {
        worker_ids: u.worker_ids,
        dp_ranks: u.dp_ranks,
        kv_usage: u.kv_usage,
        active_requests: u.active_requests,
        queue_depth: u.queue_depth,
        healthy: u.healthy,
        extensions: u.extensions,
    }
}

fn action(a: Action) -> WitAction {
    let kind = match a.kind {
        ActionKind::Admit => wit::ActionKind::Admit,
        ActionKind::Hold(why) => wit::ActionKind::Hold(why),
        ActionKind::Pause => wit::ActionKind::Pause,
        ActionKind::Resume => wit::ActionKind::Resume,
        ActionKind::AdjustPriority(delta) => wit::ActionKind::AdjustPriority(delta),
    };
    WitAction {
        session_id: a.session_id,
        kind,
    }
}
