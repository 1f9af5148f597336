//! What the engine answered, as API-neutral events, and the reply they add up to.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};
use switchyard_parsers::ParsedEvent;

use crate::ir::{Block, Conversation, Message, Role, ToolOrigin};

/// How a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn (end-of-sequence token or a stop token).
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// One of the request's stop strings matched (the string).
    StopSequence(String),
    /// The engine filtered the output.
    ContentFilter,
}

impl FinishReason {
    /// OpenAI's `finish_reason` (`stop`, `length`, `tool_calls`, `content_filter`; a matched stop
    /// string is `stop`).
    pub fn as_openai(&self) -> &'static str {
        match self {
            Self::Stop | Self::StopSequence(_) => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
        }
    }
}

/// Token usage of one generation, as the engine reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub prompt_tokens: u64,
    /// Generated tokens, reasoning included.
    pub completion_tokens: u64,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u64,
    /// Generated reasoning tokens, when the engine counts them.
    pub reasoning_tokens: Option<u64>,
}

/// One event of an engine's reply, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyEvent {
    /// Text, reasoning or a piece of a tool call.
    Output(ParsedEvent),
    /// The generation ended.
    Finish {
        /// Why.
        reason: FinishReason,
    },
    /// Token usage (the last one reported counts).
    Usage(Usage),
}

impl From<ParsedEvent> for ReplyEvent {
    fn from(event: ParsedEvent) -> Self {
        ReplyEvent::Output(event)
    }
}

/// What the encoders are told about the request they answer. Ids and times come from the
/// gateway: this crate never reads a clock.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReplyMeta {
    /// The gateway's id for the request; each API prefixes it (`chatcmpl-`, `cmpl-`, `resp_`,
    /// `msg_`), see [`crate::Api::object_id`].
    pub request_id: String,
    /// Unix seconds when the request arrived.
    pub created: u64,
    /// The model name to report.
    pub model: String,
    /// Chat and completions streams end with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The prompt's token count as the gateway counted it, for Anthropic's `message_start` (the
    /// engine's count arrives only at the end).
    pub prompt_tokens: Option<u64>,
    /// Request fields the Responses API's response object repeats
    /// ([`crate::ResponsesRequest::echo`]), shared with the request: Codex's tool definitions
    /// alone are ~19 KB.
    pub echo: Arc<Map<String, Value>>,
    /// Tools the client declared as something other than a plain function, by the name the model
    /// sees: their calls go back in the client's shape (Responses namespaces and custom tools).
    pub tool_origins: Vec<(String, ToolOrigin)>,
    /// Responses reasoning items carry a summary (`reasoning.summary`).
    pub reasoning_summary: bool,
    /// Responses reasoning items carry `encrypted_content` (`include`).
    pub encrypted_reasoning: bool,
}

impl ReplyMeta {
    /// Meta with the required fields; the rest default (no usage chunk, no prompt count, no
    /// echo).
    pub fn new(request_id: impl Into<String>, created: u64, model: impl Into<String>) -> Self {
        Self {
            request_id: request_id.into(),
            created,
            model: model.into(),
            ..Self::default()
        }
    }

    /// How the client declared the tool the model calls `name`.
    pub fn tool_origin(&self, name: &str) -> &ToolOrigin {
        static FUNCTION: ToolOrigin = ToolOrigin::Function;
        self.tool_origins
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&FUNCTION, |(_, origin)| origin)
    }

    /// Meta for a reply to `conv`: its model and whether it asked for stream usage.
    pub fn for_conversation(
        request_id: impl Into<String>,
        created: u64,
        conv: &Conversation,
    ) -> Self {
        Self {
            include_usage: conv.include_usage,
            ..Self::new(request_id, created, conv.model.clone())
        }
    }
}

/// A change to the reply's blocks, for the stream encoders: a block opens, grows or closes.
/// Blocks are numbered in order; an API's content index or output index is this number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step<'e> {
    Open(usize),
    Delta(usize, &'e str),
    Close(usize),
}

/// The reply so far: blocks (text, reasoning, tool calls in order), finish reason and usage.
/// A block ends when one of another kind (or another tool call) starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    blocks: Vec<Block>,
    open: Option<usize>,
    /// (the model's tool call index, block number), in call order.
    calls: Vec<(usize, usize)>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

// === impl Reply ===

impl Reply {
    /// An empty reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one event.
    pub fn push(&mut self, event: &ReplyEvent) {
        self.apply(event);
    }

