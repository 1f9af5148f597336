//! Incremental parsers that turn a model's raw output text into typed events: plain text,
//! reasoning, and tool calls, in the format each model family was trained on.
//!
//! Used when the gateway renders prompts itself (`tokens` upstream mode) and for engines without
//! a parser. Text arrives in arbitrary chunks (a chunk may end in the middle of a tag or a UTF-8
//! sequence is never split: chunks are `&str`); the output is the same however it is split.
//!
//! - [`OutputParser`] is what the gateway uses: a reasoning parser, then a tool-call parser on
//!   the text that is left, chosen by the names vLLM and SGLang use ([`REASONING_PARSERS`],
//!   [`TOOL_PARSERS`]).
//! - [`tool_parser`] and [`reasoning_parser`] build one stage alone.
//! - [`format_tool_calls`] writes calls the way a model family does (for the mock engine and for
//!   fixtures); the tool parser of the same name reads them back.
//!
//! Only text that could still be the start of a tag is held back, and JSON arguments stream as
//! they arrive. Markup that turns out malformed is returned as text, never dropped (see
//! [`CallEmission`] for what a streaming client sees). Calls the model gives no id get
//! `{id_prefix}{index}`, so that responses are reproducible.
//!
//! The crate is pure: no I/O, no async, no clock; it depends on serde, serde_json and thiserror
//! only, and must stay that way (the gateway runs it inside its response stream). Reading
//! order: the `stream` module (driver, cursor, emitter, tag matcher), the shared sub-parsers
//! under `tool/`, then one family file per format.
//!
//! ```
//! use switchyard_parsers::{OutputParser, ParsedEvent};
//!
//! let mut parser = OutputParser::new(Some("qwen3"), Some("hermes"), "call_abc_")?;
//! let mut events = parser.push("<think>The user wants weather.</think>Let me check.<tool_");
//! events.extend(parser.push("call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"SF\"}}\n</tool_call>"));
//! events.extend(parser.finish());
//! assert_eq!(events, vec![
//!     ParsedEvent::Reasoning("The user wants weather.".into()),
//!     ParsedEvent::Text("Let me check.".into()),
//!     ParsedEvent::ToolCallStart { index: 0, id: "call_abc_0".into(), name: "get_weather".into() },
//!     ParsedEvent::ToolCallArguments { index: 0, delta: "{\"city\": \"SF\"}".into() },
//! ]);
//! # Ok::<(), switchyard_parsers::UnknownParser>(())
//! ```

#![forbid(unsafe_code)]

mod call;
mod error;
mod json;
mod output;
mod pylit;
mod reasoning;
mod registry;
mod stream;
mod tool;

pub use call::{CallEmission, CallIds, ParsedCall, ParsedOutput, ToolCall};
pub use error::{ParserError, ParserKind, UnknownParser, Unrepresentable};
pub use output::OutputParser;
pub use reasoning::ReasoningParser;
pub use registry::{
    REASONING_PARSERS, TOOL_PARSERS, format_tool_calls, reasoning_parser, reasoning_parser_name,
    tool_parser, tool_parser_name, tool_parser_with,
};
pub use tool::ToolCallParser;

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
