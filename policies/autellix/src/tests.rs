//! The native twin's scenarios, through the SDK's inputs (the service extension column).

use super::*;
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{Request, SessionPhase};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn served(id: &str, service_ms: u64) -> SessionView {
    SessionView {
        session_id: id.into(),
        phase: SessionPhase::ToolCall,
        context_tokens: 1_000,
        service_ms,
        ..SessionView::default()
    }
}

fn deltas(actions: &[Action]) -> Vec<(String, i32)> {
    actions
        .iter()
        .map(|a| match a.kind {
            ActionKind::AdjustPriority(d) => (a.session_id.clone(), d),
            ref other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn sessions(rows: &[SessionView]) -> Sessions {
    rows.iter().cloned().collect()
}

#[test]
fn levels_grow_geometrically_and_stop_at_the_last() {
    let a = Autellix::default();
    assert_eq!(a.level(secs(0.0)), 0);
    assert_eq!(a.level(secs(1.9)), 0);
    assert_eq!(a.level(secs(2.0)), 1);
    assert_eq!(a.level(secs(3.9)), 1);
    assert_eq!(a.level(secs(4.0)), 2);
    assert_eq!(a.level(secs(100_000.0)), 7);
}

#[test]
fn least_attained_service_gets_the_highest_priority() {
    let mut a = AdmissionHarness::new(Autellix::default());
    let workers = Utilization::default();
    let view = sessions(&[
        served("long", 10_000),
        served("new", 0),
        served("mid", 3_000),
    ]);
    assert_eq!(
        deltas(&a.tick(0, &view, &workers)),
        [("long".to_owned(), -180), ("mid".to_owned(), -60)]
    );
    assert!(a.tick(0, &view, &workers).is_empty());
    let later = sessions(&[
        served("long", 10_000),
        served("new", 0),
        served("mid", 5_000),
    ]);
    let incoming = Incoming {
        request: Request::new(16, 16).with_session("new"),
        waited_ms: 0,
    };
    assert_eq!(
        deltas(&a.arrival(0, &incoming, &later, &workers)),
        [("mid".to_owned(), -60)]
    );
}

#[test]
fn a_program_that_left_and_came_back_starts_from_nothing_applied() {
    let mut a = AdmissionHarness::new(Autellix::default());
    let workers = Utilization::default();
    assert_eq!(
        deltas(&a.tick(0, &sessions(&[served("p", 2_000)]), &workers)),
        [("p".to_owned(), -60)]
    );
    assert!(a.tick(0, &sessions(&[served("q", 0)]), &workers).is_empty());
    assert_eq!(
        deltas(&a.tick(0, &sessions(&[served("p", 2_000)]), &workers)),
        [("p".to_owned(), -60)]
    );
}
