use super::*;
use crate::admission::testing::{session, worker};
use crate::router::PolicyRequest;
use SessionPhase::{Paused, Queued, Running, ToolCall};

const CAP: u64 = 100_000;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn view(sessions: Vec<SessionView>, workers: u32) -> AdmissionView {
    AdmissionView {
        sessions,
        workers: (0..workers).map(|w| worker(w, CAP)).collect(),
    }
}

fn with_idle(mut s: SessionView, idle: Duration) -> SessionView {
    s.idle = idle;
    s
}

/// A paused program: ACTING (tool running), REASONING (a request waits) or new (no rank yet).
fn paused(id: &str, tokens: u64, worker: Option<u32>, waiting: bool) -> SessionView {
    let mut s = session(id, Paused, tokens, worker);
    s.queued_requests = u32::from(waiting);
    s
}

fn of(actions: &[AdmissionAction], kind: &ActionKind) -> Vec<String> {
    actions
        .iter()
        .filter(|a| &a.kind == kind)
        .map(|a| a.session_id.clone())
        .collect()
}

#[test]
fn overload_pauses_acting_programs_smallest_first_down_to_the_target() {
    // used = 30.1K + 20.1K + 40.1K + 10.1K = 100.4K of 100K.
    let v = view(
        vec![
            session("a30", ToolCall, 30_000, Some(0)),
            session("b20", ToolCall, 20_000, Some(0)),
            session("c40", ToolCall, 40_000, Some(0)),
            session("r10", Running, 10_000, Some(0)),
        ],
        1,
    );
    let mut ta = ThunderAgent::default();
    let actions = ta.tick(&v, secs(5));
    // b20 brings U to 0.803 (> 0.80): a30 goes too; then 0.502, and c40 and the running one stay.
    assert_eq!(of(&actions, &ActionKind::Pause), ["b20", "a30"]);
}

#[test]
fn without_enough_acting_programs_the_smallest_reasoning_ones_are_marked() {
    // Only running programs: 49.1K + 30.1K + 16.1K = 95.3K; pausing r16 leaves 79.2K.
    let v = view(
        vec![
            session("r49", Running, 49_000, Some(0)),
            session("r30", Running, 30_000, Some(0)),
            session("r16", Running, 16_000, Some(0)),
        ],
        1,
    );
    let actions = ThunderAgent::default().tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::Pause), ["r16"]);
    // With an ACTING program too, the ACTING one goes first even though it is larger.
    let mut v = v;
    v.sessions.push(session("a20", ToolCall, 20_000, Some(0)));
    let actions = ThunderAgent::default().tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::Pause), ["a20", "r16"]);
}

#[test]
fn below_the_pause_threshold_nothing_is_paused() {
    let v = view(vec![session("a", ToolCall, 94_000, Some(0))], 1);
    let actions = ThunderAgent::default().tick(&v, secs(5));
    assert!(of(&actions, &ActionKind::Pause).is_empty(), "{actions:?}");
}

#[test]
fn resume_waits_for_the_hysteresis_threshold() {
    let mut ta = ThunderAgent::default();
    // 76.1K running + 10.1K for the paused one = 86.2K > 85K: stays paused.
    let full = view(
        vec![
            session("run", Running, 76_000, Some(0)),
            paused("p", 10_000, Some(0), false),
        ],
        1,
    );
    assert!(of(&ta.tick(&full, secs(5)), &ActionKind::Resume).is_empty());
    // 74.1K + 10.1K = 84.2K <= 85K: resumed, with the boost, back on its worker.
    let room = view(
        vec![
            session("run", Running, 74_000, Some(0)),
            paused("p", 10_000, Some(0), false),
        ],
        1,
    );
    let actions = ta.tick(&room, secs(10));
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert_eq!(of(&actions, &ActionKind::AdjustPriority(1)), ["p"]);
    assert_eq!(ta.placement(&room, "p", secs(10)), Some(Rank::new(0, 0)));
}

