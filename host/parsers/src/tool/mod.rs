//! Tool-call parsers, one module per model family, built from shared pieces: [`args`] (a header
//! then streamed JSON arguments), [`envelope`] (`{"name": .., "arguments": ..}` objects),
//! [`sectioned`] (calls between begin/end tokens inside a section) and [`xml_params`] (calls
//! whose arguments are written one parameter per tag).

pub(crate) mod args;
pub(crate) mod deepseek;
pub(crate) mod envelope;
pub(crate) mod glm47;
pub(crate) mod harmony;
pub(crate) mod hermes;
pub(crate) mod kimi_k2;
pub(crate) mod llama3_json;
pub(crate) mod minimax_m2;
pub(crate) mod mistral;
pub(crate) mod pythonic;
pub(crate) mod qwen3_coder;
pub(crate) mod sectioned;
pub(crate) mod xml_params;

use serde_json::{Map, Value};

use crate::ParsedEvent;
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::stream::{Driver, Machine};

/// An incremental tool-call parser: text in, `Text` and tool-call events out (the `harmony`
/// parser also emits `Reasoning`, since gpt-oss's channels carry both).
pub trait ToolCallParser: Send + std::fmt::Debug {
    /// Parses the next chunk of output. Returns what can be decided; only text that may still be
    /// the start of a tag (or an unfinished call header) is held back.
    fn push(&mut self, text: &str) -> Vec<ParsedEvent>;

    /// The output ended: returns what was held back. Markup that never completed is returned as
    /// text; a call whose arguments are complete is kept even if its closing tags are missing.
    fn finish(&mut self) -> Vec<ParsedEvent>;
}

/// Marks the machines that are tool-call parsers.
pub(crate) trait ToolMachine: Machine {}

impl<M: ToolMachine> ToolCallParser for Driver<M> {
    fn push(&mut self, text: &str) -> Vec<ParsedEvent> {
        self.feed(text)
    }

    fn finish(&mut self) -> Vec<ParsedEvent> {
        self.end()
    }
}

/// A call's name and arguments, checked for writing.
pub(crate) type NamedArgs<'a> = (&'a str, &'a Map<String, Value>);

/// Checks that every call can be written (a name of `[A-Za-z0-9_-]`, object arguments) and
/// returns them as name and arguments.
pub(crate) fn checked_calls<'a>(
    parser: &'static str,
    calls: &'a [ToolCall],
) -> Result<Vec<NamedArgs<'a>>, Unrepresentable> {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let fail = |reason: &str| Unrepresentable {
                parser,
                index,
                name: call.name.clone(),
                reason: reason.to_owned(),
            };
            let name_ok = !call.name.is_empty()
                && call
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(fail(
                    "tool names must be non-empty and made of [A-Za-z0-9_-]",
                ));
            }
            match &call.arguments {
                Value::Object(args) => Ok((call.name.as_str(), args)),
                _ => Err(fail("arguments must be a JSON object")),
            }
        })
        .collect()
}

/// Arguments as JSON text, written as chat templates write them.
pub(crate) fn args_json(args: &Map<String, Value>) -> String {
    crate::json::write(&Value::Object(args.clone()), false)
}

/// `{"<name key>": name, "<args key>": args}`.
pub(crate) fn envelope_json(
    keys: &envelope::EnvelopeKeys,
    name: &str,
    args_key: &str,
    args: &Map<String, Value>,
) -> Value {
    let mut object = Map::new();
    object.insert(keys.name.to_owned(), Value::String(name.to_owned()));
    object.insert(args_key.to_owned(), Value::Object(args.clone()));
    Value::Object(object)
}
