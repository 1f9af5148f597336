use super::*;
use crate::kv_hints::{RankUsage, SessionResidency};
use crate::worker::Rank;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn event(session: &str, at_ms: u64, kind: LifecycleKind) -> LifecycleEvent {
    LifecycleEvent {
        session_id: session.into(),
        at: ms(at_ms),
        kind,
    }
}

fn tool_call(session: &str, at_ms: u64, tool: &str) -> LifecycleEvent {
    event(
        session,
        at_ms,
        LifecycleKind::TurnEndWithToolCall {
            tool_name: Some(tool.into()),
            context_tokens: 20_000,
        },
    )
}

fn tool_result(session: &str, at_ms: u64, tool: &str, waited_ms: u64) -> LifecycleEvent {
    event(
        session,
        at_ms,
        LifecycleKind::ToolResult {
            tool_name: Some(tool.into()),
            waited: ms(waited_ms),
        },
    )
}

/// An index holding blocks of `sessions` on rank 0.0.
fn holding(sessions: &[&str]) -> IndexState {
    IndexState {
        residency: sessions
            .iter()
            .map(|s| SessionResidency {
                session_id: (*s).into(),
                rank: Rank::new(0, 0),
                device_blocks: 100,
                host_blocks: 0,
                disk_blocks: 0,
            })
            .collect(),
        usage: Vec::new(),
    }
}

fn hint(session: &str, kind: HintKind) -> KvHint {
    KvHint::new(session, kind)
}

const DEMOTE: HintKind = HintKind::Demote(HintTier::Host);
const PREFETCH: HintKind = HintKind::Prefetch(HintTier::Device);

/// `bash` learnt at 10 s: its first call (unseen, 1 s predicted) is not demoted.
fn demoter_that_knows_bash() -> DemoteOnToolCall {
    let mut demoter = DemoteOnToolCall::default();
    let index = holding(&["s1"]);
    assert!(
        demoter
            .on_events(&[tool_call("s1", 0, "bash")], &index, ms(0))
            .is_empty()
    );
    assert!(
        demoter
            .on_events(
                &[tool_result("s1", 10_000, "bash", 10_000)],
                &index,
                ms(10_000)
            )
            .is_empty()
    );
    assert_eq!(demoter.tools().predict(Some("bash")), ms(10_000));
    demoter
}

#[test]
fn a_slow_tool_is_demoted_then_prefetched_just_before_it_returns() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1"]);
    assert_eq!(
        demoter.on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(20_000)),
        [hint("s1", DEMOTE)]
    );
    // Predicted back at 30 s: the prefetch is due 500 ms before.
    assert_eq!(demoter.planned_prefetch("s1"), Some(ms(29_500)));
    assert!(demoter.on_events(&[], &index, ms(29_400)).is_empty());
    // Sub-millisecond parts are ignored, as the WIT would.
    let just_before = ms(29_499) + Duration::from_micros(999);
    assert!(demoter.on_events(&[], &index, just_before).is_empty());
    assert_eq!(
        demoter.on_events(&[], &index, ms(29_500)),
        [hint("s1", PREFETCH)]
    );
    // Once.
    assert!(demoter.on_events(&[], &index, ms(29_600)).is_empty());
    assert_eq!(demoter.planned_prefetch("s1"), None);
}

#[test]
fn a_tool_result_cancels_the_prefetch_and_teaches_the_tool_time() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1"]);
    demoter.on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(20_000));
    // Back after 5 s: the request brings the blocks itself.
    assert!(
        demoter
            .on_events(
                &[tool_result("s1", 25_000, "bash", 5_000)],
                &index,
                ms(25_000)
            )
            .is_empty()
    );
    assert!(demoter.on_events(&[], &index, ms(40_000)).is_empty());
    // EWMA: 0.7 * 10 s + 0.3 * 5 s.
    assert_eq!(demoter.tools().predict(Some("bash")), ms(8_500));
}

#[test]
fn a_result_in_the_call_where_the_prefetch_falls_due_cancels_it() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1"]);
    demoter.on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(20_000));
    let late = [tool_result("s1", 29_000, "bash", 9_000)];
    assert!(demoter.on_events(&late, &index, ms(29_600)).is_empty());
    assert_eq!(demoter.planned_prefetch("s1"), None);
}

