use super::*;
use crate::index::IndexOp;
use crate::programs::{ThinkingSpan, TurnEnd, Usage};
use crate::worker::Tier;

fn hashes(range: std::ops::Range<u64>) -> Vec<SequenceHash> {
    range.map(SequenceHash).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn turn<'a>(session: &'a str, rank: Rank, hashes: &'a [SequenceHash]) -> RoutedTurn<'a> {
    RoutedTurn {
        session_id: session,
        parent_session_id: None,
        rank,
        hashes,
        prompt_tokens: hashes.len() as u64 * 16,
    }
}

fn kinds(events: &[LifecycleEvent]) -> Vec<(&str, &LifecycleKind)> {
    events
        .iter()
        .map(|e| (e.session_id.as_str(), &e.kind))
        .collect()
}

const R0: Rank = Rank {
    worker: crate::worker::WorkerId(0),
    dp_rank: 0,
};
const R1: Rank = Rank {
    worker: crate::worker::WorkerId(1),
    dp_rank: 0,
};

#[test]
fn a_tool_call_is_answered_by_the_next_turn_with_the_wait() {
    let mut tracker = SessionTracker::default();
    let first = hashes(0..10);
    assert!(tracker.routed(turn("s", R0, &first), ms(0)).is_empty());
    let end = TurnEnd {
        usage: Some(Usage {
            prompt_tokens: 160,
            completion_tokens: 40,
        }),
        tool_call: true,
        tool_name: Some("bash".into()),
        thinking: Vec::new(),
    };
    let events = tracker.turn_ended("s", &end, ms(100));
    assert_eq!(
        kinds(&events),
        [(
            "s",
            &LifecycleKind::TurnEndWithToolCall {
                tool_name: Some("bash".into()),
                context_tokens: 160 + 40,
            }
        )]
    );
    assert!(tracker.waiting_on_tools());
    let second = hashes(0..12);
    let events = tracker.routed(turn("s", R0, &second), ms(2_600));
    assert_eq!(
        kinds(&events),
        [(
            "s",
            &LifecycleKind::ToolResult {
                tool_name: Some("bash".into()),
                waited: ms(2_500),
            }
        )]
    );
    assert!(!tracker.waiting_on_tools());
    // A turn that ends without a tool call starts no wait.
    assert!(
        tracker
            .turn_ended("s", &TurnEnd::default(), ms(3_000))
            .is_empty()
    );
    assert!(tracker.routed(turn("s", R0, &second), ms(4_000)).is_empty());
}

#[test]
fn a_turn_that_thought_reports_its_span_and_marks_the_session() {
    let mut tracker = SessionTracker::default();
    tracker.routed(turn("s", R0, &hashes(0..4)), ms(0));
    assert!(!tracker.thinks("s"));
    let end = TurnEnd {
        tool_call: true,
        tool_name: Some("read".into()),
        thinking: vec![ThinkingSpan {
            offset: 0,
            tokens: 300,
        }],
        ..TurnEnd::default()
    };
    let events = tracker.turn_ended("s", &end, ms(50));
    assert_eq!(
        kinds(&events),
        [
            // The span starts where the turn's 64-token prompt ends.
            ("s", &LifecycleKind::ThinkingStart { at_token: 64 }),
            (
                "s",
                &LifecycleKind::ThinkingEnd {
                    at_token: 64,
                    tokens: 300
                }
            ),
            (
                "s",
                &LifecycleKind::TurnEndWithToolCall {
                    tool_name: Some("read".into()),
                    context_tokens: 64,
                }
            ),
        ]
    );
    assert!(tracker.thinks("s"));
    // Unknown sessions think nothing, and report nothing.
    assert!(!tracker.thinks("t"));
    assert!(tracker.turn_ended("t", &end, ms(60)).is_empty());
}

#[test]
fn each_thinking_span_of_an_answer_is_reported_where_it_starts() {
    let mut tracker = SessionTracker::default();
    tracker.routed(turn("s", R0, &hashes(0..4)), ms(0));
    // Reasoning, 20 tokens of text, more reasoning: two spans, the second after the first
    // span's 100 tokens and the text's 20.
    let end = TurnEnd {
        thinking: vec![
            ThinkingSpan {
                offset: 0,
                tokens: 100,
            },
            ThinkingSpan {
                offset: 120,
                tokens: 30,
            },
        ],
        ..TurnEnd::default()
    };
    let events = tracker.turn_ended("s", &end, ms(50));
    assert_eq!(
        kinds(&events),
        [
            ("s", &LifecycleKind::ThinkingStart { at_token: 64 }),
            (
                "s",
                &LifecycleKind::ThinkingEnd {
                    at_token: 64,
                    tokens: 100
                }
            ),
            ("s", &LifecycleKind::ThinkingStart { at_token: 184 }),
            (
                "s",
                &LifecycleKind::ThinkingEnd {
                    at_token: 184,
                    tokens: 30
                }
            ),
        ]
    );
}

#[test]
fn a_subagent_is_spawned_once_and_ends_on_its_parent() {
    let mut tracker = SessionTracker::default();
    let parent = hashes(0..8);
    tracker.routed(turn("p", R0, &parent), ms(0));
    let child = hashes(0..10);
    let spawn = RoutedTurn {
        parent_session_id: Some("p"),
        ..turn("c", R1, &child)
    };
    let events = tracker.routed(spawn, ms(5));
    assert_eq!(
        kinds(&events),
        [("p", &LifecycleKind::SubagentSpawn("c".into()))]
    );
    assert!(tracker.routed(spawn, ms(6)).is_empty());
    let events = tracker.ended("c", ms(9));
    assert_eq!(
        kinds(&events),
        [
            ("c", &LifecycleKind::SessionEnd),
            ("p", &LifecycleKind::SubagentEnd("c".into())),
        ]
    );
    assert!(tracker.ended("stranger", ms(9)).is_empty());
}

#[test]
fn a_much_shorter_prompt_that_drops_the_prefix_is_a_compaction() {
    let mut tracker = SessionTracker::default();
    let long = hashes(0..100);
    tracker.routed(turn("s", R0, &long), ms(0));
    // Extending the conversation is not a compaction, nor is a short prompt that keeps the
    // prefix (a retry with less context).
    let longer = hashes(0..110);
    assert!(tracker.routed(turn("s", R0, &longer), ms(1)).is_empty());
    let mut kept = hashes(0..60);
    kept.truncate(55);
    assert!(tracker.routed(turn("s", R0, &kept), ms(2)).is_empty());
    tracker.routed(turn("s", R0, &longer), ms(3));
    let summary = hashes(1_000..1_020);
    let events = tracker.routed(turn("s", R0, &summary), ms(4));
    assert_eq!(
        kinds(&events),
        [(
            "s",
            &LifecycleKind::Compaction {
                tokens_before: 110 * 16,
                tokens_after: 20 * 16,
            }
        )]
    );
}

#[test]
fn residency_reads_each_lineage_from_the_index() {
    let mut tracker = SessionTracker::default();
    let prompt = hashes(0..10);
    tracker.routed(turn("s", R0, &prompt), ms(0));
    tracker.routed(turn("s", R1, &prompt), ms(1));
    let mut index = KvIndex::new();
    index.apply(&IndexOp::Store {
        rank: R0,
        tier: Tier::Device,
        blocks: hashes(0..6),
        locals: Vec::new(),
    });
    index.apply(&IndexOp::Store {
        rank: R0,
        tier: Tier::Host,
        blocks: hashes(0..10),
        locals: Vec::new(),
    });
    index.apply(&IndexOp::Store {
        rank: R1,
        tier: Tier::Device,
        blocks: hashes(0..3),
        locals: Vec::new(),
    });
    let mut residency = tracker.residency(["s", "unknown"], &index);
    residency.sort_by_key(|r| r.rank);
    let view: Vec<_> = residency
        .iter()
        .map(|r| (r.rank, r.device_blocks, r.host_blocks))
        .collect();
    assert_eq!(view, [(R0, 6, 4), (R1, 3, 0)]);
}

#[test]
fn residency_follows_every_change_of_the_rank_and_of_the_lineage() {
    let mut tracker = SessionTracker::default();
    let prompt = hashes(0..10);
    tracker.routed(turn("s", R0, &prompt), ms(0));
    let store = |rank, tier, blocks| IndexOp::Store {
        rank,
        tier,
        blocks,
        locals: Vec::new(),
    };
    let device = |tracker: &SessionTracker, index: &KvIndex| -> Vec<(u32, u32)> {
        tracker
            .residency(["s"], index)
            .iter()
            .map(|r| (r.device_blocks, r.host_blocks))
            .collect()
    };
    let mut index = KvIndex::new();
    assert_eq!(device(&tracker, &index), []);
    index.apply(&store(R0, Tier::Device, hashes(0..4)));
    assert_eq!(device(&tracker, &index), [(4, 0)]);
    // Another rank's change leaves the answer (and what it was kept with) as it was.
    let r0 = index.rank_stamp(R0);
    index.apply(&store(R1, Tier::Device, hashes(0..10)));
    assert_eq!(index.rank_stamp(R0), r0);
    assert_eq!(device(&tracker, &index), [(4, 0)]);
    // The rank's own changes are seen: more stored, then a hole in the prefix.
    index.apply(&store(R0, Tier::Device, hashes(4..8)));
    assert_eq!(device(&tracker, &index), [(8, 0)]);
    index.apply(&IndexOp::Remove {
        rank: R0,
        tier: Tier::Device,
        blocks: hashes(2..3),
    });
    index.apply(&store(R0, Tier::Host, hashes(2..3)));
    assert_eq!(device(&tracker, &index), [(2, 6)]);
    // So is a new lineage on the rank, and another index (its stamps are its own).
    tracker.routed(turn("s", R0, &hashes(0..2)), ms(1));
    assert_eq!(device(&tracker, &index), [(2, 0)]);
    let other = KvIndex::new();
    assert_eq!(device(&tracker, &other), []);
}

#[test]
fn the_lineage_is_the_last_prompt_per_rank_most_recent_last() {
    let mut tracker = SessionTracker::default();
    tracker.routed(turn("s", R0, &hashes(0..4)), ms(0));
    tracker.routed(turn("s", R1, &hashes(0..6)), ms(1));
    tracker.routed(turn("s", R0, &hashes(0..9)), ms(2));
    assert_eq!(tracker.lineage("s").collect::<Vec<_>>(), [(R1, 6), (R0, 9)]);
    assert_eq!(tracker.lineage("unknown").count(), 0);
}

#[test]
fn hints_resolve_to_the_sessions_blocks_on_the_right_ranks() {
    let mut tracker = SessionTracker::default();
    let parent = hashes(0..8);
    tracker.routed(turn("p", R0, &parent), ms(0));
    let mut child = hashes(0..5);
    child.extend(hashes(500..503));
    let spawn = RoutedTurn {
        parent_session_id: Some("p"),
        ..turn("c", R1, &child)
    };
    tracker.routed(spawn, ms(1));
    tracker.routed(turn("p", R1, &parent), ms(2));

    let actions = |hint: KvHint| -> Vec<(Rank, ActionType, Vec<u64>)> {
        tracker
            .resolve(&hint)
            .into_iter()
            .map(|(rank, kind, payload)| (rank, kind, payload.block_hashes))
            .collect()
    };
    let ids = |v: &[SequenceHash]| v.iter().map(|h| h.0).collect::<Vec<_>>();

    // Demote: every rank the session was routed to, or only the target.
    assert_eq!(
        actions(KvHint::new("p", HintKind::Demote(HintTier::Host))),
        [
            (R0, ActionType::Demote, ids(&parent)),
            (R1, ActionType::Demote, ids(&parent))
        ]
    );
    let targeted = KvHint {
        target: Some(R0),
        ..KvHint::new("c", HintKind::Demote(HintTier::Host))
    };
    assert!(actions(targeted).is_empty(), "c was never on R0");
    // Prefetch: where the session was routed last.
    assert_eq!(
        actions(KvHint::new("p", HintKind::Prefetch(HintTier::Device))),
        [(R1, ActionType::Prefetch, ids(&parent))]
    );
    // Evict of a subagent: only what it does not share with its parent.
    assert_eq!(
        actions(KvHint::new("c", HintKind::Evict)),
        [(R1, ActionType::Evict, vec![500, 501, 502])]
    );
    // Share with a session on a rank that lacks the prefix: retained here, prefetched there.
    let mut other = SessionTracker::default();
    other.routed(turn("p", R0, &parent), ms(0));
    other.routed(turn("x", R1, &child), ms(1));
    let shared: Vec<_> = other
        .resolve(&KvHint::new("p", HintKind::Share("x".into())))
        .into_iter()
        .map(|(rank, kind, _)| (rank, kind))
        .collect();
    assert_eq!(
        shared,
        [(R0, ActionType::Retain), (R1, ActionType::Prefetch)]
    );
    let pin = tracker.resolve(&KvHint::new("c", HintKind::Pin(Duration::from_secs(3))));
    assert_eq!(pin[0].2.ttl_ms, Some(3_000));
    assert!(
        tracker
            .resolve(&KvHint::new("ghost", HintKind::Evict))
            .is_empty()
    );
}

#[test]
fn a_round_concerns_the_sessions_its_events_name_and_those_waiting_on_a_tool() {
    let mut tracker = SessionTracker::default();
    let prompt = hashes(0..4);
    for session in ["waits", "p", "quiet"] {
        tracker.routed(turn(session, R0, &prompt), ms(0));
    }
    let tool_call = TurnEnd {
        tool_call: true,
        ..TurnEnd::default()
    };
    tracker.turn_ended("waits", &tool_call, ms(1));
    let spawn = RoutedTurn {
        parent_session_id: Some("p"),
        ..turn("c", R1, &prompt)
    };
    let events = tracker.routed(spawn, ms(2));
    let sessions: Vec<&str> = tracker.round_sessions(&events).into_iter().collect();
    assert_eq!(sessions, ["c", "p", "waits"]);
    assert_eq!(
        tracker.round_sessions(&[]).into_iter().collect::<Vec<_>>(),
        ["waits"]
    );
}

#[test]
fn hints_become_actions_numbered_per_rank_in_order() {
    let mut tracker = SessionTracker::default();
    let (a, b) = (hashes(0..4), hashes(10..12));
    tracker.routed(turn("a", R0, &a), ms(0));
    tracker.routed(turn("a", R1, &a), ms(1));
    tracker.routed(turn("b", R1, &b), ms(2));
    let per_rank = tracker.actions(&[
        KvHint::new("a", HintKind::Demote(HintTier::Host)),
        KvHint::new("b", HintKind::Evict),
        KvHint::new("ghost", HintKind::Evict),
    ]);
    let seen: Vec<(Rank, &str, Option<ActionType>, usize)> = per_rank
        .iter()
        .flat_map(|(rank, actions)| {
            actions.iter().map(|a| {
                let blocks = a.payload.block_hashes.len();
                (*rank, a.action_id.as_str(), a.kind(), blocks)
            })
        })
        .collect();
    assert_eq!(
        seen,
        [
            (R0, "a1", Some(ActionType::Demote), 4),
            (R1, "a1", Some(ActionType::Demote), 4),
            (R1, "a2", Some(ActionType::Evict), 2),
        ]
    );
}

#[test]
fn it_is_bounded_and_forgets_the_least_recently_seen() {
    let mut tracker = SessionTracker::new(2);
    let prompt = hashes(0..4);
    tracker.routed(turn("a", R0, &prompt), ms(0));
    tracker.routed(turn("b", R0, &prompt), ms(1));
    tracker.routed(turn("a", R0, &prompt), ms(2));
    tracker.routed(turn("c", R0, &prompt), ms(3));
    assert_eq!(tracker.len(), 2);
    assert!(
        tracker
            .resolve(&KvHint::new("b", HintKind::Evict))
            .is_empty()
    );
    assert!(
        !tracker
            .resolve(&KvHint::new("a", HintKind::Evict))
            .is_empty()
    );
    let long = "x".repeat(MAX_SESSION_ID_BYTES + 1);
    tracker.routed(turn(&long, R0, &prompt), ms(4));
    assert!(
        tracker
            .resolve(&KvHint::new(long, HintKind::Evict))
            .is_empty()
    );
    assert_eq!(tracker.len(), 2);
}
