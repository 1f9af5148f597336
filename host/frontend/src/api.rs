//! The client APIs, and what differs between them on the way out.

use serde_json::Value;

use crate::encode::chat::{ChunkFormat, Flavor};
use crate::encode::{self, Encoder, StreamEncoder};
use crate::error::ApiError;
use crate::reply::{Reply, ReplyMeta};

/// A client API this gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

// === impl Api ===

impl Api {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// The error body in this API's shape (Anthropic's for messages, OpenAI's otherwise).
    pub fn error_body(self, error: &ApiError) -> Value {
        match self {
            Api::Messages => error.to_anthropic_json(),
            _ => error.to_openai_json(),
        }
    }

    /// The id of the response object for the gateway's `request_id`: `chatcmpl-…`, `cmpl-…`,
    /// `resp_…` (also the key of [`crate::ResponseStore`]), `msg_…`.
    pub fn object_id(self, request_id: &str) -> String {
        let prefix = match self {
            Api::ChatCompletions => "chatcmpl-",
            Api::Completions => "cmpl-",
            Api::Responses => "resp_",
            Api::Messages => "msg_",
        };
        format!("{prefix}{request_id}")
    }

    /// A streaming encoder answering in this API's server-sent events.
    pub fn stream_encoder(self, meta: ReplyMeta) -> Box<dyn StreamEncoder> {
        match self {
            Api::ChatCompletions => Box::new(Encoder::new(ChunkFormat::new(Flavor::Chat), meta)),
            Api::Completions => Box::new(Encoder::new(ChunkFormat::new(Flavor::Completion), meta)),
            Api::Responses => Box::new(Encoder::new(
                encode::responses::EventFormat::default(),
                meta,
            )),
            Api::Messages => Box::new(Encoder::new(encode::messages::EventFormat, meta)),
        }
    }

    /// The full (non-streaming) response body for a finished reply.
    pub fn response_body(self, reply: &Reply, meta: &ReplyMeta) -> Value {
        match self {
            Api::ChatCompletions => encode::chat::body(Flavor::Chat, reply, meta),
            Api::Completions => encode::chat::body(Flavor::Completion, reply, meta),
            Api::Responses => encode::responses::body(reply, meta),
            Api::Messages => encode::messages::body(reply, meta),
        }
    }
}
