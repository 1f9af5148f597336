//! The adapter: ticks and arrivals through the SDK harness answer what the core policy answers
//! (driven in lockstep on the same view), with the priorities it applied kept across calls.

use super::*;
use admission_adapter::{actions, arrival, view};
use std::time::Duration;
use switchyard_core::admission::AdmissionPolicy as _;
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{
    Action, ActionKind, Incoming, Request, SessionPhase, SessionView, Sessions, Utilization,
};

fn sessions(served_ms: &[(&str, u64)]) -> Sessions {
    served_ms
        .iter()
        .map(|&(id, service_ms)| SessionView {
            session_id: id.into(),
            phase: SessionPhase::ToolCall,
            context_tokens: 1_000,
            service_ms,
            ..SessionView::default()
        })
        .collect()
}

#[test]
fn ticks_are_the_core_policys_and_keep_its_state() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let workers = Utilization::default();
    let early = sessions(&[("long", 10_000), ("new", 0), ("mid", 3_000)]);
    let later = sessions(&[("long", 10_000), ("new", 2_500)]);
    let mut answers = Vec::new();
    for (now_ms, view_now) in [(0, &early), (1_000, &early), (2_000, &later)] {
        let got = component.tick(now_ms, view_now, &workers);
        let native = actions(core.tick(&view(view_now, &workers), Duration::from_millis(now_ms)));
        assert_eq!(got, native, "tick at {now_ms} ms");
        answers.push(got);
    }
    let adjust = |id: &str, delta| Action::new(id, ActionKind::AdjustPriority(delta));
    assert_eq!(answers[0], [adjust("long", -180), adjust("mid", -60)]);
    // Applied priorities are remembered: nothing to move again.
    assert!(answers[1].is_empty());
    assert_eq!(answers[2], [adjust("new", -60)]);
}

#[test]
fn an_arrival_is_the_core_policys() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let (view_now, workers) = (sessions(&[("a", 4_500)]), Utilization::default());
    let incoming = Incoming {
        request: Request::new(16, 16).with_session("a"),
        waited_ms: 0,
    };
    let got = component.arrival(0, &incoming, &view_now, &workers);
    let native = actions(core.arrival(
        &view(&view_now, &workers),
        &arrival(&incoming),
        Duration::ZERO,
    ));
    assert_eq!(got, native);
    assert_eq!(got, [Action::new("a", ActionKind::AdjustPriority(-120))]);
}
