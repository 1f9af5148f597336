//! `format_tool_calls(name, calls)` read back by `tool_parser(name)` gives the same calls, for
//! every format, however the text is chunked.

use proptest::prelude::*;
use serde_json::{Map, Value};
use switchyard_parsers::{CallEmission, ParsedOutput, TOOL_PARSERS, ToolCall, format_tool_calls};

use crate::support::run_tool;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        // Quarters are exact in binary, so the value does not depend on float parsing precision.
        any::<i32>().prop_map(|n| Value::from(f64::from(n) / 4.0)),
        // Quotes, backslashes, newlines, markup characters, non-ASCII and text that looks like
        // JSON or like the formats' own tags.
        "[a-z \"'\\\\\n\t<>/{}\\[\\]=:,é中😀]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("42"),
            Just("true"),
            Just(" padded "),
            Just("</parameter>"),
            Just("<|call|>")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z ]{1,5}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    let args = prop::collection::btree_map("[a-z_][a-z0-9_]{0,8}", json_value(), 0..4);
    ("[a-z][a-z0-9_]{0,10}", args).prop_map(|(name, args)| ToolCall {
        name,
        arguments: Value::Object(args.into_iter().collect()),
    })
}

/// Char boundaries of `text` picked by `picks`, sorted, to split it at.
fn split_at<'t>(text: &'t str, picks: &[prop::sample::Index]) -> Vec<&'t str> {
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let mut cuts: Vec<usize> = picks
        .iter()
        .map(|p| bounds[p.index(bounds.len().max(1))])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut chunks = Vec::new();
    let mut from = 0;
    for cut in cuts {
        chunks.push(&text[from..cut]);
        from = cut;
    }
    chunks.push(&text[from..]);
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn formatted_calls_parse_back(
        calls in prop::collection::vec(tool_call(), 1..4),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        for name in TOOL_PARSERS {
            let text = format_tool_calls(name, &calls).unwrap();
            for emission in [CallEmission::Streaming, CallEmission::Complete] {
                let events = run_tool(name, emission, &split_at(&text, &picks));
                let output: ParsedOutput = events.into_iter().collect();
                prop_assert!(output.text.trim().is_empty(), "{name}: stray text {:?} from {text}", output.text);
                prop_assert_eq!(output.calls.len(), calls.len(), "{}: {}", name, text);
                for (got, want) in output.calls.iter().zip(&calls) {
                    prop_assert_eq!(&got.name, &want.name);
                    let args: Value = serde_json::from_str(&got.arguments).unwrap();
                    prop_assert_eq!(&args, &want.arguments, "{}: {}", name, text);
                }
            }
        }
    }

    /// Output cut off anywhere: the complete calls are kept and the rest comes back as text.
    #[test]
    fn truncated_output_keeps_complete_calls_and_returns_the_rest(
        calls in prop::collection::vec(tool_call(), 1..3),
        cut in any::<prop::sample::Index>(),
    ) {
        for name in TOOL_PARSERS {
            let text = format_tool_calls(name, &calls).unwrap();
            let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            let truncated = &text[..bounds[cut.index(bounds.len())]];
            let output: ParsedOutput =
                run_tool(name, CallEmission::Complete, &[truncated]).into_iter().collect();
            prop_assert!(output.calls.len() <= calls.len());
            for (got, want) in output.calls.iter().zip(&calls) {
                prop_assert_eq!(&got.name, &want.name, "{}: {}", name, truncated);
                let args: Value = serde_json::from_str(&got.arguments).unwrap();
                prop_assert_eq!(&args, &want.arguments);
            }
            prop_assert!(
                truncated.trim_end().ends_with(output.text.trim()),
                "{name}: text {:?} is not the tail of {truncated:?}", output.text
            );
        }
    }
}

#[test]
fn formats_refuse_what_they_cannot_write() {
    let bad_name = [ToolCall {
        name: "has space".into(),
        arguments: serde_json::json!({}),
    }];
    let not_object = [ToolCall {
        name: "f".into(),
        arguments: serde_json::json!([1]),
    }];
    for name in TOOL_PARSERS {
        assert!(format_tool_calls(name, &bad_name).is_err(), "{name}");
        assert!(format_tool_calls(name, &not_object).is_err(), "{name}");
    }
    let bad_key = [ToolCall {
        name: "f".into(),
        arguments: serde_json::json!({"a-b": 1}),
    }];
    let err = format_tool_calls("pythonic", &bad_key)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a Python identifier"), "{err}");
}
