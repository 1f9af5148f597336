//! The admission decision as a policy: which agent sessions (programs) may send work to the
//! engines now, reviewed periodically (`tick`) and when a request arrives (`arrival`).
//!
//! Mirrors the `admission` world of `switchyard:policy` (wit/admission.wit); the policy host puts
//! the same trait behind a Wasm component. Sessions without an action keep their current state,
//! and an arrival without an action is admitted, so returning nothing is always safe.
//!
//! [`AdmissionController`] applies a policy's actions to the programs of
//! [`crate::programs::ProgramTracker`]; the gateway and the simulator both drive it. The native
//! policies: [`AdmitAll`] (`none`), [`ThunderAgent`], [`Continuum`] and [`Autellix`].

mod autellix;
mod continuum;
mod controller;
pub(crate) mod params;
mod thunder_agent;

pub use autellix::{Autellix, AutellixConfig};
pub use continuum::{Continuum, ContinuumConfig, ToolDurations};
pub use controller::{
    AdmissionConfig, AdmissionController, AdmissionMetrics, AdmissionRequest, ArrivalOutcome,
    Release,
};
pub use params::{ParamError, native_admission_spec, parse_duration};
pub use thunder_agent::{ThunderAgent, ThunderAgentConfig};

use crate::router::PolicyRequest;
use crate::worker::Rank;
use std::collections::HashSet;
use std::time::Duration;

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

/// One session (agent program) as an admission policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionView {
    /// Session id.
    pub session_id: String,
    /// The session that spawned it (a subagent's parent), if any.
    pub parent_session_id: Option<String>,
    /// Phase.
    pub phase: SessionPhase,
    /// Current priority (after earlier adjustments); higher is more urgent.
    pub priority: i32,
    /// Requests running.
    pub active_requests: u32,
    /// Requests waiting in the gateway queue.
    pub queued_requests: u32,
    /// Tokens in its context (last prompt plus output).
    pub context_tokens: u64,
    /// Time since its first request.
    pub age: Duration,
    /// Time since it last had a request running (zero while running).
    pub idle: Duration,
    /// The worker rank its last (or current) request ran on; `None` for a new program. Not in
    /// the WIT record: hosts pass it to Wasm as the `switchyard.rank` extension.
    pub rank: Option<Rank>,
    /// Paused by an admission action. Unlike [`SessionPhase::Paused`] this is also set while the
    /// paused program still finishes a running request (paused "at its next tool boundary").
    /// Wasm: the `switchyard.paused` extension.
    pub paused: bool,
    /// How long it has been paused (zero when not paused). Wasm: `switchyard.paused-for-ms`.
    pub paused_for: Duration,
    /// Attained service: the summed run time (sent to an engine until its end) of its finished
    /// requests. Wasm: `switchyard.service-ms`.
    pub service: Duration,
    /// The tool its last turn called, if that turn ended with a tool call (`""` when the name is
    /// unknown); kept while its next request waits, so a policy sees which tool just returned.
    /// Wasm: `switchyard.tool`.
    pub tool: Option<String>,
}

/// Utilization of one worker rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankUtilization {
    /// The rank.
    pub rank: Rank,
    /// Fraction of KV capacity in use, 0.0 to 1.0.
    pub kv_usage: f32,
    /// Requests in flight.
    pub active_requests: u32,
    /// Requests waiting in the engine's queue.
    pub queue_depth: u32,
    /// Whether the host routes to the rank.
    pub healthy: bool,
    /// KV capacity in tokens (blocks x block size); 0 when unknown. Not in the WIT record: hosts
    /// pass it to Wasm as the `switchyard.kv-capacity-tokens` extension.
    pub kv_capacity_tokens: u64,
}

/// Everything an admission policy sees: every known session and every rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionView {
    /// Known sessions.
    pub sessions: Vec<SessionView>,
    /// Worker ranks.
    pub workers: Vec<RankUtilization>,
}

/// A request that arrived and is not admitted yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct Arrival<'a> {
    /// The request, as the router would see it; its `session_id` names the arriving session.
    pub request: PolicyRequest<'a>,
    /// How long it has waited so far (zero on first arrival).
    pub waited: Duration,
}

