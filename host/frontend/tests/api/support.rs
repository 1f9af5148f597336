//! Shared test data: fixtures, the golden reply, meta.

use serde_json::Value;
use switchyard_frontend::{FinishReason, ParsedEvent, ReplyEvent, ReplyMeta, SseFrame, Usage};

/// A fixture under `tests/fixtures/`.
pub(crate) fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Reasoning, text and two tool calls, split in pieces, then finish and usage.
pub(crate) fn golden_events() -> Vec<ReplyEvent> {
    let out = ReplyEvent::Output;
    vec![
        out(ParsedEvent::Reasoning("Let me".into())),
        out(ParsedEvent::Reasoning(" think.".into())),
        out(ParsedEvent::Text("Calling".into())),
        out(ParsedEvent::Text(" tools.".into())),
        out(ParsedEvent::ToolCallStart {
            index: 0,
            id: "call_a".into(),
            name: "get_weather".into(),
        }),
        out(ParsedEvent::ToolCallArguments {
            index: 0,
            delta: "{\"city\":".into(),
        }),
        out(ParsedEvent::ToolCallArguments {
            index: 0,
            delta: "\"Paris\"}".into(),
        }),
        out(ParsedEvent::ToolCallStart {
            index: 1,
            id: "call_b".into(),
            name: "get_time".into(),
        }),
        out(ParsedEvent::ToolCallArguments {
            index: 1,
            delta: "{}".into(),
        }),
        ReplyEvent::Finish {
            reason: FinishReason::ToolCalls,
        },
        ReplyEvent::Usage(Usage {
            prompt_tokens: 100,
            completion_tokens: 20,
            cached_tokens: 64,
            reasoning_tokens: Some(5),
        }),
    ]
}

/// The meta of the golden reply.
pub(crate) fn meta() -> ReplyMeta {
    ReplyMeta {
        include_usage: true,
        prompt_tokens: Some(100),
        ..ReplyMeta::new("req1", 1_700_000_000, "m")
    }
}

/// Frames as (event name, parsed data); `[DONE]` stays a string.
pub(crate) fn parsed(frames: &[SseFrame]) -> Vec<(Option<&'static str>, Value)> {
    frames
        .iter()
        .map(|f| {
            assert!(!f.data.contains('\n'), "data must be one line: {}", f.data);
            let data =
                serde_json::from_str(&f.data).unwrap_or_else(|_| Value::from(f.data.clone()));
            (f.event, data)
        })
        .collect()
}
