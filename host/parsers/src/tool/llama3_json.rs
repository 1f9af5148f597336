//! `llama3_json` (Llama 3.1–3.3 and 4 with JSON tool calling): the output is
//! `{"name": "f", "parameters": {..}}`, several separated by `;`, either from the very start or
//! after `<|python_tag|>`. `arguments` is accepted in place of `parameters`.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py` (calls only
//! when the output starts with `<|python_tag|>` or `{`; `;`-separated objects; `parameters` or
//! `arguments`) and SGLang `python/sglang/srt/function_call/llama32_detector.py`. Here
//! `<|python_tag|>` after some text starts calls too.

use super::args::Progress;
use super::envelope::{EnvelopeKeys, EnvelopeList, ListSyntax};
use super::{ToolMachine, checked_calls, envelope_json};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::stream::{Cursor, Emitter, Machine};

const PYTHON_TAG: &str = "<|python_tag|>";
const KEYS: EnvelopeKeys = EnvelopeKeys {
    name: "name",
    args: &["parameters", "arguments"],
};
const LIST: ListSyntax = ListSyntax {
    open: None,
    separator: ";",
    close: None,
};

/// The `llama3_json` parser.
#[derive(Debug, Default)]
pub(crate) struct Llama3Json {
    state: State,
}

#[derive(Debug, Default)]
enum State {
    /// Nothing read yet: a `{` here starts calls.
    #[default]
    Start,
    Text,
    Calls(Box<EnvelopeList>),
}

impl Machine for Llama3Json {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        self.state = match std::mem::take(&mut self.state) {
            State::Start if cur.rest().starts_with('{') => {
                cur.out.open_markup();
                State::Calls(Box::new(EnvelopeList::new(LIST, KEYS)))
            }
            State::Start | State::Text => match cur.text_until_markup(&[PYTHON_TAG]) {
                Some(_) => State::Calls(Box::new(EnvelopeList::new(LIST, KEYS))),
                None => State::Text,
            },
            State::Calls(mut list) => match list.step(cur) {
                Progress::Pending => State::Calls(list),
                Progress::Complete => {
                    cur.out.close_markup();
                    State::Text
                }
                Progress::Invalid => {
                    cur.out.fail_markup();
                    State::Text
                }
            },
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        out.settle_markup();
    }
}

impl ToolMachine for Llama3Json {}

/// Writes calls as Llama 3's JSON tool-calling prompt asks for them.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let objects: Vec<String> = checked_calls("llama3_json", calls)?
        .into_iter()
        .map(|(name, args)| {
            crate::json::write(&envelope_json(&KEYS, name, KEYS.args[0], args), false)
        })
        .collect();
    Ok(objects.join("; "))
}
