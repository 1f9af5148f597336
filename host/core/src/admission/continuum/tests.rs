use super::*;
use crate::admission::testing::{session, worker};
use crate::router::PolicyRequest;
use SessionPhase::{Queued, Running, ToolCall};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn arrival(id: &str, waited: Duration) -> Arrival<'_> {
    Arrival {
        request: PolicyRequest {
            session_id: Some(id),
            ..PolicyRequest::default()
        },
        waited,
    }
}

/// A program in a call of `tool` for `idle`.
fn calling(id: &str, tokens: u64, tool: &str, idle: Duration) -> SessionView {
    let mut s = session(id, ToolCall, tokens, Some(0));
    s.tool = Some(tool.into());
    s.idle = idle;
    s
}

/// A program whose call of `tool`, `idle` long, just returned with its next request.
fn returning(id: &str, tokens: u64, tool: &str, idle: Duration) -> SessionView {
    let mut s = calling(id, tokens, tool, idle);
    s.phase = Queued;
    s.queued_requests = 1;
    s
}

fn view(sessions: Vec<SessionView>) -> AdmissionView {
    AdmissionView {
        sessions,
        workers: vec![worker(0, 100_000)],
    }
}

fn held(actions: &[AdmissionAction]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a.kind, ActionKind::Hold(_)))
}

#[test]
fn quantiles_are_nearest_rank_over_a_window() {
    let mut d = ToolDurations::new(10);
    for s in 1..=10 {
        d.observe("bash", secs(s));
    }
    assert_eq!(d.quantile("bash", 0.9), Some(secs(9)));
    assert_eq!(d.quantile("bash", 0.5), Some(secs(5)));
    assert_eq!(d.quantile("bash", 1.0), Some(secs(10)));
    assert_eq!(d.quantile("grep", 0.9), None);
    // The window keeps the latest ten: 1 s falls out, 100 s comes in.
    d.observe("bash", secs(100));
    assert_eq!(d.count("bash"), 10);
    assert_eq!(d.quantile("bash", 0.0), Some(secs(2)));
    assert_eq!(d.quantile("bash", 1.0), Some(secs(100)));
}

#[test]
fn each_tool_learns_its_own_ttl_from_observed_calls() {
    let mut c = Continuum::default();
    assert_eq!(c.ttl("bash"), secs(30), "default until learnt");
    // Five bash calls of 2..=6 s and one long test run, each observed as its program returns.
    for (i, s) in [2, 3, 4, 5, 6].into_iter().enumerate() {
        let id = format!("p{i}");
        let v = view(vec![returning(&id, 1_000, "bash", secs(s))]);
        assert!(
            c.arrival(&v, &arrival(&id, Duration::ZERO), secs(100))
                .is_empty()
        );
    }
    let v = view(vec![returning("t", 1_000, "pytest", secs(200))]);
    c.arrival(&v, &arrival("t", Duration::ZERO), secs(100));
    assert_eq!(c.durations().count("bash"), 5);
    assert_eq!(c.ttl("bash"), secs(6), "p90 of 2..=6 s");
    assert_eq!(c.ttl("pytest"), secs(30), "one sample is not enough");
    // A re-offered request is not a second observation.
    let v = view(vec![returning("p0", 1_000, "bash", secs(50))]);
    c.arrival(&v, &arrival("p0", secs(5)), secs(105));
    assert_eq!(c.durations().count("bash"), 5);
}

#[test]
fn arrivals_that_would_evict_a_pinned_program_wait_until_its_lease_lapses() {
    let mut c = Continuum::default();
    // A 60K program is 1 s into a bash call (TTL 30 s by default); a 40K newcomer does not fit
    // next to it within 95% of 100K.
    let pinned = view(vec![
        calling("pinned", 60_000, "bash", secs(1)),
        session("new", Queued, 40_000, None),
    ]);
    assert!(held(&c.arrival(
        &pinned,
        &arrival("new", Duration::ZERO),
        secs(1)
    )));
    // A smaller one fits.
    let small = view(vec![
        calling("pinned", 60_000, "bash", secs(1)),
        session("new", Queued, 30_000, None),
    ]);
    assert!(
        c.arrival(&small, &arrival("new", Duration::ZERO), secs(1))
            .is_empty()
    );
    // Once the call outlived its TTL the pin lapses and the re-offer is admitted.
    let lapsed = view(vec![
        calling("pinned", 60_000, "bash", secs(31)),
        session("new", Queued, 40_000, None),
    ]);
    assert!(
        c.arrival(&lapsed, &arrival("new", secs(30)), secs(31))
            .is_empty()
    );
}

#[test]
fn a_program_returning_within_its_ttl_is_admitted_even_when_full() {
    let mut c = Continuum::default();
    let v = view(vec![
        session("busy", Running, 90_000, Some(0)),
        returning("back", 40_000, "bash", secs(5)),
    ]);
    assert!(
        c.arrival(&v, &arrival("back", Duration::ZERO), secs(5))
            .is_empty()
    );
    // Back after its lease lapsed, it competes like anyone else.
    let late = view(vec![
        session("busy", Running, 90_000, Some(0)),
        returning("late", 40_000, "bash", secs(45)),
    ]);
    assert!(held(&c.arrival(
        &late,
        &arrival("late", Duration::ZERO),
        secs(45)
    )));
}

#[test]
fn leases_render_as_pin_hints_for_what_is_left() {
    let c = Continuum::default();
    let v = view(vec![
        calling("a", 1_000, "bash", secs(10)),
        calling("b", 1_000, "bash", secs(40)),
        session("c", Running, 1_000, Some(0)),
    ]);
    let pins = c.pins(&v);
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].session_id, "a");
    assert_eq!(pins[0].target, Some(Rank::new(0, 0)));
    assert_eq!(pins[0].kind, HintKind::Pin(secs(20)));
}
