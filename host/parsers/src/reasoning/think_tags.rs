//! Reasoning between think tags, `<think>…</think>answer`, in its variants: whether the opening
//! tag must be there, and which token may end reasoning without the closing tag.

use super::ReasoningMachine;
use crate::stream::{Cursor, Emitter, Machine};

/// The tags of one family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThinkSyntax {
    pub(crate) open: &'static str,
    pub(crate) close: &'static str,
    pub(crate) opening: Opening,
    /// A token that ends reasoning when it comes before `close` (it stays in the text, for the
    /// tool parser): models that open a tool call while still thinking.
    pub(crate) implicit_close: Option<&'static str>,
}

/// Where reasoning starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// From the first byte: the chat template already wrote the opening tag (one at the very
    /// start is dropped).
    Implied,
    /// Only if the output starts with the opening tag; otherwise it is all text.
    Required,
}

/// The think-tag machine.
#[derive(Debug)]
pub(crate) struct ThinkTags {
    syntax: ThinkSyntax,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Reasoning,
    Answer,
}

impl ThinkTags {
    pub(crate) fn new(syntax: ThinkSyntax) -> Self {
        Self {
            syntax,
            state: State::Start,
        }
    }
}

impl Machine for ThinkTags {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        let s = &self.syntax;
        match self.state {
            State::Start => {
                let rest = cur.rest();
                if rest.starts_with(s.open) {
                    cur.consume(s.open.len());
                    self.state = State::Reasoning;
                } else if !cur.at_end() && s.open.starts_with(rest) {
                    cur.wait();
                } else {
                    self.state = match s.opening {
                        Opening::Implied => State::Reasoning,
                        Opening::Required => State::Answer,
                    };
                }
            }
            State::Reasoning => {
                let ends = [s.close, s.implicit_close.unwrap_or_default()];
                let (reasoning, found) = cur.until(&ends);
                cur.out.reasoning(reasoning);
                match found {
                    Some(0) => {
                        cur.consume(s.close.len());
                        self.state = State::Answer;
                    }
                    Some(_) => self.state = State::Answer,
                    None => {}
                }
            }
            State::Answer => {
                let text = cur.consume_all();
                cur.out.text(text);
            }
        }
    }

    fn finish(&mut self, _out: &mut Emitter) {}
}

impl ReasoningMachine for ThinkTags {}

/// `<think>` prepended to the output, which stays text (MiniMax M2's "append think" mode: the
/// client gets the thinking inline, as the model wrote it).
#[derive(Debug, Default)]
pub(crate) struct PrependThink {
    done: bool,
}

impl PrependThink {
    const OPEN: &'static str = "<think>";
}

impl Machine for PrependThink {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        if !self.done {
            self.done = true;
            cur.out.text(Self::OPEN);
        }
        let text = cur.consume_all();
        cur.out.text(text);
    }

    fn finish(&mut self, out: &mut Emitter) {
        if !self.done {
            self.done = true;
            out.text(Self::OPEN);
        }
    }
}

impl ReasoningMachine for PrependThink {}
