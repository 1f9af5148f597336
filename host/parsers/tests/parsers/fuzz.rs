//! Hostile model output: arbitrary text, and soup of every format's tags, fed to every parser at
//! arbitrary split points. Properties: no panic, and streaming in pieces gives the same events
//! as parsing at once (the crate is split-safe by design; see `lib.rs`).
//!
//! 256 cases per run; `PROPTEST_CASES=100000 cargo test -p switchyard-parsers --test parsers fuzz`
//! for a longer one.

use proptest::prelude::*;
use switchyard_parsers::{
    CallEmission, OutputParser, ParsedEvent, REASONING_PARSERS, TOOL_PARSERS,
};

use crate::support::{normalize, run_reasoning, run_tool};

/// Tags and fragments of every tool and reasoning format, and characters that end or escape
/// them, so that generated text reaches deep into each parser's states.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"f\", \"arguments\": ",
    "{\"a\": [1, {\"b\": \"<\"}]}",
    "{",
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
    "</minimax:tool_call>",
    "<invoke name=\"f\">",
    "<parameter name=\"a\">",
    "</invoke>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>functions.f:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "function",
    "```json\n",
    "```",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_tag|>",
    ";",
    "[f(a=1)",
    "[",
    "]",
    "(",
    ")",
    "=",
    "<|start|>assistant",
    "<|channel|>analysis",
    "<|channel|>final",
    "<|channel|>commentary to=functions.g",
    "<|constrain|>json",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<think>",
    "</think>",
    "◁think▷",
    "◁/think▷",
    "<",
    "</",
    "<|",
    "é😀",
    "\n",
    " ",
    "\"",
    "\\",
    "'",
];

/// Text a model might emit, or not: glued pieces of every format, or any string at all.
fn output_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(PIECES), 0..24).prop_map(|p| p.concat()),
        1 => any::<String>(),
        1 => prop::collection::vec(
            prop_oneof![prop::sample::select(PIECES).prop_map(str::to_owned), any::<String>()],
            0..8
        )
        .prop_map(|p| p.concat()),
    ]
}

/// `text` cut at the char boundaries `picks` choose (none for empty text).
fn split_at<'t>(text: &'t str, picks: &[prop::sample::Index]) -> Vec<&'t str> {
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    let mut cuts: Vec<usize> = if bounds.is_empty() {
        Vec::new()
    } else {
        picks
            .iter()
            .map(|p| bounds[p.index(bounds.len())])
            .collect()
    };
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

/// What the gateway runs: a reasoning parser, then a tool parser, over `chunks`.
fn run_output(reasoning: Option<&str>, tools: Option<&str>, chunks: &[&str]) -> Vec<ParsedEvent> {
    let mut parser = OutputParser::with_emission(reasoning, tools, "c_", CallEmission::Streaming)
        .expect("known parser names");
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk));
    }
    events.extend(parser.finish());
    normalize(events)
}

proptest! {
    // 256 cases (proptest's default) unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_tool_parsers_split_invariant(
        text in output_text(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let chunks = split_at(&text, &picks);
        for parser in TOOL_PARSERS {
            for emission in [CallEmission::Streaming, CallEmission::Complete] {
                let whole = run_tool(parser, emission, &[&text]);
                let split = run_tool(parser, emission, &chunks);
                prop_assert_eq!(split, whole, "{} {:?} chunks {:?}", parser, emission, chunks);
            }
        }
    }

    #[test]
    fn fuzz_reasoning_parsers_split_invariant(
        text in output_text(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let chunks = split_at(&text, &picks);
        for parser in REASONING_PARSERS {
            let whole = run_reasoning(parser, &[&text]);
            let split = run_reasoning(parser, &chunks);
            prop_assert_eq!(split, whole, "{} chunks {:?}", parser, chunks);
        }
    }

    #[test]
    fn fuzz_output_parser_split_invariant(
        text in output_text(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        reasoning in prop::option::of(prop::sample::select(REASONING_PARSERS)),
        tools in prop::option::of(prop::sample::select(TOOL_PARSERS)),
    ) {
        let chunks = split_at(&text, &picks);
        let whole = run_output(reasoning, tools, &[&text]);
        let split = run_output(reasoning, tools, &chunks);
        prop_assert_eq!(split, whole, "{:?}+{:?} chunks {:?}", reasoning, tools, chunks);
    }
}
