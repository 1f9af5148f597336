//! Admission inputs: rows survive the trip through columns and extension columns, older hosts'
//! inputs (no trial signals) decode to the documented defaults, and the harness checks actions
//! like the host.

use switchyard_policy_sdk::testing::{AdmissionHarness, check_actions};
use switchyard_policy_sdk::{
    Action, ActionKind, AdmissionPolicy, Incoming, KV_CAPACITY_COLUMN, PAUSED_COLUMN,
    PolicyMetadata, RANK_COLUMN, Rank, RankUtilization, Request, SessionPhase, SessionView,
    Sessions, TOOL_COLUMN, Utilization, find_extension,
};

fn session(id: &str, phase: SessionPhase) -> SessionView {
    SessionView {
        session_id: id.into(),
        phase,
        context_tokens: 1_000,
        ..SessionView::default()
    }
}

#[test]
fn session_rows_round_trip_with_every_trial_signal() {
    let rows = vec![
        SessionView {
            rank: Some(Rank::new(3, 1)),
            paused: true,
            paused_for_ms: 1_500,
            service_ms: 42_000,
            tool: Some("grep, then \"sed\"".into()),
            parent_session_id: Some("root".into()),
            priority: -2,
            ..session("a", SessionPhase::Running)
        },
        SessionView {
            tool: Some(String::new()),
            ..session("b", SessionPhase::ToolCall)
        },
        session("c", SessionPhase::Idle),
    ];
    let sessions: Sessions = rows.iter().cloned().collect();
    assert_eq!(sessions.len(), 3);
    assert_eq!(
        find_extension(&sessions.extensions, RANK_COLUMN),
        Some("3.1,,")
    );
    assert_eq!(
        find_extension(&sessions.extensions, TOOL_COLUMN),
        Some(r#""grep, then ""sed""","","#)
    );
    assert_eq!(sessions.rows(), rows);
}

#[test]
fn without_trial_signals_rows_take_the_documented_defaults() {
    let sessions: Sessions = [
        session("p", SessionPhase::Paused),
        session("q", SessionPhase::Queued),
    ]
    .into_iter()
    .collect();
    let bare = Sessions {
        extensions: Vec::new(),
        ..sessions
    };
    let rows = bare.rows();
    assert_eq!(
        rows.iter().map(|s| s.paused).collect::<Vec<_>>(),
        [true, false]
    );
    assert!(rows.iter().all(|s| s.rank.is_none() && s.tool.is_none()));
    assert!(
        rows.iter()
            .all(|s| s.service_ms == 0 && s.paused_for_ms == 0)
    );
    // A sent `paused` column wins over the phase; garbage reads as unknown.
    let mut sent = bare.clone();
    sent.extensions = vec![
        (PAUSED_COLUMN.into(), "0,1".into()),
        (RANK_COLUMN.into(), "x.1,2.0".into()),
    ];
    let rows = sent.rows();
    assert_eq!(
        rows.iter().map(|s| (s.paused, s.rank)).collect::<Vec<_>>(),
        [(false, None), (true, Some(Rank::new(2, 0)))]
    );
}

#[test]
fn ragged_columns_never_index_out_of_bounds() {
    let mut sessions: Sessions = [session("a", SessionPhase::Idle)].into_iter().collect();
    sessions.session_ids.push("orphan".into());
    sessions.extensions = vec![(RANK_COLUMN.into(), "1.0,2.0,3.0".into())];
    assert_eq!(sessions.rows().len(), 1);
    let workers = Utilization {
        worker_ids: vec![0, 1],
        ..Utilization::default()
    };
    assert!(workers.rows().is_empty());
}

#[test]
fn rank_rows_round_trip_with_their_capacity() {
    let rows = vec![
        RankUtilization {
            rank: Rank::new(0, 0),
            kv_usage: 0.5,
            active_requests: 3,
            queue_depth: 1,
            healthy: true,
            kv_capacity_tokens: 0,
        },
        RankUtilization {
            rank: Rank::new(0, 1),
            healthy: false,
            kv_capacity_tokens: 65_536,
            ..RankUtilization::default()
        },
    ];
    let workers: Utilization = rows.iter().copied().collect();
    assert_eq!(
        find_extension(&workers.extensions, KV_CAPACITY_COLUMN),
        Some(",65536")
    );
    assert_eq!(workers.rows(), rows);
    let unknown: Utilization = [rows[0]].into_iter().collect();
    assert!(unknown.extensions.is_empty());
}

/// Pauses every session it is told about, and one it is not.
struct PauseAll {
    stray: bool,
}

impl AdmissionPolicy for PauseAll {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new("pause-all", "0.1.0", "pauses everything")
    }

    fn tick(&mut self, _now_ms: u64, sessions: &Sessions, _w: &Utilization) -> Vec<Action> {
        let mut actions: Vec<Action> = sessions
            .session_ids
            .iter()
            .map(|id| Action::new(id.clone(), ActionKind::Pause))
            .collect();
        if self.stray {
            actions.push(Action::new("ghost", ActionKind::Pause));
        }
        actions
    }
}

#[test]
fn actions_must_name_reported_or_arriving_sessions() {
    let sessions: Sessions = [session("a", SessionPhase::Idle)].into_iter().collect();
    let workers = Utilization::default();
    let mut harness = AdmissionHarness::new(PauseAll { stray: false });
    assert_eq!(harness.tick(0, &sessions, &workers).len(), 1);
    let ghost = [Action::new("ghost", ActionKind::Admit)];
    assert!(check_actions(&ghost, &sessions, None).is_err());
    let incoming = Incoming {
        request: Request::new(16, 16).with_session("ghost"),
        waited_ms: 0,
    };
    assert!(check_actions(&ghost, &sessions, Some(&incoming)).is_ok());
    assert!(
        harness
            .arrival(0, &incoming, &sessions, &workers)
            .is_empty()
    );
}

#[test]
#[should_panic(expected = "the host would refuse these actions")]
fn the_harness_panics_on_an_unknown_session() {
    let sessions: Sessions = [session("a", SessionPhase::Idle)].into_iter().collect();
    AdmissionHarness::new(PauseAll { stray: true }).tick(0, &sessions, &Utilization::default());
}
