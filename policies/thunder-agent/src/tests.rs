//! The adapter: ticks and arrivals through the SDK harness answer what the core policy answers
//! (driven in lockstep on the same view), with its state kept across calls.

use super::*;
use admission_adapter::{actions, arrival, view};
use std::time::Duration;
use switchyard_core::admission::AdmissionPolicy as _;
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{
    Action, ActionKind, Incoming, Rank, RankUtilization, Request, SessionPhase, SessionView,
    Sessions, Utilization,
};

const CAP: u64 = 100_000;

fn session(id: &str, phase: SessionPhase, tokens: u64, worker: Option<u32>) -> SessionView {
    SessionView {
        session_id: id.into(),
        phase,
        active_requests: u32::from(phase == SessionPhase::Running),
        queued_requests: u32::from(phase == SessionPhase::Queued),
        context_tokens: tokens,
        rank: worker.map(|w| Rank::new(w, 0)),
        paused: phase == SessionPhase::Paused,
        ..SessionView::default()
    }
}

fn one_worker() -> Utilization {
    [RankUtilization {
        rank: Rank::new(0, 0),
        healthy: true,
        kv_capacity_tokens: CAP,
        ..RankUtilization::default()
    }]
    .into_iter()
    .collect()
}

#[test]
fn ticks_are_the_core_policys_and_keep_its_state() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let workers = one_worker();
    // Over the pause threshold: the ACTING program is paused; then, still in the soft band, the
    // running one is demoted once (the demotion is state: a second tick does not repeat it).
    let overloaded: Sessions = [
        session("run", SessionPhase::Running, 60_000, Some(0)),
        session("tool", SessionPhase::ToolCall, 40_000, Some(0)),
    ]
    .into_iter()
    .collect();
    let banded: Sessions = [
        session("run", SessionPhase::Running, 85_000, Some(0)),
        session("tool", SessionPhase::Paused, 40_000, Some(0)),
    ]
    .into_iter()
    .collect();
    let mut answers = Vec::new();
    for (now_ms, sessions) in [(5_000, &overloaded), (10_000, &banded), (15_000, &banded)] {
        let got = component.tick(now_ms, sessions, &workers);
        let want = actions(core.tick(&view(sessions, &workers), Duration::from_millis(now_ms)));
        assert_eq!(got, want, "tick at {now_ms} ms");
        answers.push(got);
    }
    assert_eq!(answers[0], [Action::new("tool", ActionKind::Pause)]);
    assert_eq!(
        answers[1],
        [Action::new("run", ActionKind::AdjustPriority(-2))]
    );
    assert!(answers[2].is_empty());
}

#[test]
fn an_arrival_is_the_core_policys() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let workers = one_worker();
    let incoming = Incoming {
        request: Request::new(16, 16).with_session("new"),
        waited_ms: 0,
    };
    // A new program waits behind a paused one; alone, it is placed (no action).
    for (paused, want) in [
        (true, vec![Action::new("new", ActionKind::Pause)]),
        (false, Vec::new()),
    ] {
        let mut rows = vec![session("new", SessionPhase::Queued, 1_000, None)];
        if paused {
            rows.push(session("waiting", SessionPhase::Paused, 1_000, Some(0)));
        }
        let sessions: Sessions = rows.into_iter().collect();
        let got = component.arrival(5_000, &incoming, &sessions, &workers);
        let native = actions(core.arrival(
            &view(&sessions, &workers),
            &arrival(&incoming),
            Duration::from_secs(5),
        ));
        assert_eq!(got, native);
        assert_eq!(got, want);
    }
}