#[test]
fn a_new_tool_call_replaces_the_plan_in_the_same_call() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1"]);
    demoter.on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(20_000));
    // The result went unreported; at 30 s the next turn ends in another bash call: demoted
    // again, and the old plan (due at 29.5 s) does not fire.
    assert_eq!(
        demoter.on_events(&[tool_call("s1", 30_000, "bash")], &index, ms(30_000)),
        [hint("s1", DEMOTE)]
    );
    assert_eq!(demoter.planned_prefetch("s1"), Some(ms(39_500)));
}

#[test]
fn short_waits_and_late_reports_are_not_demoted() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1", "s2"]);
    // Unseen tool: 1 s predicted, under the 2 s threshold.
    assert!(
        demoter
            .on_events(&[tool_call("s2", 20_000, "grep")], &index, ms(20_000))
            .is_empty()
    );
    // A 10 s tool reported 9 s late has 1 s left: not worth a demotion.
    assert!(
        demoter
            .on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(29_000))
            .is_empty()
    );
    assert_eq!(demoter.planned_prefetch("s1"), None);
}

#[test]
fn a_session_end_evicts_and_drops_the_plan() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["s1"]);
    demoter.on_events(&[tool_call("s1", 20_000, "bash")], &index, ms(20_000));
    let end = [event("s1", 21_000, LifecycleKind::SessionEnd)];
    assert_eq!(
        demoter.on_events(&end, &index, ms(21_000)),
        [hint("s1", HintKind::Evict)]
    );
    assert!(demoter.on_events(&[], &index, ms(30_000)).is_empty());
}

#[test]
fn no_prefetch_for_a_session_the_index_no_longer_holds() {
    let mut demoter = demoter_that_knows_bash();
    demoter.on_events(
        &[tool_call("s1", 20_000, "bash")],
        &holding(&["s1"]),
        ms(20_000),
    );
    // The engines dropped it meanwhile: nothing to bring back, and the plan is spent.
    assert!(demoter.on_events(&[], &holding(&[]), ms(29_500)).is_empty());
    assert!(
        demoter
            .on_events(&[], &holding(&["s1"]), ms(29_600))
            .is_empty()
    );
}

#[test]
fn prefetches_fall_due_in_time_order() {
    let mut demoter = demoter_that_knows_bash();
    let index = holding(&["a", "b", "c"]);
    let calls = [
        tool_call("a", 21_000, "bash"),
        tool_call("b", 20_000, "bash"),
        tool_call("c", 40_000, "bash"),
    ];
    assert_eq!(
        demoter.on_events(&calls, &index, ms(21_000)),
        [hint("a", DEMOTE), hint("b", DEMOTE), hint("c", DEMOTE)]
    );
    assert_eq!(
        demoter.on_events(&[], &index, ms(31_000)),
        [hint("b", PREFETCH), hint("a", PREFETCH)]
    );
}

#[test]
fn tool_times_are_moving_averages_with_bounded_memory() {
    let mut tools = ToolTimes::new(ms(1_000), 0.3, 2);
    assert_eq!(tools.predict(Some("bash")), ms(1_000));
    tools.observe(Some("bash"), ms(10_000));
    tools.observe(Some("bash"), ms(20_000));
    assert_eq!(tools.predict(Some("bash")), ms(13_000));
    // Calls without a name share one estimate, apart from any named tool.
    tools.observe(None, ms(4_000));
    assert_eq!(tools.predict(None), ms(4_000));
    assert_eq!(tools.predict(Some("")), ms(1_000));
    // A third tool pushes out the least recently observed one (bash).
    tools.observe(Some("pytest"), ms(60_000));
    assert_eq!(tools.len(), 2);
    assert_eq!(tools.predict(Some("bash")), ms(1_000));
    assert_eq!(tools.predict(Some("pytest")), ms(60_000));
    // A weight out of range trusts the newest observation only.
    let mut jumpy = ToolTimes::new(ms(1_000), f64::NAN, 4);
    jumpy.observe(Some("bash"), ms(10_000));
    jumpy.observe(Some("bash"), ms(3_000));
    assert_eq!(jumpy.predict(Some("bash")), ms(3_000));
}

#[test]
fn planned_prefetches_are_bounded_by_max_sessions() {
    let mut demoter = DemoteOnToolCall::new(DemoteOnToolCallConfig {
        unseen_tool_time: ms(10_000),
        max_sessions: 2,
        ..DemoteOnToolCallConfig::default()
    });
    let index = holding(&["a", "b", "c"]);
    let calls = [
        tool_call("a", 0, "bash"),
        tool_call("b", 0, "bash"),
        tool_call("c", 0, "bash"),
    ];
    assert_eq!(demoter.on_events(&calls, &index, ms(0)).len(), 3);
    // `a`'s plan made room for `c`'s.
    assert_eq!(demoter.planned_prefetch("a"), None);
    assert_eq!(
        demoter.on_events(&[], &index, ms(9_500)),
        [hint("b", PREFETCH), hint("c", PREFETCH)]
    );
}