    /// Adds one event and says how the blocks changed (at most: close one, open one, grow it).
    pub(crate) fn apply<'e>(&mut self, event: &'e ReplyEvent) -> [Option<Step<'e>>; 3] {
        let mut steps = [None; 3];
        match event {
            ReplyEvent::Finish { reason } => self.finish = Some(reason.clone()),
            ReplyEvent::Usage(usage) => self.usage = Some(*usage),
            ReplyEvent::Output(ParsedEvent::Text(delta)) => {
                steps = self.grow_text(
                    delta,
                    |b| matches!(b, Block::Text { .. }),
                    || Block::Text {
                        text: String::new(),
                    },
                );
            }
            ReplyEvent::Output(ParsedEvent::Reasoning(delta)) => {
                steps = self.grow_text(
                    delta,
                    |b| matches!(b, Block::Thinking { .. }),
                    || Block::Thinking {
                        text: String::new(),
                        signature: None,
                    },
                );
            }
            ReplyEvent::Output(ParsedEvent::ToolCallStart { index, id, name }) => {
                if self.calls.iter().any(|(i, _)| i == index) {
                    return steps;
                }
                steps[0] = self.close().map(Step::Close);
                let n = self.blocks.len();
                self.blocks.push(Block::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
                self.calls.push((*index, n));
                self.open = Some(n);
                steps[1] = Some(Step::Open(n));
            }
            ReplyEvent::Output(ParsedEvent::ToolCallArguments { index, delta }) => {
                let block = self.calls.iter().find(|(i, _)| i == index).map(|c| c.1);
                if let Some(n) = block.filter(|_| !delta.is_empty())
                    && let Some(Block::ToolCall { arguments, .. }) = self.blocks.get_mut(n)
                {
                    arguments.push_str(delta);
                    // A late piece of an already closed call still counts, by its number.
                    steps[0] = Some(Step::Delta(n, delta));
                }
            }
        }
        steps
    }

    /// Appends text to the open block if `is_kind` accepts it, else closes it and opens a new one.
    fn grow_text<'e>(
        &mut self,
        delta: &'e str,
        is_kind: impl Fn(&Block) -> bool,
        new: impl FnOnce() -> Block,
    ) -> [Option<Step<'e>>; 3] {
        let mut steps = [None; 3];
        if delta.is_empty() {
            return steps;
        }
        let open = self
            .open
            .filter(|&n| self.blocks.get(n).is_some_and(&is_kind));
        let n = match open {
            Some(n) => n,
            None => {
                steps[0] = self.close().map(Step::Close);
                self.blocks.push(new());
                let n = self.blocks.len() - 1;
                self.open = Some(n);
                steps[1] = Some(Step::Open(n));
                n
            }
        };
        if let Some(Block::Text { text } | Block::Thinking { text, .. }) = self.blocks.get_mut(n) {
            text.push_str(delta);
        }
        steps[2] = Some(Step::Delta(n, delta));
        steps
    }

    /// Closes the open block, if any, and returns its number.
    pub(crate) fn close(&mut self) -> Option<usize> {
        self.open.take()
    }

    /// The blocks so far: `Text`, `Thinking` and `ToolCall`, in order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The reply as an assistant message (for the response store, or to warm the next turn).
    pub fn message(&self) -> Message {
        Message {
            role: Role::Assistant,
            blocks: self.blocks.clone(),
        }
    }

    /// The visible text, concatenated.
    pub fn text(&self) -> String {
        self.texts(|b| match b {
            Block::Text { text } => Some(text),
            _ => None,
        })
    }

    /// The reasoning text, concatenated.
    pub fn reasoning(&self) -> String {
        self.texts(|b| match b {
            Block::Thinking { text, .. } => Some(text),
            _ => None,
        })
    }

    fn texts<'a>(&'a self, pick: impl Fn(&'a Block) -> Option<&'a String>) -> String {
        self.blocks
            .iter()
            .filter_map(pick)
            .map(String::as_str)
            .collect()
    }

    /// Whether the model called a tool.
    pub fn has_tool_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    /// The position of block `n` among this reply's tool calls (chat's `tool_calls[].index`).
    pub(crate) fn call_ordinal(&self, n: usize) -> Option<usize> {
        self.calls.iter().position(|&(_, b)| b == n)
    }

    /// Whether a `Finish` event arrived.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Why the generation ended: as reported, except that a plain stop after tool calls is
    /// `ToolCalls` and `ToolCalls` without any call is `Stop` (engines differ); `Stop` when
    /// nothing was reported.
    pub fn finish_reason(&self) -> FinishReason {
        match &self.finish {
            // Claimed tool calls that never came (unparsable output) end the turn.
            None | Some(FinishReason::Stop | FinishReason::ToolCalls) => {
                if self.has_tool_calls() {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                }
            }
            Some(reason) => reason.clone(),
        }
    }

    /// The last usage reported (zeros when none was).
    pub fn usage(&self) -> Usage {
        self.usage.unwrap_or_default()
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    /// The `event:` line (Responses and Anthropic name their events; chat does not).
    pub event: Option<&'static str>,
    /// The `data:` line: JSON, or `[DONE]`. Never contains a newline.
    pub data: String,
}

