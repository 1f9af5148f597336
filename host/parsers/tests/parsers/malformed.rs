//! Malformed markup is returned as text, never lost, and never panics.

use switchyard_parsers::{CallEmission, ParsedOutput, TOOL_PARSERS};

use crate::support::{assert_output, call, run_tool, same_for_every_split};

/// Markup that is not a well-formed call, per format: invalid JSON, a missing name, wrong
/// structure, or a call cut off.
const BROKEN: &[(&str, &str)] = &[
    (
        "hermes",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {'a': 1}}\n</tool_call>",
    ),
    ("hermes", "<tool_call>{\"arguments\": {}}</tool_call>"),
    (
        "hermes",
        "<tool_call>{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}</tool_call>",
    ),
    (
        "hermes",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1",
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n",
    ),
    ("qwen3_coder", "<tool_call>\nnot a function\n</tool_call>"),
    (
        "minimax_m2",
        "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1</parameter>\n",
    ),
    (
        "glm47",
        "<tool_call>f<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>",
    ),
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": }<|tool_call_end|><|tool_calls_section_end|>",
    ),
    ("kimi_k2", "<|tool_calls_section_begin|>"),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1,}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    (
        "deepseek_v3_1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    ("llama3_json", "{\"result\": 42}"),
    (
        "llama3_json",
        "<|python_tag|>brave_search.call(query=\"x\")",
    ),
    ("mistral", "[TOOL_CALLS][{\"name\": 3, \"arguments\": {}}]"),
    ("mistral", "[TOOL_CALLS]f[ARGS]{\"a\": tru}"),
    ("pythonic", "[f(1, 2)]"),
    ("pythonic", "[f(a=1), g(b=2)"),
    (
        "harmony",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\" 1}<|call|>",
    ),
    (
        "harmony",
        "<|start|>assistant<|channel|>commentary to=functions.f",
    ),
];

#[test]
fn every_format_has_broken_samples() {
    for name in TOOL_PARSERS {
        assert!(BROKEN.iter().any(|(parser, _)| parser == name), "{name}");
    }
}

#[test]
fn broken_markup_comes_back_as_text_when_calls_are_held_until_complete() {
    for (parser, input) in BROKEN {
        let text = format!("before {input} after");
        let events = same_for_every_split(&text, |chunks| {
            run_tool(parser, CallEmission::Complete, chunks)
        });
        let output: ParsedOutput = events.into_iter().collect();
        assert!(
            output.calls.is_empty(),
            "{parser}: {input} gave {:?}",
            output.calls
        );
        assert_eq!(output.text, text, "{parser}");
    }
}

#[test]
fn broken_markup_comes_back_as_text_when_streaming_too() {
    for (parser, input) in BROKEN {
        let text = format!("before {input} after");
        let events = same_for_every_split(&text, |chunks| {
            run_tool(parser, CallEmission::Streaming, chunks)
        });
        let output: ParsedOutput = events.into_iter().collect();
        // A call may have been announced before the markup broke; its raw text comes back all the same.
        assert_eq!(output.text, text, "{parser}");
    }
}

#[test]
fn a_failed_call_does_not_take_an_index_when_held() {
    let input = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    let events = run_tool("hermes", CallEmission::Complete, &[input]);
    let raw = "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>";
    assert_output(&events, raw, "", &[call("g", serde_json::json!({}))]);
}

#[test]
fn a_missing_closing_tag_keeps_a_complete_call() {
    for (parser, input) in [
        (
            "hermes",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        ),
        (
            "kimi_k2",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}",
        ),
        (
            "deepseek_v3_1",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}",
        ),
        (
            "harmony",
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}",
        ),
        (
            "minimax_m2",
            "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter></invoke>",
        ),
    ] {
        let mut expected = call("f", serde_json::json!({"a": 1}));
        if parser == "kimi_k2" {
            expected.id = Some("functions.f:0");
        }
        let events = same_for_every_split(input, |chunks| {
            run_tool(parser, CallEmission::Complete, chunks)
        });
        assert_output(&events, "", "", &[expected]);
    }
}

#[test]
fn arbitrary_markup_soup_never_panics_and_is_split_invariant() {
    // Pieces of every format, glued in odd orders.
    let pieces = [
        "<tool_call>",
        "</tool_call>",
        "{\"name\": \"f\", ",
        "\"arguments\": {\"a\": [1, {\"b\": \"<\"}]}",
        "}",
        "<function=f>",
        "<parameter=a>",
        "</parameter>",
        "</function>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<minimax:tool_call>",
        "<invoke name=\"f\">",
        "</invoke>",
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>functions.f:0",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "```json\n",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
        ";",
        "[f(a=1)",
        "]",
        "<|channel|>analysis",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        " to=functions.g",
        "é😀",
        "\n",
        "\"",
        "\\",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..40 {
        let mut text = String::new();
        for _ in 0..12 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            text.push_str(pieces[(seed % pieces.len() as u64) as usize]);
        }
        for parser in TOOL_PARSERS {
            for emission in [CallEmission::Streaming, CallEmission::Complete] {
                let events =
                    same_for_every_split(&text, |chunks| run_tool(parser, emission, chunks));
                let output: ParsedOutput = events.into_iter().collect();
                for call in &output.calls {
                    if emission == CallEmission::Complete {
                        assert!(
                            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
                                &call.arguments
                            )
                            .is_ok(),
                            "{parser}: {:?} from {text:?}",
                            call.arguments
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn prose_that_mentions_tags_starts_no_call() {
    for (parser, text) in [
        (
            "hermes",
            "Wrap calls in <tool_call> tags, like <tool_call>this</tool_call>.",
        ),
        ("glm47", "Use the <tool_call> tag.\nIt wraps calls."),
        ("qwen3_coder", "Write <function=name> then parameters."),
        (
            "pythonic",
            "See [docs](url) and [f(x) for x in xs] or [run(1)].",
        ),
        ("llama3_json", "Use <|python_tag|> before code."),
    ] {
        let events = same_for_every_split(text, |chunks| {
            run_tool(parser, CallEmission::Streaming, chunks)
        });
        assert_output(&events, text, "", &[]);
    }
}
