//! The adapter: ticks and arrivals through the SDK harness answer what the core policy answers
//! (driven in lockstep on the same view), with what it learned kept across calls.

use super::*;
use admission_adapter::{actions, arrival, view};
use std::time::Duration;
use switchyard_core::admission::AdmissionPolicy as _;
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{
    Action, ActionKind, Incoming, Rank, RankUtilization, Request, SessionPhase, SessionView,
    Sessions, Utilization,
};

fn worker() -> Utilization {
    [RankUtilization {
        rank: Rank::new(0, 0),
        healthy: true,
        kv_capacity_tokens: 10_000,
        ..RankUtilization::default()
    }]
    .into_iter()
    .collect()
}

/// `pinned` in a `grep` call for 1 s on worker 0, `returning` back from a 100 ms `grep` call
/// and a new program `new` whose 6 000 tokens fit only once the pin lapses.
fn sessions() -> Sessions {
    let base = |id: &str, phase, tokens, rank: Option<Rank>| SessionView {
        session_id: id.into(),
        phase,
        context_tokens: tokens,
        rank,
        ..SessionView::default()
    };
    [
        SessionView {
            idle_ms: 1_000,
            tool: Some("grep".into()),
            ..base(
                "pinned",
                SessionPhase::ToolCall,
                5_000,
                Some(Rank::new(0, 0)),
            )
        },
        SessionView {
            queued_requests: 1,
            idle_ms: 100,
            tool: Some("grep".into()),
            ..base(
                "returning",
                SessionPhase::Queued,
                100,
                Some(Rank::new(0, 0)),
            )
        },
        SessionView {
            queued_requests: 1,
            ..base("new", SessionPhase::Queued, 6_000, None)
        },
    ]
    .into_iter()
    .collect()
}

fn incoming(id: &str) -> Incoming {
    Incoming {
        request: Request::new(16, 16).with_session(id),
        waited_ms: 0,
    }
}

#[test]
fn arrivals_are_the_core_policys_and_it_keeps_learning() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let (sessions, workers) = (sessions(), worker());
    let mut answer = |id: &str| {
        let incoming = incoming(id);
        let got = component.arrival(5_000, &incoming, &sessions, &workers);
        let native = actions(core.arrival(
            &view(&sessions, &workers),
            &arrival(&incoming),
            Duration::from_secs(5),
        ));
        assert_eq!(got, native, "arrival of {id}");
        got
    };
    let held = [Action::new(
        "new",
        ActionKind::Hold("continuum: KV pinned for running tool calls".into()),
    )];
    // The pin holds the new program back ...
    assert_eq!(answer("new"), held);
    // ... until three 100 ms grep calls teach a TTL shorter than the pinned program's call.
    for _ in 0..3 {
        assert!(answer("returning").is_empty());
    }
    assert!(answer("new").is_empty());
}

#[test]
fn ticks_are_the_core_policys() {
    let mut component = AdmissionHarness::new(Component::default());
    let mut core = Spec::policy();
    let (sessions, workers) = (sessions(), worker());
    let got = component.tick(5_000, &sessions, &workers);
    let native = actions(core.tick(&view(&sessions, &workers), Duration::from_secs(5)));
    assert_eq!(got, native);
    // Leases lapse by themselves: a tick never acts.
    assert!(got.is_empty());
}
