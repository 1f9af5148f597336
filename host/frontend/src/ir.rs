//! The internal representation (IR) every client API decodes into and every engine request is
//! rendered from.
//!
//! It keeps what any API said (lossless for the prompt): system text, messages as typed blocks,
//! tools, sampling and the agentic hints. Normalisation into one canonical prompt happens when
//! rendering ([`crate::render`]), not here, so the IR stays close to what the client sent.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One chat request (`/v1/chat/completions`, `/v1/responses`, `/v1/messages`).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// The model the client asked for.
    pub model: String,
    /// Top-level system text: Anthropic's `system`, the Responses API's `instructions`. System
    /// (and developer) *messages* stay in `messages`; rendering joins the leading ones with this.
    /// Not stored with a response (`instructions` do not carry over `previous_response_id`).
    pub system: Vec<Block>,
    /// The turns, in order.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<Tool>,
    /// Whether and which tool must be called.
    pub tool_choice: ToolChoice,
    /// Whether the model may call several tools in one turn. Default `true`.
    pub parallel_tool_calls: bool,
    /// Sampling and length limits.
    pub sampling: Sampling,
    /// Structured output, in chat completions' `response_format` shape
    /// (`{"type": "json_schema", "json_schema": {...}}` or `{"type": "json_object"}`).
    pub response_format: Option<Value>,
    /// Anthropic extended thinking.
    pub thinking: Option<Thinking>,
    /// `reasoning_effort` (chat) / `reasoning.effort` (responses), verbatim.
    pub reasoning_effort: Option<String>,
    /// The client wants a stream.
    pub stream: bool,
    /// The client wants token usage in the stream (always true for responses and messages, whose
    /// streams end with usage; chat's `stream_options.include_usage`).
    pub include_usage: bool,
    /// Routing hints (`nvext.agent_hints`).
    pub hints: AgentHints,
    /// How long to keep the prompt's prefix cached (`nvext.cache_control` or Anthropic's
    /// `cache_control` markers).
    pub cache_control: Option<CacheControl>,
    /// Engine-specific fields passed through unchanged (`chat_template_kwargs`, `min_tokens`, ...;
    /// see [`crate::PASSTHROUGH_FIELDS`]).
    pub extra: Map<String, Value>,
    /// Hosted tools the client offered that no engine can run (`web_search`, `code_interpreter`,
    /// Anthropic server tools), by type: left out of the prompt and counted by the gateway.
    pub dropped_tools: Vec<String>,
}

impl Conversation {
    /// Removes the lines of system text (top-level and system messages) that start with one of
    /// `prefixes`, and text blocks left empty by that; returns how many lines went. Such lines
    /// (Claude Code's per-session `x-anthropic-billing-header: cc_version=...;`) would otherwise
    /// make every session's system prompt, and so its KV cache, its own.
    pub fn strip_volatile_lines(&mut self, prefixes: &[String]) -> usize {
        if prefixes.is_empty() {
            return 0;
        }
        let mut removed = 0;
        let system_messages = self
            .messages
            .iter_mut()
            .filter(|m| m.role == Role::System)
            .map(|m| &mut m.blocks);
        for blocks in std::iter::once(&mut self.system).chain(system_messages) {
            blocks.retain_mut(|block| {
                let Block::Text { text } = block else {
                    return true;
                };
                let volatile = |line: &str| prefixes.iter().any(|p| line.starts_with(p.as_str()));
                if !text.lines().any(volatile) {
                    return true;
                }
                let kept: Vec<&str> = text.lines().filter(|l| !volatile(l)).collect();
                removed += text.lines().count() - kept.len();
                *text = kept.join("\n");
                !text.is_empty()
            });
        }
        removed
    }

    /// `chat_template_kwargs` from the request (extra variables for the chat template).
    pub fn template_kwargs(&self) -> Option<&Map<String, Value>> {
        self.extra
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
    }
}

impl Default for Conversation {
    fn default() -> Self {
        Self {
            model: String::new(),
            system: Vec::new(),
            messages: Vec::new(),
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            sampling: Sampling::default(),
            response_format: None,
            thinking: None,
            reasoning_effort: None,
            stream: false,
            include_usage: false,
            hints: AgentHints::default(),
            cache_control: None,
            extra: Map::new(),
            dropped_tools: Vec::new(),
        }
    }
}

/// One `/v1/completions` request: a raw prompt, no chat template.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Completion {
    /// The model the client asked for.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling and length limits.
    pub sampling: Sampling,
    /// The client wants a stream.
    pub stream: bool,
    /// The client wants token usage in the stream.
    pub include_usage: bool,
    /// Routing hints.
    pub hints: AgentHints,
    /// How long to keep the prompt's prefix cached.
    pub cache_control: Option<CacheControl>,
    /// Engine-specific fields passed through unchanged.
    pub extra: Map<String, Value>,
}

