//! Calls inside a section of special tokens: `SECTION_BEGIN (CALL_BEGIN header args CALL_END)*
//! SECTION_END`, the arguments a JSON object streamed as it arrives (Kimi K2, DeepSeek V3/V3.1).

use super::ToolMachine;
use super::args::{HeadSyntax, HeadedArgs, Progress};
use crate::stream::{Cursor, Emitter, Expect, Machine};

/// The tokens of one sectioned format.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SectionSyntax {
    /// Any of these opens the section.
    pub(crate) section_open: &'static [&'static str],
    pub(crate) section_close: &'static str,
    pub(crate) call_open: &'static str,
    pub(crate) call_close: &'static str,
    pub(crate) head: HeadSyntax,
    /// An optional token between the arguments and `call_close` (DeepSeek V3's closing fence).
    pub(crate) args_close: Option<&'static str>,
}

/// A parser for one sectioned format.
#[derive(Debug)]
pub(crate) struct Sectioned {
    syntax: &'static SectionSyntax,
    state: State,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Text,
    /// Inside the section, between calls.
    Section,
    Call(HeadedArgs),
    /// The arguments are complete; closing tokens come next.
    AfterArgs,
}

impl Sectioned {
    pub(crate) fn new(syntax: &'static SectionSyntax) -> Self {
        Self {
            syntax,
            state: State::Text,
        }
    }

    fn fail(cur: &mut Cursor<'_>) -> State {
        cur.out.fail_markup();
        State::Text
    }
}

impl Machine for Sectioned {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        let syntax = self.syntax;
        self.state = match std::mem::take(&mut self.state) {
            State::Text => match cur.text_until_markup(syntax.section_open) {
                Some(_) => State::Section,
                None => State::Text,
            },
            State::Section => match cur.expect(&[syntax.call_open, syntax.section_close]) {
                Expect::Tag(0) => State::Call(HeadedArgs::new()),
                Expect::Tag(_) => {
                    cur.out.close_markup();
                    State::Text
                }
                Expect::More => State::Section,
                Expect::Mismatch => Self::fail(cur),
            },
            State::Call(mut call) => match call.step(&syntax.head, cur) {
                Progress::Pending => State::Call(call),
                Progress::Complete => State::AfterArgs,
                Progress::Invalid => Self::fail(cur),
            },
            State::AfterArgs => {
                let tags = [
                    syntax.call_close,
                    syntax.section_close,
                    syntax.args_close.unwrap_or_default(),
                ];
                match cur.expect(&tags) {
                    Expect::Tag(0) => {
                        cur.out.commit();
                        State::Section
                    }
                    // The call's end token is missing; the section ends the call too.
                    Expect::Tag(1) => {
                        cur.out.close_markup();
                        State::Text
                    }
                    Expect::Tag(_) | Expect::More => State::AfterArgs,
                    Expect::Mismatch => Self::fail(cur),
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        if matches!(self.state, State::AfterArgs) {
            out.commit();
        }
        out.settle_markup();
    }
}

impl ToolMachine for Sectioned {}
