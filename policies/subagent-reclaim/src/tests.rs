//! The component: a finished subagent is evicted, once, as the core strategy does.

use super::*;
use switchyard_policy_sdk::testing::KvHintsHarness;
use switchyard_policy_sdk::{
    EventKind, Hint, HintKind, IndexState, LifecycleEvent, find_extension,
};

fn event(session: &str, kind: EventKind) -> LifecycleEvent {
    LifecycleEvent {
        session_id: session.into(),
        at_ms: 1_000,
        kind,
        extensions: Vec::new(),
    }
}

#[test]
fn a_finished_subagent_is_evicted_once() {
    let mut component = KvHintsHarness::new(Component::default());
    let meta = switchyard_policy_sdk::KvHintPolicy::metadata(component.policy());
    assert_eq!(
        find_extension(&meta.extensions, "max_sessions"),
        Some("16384")
    );
    let index = IndexState::default();
    let end = [event("parent", EventKind::SubagentEnd("child".into()))];
    assert_eq!(
        component.on_events(1_000, &end, &index),
        [Hint::new("child", HintKind::Evict)]
    );
    let child_end = [event("child", EventKind::SessionEnd)];
    assert!(component.on_events(1_001, &child_end, &index).is_empty());
}
