//! The component: its metadata lists the native defaults, and a tool call through the SDK
//! harness is demoted and prefetched exactly when the core strategy does it.

use super::*;
use kv_hints_adapter::{index_state, lifecycle_events, sdk_hints};
use std::time::Duration;
use switchyard_core::kv_hints::KvHintPolicy as _;
use switchyard_policy_sdk::testing::KvHintsHarness;
use switchyard_policy_sdk::{
    EventKind, Hint, HintKind, IndexState, LifecycleEvent, Residency, Tier, ToolCall, ToolResult,
    find_extension,
};

#[test]
fn metadata_lists_the_native_defaults() {
    let component = KvHintsHarness::new(Component::default());
    let meta = switchyard_policy_sdk::KvHintPolicy::metadata(component.policy());
    assert_eq!(meta.name, "demote-on-tool-call");
    let param = |key| find_extension(&meta.extensions, key);
    assert_eq!(param("demote_threshold"), Some("2000ms"));
    assert_eq!(param("prefetch_lead"), Some("500ms"));
    assert_eq!(param("demote_to"), Some("host"));
}

#[test]
fn a_slow_tool_is_demoted_and_prefetched_like_the_core_does() {
    let mut component = KvHintsHarness::new(Component::default());
    let mut core = Spec::policy();
    let index = IndexState {
        residency: Residency {
            session_ids: vec!["s".into()],
            worker_ids: vec![0],
            dp_ranks: vec![0],
            device_blocks: vec![500],
            host_blocks: vec![0],
            disk_blocks: vec![0],
        },
        ..IndexState::default()
    };
    let call = |at_ms| LifecycleEvent {
        session_id: "s".into(),
        at_ms,
        kind: EventKind::TurnEndWithToolCall(ToolCall {
            tool_name: Some("pytest".into()),
            context_tokens: 8_000,
        }),
        extensions: Vec::new(),
    };
    let returned = index.clone().with_tool_results(&[ToolResult {
        session_id: "s".into(),
        at_ms: 30_000,
        tool_name: Some("pytest".into()),
        waited_ms: 30_000,
        position: 0,
    }]);
    let steps = [
        (0, vec![call(0)], &index),
        (30_000, vec![call(30_000)], &returned),
        (59_400, vec![], &index),
        (59_500, vec![], &index),
    ];
    let mut answers = Vec::new();
    for (now_ms, events, index) in steps {
        let got = component.on_events(now_ms, &events, index);
        let native = core.on_events(
            &lifecycle_events(&events, index),
            &index_state(index),
            Duration::from_millis(now_ms),
        );
        assert_eq!(got, sdk_hints(native), "at {now_ms} ms");
        answers.push(got);
    }
    assert_eq!(
        answers,
        [
            vec![],
            vec![Hint::new("s", HintKind::Demote(Tier::Host))],
            vec![],
            vec![Hint::new("s", HintKind::Prefetch(Tier::Device))],
        ]
    );
}
