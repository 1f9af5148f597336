//! Tool calls: what formatters take, how parsers number them, and how events add up to them.

use serde::{Deserialize, Serialize};

use crate::ParsedEvent;

/// One tool call to render in a model's format (see [`crate::format_tool_calls`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Tool (function) name.
    pub name: String,
    /// The arguments: a JSON object.
    pub arguments: serde_json::Value,
}

/// Ids for calls the model gives none for: `{prefix}{index}`, so that a response is reproducible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallIds {
    prefix: String,
}

/// When a tool parser releases a call's events.
///
/// Default: [`CallEmission::Streaming`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CallEmission {
    /// As soon as they are parsed: the name when it is known, the arguments as they arrive. A
    /// call that turns out malformed after its start was released keeps what was released, and
    /// its raw markup is also returned as text. For streaming responses.
    #[default]
    Streaming,
    /// Only once the call is known to be well formed; a malformed call yields text alone (and
    /// no index). For whole (non-streaming) responses.
    Complete,
}

/// The result of a whole output, assembled from events (see [`ParsedOutput::push`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// All `Text`, concatenated.
    pub text: String,
    /// All `Reasoning`, concatenated.
    pub reasoning: String,
    /// The calls, in index order.
    pub calls: Vec<ParsedCall>,
}

/// One call of a [`ParsedOutput`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// Position among the response's calls.
    pub index: usize,
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// The argument deltas, concatenated: a JSON object when the call is well formed.
    pub arguments: String,
}

// === impl CallIds ===

impl CallIds {
    /// Ids `{prefix}0`, `{prefix}1`, …
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The id of the call at `index`.
    pub fn id(&self, index: usize) -> String {
        format!("{}{index}", self.prefix)
    }
}

impl Default for CallIds {
    /// Ids `call_0`, `call_1`, …
    fn default() -> Self {
        Self::new("call_")
    }
}

impl From<&str> for CallIds {
    fn from(prefix: &str) -> Self {
        Self::new(prefix)
    }
}

// === impl ParsedOutput ===

impl ParsedOutput {
    /// Adds one event. Arguments for a call that never started are ignored.
    pub fn push(&mut self, event: ParsedEvent) {
        match event {
            ParsedEvent::Text(text) => self.text.push_str(&text),
            ParsedEvent::Reasoning(text) => self.reasoning.push_str(&text),
            ParsedEvent::ToolCallStart { index, id, name } => {
                let at = self.calls.partition_point(|c| c.index < index);
                self.calls.insert(
                    at,
                    ParsedCall {
                        index,
                        id,
                        name,
                        arguments: String::new(),
                    },
                );
            }
            ParsedEvent::ToolCallArguments { index, delta } => {
                if let Some(call) = self.calls.iter_mut().rev().find(|c| c.index == index) {
                    call.arguments.push_str(&delta);
                }
            }
        }
    }
}

impl Extend<ParsedEvent> for ParsedOutput {
    fn extend<I: IntoIterator<Item = ParsedEvent>>(&mut self, events: I) {
        for event in events {
            self.push(event);
        }
    }
}

impl FromIterator<ParsedEvent> for ParsedOutput {
    fn from_iter<I: IntoIterator<Item = ParsedEvent>>(events: I) -> Self {
        let mut output = Self::default();
        output.extend(events);
        output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_prefix_and_index() {
        assert_eq!(CallIds::new("call_abc_").id(3), "call_abc_3");
        assert_eq!(CallIds::default().id(0), "call_0");
    }

    #[test]
    fn events_add_up_to_an_output() {
        let output: ParsedOutput = vec![
            ParsedEvent::Reasoning("hm".into()),
            ParsedEvent::Text("a".into()),
            ParsedEvent::ToolCallStart {
                index: 0,
                id: "x".into(),
                name: "f".into(),
            },
            ParsedEvent::ToolCallArguments {
                index: 0,
                delta: "{\"a\":".into(),
            },
            ParsedEvent::ToolCallArguments {
                index: 7,
                delta: "lost".into(),
            },
            ParsedEvent::ToolCallArguments {
                index: 0,
                delta: "1}".into(),
            },
            ParsedEvent::Text("b".into()),
        ]
        .into_iter()
        .collect();
        assert_eq!(output.text, "ab");
        assert_eq!(output.reasoning, "hm");
        assert_eq!(output.calls.len(), 1);
        assert_eq!(output.calls[0].arguments, "{\"a\":1}");
    }
}