#[test]
fn the_boost_is_taken_back_once_the_request_is_released() {
    let mut ta = ThunderAgent::default();
    let v = view(vec![paused("p", 10_000, Some(0), true)], 1);
    let actions = ta.tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::AdjustPriority(1)), ["p"]);
    // Still waiting to be released (the host has not acted yet): keep the boost.
    let mut still = v.clone();
    still.sessions[0].paused = false;
    still.sessions[0].phase = Queued;
    assert!(of(&ta.tick(&still, secs(10)), &ActionKind::AdjustPriority(-1)).is_empty());
    let running = view(vec![session("p", Running, 10_000, Some(0))], 1);
    assert_eq!(
        of(
            &ta.tick(&running, secs(15)),
            &ActionKind::AdjustPriority(-1)
        ),
        ["p"]
    );
}

#[test]
fn resume_order_is_reasoning_then_new_then_acting() {
    // Room for 85K: r (50.1K) and n (30.1K) fit, a (10.1K) would make 90.3K.
    let v = view(
        vec![
            paused("a", 10_000, Some(0), false),
            paused("n", 30_000, None, true),
            paused("r", 50_000, Some(0), true),
        ],
        1,
    );
    let actions = ThunderAgent::default().tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::Resume), ["r", "n"]);
}

#[test]
fn resumed_programs_go_home_if_they_fit_else_to_the_best_fit() {
    let mut ta = ThunderAgent::default();
    // Worker 0 is full; worker 1 holds 60K, worker 2 nothing. The program from worker 0 fits on
    // both others: best fit is the fuller one.
    let v = view(
        vec![
            session("big", Running, 90_000, Some(0)),
            session("mid", Running, 60_000, Some(1)),
            paused("p", 20_000, Some(0), true),
        ],
        3,
    );
    let actions = ta.tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert_eq!(ta.placement(&v, "p", secs(5)), Some(Rank::new(1, 0)));
    // Room at home: home wins even though worker 1 is the tighter fit.
    let mut ta = ThunderAgent::default();
    let v = view(
        vec![
            session("small", Running, 10_000, Some(0)),
            session("mid", Running, 60_000, Some(1)),
            paused("p", 20_000, Some(0), true),
        ],
        2,
    );
    ta.tick(&v, secs(5));
    assert_eq!(ta.placement(&v, "p", secs(5)), Some(Rank::new(0, 0)));
}

/// With `migrate_after`, a program whose worker is full waits for it (its KV is there) rather
/// than moving to a worker with room, until it has waited that long.
#[test]
fn with_migrate_after_a_program_waits_for_its_own_worker_that_long() {
    let config = ThunderAgentConfig {
        migrate_after: secs(60),
        ..ThunderAgentConfig::default()
    };
    let mut waiting = paused("p", 20_000, Some(0), true);
    waiting.paused_for = secs(59);
    let mut v = view(vec![session("big", Running, 90_000, Some(0)), waiting], 2);
    let mut ta = ThunderAgent::new(config.clone());
    assert!(of(&ta.tick(&v, secs(5)), &ActionKind::Resume).is_empty());
    assert_eq!(ta.placement(&v, "p", secs(5)), Some(Rank::new(0, 0)));
    // Its wait is up: the best fit elsewhere, as without the parameter.
    v.sessions[1].paused_for = secs(60);
    let mut ta = ThunderAgent::new(config.clone());
    assert_eq!(of(&ta.tick(&v, secs(5)), &ActionKind::Resume), ["p"]);
    assert_eq!(ta.placement(&v, "p", secs(5)), Some(Rank::new(1, 0)));
    // A worker that left the view is no home to wait for.
    v.sessions[1].paused_for = secs(1);
    v.sessions[1].rank = Some(Rank::new(7, 0));
    let mut ta = ThunderAgent::new(config);
    assert_eq!(of(&ta.tick(&v, secs(5)), &ActionKind::Resume), ["p"]);
}

#[test]
fn programs_paused_too_long_are_forced_onto_the_least_loaded_worker() {
    let mut ta = ThunderAgent::default();
    let mut stuck = paused("p", 90_000, Some(0), true);
    stuck.paused_for = secs(30 * 60);
    let v = view(
        vec![
            session("w0", Running, 90_000, Some(0)),
            session("w1", Running, 80_000, Some(1)),
            stuck,
        ],
        2,
    );
    let actions = ta.tick(&v, secs(5));
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert_eq!(ta.placement(&v, "p", secs(5)), Some(Rank::new(1, 0)));
    // A minute less and it would still wait: nothing fits.
    let mut ta = ThunderAgent::default();
    let mut v2 = v.clone();
    v2.sessions[2].paused_for = secs(29 * 60);
    assert!(of(&ta.tick(&v2, secs(5)), &ActionKind::Resume).is_empty());
}

