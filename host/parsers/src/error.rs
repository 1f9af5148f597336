//! The crate's errors: an unknown parser name, or calls a format cannot express.

use std::fmt;

/// Everything this crate can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParserError {
    /// No parser of that name.
    #[error(transparent)]
    UnknownParser(#[from] UnknownParser),
    /// A call cannot be written in the chosen format.
    #[error(transparent)]
    Unrepresentable(#[from] Unrepresentable),
}

/// A parser name that is not one of the known names (which the message lists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} parser `{name}`; known: {}", .known.join(", "))]
pub struct UnknownParser {
    /// Which kind of parser was asked for.
    pub kind: ParserKind,
    /// The name as given.
    pub name: String,
    /// The known names of that kind.
    pub known: &'static [&'static str],
}

/// The two kinds of parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParserKind {
    /// Tool-call parsers ([`crate::TOOL_PARSERS`]).
    ToolCall,
    /// Reasoning parsers ([`crate::REASONING_PARSERS`]).
    Reasoning,
}

/// A call that the chosen format has no way to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{parser} cannot write tool call {index} (`{name}`): {reason}")]
pub struct Unrepresentable {
    /// The format.
    pub parser: &'static str,
    /// The call's position in the list given.
    pub index: usize,
    /// The call's tool name.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ParserKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ToolCall => "tool-call",
            Self::Reasoning => "reasoning",
        })
    }
}
