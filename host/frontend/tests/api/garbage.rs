//! No input makes a decoder panic; every rejection names a field.

use proptest::prelude::*;
use serde_json::{Value, json};
use switchyard_frontend::{ApiError, UpstreamChatDecoder, chat, completions, messages, responses};

use crate::support::fixture;

/// Every decoder on one body; the errors they return.
fn decode_all(body: &Value) -> Vec<ApiError> {
    let results = [
        chat::decode(body).err(),
        completions::decode(body).err(),
        responses::decode(body).err(),
        messages::decode(body).err(),
        messages::decode_count_tokens(body).err(),
    ];
    let mut upstream = UpstreamChatDecoder::new("r");
    // The engine side only needs to survive.
    let _ = upstream.decode_chunk(body);
    let _ = upstream.decode_response(body);
    let _ = upstream.decode_data(&body.to_string());
    results.into_iter().flatten().collect()
}

fn assert_names_a_field(body: &Value, err: &ApiError) {
    assert_eq!(err.status, 400, "{body}: {err}");
    let param = err
        .param
        .as_deref()
        .unwrap_or_else(|| panic!("no param for {body}: {err}"));
    assert!(!param.is_empty());
    assert!(err.message.starts_with(&format!("{param}: ")), "{err}");
}

const WRONG: fn() -> Vec<Value> = || {
    vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(1e300),
        json!(u64::MAX),
        json!(""),
        json!("x"),
        json!([]),
        json!([null]),
        json!({}),
        json!({"type": "zzz"}),
        json!({"type": 7}),
    ]
};

#[test]
fn assorted_garbage() {
    let mut bodies = WRONG();
    bodies.extend([
        json!({"model": "m"}),
        json!({"model": "m", "messages": "hello"}),
        json!({"model": "m", "messages": [null, 1, "x", []]}),
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]}),
        json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": null}]}]}),
        json!({"model": "m", "input": [{"type": "message"}], "prompt": [[[]]]}),
        json!({"model": "m", "input": [[]], "prompt": [1, "a"], "max_tokens": "many"}),
        json!({"model": ["m"], "messages": []}),
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]}),
        json!({"model": "m", "max_tokens": 1, "system": [{"type": "text"}], "messages": [{"role": "user", "content": "x"}]}),
        json!({"model": "m", "nvext": {"agent_hints": [], "cache_control": "1h"}}),
    ]);
    for body in &bodies {
        for err in decode_all(body) {
            assert_names_a_field(body, &err);
        }
    }
}

/// Every value of every fixture, replaced in turn by each wrong-typed value.
#[test]
fn every_field_of_every_fixture_replaced_by_garbage() {
    let mut checked = 0;
    for name in [
        "codex_responses.json",
        "claude_code_messages.json",
        "chat_parallel_tools.json",
    ] {
        let original = fixture(name);
        let mut pointers = Vec::new();
        collect_pointers(&original, String::new(), &mut pointers);
        for pointer in pointers {
            for wrong in WRONG() {
                let mut body = original.clone();
                if let Some(slot) = body.pointer_mut(&pointer) {
                    *slot = wrong;
                }
                for err in decode_all(&body) {
                    assert_names_a_field(&body, &err);
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} mutations");
}

fn collect_pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let child_at = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(child_at.clone());
                collect_pointers(child, child_at, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let child_at = format!("{at}/{i}");
                out.push(child_at.clone());
                collect_pointers(child, child_at, out);
            }
        }
        _ => {}
    }
}

/// JSON built from the APIs' own field names, nested at random.
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let keys = prop::sample::select(vec![
        "model",
        "messages",
        "input",
        "prompt",
        "role",
        "content",
        "type",
        "text",
        "tool_calls",
        "function",
        "name",
        "arguments",
        "id",
        "call_id",
        "tool_call_id",
        "tool_use_id",
        "output",
        "tools",
        "tool_choice",
        "parameters",
        "input_schema",
        "system",
        "instructions",
        "max_tokens",
        "stop",
        "stream",
        "stream_options",
        "nvext",
        "agent_hints",
        "cache_control",
        "ttl",
        "thinking",
        "budget_tokens",
        "source",
        "data",
        "image_url",
        "url",
        "summary",
        "reasoning",
        "text",
        "format",
        "choices",
        "delta",
        "finish_reason",
        "usage",
        "index",
        "error",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "developer",
            "tool",
            "text",
            "function",
            "message",
            "function_call",
            "function_call_output",
            "reasoning",
            "tool_use",
            "tool_result",
            "thinking",
            "image",
            "image_url",
            "input_text",
            "auto",
            "any",
            "ephemeral",
            "5m",
            "",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_json_never_panics_and_errors_name_a_field(body in arbitrary_json()) {
        for err in decode_all(&body) {
            assert_names_a_field(&body, &err);
        }
    }
}
