//! Reasoning parsers, one module per model family: they split the output into `Reasoning` and
//! `Text`. Most are the [`think_tags`] machine with the family's tags; `gpt_oss` reads harmony
//! channels.

pub(crate) mod deepseek_r1;
pub(crate) mod glm45;
pub(crate) mod gpt_oss;
pub(crate) mod kimi;
pub(crate) mod minimax_m2;
pub(crate) mod qwen3;
pub(crate) mod think_tags;

use crate::ParsedEvent;
use crate::stream::{Driver, Machine};

/// An incremental reasoning parser: text in, `Reasoning` and `Text` out.
pub trait ReasoningParser: Send + std::fmt::Debug {
    /// Parses the next chunk of output; only text that may still be the start of a tag is held
    /// back.
    fn push(&mut self, text: &str) -> Vec<ParsedEvent>;

    /// The output ended: returns what was held back.
    fn finish(&mut self) -> Vec<ParsedEvent>;
}

/// Marks the machines that are reasoning parsers.
pub(crate) trait ReasoningMachine: Machine {}

impl<M: ReasoningMachine> ReasoningParser for Driver<M> {
    fn push(&mut self, text: &str) -> Vec<ParsedEvent> {
        self.feed(text)
    }

    fn finish(&mut self) -> Vec<ParsedEvent> {
        self.end()
    }
}
