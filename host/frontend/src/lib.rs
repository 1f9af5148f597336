//! The client APIs on one internal representation (IR).
//!
//! Codex (`/v1/responses`), Claude Code (`/v1/messages`) and chat-completions harnesses
//! (`/v1/chat/completions`, `/v1/completions`) all decode into one [`Conversation`] (or a
//! [`Completion`]), are rendered from it for the engine, and get the engine's answer back in their
//! own shape. The same turn written by any of them renders the same template messages
//! ([`to_template_messages`]), hence the same prompt tokens and the same KV-cache prefix.
//!
//! Pure: serde only, no I/O, no clock (ids and times are passed in), no async. The gateway calls:
//!
//! 1. a decoder: [`chat::decode`], [`completions::decode`], [`responses::decode`],
//!    [`messages::decode`] -> IR, or an [`ApiError`] naming the bad field;
//! 2. for `previous_response_id`: [`ResponsesRequest::attach_history`] with its
//!    [`ResponseStore`];
//! 3. a renderer: [`to_chat_request`] (engine body) or [`to_template_messages`] (own tokenizer);
//! 4. per engine chunk: [`UpstreamChatDecoder`] -> [`ReplyEvent`]s (or the gateway's own output
//!    parser -> [`ReplyEvent::Output`]);
//! 5. per event: [`Api::stream_encoder`] -> [`SseFrame`]s, or an [`Aggregator`] -> one body;
//! 6. errors: [`Api::error_body`].
//!
//! ```
//! use serde_json::json;
//! use switchyard_frontend::{Api, ReplyEvent, ReplyMeta, UpstreamChatDecoder, messages, to_chat_request};
//!
//! let body = json!({"model": "m", "max_tokens": 64, "stream": true,
//!                   "messages": [{"role": "user", "content": "Hello"}]});
//! let conv = messages::decode(&body)?;
//! let engine_body = to_chat_request(&conv);
//! assert_eq!(engine_body["messages"][0], json!({"role": "user", "content": "Hello"}));
//!
//! let mut upstream = UpstreamChatDecoder::new("42");
//! let mut encoder = Api::Messages.stream_encoder(ReplyMeta::new("42", 1_700_000_000, "m"));
//! let mut wire = String::new();
//! for data in [
//!     r#"{"choices":[{"index":0,"delta":{"content":"Hi!"},"finish_reason":null}]}"#,
//!     r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
//!     "[DONE]",
//! ] {
//!     for event in upstream.decode_data(data)? {
//!         wire.extend(encoder.push(&event).iter().map(ToString::to_string));
//!     }
//! }
//! wire.extend(encoder.finish().iter().map(ToString::to_string));
//! assert!(wire.starts_with("event: message_start\n"));
//! assert!(wire.contains(r#""stop_reason":"end_turn""#));
//! # Ok::<(), switchyard_frontend::ApiError>(())
//! ```
#![forbid(unsafe_code)]

mod api;
pub mod chat;
pub mod completions;
mod encode;
mod error;
mod fields;
mod hints;
mod ir;
mod json;
pub mod messages;
mod render;
mod reply;
pub mod responses;
mod store;
mod upstream;

pub use api::Api;
pub use encode::{Aggregator, StreamEncoder};
pub use error::{ApiError, ErrorKind};
pub use fields::{PASSTHROUGH_FIELDS, parse_body};
pub use hints::{DEFAULT_CACHE_TTL, parse_ttl};
pub use ir::{
    AgentHints, Block, CacheControl, Completion, Conversation, Message, Prompt, Role, Sampling,
    Thinking, Tool, ToolChoice, ToolOrigin,
};
pub use render::{to_chat_request, to_completion_request, to_template_messages};
pub use reply::{FinishReason, Reply, ReplyEvent, ReplyMeta, SseFrame, Usage};
pub use responses::ResponsesRequest;
pub use store::{Inserted, JournalWrite, RecoveredResponses, ResponseStore};
/// The parsed-output event the reply events carry (re-exported from `switchyard-parsers`).
pub use switchyard_parsers::ParsedEvent;
pub use upstream::UpstreamChatDecoder;
