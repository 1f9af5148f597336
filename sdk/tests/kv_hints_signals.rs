//! KV-hint inputs: tool results survive the trip through index-state extension columns, older
//! hosts' inputs (no columns) decode to none, and the harness checks hints like the host.

use switchyard_policy_sdk::testing::{KvHintsHarness, check_hints};
use switchyard_policy_sdk::{
    EventKind, Hint, HintKind, IndexState, KvHintPolicy, LifecycleEvent, PolicyMetadata, Residency,
    THINKING_AT_TOKEN_EXTENSION, TOOL_RESULT_POSITION_COLUMN, TOOL_RESULT_SESSION_COLUMN,
    TOOL_RESULT_TOOL_COLUMN, TOOL_RESULT_WAITED_COLUMN, ToolResult, find_extension,
};

fn result(session: &str, tool: Option<&str>, waited_ms: u64, position: usize) -> ToolResult {
    ToolResult {
        session_id: session.into(),
        at_ms: 1_000 + waited_ms,
        tool_name: tool.map(str::to_owned),
        waited_ms,
        position,
    }
}

fn resident(sessions: &[&str]) -> IndexState {
    IndexState {
        residency: Residency {
            session_ids: sessions.iter().map(|s| (*s).to_owned()).collect(),
            worker_ids: vec![0; sessions.len()],
            dp_ranks: vec![1; sessions.len()],
            device_blocks: vec![10; sessions.len()],
            host_blocks: vec![0; sessions.len()],
            disk_blocks: vec![0; sessions.len()],
        },
        ..IndexState::default()
    }
}

#[test]
fn tool_results_round_trip_with_awkward_names() {
    let results = vec![
        result("a,b", Some("mcp, \"search\""), 12_000, 0),
        result("c", None, 0, 2),
        result("d", Some(""), 750, 2),
    ];
    let index = resident(&["a,b"]).with_tool_results(&results);
    assert_eq!(index.tool_results(), results);
    assert_eq!(
        find_extension(&index.extensions, TOOL_RESULT_TOOL_COLUMN),
        Some(r#""mcp, ""search""",,"""#)
    );
}

#[test]
fn no_columns_means_no_tool_results_and_bad_rows_are_skipped() {
    assert!(resident(&["a"]).tool_results().is_empty());
    assert!(
        resident(&["a"])
            .with_tool_results(&[])
            .extensions
            .is_empty()
    );
    // A row without a session or a wait is dropped; a missing position puts it last.
    let index = IndexState {
        extensions: vec![
            (TOOL_RESULT_SESSION_COLUMN.into(), "a,,c".into()),
            (TOOL_RESULT_WAITED_COLUMN.into(), "5,6,x".into()),
            (TOOL_RESULT_POSITION_COLUMN.into(), "".into()),
        ],
        ..IndexState::default()
    };
    assert_eq!(
        index.tool_results(),
        [ToolResult {
            session_id: "a".into(),
            at_ms: 0,
            tool_name: None,
            waited_ms: 5,
            position: usize::MAX,
        }]
    );
}

#[test]
fn hints_must_name_reported_sessions_and_ranks() {
    let spawn = LifecycleEvent {
        session_id: "p".into(),
        at_ms: 5,
        kind: EventKind::SubagentSpawn("c".into()),
        extensions: Vec::new(),
    };
    let index = resident(&["r"]).with_tool_results(&[result("t", None, 10, 1)]);
    let fine = [
        Hint::new("p", HintKind::Share("c".into())),
        Hint::new("t", HintKind::Evict),
        Hint {
            target: Some((0, 1)),
            ..Hint::new("r", HintKind::Retain)
        },
    ];
    assert_eq!(
        check_hints(&fine, std::slice::from_ref(&spawn), &index),
        Ok(())
    );
    let stranger = [Hint::new("p", HintKind::Share("ghost".into()))];
    assert!(
        check_hints(&stranger, std::slice::from_ref(&spawn), &index)
            .unwrap_err()
            .contains("ghost")
    );
    let far = [Hint {
        target: Some((3, 0)),
        ..Hint::new("r", HintKind::Retain)
    }];
    assert!(check_hints(&far, &[spawn], &index).is_err());
}

/// Evicts every session that has a tool result: names only what the host reported.
#[derive(Default)]
struct EvictReturning;

impl KvHintPolicy for EvictReturning {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new("evict-returning", "0.1.0", "evicts returning sessions")
    }

    fn on_events(
        &mut self,
        _now: u64,
        _events: &[LifecycleEvent],
        index: &IndexState,
    ) -> Vec<Hint> {
        index
            .tool_results()
            .into_iter()
            .map(|r| Hint::new(r.session_id, HintKind::Evict))
            .collect()
    }
}

#[test]
fn the_harness_passes_hints_about_tool_results() {
    let mut harness = KvHintsHarness::new(EvictReturning);
    let index = IndexState::default().with_tool_results(&[result("s", Some("bash"), 9, 0)]);
    assert_eq!(
        harness.on_events(10, &[], &index),
        [Hint::new("s", HintKind::Evict)]
    );
}

#[test]
fn a_thinking_span_says_where_it_starts_and_other_events_say_nothing() {
    let event = |kind, extensions: &[(&str, &str)]| LifecycleEvent {
        session_id: "s".into(),
        at_ms: 5,
        kind,
        extensions: extensions
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    let at = [(THINKING_AT_TOKEN_EXTENSION, "4096")];
    assert_eq!(THINKING_AT_TOKEN_EXTENSION, "switchyard.thinking.at-token");
    assert_eq!(
        event(EventKind::ThinkingStart, &at).thinking_at_token(),
        Some(4096)
    );
    assert_eq!(
        event(EventKind::ThinkingEnd(300), &at).thinking_at_token(),
        Some(4096)
    );
    // An older host sends none; another event's extensions are not read as one.
    assert_eq!(
        event(EventKind::ThinkingEnd(300), &[]).thinking_at_token(),
        None
    );
    assert_eq!(event(EventKind::SessionEnd, &at).thinking_at_token(), None);
    assert_eq!(
        event(
            EventKind::ThinkingStart,
            &[(THINKING_AT_TOKEN_EXTENSION, "x")]
        )
        .thinking_at_token(),
        None
    );
}
