//! Incremental parsers that turn a model's raw output text into typed events: plain text,
//! reasoning, and tool calls, in the format each model family was trained on.
//!
//! Used when the gateway renders prompts itself (`tokens` upstream mode) and for engines without
//! a parser. Text arrives in arbitrary chunks (a chunk may end in the middle of a tag or a UTF-8
//! sequence is never split: chunks are `&str`); the output is the same however it is split.

/// One piece of parsed model output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedEvent {
    /// Visible answer text.
    Text(String),
    /// Reasoning ("thinking") text.
    Reasoning(String),
    /// A tool call begins: its position among this response's calls, its id and the tool name.
    ToolCallStart {
        /// 0-based position among the calls of this response.
        index: usize,
        /// Call id (from the model when it gives one, else generated).
        id: String,
        /// Tool (function) name.
        name: String,
    },
    /// More of a tool call's arguments, as JSON text; the deltas of one call concatenate to a
    /// JSON object.
    ToolCallArguments {
        /// The call's position, as in `ToolCallStart`.
        index: usize,
        /// The next piece of the JSON arguments.
        delta: String,
    },
}
