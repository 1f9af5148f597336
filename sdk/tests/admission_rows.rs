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

/// Two sessions as a 1.3 host packs them (wit/README.md): `a` (parent `root`, paused, on rank
/// 3.1, called `grep`) and `b` (no parent, no rank, no tool).
fn packed() -> (String, String, Vec<u32>, Vec<i32>, Vec<u64>) {
    let counts = [
        [1, 6],      // id-ends: "a" | "root" | "b"
        [5, 6],      // parent-ends
        [1, 4],      // phases: running, idle
        [0b1111, 0], // flags: parent, paused, rank, tool
        [2, 0],      // active-requests
        [1, 0],      // queued-requests
        [3, 0],      // rank-workers
        [1, 0],      // rank-dp
        [4, 4],      // tool-ends: "grep"
    ];
    let sizes = [[100, 200], [10, 20], [1, 2], [1_500, 0], [42, 7]];
    (
        "arootb".into(),
        "grep".into(),
        counts.into_iter().flatten().collect(),
        vec![-2, 5],
        sizes.into_iter().flatten().collect(),
    )
}

#[test]
fn packed_sessions_unpack_into_typed_signals_over_stale_columns() {
    let (ids, tools, counts, priorities, sizes) = packed();
    // Columns left by an earlier, longer call, extension columns included.
    let mut sessions: Sessions = (0..5)
        .map(|i| SessionView {
            tool: Some("old".into()),
            rank: Some(Rank::new(9, 9)),
            ..session(&format!("stale-{i}"), SessionPhase::ToolCall)
        })
        .collect();
    sessions.unpack(2, &ids, &tools, &counts, &priorities, &sizes);
    assert!(sessions.extensions.is_empty(), "signals are typed now");
    assert_eq!(
        sessions.rows(),
        [
            SessionView {
                session_id: "a".into(),
                parent_session_id: Some("root".into()),
                phase: SessionPhase::Running,
                priority: -2,
                active_requests: 2,
                queued_requests: 1,
                context_tokens: 100,
                age_ms: 10,
                idle_ms: 1,
                rank: Some(Rank::new(3, 1)),
                paused: true,
                paused_for_ms: 1_500,
                service_ms: 42,
                tool: Some("grep".into()),
            },
            SessionView {
                session_id: "b".into(),
                phase: SessionPhase::Idle,
                priority: 5,
                context_tokens: 200,
                age_ms: 20,
                idle_ms: 2,
                service_ms: 7,
                ..SessionView::default()
            },
        ]
    );
}

#[test]
fn malformed_packed_lists_give_no_sessions_or_empty_ids_never_a_panic() {
    let (ids, tools, counts, priorities, sizes) = packed();
    let mut sessions = Sessions::default();
    // A count past the lists, or a list short of its columns: malformed, no sessions (rather
    // than columns read at the wrong stride).
    sessions.unpack(usize::MAX, &ids, &tools, &counts, &priorities, &sizes);
    assert_eq!(sessions.len(), 0);
    sessions.unpack(3, &ids, &tools, &counts, &priorities, &sizes);
    assert_eq!(sessions.len(), 0);
    sessions.unpack(2, &ids, &tools, &counts, &priorities[..1], &sizes);
    assert_eq!(sessions.len(), 0);
    sessions.unpack(1, &ids, &tools, &counts, &priorities, &sizes);
    assert_eq!(
        sessions.len(),
        1,
        "a shorter count reads its prefix of each list"
    );
    // Offsets past the strings, or not on a character boundary: empty text.
    let mut bad = counts.clone();
    bad[0] = 99;
    sessions.unpack(2, "éa", &tools, &bad, &priorities, &sizes);
    assert_eq!(sessions.rows()[0].session_id, "");
    bad[0] = 1;
    sessions.unpack(2, "éa", &tools, &bad, &priorities, &sizes);
    assert_eq!(sessions.rows()[0].session_id, "", "1 is inside `é`");
    // An unknown phase reads as idle.
    let mut phases = counts;
    phases[4] = 77;
    sessions.unpack(2, &ids, &tools, &phases, &priorities, &sizes);
    assert_eq!(sessions.rows()[0].phase, SessionPhase::Idle);
}

#[test]
fn packed_utilization_unpacks_with_its_capacity() {
    let mut workers: Utilization = [RankUtilization::default(); 3].into_iter().collect();
    workers.unpack(
        2,
        &[0, 0, 0, 1, 3, 0, 1, 2, 1, 0],
        &[0.5, 0.25],
        &[0, 65_536],
    );
    assert_eq!(
        workers.rows(),
        [
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
                kv_usage: 0.25,
                active_requests: 0,
                queue_depth: 2,
                healthy: false,
                kv_capacity_tokens: 65_536,
            },
        ]
    );
    workers.unpack(2, &[0; 9], &[0.5, 0.25], &[0, 1]);
    assert!(
        workers.rows().is_empty(),
        "a short u32 list holds no whole rank"
    );
}
