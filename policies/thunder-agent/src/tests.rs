//! The native twin's scenarios, through the SDK's inputs (columns and extension columns).

use super::*;
use SessionPhase::{Paused, Queued, Running, ToolCall};
use switchyard_policy_sdk::Request;
use switchyard_policy_sdk::testing::AdmissionHarness;

const CAP: u64 = 100_000;

/// A program in `phase` holding `tokens`, last on worker `worker` (`None`: new).
fn session(id: &str, phase: SessionPhase, tokens: u64, worker: Option<u32>) -> SessionView {
    SessionView {
        session_id: id.into(),
        phase,
        active_requests: u32::from(phase == Running),
        queued_requests: u32::from(phase == Queued),
        context_tokens: tokens,
        age_ms: 60_000,
        rank: worker.map(|w| Rank::new(w, 0)),
        paused: phase == Paused,
        ..SessionView::default()
    }
}

/// A paused program: ACTING (tool running), REASONING (a request waits) or new (no rank yet).
fn paused(id: &str, tokens: u64, worker: Option<u32>, waiting: bool) -> SessionView {
    SessionView {
        queued_requests: u32::from(waiting),
        ..session(id, Paused, tokens, worker)
    }
}

fn with_idle(s: SessionView, idle_ms: u64) -> SessionView {
    SessionView { idle_ms, ..s }
}

fn workers(n: u32) -> Utilization {
    (0..n)
        .map(|w| RankUtilization {
            rank: Rank::new(w, 0),
            healthy: true,
            kv_capacity_tokens: CAP,
            ..RankUtilization::default()
        })
        .collect()
}

fn harness() -> AdmissionHarness<ThunderAgent> {
    AdmissionHarness::new(ThunderAgent::default())
}

fn tick(
    ta: &mut AdmissionHarness<ThunderAgent>,
    rows: &[SessionView],
    n: u32,
    now_s: u64,
) -> Vec<Action> {
    let sessions: Sessions = rows.iter().cloned().collect();
    ta.tick(now_s * 1_000, &sessions, &workers(n))
}

fn arrive(
    ta: &mut AdmissionHarness<ThunderAgent>,
    rows: &[SessionView],
    n: u32,
    id: &str,
) -> Vec<Action> {
    let sessions: Sessions = rows.iter().cloned().collect();
    let incoming = Incoming {
        request: Request::new(16, 16).with_session(id),
        waited_ms: 0,
    };
    ta.arrival(5_000, &incoming, &sessions, &workers(n))
}

fn of(actions: &[Action], kind: &ActionKind) -> Vec<String> {
    actions
        .iter()
        .filter(|a| &a.kind == kind)
        .map(|a| a.session_id.clone())
        .collect()
}

#[test]
fn overload_pauses_acting_programs_smallest_first_down_to_the_target() {
    // used = 30.1K + 20.1K + 40.1K + 10.1K = 100.4K of 100K; b20 brings U to 0.803, a30 too.
    let rows = [
        session("a30", ToolCall, 30_000, Some(0)),
        session("b20", ToolCall, 20_000, Some(0)),
        session("c40", ToolCall, 40_000, Some(0)),
        session("r10", Running, 10_000, Some(0)),
    ];
    let actions = tick(&mut harness(), &rows, 1, 5);
    assert_eq!(of(&actions, &ActionKind::Pause), ["b20", "a30"]);
}

#[test]
fn acting_programs_go_before_smaller_reasoning_ones() {
    let rows = [
        session("r49", Running, 49_000, Some(0)),
        session("r30", Running, 30_000, Some(0)),
        session("r16", Running, 16_000, Some(0)),
        session("a20", ToolCall, 20_000, Some(0)),
    ];
    let actions = tick(&mut harness(), &rows, 1, 5);
    assert_eq!(of(&actions, &ActionKind::Pause), ["a20", "r16"]);
}

#[test]
fn resume_waits_for_the_hysteresis_threshold_and_boosts_once() {
    let mut ta = harness();
    // 76.1K + 10.1K = 86.2K > 85K: stays paused.
    let full = [
        session("run", Running, 76_000, Some(0)),
        paused("p", 10_000, Some(0), false),
    ];
    assert!(of(&tick(&mut ta, &full, 1, 5), &ActionKind::Resume).is_empty());
    // 74.1K + 10.1K = 84.2K <= 85K: resumed with the boost, placed back home.
    let room = [
        session("run", Running, 74_000, Some(0)),
        paused("p", 10_000, Some(0), false),
    ];
    let actions = tick(&mut ta, &room, 1, 10);
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert_eq!(of(&actions, &ActionKind::AdjustPriority(1)), ["p"]);
    assert_eq!(ta.policy().target("p"), Some(Rank::new(0, 0)));
    // Released and running: the boost is taken back.
    let running = [session("p", Running, 10_000, Some(1))];
    let actions = tick(&mut ta, &running, 2, 15);
    assert_eq!(of(&actions, &ActionKind::AdjustPriority(-1)), ["p"]);
}