/// What to do with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionKind {
    /// Let its waiting requests go to the router.
    Admit,
    /// Keep its waiting requests queued for now, for this reason.
    Hold(String),
    /// Stop admitting its requests until [`ActionKind::Resume`]. Never preempts a running request.
    Pause,
    /// Undo [`ActionKind::Pause`].
    Resume,
    /// Add this delta to its priority (negative lowers it).
    AdjustPriority(i32),
}

/// One admission action, tagged with the session it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionAction {
    /// The session.
    pub session_id: String,
    /// What to do with it.
    pub kind: ActionKind,
}

impl AdmissionAction {
    /// `kind` for `session_id`.
    pub fn new(session_id: impl Into<String>, kind: ActionKind) -> Self {
        Self {
            session_id: session_id.into(),
            kind,
        }
    }
}

impl AdmissionView {
    /// The session named `session_id`, if known.
    pub fn session(&self, session_id: &str) -> Option<&SessionView> {
        self.sessions.iter().find(|s| s.session_id == session_id)
    }

    /// Check that every action names a session of this view or the arriving one: an action
    /// about a session the gateway does not track cannot be applied, so the whole answer is
    /// suspect. Returns the first offending session id.
    pub fn unknown_session<'a>(
        &self,
        actions: &'a [AdmissionAction],
        arrival: Option<&Arrival<'_>>,
    ) -> Option<&'a str> {
        if actions.is_empty() {
            return None;
        }
        let mut known: HashSet<&str> = self
            .sessions
            .iter()
            .map(|s| s.session_id.as_str())
            .collect();
        known.extend(arrival.and_then(|a| a.request.session_id));
        actions
            .iter()
            .map(|a| a.session_id.as_str())
            .find(|id| !known.contains(id))
    }
}

/// An admission decision point. Implementations: [`AdmitAll`] here, and Wasm components.
pub trait AdmissionPolicy: Send + std::fmt::Debug {
    /// Name for metrics and logs.
    fn name(&self) -> &str;
    /// Periodic review, at the host's tick interval; `now` is time since the driver's epoch.
    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction>;
    /// A request arrived for a session.
    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction>;
    /// Where the request of `session_id` that admission just released should run, if the policy
    /// places programs itself (ThunderAgent keeps each program on one worker and places new and
    /// resumed ones); the router then bypasses its own choice. Default: no preference.
    ///
    /// A Wasm component places through the admission world's 1.1 `placement` export.
    fn placement(
        &mut self,
        _view: &AdmissionView,
        _session_id: &str,
        _now: Duration,
    ) -> Option<Rank> {
        None
    }

    /// Whether the policy looks at the [`AdmissionView`] at all. A view lists every program, so
    /// the controller builds it for each arrival only for policies that read it. Default: yes.
    fn reads_view(&self) -> bool {
        true
    }
}

/// Request-level admission (configured as `none`): every request goes straight to the router,
/// no session is ever paused. The baseline session-aware admission is measured against.
#[derive(Debug, Default, Clone, Copy)]
pub struct AdmitAll;

impl AdmissionPolicy for AdmitAll {
    fn name(&self) -> &str {
        "admit-all"
    }

    fn reads_view(&self) -> bool {
        false
    }

    fn tick(&mut self, _view: &AdmissionView, _now: Duration) -> Vec<AdmissionAction> {
        Vec::new()
    }

    fn arrival(
        &mut self,
        _view: &AdmissionView,
        _arrival: &Arrival<'_>,
        _now: Duration,
    ) -> Vec<AdmissionAction> {
        // No action admits the arrival.
        Vec::new()
    }
}

/// Names [`native_admission`] resolves (aliases aside).
pub const NATIVE_ADMISSION: [&str; 4] = ["none", "thunder-agent", "continuum", "autellix"];

