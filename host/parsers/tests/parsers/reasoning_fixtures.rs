//! Every reasoning parser on output in its model's format, whole and under every chunking.

use switchyard_parsers::REASONING_PARSERS;

use crate::support::{assert_output, run_reasoning, same_for_every_split};

struct Fixture {
    parser: &'static str,
    input: &'static str,
    reasoning: &'static str,
    text: &'static str,
}

const FIXTURES: &[Fixture] = &[
    // The template wrote `<think>`: everything up to `</think>` is reasoning.
    Fixture {
        parser: "deepseek_r1",
        input: "2 + 2… \"four\" 🤔\n</think>\n\nThe answer is 4.",
        reasoning: "2 + 2… \"four\" 🤔\n",
        text: "\n\nThe answer is 4.",
    },
    Fixture {
        parser: "deepseek_r1",
        input: "<think>short</think>ok",
        reasoning: "short",
        text: "ok",
    },
    Fixture {
        parser: "deepseek_r1",
        input: "cut off while thinking <",
        reasoning: "cut off while thinking <",
        text: "",
    },
    Fixture {
        parser: "qwen3",
        input: "<think>\nplan ✓\n</think>\n\nAnswer 🎉",
        reasoning: "\nplan ✓\n",
        text: "\n\nAnswer 🎉",
    },
    // Without a leading `<think>` it is all text, tags included.
    Fixture {
        parser: "qwen3",
        input: "No thinking <think>here</think>.",
        reasoning: "",
        text: "No thinking <think>here</think>.",
    },
    // A tool call opened before `</think>` ends the reasoning and stays in the text.
    Fixture {
        parser: "qwen3",
        input: "<think>need the weather<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        reasoning: "need the weather",
        text: "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    },
    Fixture {
        parser: "glm45",
        input: "<think>hmm</think>Sure.",
        reasoning: "hmm",
        text: "Sure.",
    },
    Fixture {
        parser: "glm45",
        input: "<think>a tool<tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call>",
        reasoning: "a tool",
        text: "<tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call>",
    },
    Fixture {
        parser: "kimi",
        input: "◁think▷深思◁/think▷答案",
        reasoning: "深思",
        text: "答案",
    },
    Fixture {
        parser: "kimi",
        input: "plain ◁think▷",
        reasoning: "",
        text: "plain ◁think▷",
    },
    Fixture {
        parser: "minimax_m2",
        input: "thinking…</think>\n\nanswer",
        reasoning: "thinking…",
        text: "\n\nanswer",
    },
    Fixture {
        parser: "minimax_m2_append_think",
        input: "thinking…</think>\n\nanswer",
        reasoning: "",
        text: "<think>thinking…</think>\n\nanswer",
    },
    Fixture {
        parser: "minimax_m2_append_think",
        input: "x",
        reasoning: "",
        text: "<think>x",
    },
    Fixture {
        parser: "gpt_oss",
        input: "<|channel|>analysis<|message|>Think \"hard\" 🧠<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>",
        reasoning: "Think \"hard\" 🧠",
        text: "Answer.",
    },
    // Calls pass through as raw text for a tool parser further on.
    Fixture {
        parser: "gpt_oss",
        input: "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
        reasoning: "Call it.",
        text: "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}<|call|>",
    },
];

#[test]
fn every_reasoning_parser_has_fixtures() {
    for name in REASONING_PARSERS {
        assert!(FIXTURES.iter().any(|f| f.parser == *name), "{name}");
    }
}

#[test]
fn fixtures_parse_the_same_under_every_split() {
    for f in FIXTURES {
        let events = same_for_every_split(f.input, |chunks| run_reasoning(f.parser, chunks));
        assert_output(&events, f.text, f.reasoning, &[]);
    }
}

#[test]
fn reasoning_streams_before_its_end_tag() {
    let mut parser = switchyard_parsers::reasoning_parser("qwen3").unwrap();
    let events = parser.push("<think>step one, step two </th");
    assert_eq!(
        events,
        vec![switchyard_parsers::ParsedEvent::Reasoning(
            "step one, step two ".into()
        )]
    );
}

#[test]
fn an_empty_output_is_empty() {
    for name in REASONING_PARSERS {
        let events = run_reasoning(name, &[]);
        let expected = if *name == "minimax_m2_append_think" {
            "<think>"
        } else {
            ""
        };
        assert_output(&events, expected, "", &[]);
    }
}
