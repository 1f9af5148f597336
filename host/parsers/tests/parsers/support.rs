//! Helpers: run parsers over chunked input, normalise events, compare with expectations.

use serde_json::Value;
use switchyard_parsers::{
    CallEmission, CallIds, ParsedEvent, ParsedOutput, reasoning_parser, tool_parser_with,
};

/// The id prefix every test uses.
pub(crate) const PREFIX: &str = "call_t_";

/// Merges neighbouring events of one kind, so that outputs of different chunkings compare equal.
/// (Written independently of the crate's own merging, on purpose.)
pub(crate) fn normalize(events: impl IntoIterator<Item = ParsedEvent>) -> Vec<ParsedEvent> {
    let mut out: Vec<ParsedEvent> = Vec::new();
    for event in events {
        let merged = match (out.last_mut(), &event) {
            (Some(ParsedEvent::Text(a)), ParsedEvent::Text(b)) => {
                a.push_str(b);
                true
            }
            (Some(ParsedEvent::Reasoning(a)), ParsedEvent::Reasoning(b)) => {
                a.push_str(b);
                true
            }
            (
                Some(ParsedEvent::ToolCallArguments { index: i, delta: a }),
                ParsedEvent::ToolCallArguments { index: j, delta: b },
            ) if i == j => {
                a.push_str(b);
                true
            }
            _ => false,
        };
        let empty = matches!(&event, ParsedEvent::Text(s) | ParsedEvent::Reasoning(s) if s.is_empty())
            || matches!(&event, ParsedEvent::ToolCallArguments { delta, .. } if delta.is_empty());
        if !merged && !empty {
            out.push(event);
        }
    }
    out
}

/// Runs the tool parser `name` over `chunks`.
pub(crate) fn run_tool(name: &str, emission: CallEmission, chunks: &[&str]) -> Vec<ParsedEvent> {
    let mut parser =
        tool_parser_with(name, CallIds::new(PREFIX), emission).expect("a known tool parser");
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk));
    }
    events.extend(parser.finish());
    normalize(events)
}

/// Runs the reasoning parser `name` over `chunks`.
pub(crate) fn run_reasoning(name: &str, chunks: &[&str]) -> Vec<ParsedEvent> {
    let mut parser = reasoning_parser(name).expect("a known reasoning parser");
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk));
    }
    events.extend(parser.finish());
    normalize(events)
}

/// Every way the tests split `text`: in two at every char boundary, and one char per chunk.
pub(crate) fn chunkings(text: &str) -> Vec<Vec<&str>> {
    let mut all: Vec<Vec<&str>> = text
        .char_indices()
        .skip(1)
        .map(|(i, _)| vec![&text[..i], &text[i..]])
        .collect();
    all.push(
        text.char_indices()
            .map(|(i, c)| &text[i..i + c.len_utf8()])
            .collect(),
    );
    all
}

/// Parses `text` whole and under every chunking; asserts they all agree and returns the result.
pub(crate) fn same_for_every_split(
    text: &str,
    run: impl Fn(&[&str]) -> Vec<ParsedEvent>,
) -> Vec<ParsedEvent> {
    let whole = run(&[text]);
    for chunks in chunkings(text) {
        let split = run(&chunks);
        assert_eq!(split, whole, "chunks {chunks:?}");
    }
    whole
}

/// An expected call.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) name: &'static str,
    /// `None`: the generated id `{PREFIX}{index}`.
    pub(crate) id: Option<&'static str>,
    pub(crate) args: Value,
}

pub(crate) fn call(name: &'static str, args: Value) -> Call {
    Call {
        name,
        id: None,
        args,
    }
}

/// Asserts the text, reasoning and calls of an output.
pub(crate) fn assert_output(events: &[ParsedEvent], text: &str, reasoning: &str, calls: &[Call]) {
    let output: ParsedOutput = events.iter().cloned().collect();
    assert_eq!(output.text, text, "text of {events:#?}");
    assert_eq!(output.reasoning, reasoning, "reasoning of {events:#?}");
    assert_eq!(output.calls.len(), calls.len(), "calls of {events:#?}");
    for (index, (got, want)) in output.calls.iter().zip(calls).enumerate() {
        assert_eq!(got.index, index);
        assert_eq!(got.name, want.name);
        let id = want
            .id
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{PREFIX}{index}"));
        assert_eq!(got.id, id);
        let args: Value = serde_json::from_str(&got.arguments)
            .unwrap_or_else(|e| panic!("arguments {:?} of call {index}: {e}", got.arguments));
        assert_eq!(args, want.args, "arguments of call {index}");
    }
}