/// The native admission policy named `name` (`none`/`admit-all`, `thunder-agent`, `continuum`,
/// `autellix`) with its default parameters, if there is one.
pub fn native_admission(name: &str) -> Option<Box<dyn AdmissionPolicy>> {
    match name {
        "admit-all" | "none" => Some(Box::new(AdmitAll)),
        "thunder-agent" => Some(Box::new(ThunderAgent::new(ThunderAgentConfig::default()))),
        "continuum" => Some(Box::new(Continuum::new(ContinuumConfig::default()))),
        "autellix" => Some(Box::new(Autellix::new(AutellixConfig::default()))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, phase: SessionPhase) -> SessionView {
        SessionView {
            session_id: id.into(),
            parent_session_id: None,
            phase,
            priority: 0,
            active_requests: 0,
            queued_requests: 1,
            context_tokens: 4096,
            age: Duration::from_secs(10),
            idle: Duration::ZERO,
            rank: None,
            paused: false,
            paused_for: Duration::ZERO,
            service: Duration::ZERO,
            tool: None,
        }
    }

    fn view() -> AdmissionView {
        AdmissionView {
            sessions: vec![
                session("a", SessionPhase::Running),
                session("b", SessionPhase::ToolCall),
            ],
            workers: vec![RankUtilization {
                rank: Rank::new(0, 0),
                kv_usage: 0.97,
                active_requests: 3,
                queue_depth: 0,
                healthy: true,
                kv_capacity_tokens: 1 << 20,
            }],
        }
    }

    #[test]
    fn admit_all_never_acts() {
        let mut policy = AdmitAll;
        assert!(policy.tick(&view(), Duration::from_secs(5)).is_empty());
        let arrival = Arrival {
            request: PolicyRequest {
                session_id: Some("c"),
                ..PolicyRequest::default()
            },
            waited: Duration::ZERO,
        };
        assert!(policy.arrival(&view(), &arrival, Duration::ZERO).is_empty());
    }

    #[test]
    fn native_names_resolve() {
        assert_eq!(
            native_admission("none").map(|p| p.name().to_owned()),
            Some("admit-all".into())
        );
        for name in NATIVE_ADMISSION {
            assert!(native_admission(name).is_some(), "{name}");
        }
        assert_eq!(
            native_admission("thunder-agent").map(|p| p.name().to_owned()),
            Some("thunder-agent".into())
        );
        assert!(native_admission("kvflow").is_none());
    }

    #[test]
    fn sessions_are_found_by_id() {
        assert_eq!(
            view().session("b").map(|s| s.phase),
            Some(SessionPhase::ToolCall)
        );
        assert!(view().session("z").is_none());
    }

    #[test]
    fn actions_must_name_known_or_arriving_sessions() {
        let view = view();
        let actions = [
            AdmissionAction::new("a", ActionKind::Pause),
            AdmissionAction::new("c", ActionKind::Admit),
        ];
        assert_eq!(view.unknown_session(&actions, None), Some("c"));
        let arrival = Arrival {
            request: PolicyRequest {
                session_id: Some("c"),
                ..PolicyRequest::default()
            },
            waited: Duration::ZERO,
        };
        assert_eq!(view.unknown_session(&actions, Some(&arrival)), None);
        assert_eq!(view.unknown_session(&[], None), None);
    }
}

/// View builders for the policies' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{RankUtilization, SessionPhase, SessionView};
    use crate::worker::Rank;
    use std::time::Duration;

    /// An active session in `phase` holding `tokens`, last on worker `worker` (`None`: new).
    pub(crate) fn session(
        id: &str,
        phase: SessionPhase,
        tokens: u64,
        worker: Option<u32>,
    ) -> SessionView {
        SessionView {
            session_id: id.into(),
            parent_session_id: None,
            phase,
            priority: 0,
            active_requests: u32::from(phase == SessionPhase::Running),
            queued_requests: u32::from(phase == SessionPhase::Queued),
            context_tokens: tokens,
            age: Duration::from_secs(60),
            idle: Duration::ZERO,
            rank: worker.map(|w| Rank::new(w, 0)),
            paused: phase == SessionPhase::Paused,
            paused_for: Duration::ZERO,
            service: Duration::ZERO,
            tool: None,
        }
    }

    /// A healthy worker `w` with `capacity` KV tokens.
    pub(crate) fn worker(w: u32, capacity: u64) -> RankUtilization {
        RankUtilization {
            rank: Rank::new(w, 0),
            kv_usage: 0.0,
            active_requests: 0,
            queue_depth: 0,
            healthy: true,
            kv_capacity_tokens: capacity,
        }
    }
}
