//! `mistral` (Mistral 7B v0.3 through Mistral Small 3.x, Magistral, Devstral). Two forms, told
//! apart by what follows `[TOOL_CALLS]`:
//!
//! - before tokenizer v11: a JSON list, `[TOOL_CALLS][{"name": "f", "arguments": {..}}, ..]`;
//! - v11 on: `[TOOL_CALLS]NAME[ARGS]{json}` per call (`[CALL_ID]ID` may come before `[ARGS]`,
//!   and with the special tokens skipped `[ARGS]` is absent: `NAME{json}`).
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/mistral_tool_parser.py` and SGLang
//! `python/sglang/srt/function_call/mistral_detector.py`.

use super::args::{CallHead, HeadSyntax, HeadedArgs, Progress, plain_name};
use super::envelope::{EnvelopeKeys, EnvelopeList, ListSyntax};
use super::{ToolMachine, args_json, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::stream::{Cursor, Emitter, Machine};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
const KEYS: EnvelopeKeys = EnvelopeKeys {
    name: "name",
    args: &["arguments"],
};
const LIST: ListSyntax = ListSyntax {
    open: Some("["),
    separator: ",",
    close: Some("]"),
};
const HEAD: HeadSyntax = HeadSyntax {
    ends: &[ARGS, "{"],
    parse: parse_head,
};

/// The `mistral` parser.
#[derive(Debug, Default)]
pub(crate) struct Mistral {
    state: State,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Text,
    /// After `[TOOL_CALLS]`: the next char tells the form.
    Form,
    List(EnvelopeList),
    Named(HeadedArgs),
}

impl Machine for Mistral {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        let progress = match &mut self.state {
            State::Text => {
                if cur.text_until_markup(&[TOOL_CALLS]).is_some() {
                    self.state = State::Form;
                }
                return;
            }
            State::Form => {
                match cur.peek_after_ws() {
                    Some('[') => self.state = State::List(EnvelopeList::new(LIST, KEYS)),
                    Some(_) => self.state = State::Named(HeadedArgs::new()),
                    None => {}
                }
                return;
            }
            State::List(list) => list.step(cur),
            State::Named(call) => call.step(&HEAD, cur),
        };
        match progress {
            Progress::Pending => {}
            Progress::Complete => {
                cur.out.close_markup();
                self.state = State::Text;
            }
            Progress::Invalid => {
                cur.out.fail_markup();
                self.state = State::Text;
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        out.settle_markup();
    }
}

impl ToolMachine for Mistral {}

/// `NAME` or `NAME[CALL_ID]ID`.
fn parse_head(head: &str) -> Option<CallHead> {
    let (name, id) = match head.split_once(CALL_ID) {
        Some((name, id)) => (name, plain_name(id)),
        None => (head, None),
    };
    Some(CallHead {
        name: plain_name(name)?,
        id,
    })
}

/// Writes calls in the v11 form.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let mut out = String::new();
    for (name, args) in checked_calls("mistral", calls)? {
        let args = args_json(args);
        out.push_str(&format!("{TOOL_CALLS}{name}{ARGS}{args}"));
    }
    Ok(out)
}