#[test]
fn a_finished_subagent_is_evicted_once() {
    let mut reclaim = SubagentReclaim::default();
    let index = holding(&[]);
    let spawn = [event("p", 0, LifecycleKind::SubagentSpawn("c".into()))];
    assert!(reclaim.on_events(&spawn, &index, ms(0)).is_empty());
    let end = [event("p", 5_000, LifecycleKind::SubagentEnd("c".into()))];
    assert_eq!(
        reclaim.on_events(&end, &index, ms(5_000)),
        [hint("c", HintKind::Evict)]
    );
    // The child's own end, reported later, does not evict it again; the parent's does.
    let ends = [
        event("c", 5_001, LifecycleKind::SessionEnd),
        event("p", 9_000, LifecycleKind::SessionEnd),
    ];
    assert_eq!(
        reclaim.on_events(&ends, &index, ms(9_000)),
        [hint("p", HintKind::Evict)]
    );
}

#[test]
fn reclaim_remembers_a_bounded_number_of_sessions() {
    let mut reclaim = SubagentReclaim::new(SubagentReclaimConfig { max_sessions: 1 });
    let index = holding(&[]);
    let end = |s: &str| [event(s, 0, LifecycleKind::SessionEnd)];
    assert_eq!(reclaim.on_events(&end("a"), &index, ms(0)).len(), 1);
    assert_eq!(reclaim.on_events(&end("a"), &index, ms(1)).len(), 0);
    assert_eq!(reclaim.on_events(&end("b"), &index, ms(2)).len(), 1);
    // `a` was forgotten to remember `b`.
    assert_eq!(reclaim.on_events(&end("a"), &index, ms(3)).len(), 1);
}

#[test]
fn a_parent_shares_with_each_subagent_and_outlives_them() {
    let mut share = ShareToSubagent::default();
    let index = holding(&["p"]);
    let spawns = [
        event("p", 0, LifecycleKind::SubagentSpawn("c1".into())),
        event("p", 1, LifecycleKind::SubagentSpawn("c2".into())),
        // A session cannot share with itself.
        event("p", 2, LifecycleKind::SubagentSpawn("p".into())),
    ];
    assert_eq!(
        share.on_events(&spawns, &index, ms(2)),
        [
            hint("p", HintKind::Share("c1".into())),
            hint("p", HintKind::Share("c2".into()))
        ]
    );
    // The parent ends first: its prefix stays while the subagents run.
    let parent_end = [event("p", 3_000, LifecycleKind::SessionEnd)];
    assert!(share.on_events(&parent_end, &index, ms(3_000)).is_empty());
    let c1_end = [event("p", 4_000, LifecycleKind::SubagentEnd("c1".into()))];
    assert!(share.on_events(&c1_end, &index, ms(4_000)).is_empty());
    assert_eq!(share.live_subagents("p"), 1);
    // The last one ends (its own end event): it goes, and the parent with it.
    let c2_end = [event("c2", 5_000, LifecycleKind::SessionEnd)];
    assert_eq!(
        share.on_events(&c2_end, &index, ms(5_000)),
        [hint("c2", HintKind::Evict), hint("p", HintKind::Evict)]
    );
    assert_eq!(share.live_subagents("p"), 0);
}

#[test]
fn a_deferred_eviction_is_dropped_when_the_index_no_longer_holds_the_parent() {
    let mut share = ShareToSubagent::default();
    let spawn = [event("p", 0, LifecycleKind::SubagentSpawn("c".into()))];
    share.on_events(&spawn, &holding(&[]), ms(0));
    share.on_events(
        &[event("p", 1, LifecycleKind::SessionEnd)],
        &holding(&[]),
        ms(1),
    );
    // The child's end frees `p` too, but `p` is neither in the events nor in the index: a
    // hint about it would be refused.
    let end = [event("c", 2, LifecycleKind::SessionEnd)];
    assert_eq!(
        share.on_events(&end, &holding(&[]), ms(2)),
        [hint("c", HintKind::Evict)]
    );
    assert_eq!(share.live_subagents("p"), 0);
    // A session without subagents is evicted when it ends.
    let alone = [event("q", 3, LifecycleKind::SessionEnd)];
    assert_eq!(
        share.on_events(&alone, &holding(&[]), ms(3)),
        [hint("q", HintKind::Evict)]
    );
}

