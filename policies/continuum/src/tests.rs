//! The native twin's scenarios, through the SDK's inputs (columns and extension columns).

use super::*;
use SessionPhase::{Queued, Running, ToolCall};
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{Request, TOOL_COLUMN};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn session(id: &str, phase: SessionPhase, tokens: u64, worker: Option<u32>) -> SessionView {
    SessionView {
        session_id: id.into(),
        phase,
        active_requests: u32::from(phase == Running),
        queued_requests: u32::from(phase == Queued),
        context_tokens: tokens,
        rank: worker.map(|w| Rank::new(w, 0)),
        ..SessionView::default()
    }
}

/// A program in a call of `tool` for `idle_s`.
fn calling(id: &str, tokens: u64, tool: &str, idle_s: u64) -> SessionView {
    SessionView {
        tool: Some(tool.into()),
        idle_ms: idle_s * 1_000,
        ..session(id, ToolCall, tokens, Some(0))
    }
}

/// A program whose call of `tool`, `idle_s` long, just returned with its next request.
fn returning(id: &str, tokens: u64, tool: &str, idle_s: u64) -> SessionView {
    SessionView {
        phase: Queued,
        queued_requests: 1,
        ..calling(id, tokens, tool, idle_s)
    }
}

fn arrive(
    c: &mut AdmissionHarness<Continuum>,
    rows: &[SessionView],
    id: &str,
    waited_s: u64,
) -> Vec<Action> {
    let sessions: Sessions = rows.iter().cloned().collect();
    let workers: Utilization = [RankUtilization {
        rank: Rank::new(0, 0),
        healthy: true,
        kv_capacity_tokens: 100_000,
        ..RankUtilization::default()
    }]
    .into_iter()
    .collect();
    let incoming = Incoming {
        request: Request::new(16, 16).with_session(id),
        waited_ms: waited_s * 1_000,
    };
    c.arrival(0, &incoming, &sessions, &workers)
}

fn held(actions: &[Action]) -> bool {
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
    assert_eq!(d.quantile("grep", 0.9), None);
    d.observe("bash", secs(100));
    assert_eq!(d.count("bash"), 10);
    assert_eq!(d.quantile("bash", 0.0), Some(secs(2)));
    assert_eq!(d.quantile("bash", 1.0), Some(secs(100)));
}

#[test]
fn each_tool_learns_its_own_ttl_from_observed_calls() {
    let mut c = AdmissionHarness::new(Continuum::default());
    assert_eq!(c.policy().ttl("bash"), secs(30), "default until learnt");
    for (i, s) in [2, 3, 4, 5, 6].into_iter().enumerate() {
        let id = format!("p{i}");
        assert!(arrive(&mut c, &[returning(&id, 1_000, "bash", s)], &id, 0).is_empty());
    }
    arrive(&mut c, &[returning("t", 1_000, "pytest", 200)], "t", 0);
    assert_eq!(c.policy().durations().count("bash"), 5);
    assert_eq!(c.policy().ttl("bash"), secs(6), "p90 of 2..=6 s");
    assert_eq!(
        c.policy().ttl("pytest"),
        secs(30),
        "one sample is not enough"
    );
    // A re-offered request is not a second observation.
    arrive(&mut c, &[returning("p0", 1_000, "bash", 50)], "p0", 5);
    assert_eq!(c.policy().durations().count("bash"), 5);
}

#[test]
fn tool_names_with_separators_survive_the_extension_column() {
    let mut c = AdmissionHarness::new(Continuum::default());
    let tool = "mcp, \"quoted\"";
    let rows = [returning("p", 1_000, tool, 4)];
    let sessions: Sessions = rows.iter().cloned().collect();
    assert!(sessions.extensions.iter().any(|(k, _)| k == TOOL_COLUMN));
    arrive(&mut c, &rows, "p", 0);
    assert_eq!(c.policy().durations().count(tool), 1);
}

#[test]
fn arrivals_that_would_evict_a_pinned_program_wait_until_its_lease_lapses() {
    let mut c = AdmissionHarness::new(Continuum::default());
    let pinned = [
        calling("pinned", 60_000, "bash", 1),
        session("new", Queued, 40_000, None),
    ];
    assert!(held(&arrive(&mut c, &pinned, "new", 0)));
    let small = [
        calling("pinned", 60_000, "bash", 1),
        session("new", Queued, 30_000, None),
    ];
    assert!(arrive(&mut c, &small, "new", 0).is_empty());
    let lapsed = [
        calling("pinned", 60_000, "bash", 31),
        session("new", Queued, 40_000, None),
    ];
    assert!(arrive(&mut c, &lapsed, "new", 30).is_empty());
}

#[test]
fn a_program_returning_within_its_ttl_is_admitted_even_when_full() {
    let mut c = AdmissionHarness::new(Continuum::default());
    let back = [
        session("busy", Running, 90_000, Some(0)),
        returning("back", 40_000, "bash", 5),
    ];
    assert!(arrive(&mut c, &back, "back", 0).is_empty());
    let late = [
        session("busy", Running, 90_000, Some(0)),
        returning("late", 40_000, "bash", 45),
    ];
    assert!(held(&arrive(&mut c, &late, "late", 0)));
}

#[test]
fn ticks_never_act() {
    let mut c = AdmissionHarness::new(Continuum::default());
    let sessions: Sessions = [calling("a", 1_000, "bash", 1)].into_iter().collect();
    assert!(c.tick(1_000, &sessions, &Utilization::default()).is_empty());
    assert_eq!(c.policy().config(), &ContinuumConfig::default());
}
