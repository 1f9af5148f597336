use super::*;
use crate::admission::testing::session;
use crate::admission::{ActionKind, SessionPhase};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn served(id: &str, service: f64) -> SessionView {
    let mut s = session(id, SessionPhase::ToolCall, 1_000, Some(0));
    s.service = secs(service);
    s
}

fn deltas(actions: &[AdmissionAction]) -> Vec<(String, i32)> {
    actions
        .iter()
        .map(|a| match a.kind {
            ActionKind::AdjustPriority(d) => (a.session_id.clone(), d),
            ref other => panic!("unexpected {other:?}"),
        })
        .collect()
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
    let mut a = Autellix::default();
    let view = AdmissionView {
        sessions: vec![served("long", 10.0), served("new", 0.0), served("mid", 3.0)],
        workers: Vec::new(),
    };
    // long: level 3 (8 <= 10 < 16); mid: level 1; new: level 0 needs no change.
    assert_eq!(
        deltas(&a.tick(&view, Duration::ZERO)),
        [("long".to_owned(), -180), ("mid".to_owned(), -60)]
    );
    // Applied once: the same view asks for nothing more.
    assert!(a.tick(&view, Duration::ZERO).is_empty());
    // mid attains more service and drops one level: only the difference is applied.
    let later = AdmissionView {
        sessions: vec![served("long", 10.0), served("new", 0.0), served("mid", 5.0)],
        workers: Vec::new(),
    };
    assert_eq!(
        deltas(&a.tick(&later, Duration::ZERO)),
        [("mid".to_owned(), -60)]
    );
}