#[test]
fn compaction_and_session_end_evict_once_per_answer() {
    let mut compaction = CompactionEvict;
    let compacted = LifecycleKind::Compaction {
        tokens_before: 90_000,
        tokens_after: 10_000,
    };
    let events = [
        event("s", 0, compacted.clone()),
        event("s", 1, LifecycleKind::ThinkingStart { at_token: 10 }),
        event("t", 2, compacted),
        event("s", 3, LifecycleKind::SessionEnd),
        event(
            "u",
            4,
            LifecycleKind::ThinkingEnd {
                at_token: 10,
                tokens: 300,
            },
        ),
    ];
    assert_eq!(
        compaction.on_events(&events, &holding(&[]), ms(4)),
        [hint("s", HintKind::Evict), hint("t", HintKind::Evict)]
    );
}

#[test]
fn the_lru_drops_the_least_recently_used_entry() {
    let mut lru = Lru::new(2);
    assert_eq!(lru.insert("a", 1), None);
    assert_eq!(lru.insert("b", 2), None);
    // Touching `a` makes `b` the oldest.
    assert_eq!(lru.get_mut("a").copied(), Some(1));
    assert_eq!(lru.insert("c", 3), Some(("b", 2)));
    // Peeking does not count as a use.
    assert_eq!(lru.peek("a"), Some(&1));
    assert_eq!(lru.insert("d", 4), Some(("a", 1)));
    // Replacing a key takes no room.
    assert_eq!(lru.insert("d", 5), None);
    assert_eq!(
        (lru.len(), lru.remove("c"), lru.peek("d")),
        (2, Some(3), Some(&5))
    );
}

/// `holding(&["s1"])` with rank 0.0 using `used` of `capacity` device blocks.
fn holding_with_usage(used: u64, capacity: u64) -> IndexState {
    let mut index = holding(&["s1"]);
    index.usage = vec![RankUsage {
        rank: Rank::new(0, 0),
        device_used_blocks: used,
        device_capacity_blocks: capacity,
        host_used_blocks: 0,
        host_capacity_blocks: 0,
    }];
    index
}

#[test]
fn a_slow_tool_is_demoted_only_when_the_device_is_short() {
    let demotes = |demoter: &mut DemoteOnToolCall, index: &IndexState, at: u64| {
        let hints = demoter.on_events(&[tool_call("s1", at, "bash")], index, ms(at));
        hints.contains(&hint("s1", DEMOTE))
    };
    let mut demoter = demoter_that_knows_bash();
    // Room on the device: the demote would only move hits to the host; no prefetch planned.
    assert!(!demotes(
        &mut demoter,
        &holding_with_usage(500, 1_000),
        20_000
    ));
    assert_eq!(demoter.planned_prefetch("s1"), None);
    assert!(!demotes(
        &mut demoter,
        &holding_with_usage(899, 1_000),
        40_000
    ));
    // Short: at or above the default 0.9.
    assert!(demotes(
        &mut demoter,
        &holding_with_usage(900, 1_000),
        60_000
    ));
    assert!(demoter.planned_prefetch("s1").is_some());
    // Unknown capacity, or no usage of the rank: as before the gate.
    assert!(demotes(&mut demoter, &holding_with_usage(0, 0), 80_000));
    assert!(demotes(&mut demoter, &holding(&["s1"]), 100_000));
    // A rank that does not hold the session's device blocks does not count.
    let mut elsewhere = holding_with_usage(500, 1_000);
    elsewhere.usage.push(RankUsage {
        rank: Rank::new(1, 0),
        device_used_blocks: 1_000,
        device_capacity_blocks: 1_000,
        host_used_blocks: 0,
        host_capacity_blocks: 0,
    });
    assert!(!demotes(&mut demoter, &elsewhere, 120_000));

    // The threshold is a parameter: 0 demotes whatever the usage.
    let mut config = DemoteOnToolCallConfig::default();
    config.set("demote_above_usage", "0").expect("valid");
    config.set("unseen_tool_time", "10s").expect("valid");
    let mut eager = DemoteOnToolCall::new(config);
    assert!(demotes(&mut eager, &holding_with_usage(0, 1_000), 0));
}
