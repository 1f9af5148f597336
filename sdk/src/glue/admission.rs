//! Admission world: conversions and the calls `export_admission!` forwards to.

use super::admission_world::switchyard::policy::admission_types as wit;
use super::common;
pub use super::router_world::switchyard::policy::types::PolicyMetadata as WitMetadata;
use crate::admission::{
    Action, ActionKind, AdmissionPolicy, Incoming, SessionPhase, Sessions, Utilization,
};

pub use wit::{
    Action as WitAction, Incoming as WitIncoming, PackedSessions as WitPackedSessions,
    PackedUtilization as WitPackedUtilization, Sessions as WitSessions,
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
    let incoming = incoming(req);
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

/// `tick-packed` export (1.3).
pub fn tick_packed<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    state: WitPackedSessions,
    workers: WitPackedUtilization,
) -> Vec<WitAction> {
    with_unpacked(state, workers, |sessions, workers| {
        let actions = policy.tick(now_ms, sessions, workers);
        actions.into_iter().map(action).collect()
    })
}

/// `arrival-packed` export (1.3).
pub fn arrival_packed<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    req: WitIncoming,
    state: WitPackedSessions,
    workers: WitPackedUtilization,
) -> Vec<WitAction> {
    let incoming = incoming(req);
    with_unpacked(state, workers, |sessions, workers| {
        let actions = policy.arrival(now_ms, &incoming, sessions, workers);
        actions.into_iter().map(action).collect()
    })
}

/// `placement-packed` export (1.3).
pub fn placement_packed<P: AdmissionPolicy>(
    policy: &mut P,
    now_ms: u64,
    session_id: String,
    state: WitPackedSessions,
    workers: WitPackedUtilization,
) -> Option<(u32, u32)> {
    with_unpacked(state, workers, |sessions, workers| {
        policy
            .placement(now_ms, &session_id, sessions, workers)
            .map(|rank| (rank.worker_id, rank.dp_rank))
    })
}

/// Run `f` on the packed columns unpacked into the `Sessions` and `Utilization` this instance
/// keeps, so a call allocates nothing for them once their buffers have grown.
fn with_unpacked<R>(
    state: WitPackedSessions,
    workers: WitPackedUtilization,
    f: impl FnOnce(&Sessions, &Utilization) -> R,
) -> R {
    std::thread_local! {
        static COLUMNS: std::cell::RefCell<(Sessions, Utilization)> =
            std::cell::RefCell::default();
    }
    COLUMNS.with_borrow_mut(|(sessions, ranks)| {
        sessions.unpack(
            state.count as usize,
            &state.ids,
            &state.tools,
            &state.counts,
            &state.priorities,
            &state.sizes,
        );
        sessions.extensions = state.extensions.unwrap_or_default();
        ranks.unpack(
            workers.count as usize,
            &workers.counts,
            &workers.kv_usage,
            &workers.kv_capacity_tokens,
        );
        ranks.extensions = workers.extensions.unwrap_or_default();
        f(sessions, ranks)
    })
}

/// `configure` export (1.1).
pub fn configure<P: AdmissionPolicy>(
    policy: &mut P,
    params: Vec<(String, String)>,
) -> Result<(), String> {
    policy.configure(&params)
}

fn incoming(req: WitIncoming) -> Incoming {
    Incoming {
        request: common::request(req.req),
        waited_ms: req.waited_ms,
    }
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
        signals: None,
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
        kv_capacity_tokens: None,
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