impl SseFrame {
    /// The frame's bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.wire_len());
        self.write_to(&mut out);
        out
    }

    /// Append the frame's bytes on the wire to `out` (a stream's frames go out in one buffer).
    pub fn write_to(&self, out: &mut Vec<u8>) {
        if let Some(event) = self.event {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(self.data.as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// The length of [`to_bytes`](Self::to_bytes).
    pub fn wire_len(&self) -> usize {
        self.event.map_or(0, |e| "event: \n".len() + e.len()) + "data: \n\n".len() + self.data.len()
    }
}

impl fmt::Display for SseFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(event) = self.event {
            writeln!(f, "event: {event}")?;
        }
        write!(f, "data: {}\n\n", self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(e: ParsedEvent) -> ReplyEvent {
        ReplyEvent::Output(e)
    }

    #[test]
    fn blocks_open_close_and_grow() {
        let mut reply = Reply::new();
        let events = [
            out(ParsedEvent::Reasoning("think".into())),
            out(ParsedEvent::Reasoning("ing".into())),
            out(ParsedEvent::Text("".into())),
            out(ParsedEvent::Text("hi".into())),
            out(ParsedEvent::ToolCallStart {
                index: 0,
                id: "c0".into(),
                name: "f".into(),
            }),
            out(ParsedEvent::ToolCallArguments {
                index: 0,
                delta: "{}".into(),
            }),
            out(ParsedEvent::ToolCallArguments {
                index: 9,
                delta: "lost".into(),
            }),
        ];
        let steps: Vec<Vec<Step<'_>>> = events
            .iter()
            .map(|e| reply.apply(e).into_iter().flatten().collect())
            .collect();
        assert_eq!(
            steps,
            vec![
                vec![Step::Open(0), Step::Delta(0, "think")],
                vec![Step::Delta(0, "ing")],
                vec![],
                vec![Step::Close(0), Step::Open(1), Step::Delta(1, "hi")],
                vec![Step::Close(1), Step::Open(2)],
                vec![Step::Delta(2, "{}")],
                vec![],
            ]
        );
        assert_eq!(reply.reasoning(), "thinking");
        assert_eq!(reply.text(), "hi");
        assert_eq!(reply.call_ordinal(2), Some(0));
        assert_eq!(reply.finish_reason(), FinishReason::ToolCalls);
        reply.push(&ReplyEvent::Finish {
            reason: FinishReason::Length,
        });
        assert_eq!(reply.finish_reason(), FinishReason::Length);
    }

    #[test]
    fn finish_reason_follows_the_calls_actually_made() {
        let mut reply = Reply::new();
        assert_eq!(reply.finish_reason(), FinishReason::Stop);
        reply.push(&ReplyEvent::Finish {
            reason: FinishReason::ToolCalls,
        });
        assert_eq!(reply.finish_reason(), FinishReason::Stop, "no call came");
        reply.push(&out(ParsedEvent::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: "f".into(),
        }));
        assert_eq!(reply.finish_reason(), FinishReason::ToolCalls);
        reply.push(&ReplyEvent::Finish {
            reason: FinishReason::StopSequence("x".into()),
        });
        assert_eq!(
            reply.finish_reason(),
            FinishReason::StopSequence("x".into())
        );
    }

    #[test]
    fn frames_on_the_wire() {
        let named = SseFrame {
            event: Some("ping"),
            data: "{}".into(),
        };
        assert_eq!(named.to_bytes(), b"event: ping\ndata: {}\n\n");
        let plain = SseFrame {
            event: None,
            data: "[DONE]".into(),
        };
        assert_eq!(plain.to_string(), "data: [DONE]\n\n");
        for frame in [&named, &plain] {
            assert_eq!(frame.to_bytes(), frame.to_string().into_bytes());
            assert_eq!(frame.wire_len(), frame.to_string().len());
        }
    }
}
