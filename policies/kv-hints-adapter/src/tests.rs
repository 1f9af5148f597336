//! The conversion, through the columns the host sends (tool results included), and a strategy
//! run through the SDK harness in lockstep with its core twin.

use super::*;
use switchyard_core::kv_hints::KvHintPolicy as _;
use switchyard_core::kv_hints::strategies::DemoteOnToolCall;
use switchyard_policy_sdk::testing::KvHintsHarness;
use switchyard_policy_sdk::{Compaction, EventKind, Residency, TierUsage, ToolCall, ToolResult};

fn event(session: &str, at_ms: u64, kind: EventKind) -> sdk::LifecycleEvent {
    sdk::LifecycleEvent {
        session_id: session.into(),
        at_ms,
        kind,
        extensions: Vec::new(),
    }
}

fn result(session: &str, at_ms: u64, waited_ms: u64, position: usize) -> ToolResult {
    ToolResult {
        session_id: session.into(),
        at_ms,
        tool_name: Some("bash".into()),
        waited_ms,
        position,
    }
}

fn resident(sessions: &[&str]) -> sdk::IndexState {
    let n = sessions.len();
    sdk::IndexState {
        residency: Residency {
            session_ids: sessions.iter().map(|s| (*s).to_owned()).collect(),
            worker_ids: (0..n as u32).collect(),
            dp_ranks: vec![1; n],
            device_blocks: vec![64; n],
            host_blocks: vec![8; n],
            disk_blocks: vec![1; n],
        },
        ..sdk::IndexState::default()
    }
}

#[test]
fn tool_results_go_back_where_they_happened() {
    let events = [
        event("a", 10, EventKind::ThinkingStart),
        event("b", 20, EventKind::SessionEnd),
    ];
    let index = resident(&[]).with_tool_results(&[
        result("r0", 5, 1_000, 0),
        result("r1", 15, 2_000, 1),
        result("r2", 16, 3_000, 1),
        result("r3", 25, 4_000, 2),
        result("r4", 26, 5_000, usize::MAX),
    ]);
    let order: Vec<(String, u64)> = lifecycle_events(&events, &index)
        .into_iter()
        .map(|e| (e.session_id, e.at.as_millis() as u64))
        .collect();
    let want = [
        ("r0", 5),
        ("a", 10),
        ("r1", 15),
        ("r2", 16),
        ("b", 20),
        ("r3", 25),
        ("r4", 26),
    ];
    assert_eq!(
        order,
        want.map(|(s, at)| (s.to_owned(), at)).to_vec(),
        "{index:?}"
    );
    assert_eq!(
        lifecycle_events(&events, &index)[2].kind,
        LifecycleKind::ToolResult {
            tool_name: Some("bash".into()),
            waited: Duration::from_millis(2_000),
        }
    );
}

#[test]
fn every_event_kind_keeps_its_fields() {
    let kinds = [
        (
            EventKind::TurnEndWithToolCall(ToolCall {
                tool_name: None,
                context_tokens: 30_000,
            }),
            LifecycleKind::TurnEndWithToolCall {
                tool_name: None,
                context_tokens: 30_000,
            },
        ),
        (
            EventKind::SubagentSpawn("c".into()),
            LifecycleKind::SubagentSpawn("c".into()),
        ),
        (
            EventKind::SubagentEnd("c".into()),
            LifecycleKind::SubagentEnd("c".into()),
        ),
        (
            EventKind::Compaction(Compaction {
                tokens_before: 9,
                tokens_after: 3,
            }),
            LifecycleKind::Compaction {
                tokens_before: 9,
                tokens_after: 3,
            },
        ),
        (
            EventKind::ThinkingStart,
            LifecycleKind::ThinkingStart { at_token: 1_234 },
        ),
        (
            EventKind::ThinkingEnd(77),
            LifecycleKind::ThinkingEnd {
                at_token: 1_234,
                tokens: 77,
            },
        ),
        (EventKind::SessionEnd, LifecycleKind::SessionEnd),
    ];
    for (sdk_kind, core_kind) in kinds {
        // A thinking span's start comes in the extensions; other events ignore them.
        let mut sent = event("s", 42, sdk_kind);
        sent.extensions = vec![("switchyard.thinking.at-token".to_owned(), "1234".to_owned())];
        let converted = lifecycle_events(&[sent], &resident(&[]));
        assert_eq!(
            converted,
            [LifecycleEvent {
                session_id: "s".into(),
                at: Duration::from_millis(42),
                kind: core_kind,
            }]
        );
    }
}