/// A completion prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with the model's special tokens.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// System or developer instructions.
    System,
    /// The user (or the harness speaking for it).
    User,
    /// The model.
    Assistant,
    /// Tool results.
    Tool,
}

impl Role {
    /// The role's name in chat templates and chat completions.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One turn. Serialized (as the Responses store's journal keeps it) with serde's derived
/// shape: `{"role": "user", "blocks": [{"type": "text", "text": "..."}]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Its author.
    pub role: Role,
    /// Its content, in order. A `Tool` message holds one `ToolResult`.
    pub blocks: Vec<Block>,
}

impl Message {
    /// A message of one text block.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            blocks: vec![Block::Text { text: text.into() }],
        }
    }
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning.
    Thinking {
        /// The reasoning text (may be empty when only a signature came back).
        text: String,
        /// Anthropic's `signature` or the Responses API's `encrypted_content`: opaque, echoed back.
        signature: Option<String>,
    },
    /// Anthropic's `redacted_thinking`: opaque, never rendered into the prompt.
    RedactedThinking {
        /// The opaque payload.
        data: String,
    },
    /// A call the model made.
    ToolCall {
        /// Call id, answered by a `ToolResult` with the same `call_id`.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as JSON text, as the client sent them (normally an object).
        arguments: String,
    },
    /// The result of a call.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// Text and image blocks.
        content: Vec<Block>,
        /// The tool failed (Anthropic's `is_error`).
        is_error: bool,
    },
    /// An image, by URL (`data:` URLs for inline images).
    Image {
        /// `https://...` or `data:<media type>;base64,<data>`.
        url: String,
    },
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Name, as the model sees it (`namespace.name` for a function inside a namespace).
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON Schema of its arguments (an empty object schema when the client gave none).
    pub parameters: Value,
    /// How the client declared it, so that a call comes back in the client's shape.
    pub origin: ToolOrigin,
}

/// How a client declared a tool that the model sees as a plain function.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolOrigin {
    /// A function tool.
    #[default]
    Function,
    /// A function inside a Responses `namespace` tool (Codex's `multi_agent_v1`): the model sees
    /// `namespace.name`; calls go back as `{namespace, name}`.
    Namespaced {
        /// The namespace.
        namespace: String,
        /// The function's own name.
        name: String,
    },
    /// A Responses `custom` (freeform) tool: the model sees one string parameter, `input`; calls
    /// go back as `custom_tool_call` items carrying that string.
    Custom,
}

/// The one parameter of a `custom` tool, as the model sees it.
pub(crate) const CUSTOM_TOOL_INPUT: &str = "input";

/// Whether and which tool must be called.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call (Anthropic's `any`).
    Required,
    /// This tool.
    Named(String),
}

/// Sampling and length limits; `None` leaves the engine's default.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling.
    pub top_k: Option<u32>,
    /// Min-p sampling.
    pub min_p: Option<f64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Random seed.
    pub seed: Option<i64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Repetition penalty (vLLM, SGLang).
    pub repetition_penalty: Option<f64>,
}

/// Anthropic extended thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thinking {
    /// Most tokens to spend thinking (`None`: `adaptive`, the model decides).
    pub budget_tokens: Option<u32>,
}

/// Routing hints from `nvext.agent_hints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentHints {
    /// Higher is more important.
    pub priority: Option<i32>,
    /// Expected output length in tokens.
    pub osl: Option<u32>,
    /// Warm the next turn's prefix on the same worker after this response.
    pub speculative_prefill: bool,
}

/// Keep the prompt's prefix cached on its worker for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheControl {
    /// How long (`5m` when the client gave no TTL).
    pub ttl: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_system_lines_are_stripped() {
        let billing = "x-anthropic-billing-header: cc_version=2.1.332.9a2; cc_entrypoint=sdk-cli;";
        let mut conv = Conversation {
            system: vec![
                Block::Text {
                    text: billing.into(),
                },
                Block::Text {
                    text: format!("You are Claude Code.\n{billing}\nBe brief."),
                },
            ],
            messages: vec![
                Message::text(Role::User, billing),
                Message::text(Role::System, "# Agents"),
            ],
            ..Conversation::default()
        };
        let prefixes = vec!["x-anthropic-billing-header:".to_owned()];
        assert_eq!(conv.strip_volatile_lines(&prefixes), 2);
        assert_eq!(
            conv.system,
            [Block::Text {
                text: "You are Claude Code.\nBe brief.".into()
            }]
        );
        // The user's own text is never touched.
        assert_eq!(conv.messages[0], Message::text(Role::User, billing));
        assert_eq!(conv.strip_volatile_lines(&prefixes), 0);
        assert_eq!(conv.strip_volatile_lines(&[]), 0);
    }
}