#[test]
fn the_soft_band_demotes_for_one_and_a_half_ticks() {
    let mut ta = ThunderAgent::default();
    // 90.1K: between 0.80 and 0.95.
    let band = view(vec![session("a", Running, 90_000, Some(0))], 1);
    let low = view(vec![session("a", Running, 50_000, Some(0))], 1);
    assert_eq!(
        of(&ta.tick(&band, secs(0)), &ActionKind::AdjustPriority(-2)),
        ["a"]
    );
    // Renewed while in the band, without a second demotion.
    assert!(ta.tick(&band, secs(5)).is_empty());
    // Lasts 7.5 s after the last renewal (5 s): not lifted at 10 s, lifted at 15 s.
    assert!(ta.tick(&low, secs(10)).is_empty());
    assert_eq!(
        of(&ta.tick(&low, secs(15)), &ActionKind::AdjustPriority(2)),
        ["a"]
    );
}

#[test]
fn acting_programs_decay_on_the_resume_side_only() {
    // a: 60K acting. used = 60.1K + 20.1K = 80.2K (no pause); resuming p (30.1K) needs room.
    let sessions = |idle| {
        vec![
            with_idle(session("a", ToolCall, 60_000, Some(0)), idle),
            session("r", Running, 20_000, Some(0)),
            paused("p", 30_000, Some(0), true),
        ]
    };
    let fresh = view(sessions(secs(0)), 1);
    assert!(
        of(
            &ThunderAgent::default().tick(&fresh, secs(5)),
            &ActionKind::Resume
        )
        .is_empty()
    );
    // After 10 s of tool time a's 60K count ~59 tokens: p fits.
    let old = view(sessions(secs(10)), 1);
    let actions = ThunderAgent::default().tick(&old, secs(5));
    assert_eq!(of(&actions, &ActionKind::Resume), ["p"]);
    assert!(of(&actions, &ActionKind::Pause).is_empty());
}

#[test]
fn new_programs_go_to_the_least_decayed_load_or_queue_behind_paused_ones() {
    let mut ta = ThunderAgent::default();
    let arrival = |id| Arrival {
        request: PolicyRequest {
            session_id: Some(id),
            ..PolicyRequest::default()
        },
        waited: Duration::ZERO,
    };
    let v = view(
        vec![
            session("on0", Running, 40_000, Some(0)),
            with_idle(session("on1", ToolCall, 70_000, Some(1)), secs(30)),
            session("new", Queued, 10_000, None),
        ],
        2,
    );
    // Worker 1 holds more, but its program has been in its tool for 30 s: it decays away.
    assert!(ta.arrival(&v, &arrival("new"), secs(5)).is_empty());
    assert_eq!(ta.placement(&v, "new", secs(5)), Some(Rank::new(1, 0)));
    // Sticky afterwards: an old program stays where it ran.
    assert_eq!(ta.placement(&v, "on0", secs(5)), Some(Rank::new(0, 0)));

    let mut ta = ThunderAgent::default();
    let mut behind = v.clone();
    behind
        .sessions
        .push(paused("waiting", 5_000, Some(0), false));
    assert_eq!(
        of(
            &ta.arrival(&behind, &arrival("new"), secs(5)),
            &ActionKind::Pause
        ),
        ["new"]
    );
    // No room anywhere: queue too.
    let full = view(
        vec![
            session("on0", Running, 84_000, Some(0)),
            session("new", Queued, 10_000, None),
        ],
        1,
    );
    assert_eq!(
        of(
            &ta.arrival(&full, &arrival("new"), secs(5)),
            &ActionKind::Pause
        ),
        ["new"]
    );
}

#[test]
fn unknown_capacity_leaves_everything_to_the_router() {
    let mut v = view(vec![session("a", Running, 1 << 40, Some(0))], 1);
    v.workers[0].kv_capacity_tokens = 0;
    let mut ta = ThunderAgent::default();
    assert!(ta.tick(&v, secs(5)).is_empty());
}
