//! `hermes` (Hermes 2 Pro, Qwen 2.5/3, many fine-tunes): each call is a JSON object in tags,
//! `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>`, after optional text.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py` and SGLang
//! `python/sglang/srt/function_call/hermes_detector.py`: the JSON between the tags is the call;
//! the closing tag may be missing at the end of the output.

use super::args::Progress;
use super::envelope::{Envelope, EnvelopeKeys};
use super::{ToolMachine, checked_calls, envelope_json};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::stream::{Cursor, Emitter, Expect, Machine};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEYS: EnvelopeKeys = EnvelopeKeys {
    name: "name",
    args: &["arguments"],
};

/// The `hermes` parser.
#[derive(Debug, Default)]
pub(crate) struct Hermes {
    state: State,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Text,
    Call(Envelope),
    /// The object is complete; the closing tag comes next.
    Close,
}

impl Machine for Hermes {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        self.state = match std::mem::take(&mut self.state) {
            State::Text => match cur.text_until_markup(&[OPEN]) {
                Some(_) => State::Call(Envelope::new(KEYS)),
                None => State::Text,
            },
            State::Call(mut envelope) => match envelope.step(cur) {
                Progress::Pending => State::Call(envelope),
                Progress::Complete => State::Close,
                Progress::Invalid => {
                    cur.out.fail_markup();
                    State::Text
                }
            },
            State::Close => match cur.expect(&[CLOSE]) {
                Expect::Tag(_) => {
                    cur.out.close_markup();
                    State::Text
                }
                Expect::More => State::Close,
                Expect::Mismatch => {
                    cur.out.fail_markup();
                    State::Text
                }
            },
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        if matches!(self.state, State::Close) {
            out.commit();
        }
        out.settle_markup();
    }
}

impl ToolMachine for Hermes {}

/// Writes calls as the Qwen/Hermes chat templates do.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let mut out = String::new();
    for (i, (name, args)) in checked_calls("hermes", calls)?.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let call = envelope_json(&KEYS, name, KEYS.args[0], args);
        out.push_str(&format!(
            "{OPEN}\n{}\n{CLOSE}",
            crate::json::write(&call, false)
        ));
    }
    Ok(out)
}