#[test]
fn the_soft_band_demotes_for_one_and_a_half_ticks() {
    let mut ta = harness();
    let band = [session("a", Running, 90_000, Some(0))];
    let low = [session("a", Running, 50_000, Some(0))];
    assert_eq!(
        of(&tick(&mut ta, &band, 1, 0), &ActionKind::AdjustPriority(-2)),
        ["a"]
    );
    assert!(tick(&mut ta, &band, 1, 5).is_empty());
    assert!(tick(&mut ta, &low, 1, 10).is_empty());
    assert_eq!(
        of(&tick(&mut ta, &low, 1, 15), &ActionKind::AdjustPriority(2)),
        ["a"]
    );
}

#[test]
fn programs_paused_too_long_are_forced_onto_the_least_loaded_worker() {
    let stuck = |paused_for_ms| SessionView {
        paused_for_ms,
        ..paused("p", 90_000, Some(0), true)
    };
    let rows = |p| {
        [
            session("w0", Running, 90_000, Some(0)),
            session("w1", Running, 80_000, Some(1)),
            p,
        ]
    };
    let mut ta = harness();
    let actions = tick(&mut ta, &rows(stuck(30 * 60_000)), 2, 5);
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert_eq!(ta.policy().target("p"), Some(Rank::new(1, 0)));
    let actions = tick(&mut harness(), &rows(stuck(29 * 60_000)), 2, 5);
    assert!(of(&actions, &ActionKind::Resume).is_empty());
}

#[test]
fn acting_programs_decay_on_the_resume_side_only() {
    let rows = |idle_ms| {
        [
            with_idle(session("a", ToolCall, 60_000, Some(0)), idle_ms),
            session("r", Running, 20_000, Some(0)),
            paused("p", 30_000, Some(0), true),
        ]
    };
    assert!(of(&tick(&mut harness(), &rows(0), 1, 5), &ActionKind::Resume).is_empty());
    let actions = tick(&mut harness(), &rows(10_000), 1, 5);
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert!(of(&actions, &ActionKind::Pause).is_empty());
}

#[test]
fn new_programs_go_to_the_least_decayed_load_or_queue_behind_paused_ones() {
    let rows = vec![
        session("on0", Running, 40_000, Some(0)),
        with_idle(session("on1", ToolCall, 70_000, Some(1)), 30_000),
        session("new", Queued, 10_000, None),
    ];
    let mut ta = harness();
    assert!(arrive(&mut ta, &rows, 2, "new").is_empty());
    assert_eq!(ta.policy().target("new"), Some(Rank::new(1, 0)));
    let mut behind = rows.clone();
    behind.push(paused("waiting", 5_000, Some(0), false));
    assert_eq!(
        of(
            &arrive(&mut harness(), &behind, 2, "new"),
            &ActionKind::Pause
        ),
        ["new"]
    );
    let full = [
        session("on0", Running, 84_000, Some(0)),
        session("new", Queued, 10_000, None),
    ];
    assert_eq!(
        of(&arrive(&mut harness(), &full, 1, "new"), &ActionKind::Pause),
        ["new"]
    );
}

#[test]
fn without_capacity_columns_everything_is_left_to_the_router() {
    let sessions: Sessions = [session("a", Running, 1 << 40, Some(0))]
        .into_iter()
        .collect();
    let mut bare = workers(1);
    bare.extensions.clear();
    assert!(harness().tick(5_000, &sessions, &bare).is_empty());
}

#[test]
fn metadata_lists_the_parameters_in_force() {
    let metadata = ThunderAgent::default().metadata();
    assert_eq!(metadata.name, "thunder-agent");
    let param = |key: &str| {
        metadata
            .extensions
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(param("decay_half_life").as_deref(), Some("1000ms"));
    assert_eq!(param("pause_threshold").as_deref(), Some("0.95"));
    assert_eq!(
        metadata.extensions.len(),
        ThunderAgentConfig::default().params().len()
    );
}
