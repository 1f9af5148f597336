//! The component: a spawn shares the parent's prefix, and the parent outlives its subagent.

use super::*;
use switchyard_policy_sdk::testing::KvHintsHarness;
use switchyard_policy_sdk::{EventKind, Hint, HintKind, IndexState, LifecycleEvent, Residency};

fn event(session: &str, kind: EventKind) -> LifecycleEvent {
    LifecycleEvent {
        session_id: session.into(),
        at_ms: 1_000,
        kind,
        extensions: Vec::new(),
    }
}

#[test]
fn a_parent_shares_and_waits_for_its_subagent() {
    let mut component = KvHintsHarness::new(Component::default());
    let index = IndexState {
        residency: Residency {
            session_ids: vec!["parent".into()],
            worker_ids: vec![0],
            dp_ranks: vec![0],
            device_blocks: vec![100],
            host_blocks: vec![0],
            disk_blocks: vec![0],
        },
        ..IndexState::default()
    };
    let spawn = [event("parent", EventKind::SubagentSpawn("child".into()))];
    assert_eq!(
        component.on_events(1_000, &spawn, &index),
        [Hint::new("parent", HintKind::Share("child".into()))]
    );
    let parent_end = [event("parent", EventKind::SessionEnd)];
    assert!(component.on_events(2_000, &parent_end, &index).is_empty());
    assert_eq!(component.policy().policy().live_subagents("parent"), 1);
    let child_end = [event("child", EventKind::SessionEnd)];
    assert_eq!(
        component.on_events(3_000, &child_end, &index),
        [
            Hint::new("child", HintKind::Evict),
            Hint::new("parent", HintKind::Evict)
        ]
    );
}