#[test]
fn the_index_keeps_its_rows_and_cuts_ragged_columns() {
    let mut index = resident(&["a", "b"]);
    index.usage = TierUsage {
        worker_ids: vec![3],
        dp_ranks: vec![1],
        device_used_blocks: vec![10],
        device_capacity_blocks: vec![100],
        host_used_blocks: vec![20],
        host_capacity_blocks: vec![200],
    };
    let converted = index_state(&index);
    assert_eq!(
        converted.residency[1],
        SessionResidency {
            session_id: "b".into(),
            rank: Rank::new(1, 1),
            device_blocks: 64,
            host_blocks: 8,
            disk_blocks: 1,
        }
    );
    assert_eq!(
        converted.usage,
        [RankUsage {
            rank: Rank::new(3, 1),
            device_used_blocks: 10,
            device_capacity_blocks: 100,
            host_used_blocks: 20,
            host_capacity_blocks: 200,
        }]
    );
    index.residency.disk_blocks.pop();
    assert_eq!(index_state(&index).residency.len(), 1);
}

#[test]
fn every_hint_kind_comes_back() {
    let kinds = [
        (
            HintKind::Share("c".into()),
            sdk::HintKind::Share("c".into()),
        ),
        (
            HintKind::Prefetch(HintTier::Device),
            sdk::HintKind::Prefetch(sdk::Tier::Device),
        ),
        (
            HintKind::Demote(HintTier::Host),
            sdk::HintKind::Demote(sdk::Tier::Host),
        ),
        (
            HintKind::Demote(HintTier::Disk),
            sdk::HintKind::Demote(sdk::Tier::Disk),
        ),
        (
            HintKind::Prefetch(HintTier::Shared),
            sdk::HintKind::Prefetch(sdk::Tier::Shared),
        ),
        (
            HintKind::Pin(Duration::from_millis(1_500)),
            sdk::HintKind::Pin(1_500),
        ),
        (HintKind::Retain, sdk::HintKind::Retain),
        (HintKind::Evict, sdk::HintKind::Evict),
    ];
    for (core_kind, sdk_kind) in kinds {
        let hint = KvHint {
            target: Some(Rank::new(2, 1)),
            ..KvHint::new("s", core_kind)
        };
        assert_eq!(
            sdk_hints(vec![hint]),
            [sdk::Hint {
                target: Some((2, 1)),
                ..sdk::Hint::new("s", sdk_kind)
            }]
        );
    }
}

/// A test component running the core's demote-on-tool-call.
#[derive(Debug)]
enum Demote {}

impl Builtin for Demote {
    type Policy = DemoteOnToolCall;

    fn policy() -> DemoteOnToolCall {
        DemoteOnToolCall::default()
    }

    fn metadata(_policy: &DemoteOnToolCall) -> PolicyMetadata {
        metadata("demote-on-tool-call", "1.0.0", "test", [])
    }
}

#[test]
fn a_strategy_learns_from_tool_results_in_the_columns() {
    let mut component = KvHintsHarness::new(Native::<Demote>::default());
    let mut core = Demote::policy();
    let call = |at_ms| {
        event(
            "s",
            at_ms,
            EventKind::TurnEndWithToolCall(ToolCall {
                tool_name: Some("bash".into()),
                context_tokens: 1_000,
            }),
        )
    };
    let index = resident(&["s"]);
    // An unseen tool; then its result (10 s) and, in the same call, the next call of it.
    let steps = [
        (0, vec![call(0)], index.clone()),
        (
            10_000,
            vec![call(10_000)],
            index
                .clone()
                .with_tool_results(&[result("s", 10_000, 10_000, 0)]),
        ),
        (19_400, vec![], index.clone()),
        (19_500, vec![], index.clone()),
    ];
    let mut answers = Vec::new();
    for (now_ms, events, index) in &steps {
        let got = component.on_events(*now_ms, events, index);
        let want = sdk_hints(core.on_events(
            &lifecycle_events(events, index),
            &index_state(index),
            millis(*now_ms),
        ));
        assert_eq!(got, want, "at {now_ms} ms");
        answers.push(got);
    }
    assert_eq!(
        answers,
        [
            vec![],
            vec![sdk::Hint::new("s", sdk::HintKind::Demote(sdk::Tier::Host))],
            vec![],
            vec![sdk::Hint::new(
                "s",
                sdk::HintKind::Prefetch(sdk::Tier::Device)
            )],
        ]
    );
}
