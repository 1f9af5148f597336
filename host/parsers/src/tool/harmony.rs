//! `harmony` (gpt-oss): the output is a sequence of messages,
//! `[<|start|>assistant]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>`.
//! The `analysis` channel is reasoning, `final` (and `commentary` without a recipient, the
//! preambles) is text, and a message to `functions.NAME` is a call whose body is its JSON
//! arguments, ended by `<|call|>`. The answer ends with `<|return|>`.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/openai_tool_parser.py` and
//! `vllm/reasoning/gptoss_reasoning_parser.py`, SGLang `python/sglang/srt/parser/harmony_parser.py`
//! and `python/sglang/srt/function_call/gpt_oss_detector.py`, and OpenAI's harmony format guide.
//! Engines often drop the final `<|call|>`/`<|return|>` (they are stop tokens): a call whose
//! arguments are complete is kept without it.
//!
//! The same machine is the `gpt_oss` reasoning parser, configured to pass call messages through
//! as raw text (as SGLang's gpt-oss reasoning detector does) instead of parsing them.

use super::args::{ArgsStream, Progress, plain_name};
use super::{ToolMachine, args_json, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::reasoning::ReasoningMachine;
use crate::stream::{Cursor, Emitter, Expect, Machine};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
/// Tokens that end a message body.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// Tokens that start a message: a body without its end token stops at one.
const HEADS: [&str; 2] = [START, CHANNEL];
/// Where a body ends: its end token, or the next message when that token was dropped.
const BOUNDARIES: [&str; 5] = [ENDS[0], ENDS[1], ENDS[2], START, CHANNEL];

/// The harmony machine.
#[derive(Debug)]
pub(crate) struct Harmony {
    /// `false` for the reasoning parser: call messages pass through as text.
    parse_calls: bool,
    state: State,
}

#[derive(Debug, Default)]
enum State {
    /// Between messages.
    #[default]
    Between,
    Header(String),
    Body(Body),
    Call(ArgsStream),
    /// A call's arguments are complete; its end token comes next.
    CallEnd,
    /// A message passed through as text up to its end token.
    Raw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Text,
}

impl Harmony {
    /// The `harmony` tool-call parser.
    pub(crate) fn tool_parser() -> Self {
        Self {
            parse_calls: true,
            state: State::Between,
        }
    }

    /// The `gpt_oss` reasoning parser.
    pub(crate) fn reasoning_parser() -> Self {
        Self {
            parse_calls: false,
            state: State::Between,
        }
    }

    /// The header is complete (`<|message|>` consumed): start the body it announces.
    fn header_done(&self, cur: &mut Cursor<'_>, header: &str) -> State {
        let channel = word_after(header, CHANNEL);
        match word_after(header, "to=") {
            Some(recipient) if self.parse_calls => {
                let name = recipient.strip_prefix("functions.").unwrap_or(recipient);
                match plain_name(name) {
                    Some(name) => {
                        cur.out.start_call(name, None);
                        State::Call(ArgsStream::default())
                    }
                    None => {
                        cur.out.fail_markup();
                        State::Raw
                    }
                }
            }
            // Messages to a recipient stay raw text for a tool parser further on.
            Some(_) => {
                cur.out.fail_markup();
                State::Raw
            }
            None => {
                cur.out.close_markup();
                State::Body(if channel == Some("analysis") {
                    Body::Reasoning
                } else {
                    Body::Text
                })
            }
        }
    }
}

impl Machine for Harmony {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        self.state = match std::mem::take(&mut self.state) {
            State::Between => {
                let (text, found) = cur.until(&HEADS);
                cur.out.text(text);
                if found.is_none() {
                    return;
                }
                // The opening token stays in the header text.
                cur.out.open_markup();
                State::Header(String::new())
            }
            State::Header(mut header) => {
                let (piece, found) = cur.until(&[MESSAGE]);
                header.push_str(piece);
                if found.is_none() {
                    State::Header(header)
                } else {
                    cur.consume(MESSAGE.len());
                    self.header_done(cur, &header)
                }
            }
            State::Body(body) => {
                let (piece, found) = cur.until(&BOUNDARIES);
                match body {
                    Body::Reasoning => cur.out.reasoning(piece),
                    Body::Text => cur.out.text(piece),
                }
                match found {
                    None => State::Body(body),
                    Some(end) if end < ENDS.len() => {
                        cur.consume(ENDS[end].len());
                        State::Between
                    }
                    Some(_) => State::Between,
                }
            }
            State::Call(mut args) => match args.step(cur) {
                Progress::Pending => State::Call(args),
                Progress::Complete => State::CallEnd,
                Progress::Invalid => {
                    cur.out.fail_markup();
                    State::Raw
                }
            },
            State::CallEnd => {
                match cur.lookahead(&BOUNDARIES) {
                    Expect::Tag(i) => {
                        // An end token is the call's; a new header means it was dropped.
                        if i < ENDS.len() {
                            cur.consume(BOUNDARIES[i].len());
                        }
                        cur.out.close_markup();
                        State::Between
                    }
                    Expect::More => State::CallEnd,
                    Expect::Mismatch => {
                        cur.out.fail_markup();
                        State::Raw
                    }
                }
            }
            State::Raw => {
                let (piece, found) = cur.until(&ENDS);
                cur.out.text(piece);
                match found {
                    None => State::Raw,
                    Some(end) => {
                        let token = cur.consume(ENDS[end].len());
                        cur.out.text(token);
                        State::Between
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        if matches!(self.state, State::CallEnd) {
            out.commit();
        }
        out.settle_markup();
    }
}

impl ToolMachine for Harmony {}
impl ReasoningMachine for Harmony {}

/// The word after `marker` in a header: up to whitespace or the next special token.
fn word_after<'h>(header: &'h str, marker: &str) -> Option<&'h str> {
    let (_, after) = header.split_once(marker)?;
    let end = after
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(after.len());
    Some(&after[..end]).filter(|w| !w.is_empty())
}

/// Writes calls as gpt-oss writes them after the prompt's `<|start|>assistant`.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let mut out = String::new();
    for (i, (name, args)) in checked_calls("harmony", calls)?.into_iter().enumerate() {
        if i > 0 {
            out.push_str(START);
            out.push_str("assistant");
        }
        let args = args_json(args);
        out.push_str(&format!(
            "{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}{args}<|call|>"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_name_channel_and_recipient() {
        let header =
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json";
        assert_eq!(word_after(header, CHANNEL), Some("commentary"));
        assert_eq!(word_after(header, "to="), Some("functions.get_weather"));
        let header = "<|start|>assistant to=functions.f<|channel|>commentary json";
        assert_eq!(word_after(header, "to="), Some("functions.f"));
        assert_eq!(word_after("<|channel|>final", "to="), None);
    }
}
