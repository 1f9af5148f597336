//! Replies in each client API's shape: streaming encoders (server-sent events) and full bodies.
//!
//! One skeleton ([`Encoder`]) drives every API: it folds events into a [`Reply`], turns block
//! changes into [`Step`]s and hands them to the API's [`Format`], which writes that API's frames.
//! The full (non-streaming) body of each API is built from the same [`Reply`] by the same code
//! that writes the stream's final object.

use std::fmt;

use serde_json::Value;

use crate::api::Api;
use crate::error::ApiError;
use crate::reply::{Reply, ReplyEvent, ReplyMeta, SseFrame, Step};

pub(crate) mod chat;
pub(crate) mod messages;
pub(crate) mod responses;

/// Turns one reply's events into an API's server-sent events.
///
/// Call [`start`](StreamEncoder::start) when the engine answers (optional: the first
/// [`push`](StreamEncoder::push) starts too), `push` per event, then [`finish`](StreamEncoder::finish)
/// at the end of the engine's stream, or [`fail`](StreamEncoder::fail) when it broke. After
/// `finish` or `fail` every call returns no frames.
pub trait StreamEncoder: fmt::Debug + Send {
    /// The frames that open the stream (`role` chunk, `response.created`, `message_start`).
    fn start(&mut self) -> Vec<SseFrame>;
    /// The frames for one event.
    fn push(&mut self, event: &ReplyEvent) -> Vec<SseFrame>;
    /// The frames that end the stream: closes open blocks, the finish reason, usage, the end
    /// marker (`[DONE]`, `response.completed`, `message_stop`).
    fn finish(&mut self) -> Vec<SseFrame>;
    /// The frames that end the stream with an error (the client already got a 200).
    fn fail(&mut self, error: &ApiError) -> Vec<SseFrame>;
    /// The reply so far.
    fn reply(&self) -> &Reply;
}

/// What one API writes; the [`Encoder`] calls it in order.
pub(crate) trait Format: fmt::Debug + Send {
    /// The opening frames.
    fn start(&mut self, meta: &ReplyMeta, out: &mut Vec<SseFrame>);
    /// One change to the blocks.
    fn step(&mut self, reply: &Reply, step: Step<'_>, meta: &ReplyMeta, out: &mut Vec<SseFrame>);
    /// A `Finish` event arrived (chat says so at once; others wait for usage at the end).
    fn finished(&mut self, _reply: &Reply, _meta: &ReplyMeta, _out: &mut Vec<SseFrame>) {}
    /// The closing frames; every block is closed already.
    fn end(&mut self, reply: &Reply, meta: &ReplyMeta, out: &mut Vec<SseFrame>);
    /// The closing frames after a failure.
    fn fail(&mut self, reply: &Reply, meta: &ReplyMeta, error: &ApiError, out: &mut Vec<SseFrame>);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Fresh,
    Streaming,
    Ended,
}

/// The shared streaming skeleton.
#[derive(Debug)]
pub(crate) struct Encoder<F> {
    format: F,
    meta: ReplyMeta,
    reply: Reply,
    phase: Phase,
}

impl<F: Format> Encoder<F> {
    pub(crate) fn new(format: F, meta: ReplyMeta) -> Self {
        Self {
            format,
            meta,
            reply: Reply::new(),
            phase: Phase::Fresh,
        }
    }

    fn ensure_started(&mut self, out: &mut Vec<SseFrame>) {
        if self.phase == Phase::Fresh {
            self.format.start(&self.meta, out);
            self.phase = Phase::Streaming;
        }
    }
}

impl<F: Format> StreamEncoder for Encoder<F> {
    fn start(&mut self) -> Vec<SseFrame> {
        let mut out = Vec::new();
        self.ensure_started(&mut out);
        out
    }

    fn push(&mut self, event: &ReplyEvent) -> Vec<SseFrame> {
        let mut out = Vec::new();
        if self.phase == Phase::Ended {
            return out;
        }
        self.ensure_started(&mut out);
        for step in self.reply.apply(event).into_iter().flatten() {
            self.format.step(&self.reply, step, &self.meta, &mut out);
        }
        if matches!(event, ReplyEvent::Finish { .. }) {
            self.format.finished(&self.reply, &self.meta, &mut out);
        }
        out
    }

    fn finish(&mut self) -> Vec<SseFrame> {
        let mut out = Vec::new();
        if self.phase == Phase::Ended {
            return out;
        }
        self.ensure_started(&mut out);
        if let Some(n) = self.reply.close() {
            self.format
                .step(&self.reply, Step::Close(n), &self.meta, &mut out);
        }
        self.format.end(&self.reply, &self.meta, &mut out);
        self.phase = Phase::Ended;
        out
    }

    fn fail(&mut self, error: &ApiError) -> Vec<SseFrame> {
        let mut out = Vec::new();
        if self.phase == Phase::Ended {
            return out;
        }
        self.ensure_started(&mut out);
        self.format.fail(&self.reply, &self.meta, error, &mut out);
        self.phase = Phase::Ended;
        out
    }

    fn reply(&self) -> &Reply {
        &self.reply
    }
}

/// Collects a whole reply and writes the API's non-streaming response body.
#[derive(Debug, Clone)]
pub struct Aggregator {
    api: Api,
    meta: ReplyMeta,
    reply: Reply,
}

// === impl Aggregator ===

impl Aggregator {
    /// An empty aggregator answering in `api`'s shape.
    pub fn new(api: Api, meta: ReplyMeta) -> Self {
        Self {
            api,
            meta,
            reply: Reply::new(),
        }
    }

    /// Adds one event.
    pub fn push(&mut self, event: &ReplyEvent) {
        self.reply.push(event);
    }

    /// The reply so far.
    pub fn reply(&self) -> &Reply {
        &self.reply
    }

    /// The full response body (`chat.completion`, `text_completion`, `response`, `message`).
    pub fn finish(&self) -> Value {
        self.api.response_body(&self.reply, &self.meta)
    }
}

/// `{"type": kind, ...fields}`: the shape of every Responses and Anthropic event.
pub(crate) fn typed(kind: &str, fields: Value) -> Value {
    let mut event = serde_json::Map::new();
    event.insert("type".into(), kind.into());
    if let Value::Object(fields) = fields {
        event.extend(fields);
    }
    Value::Object(event)
}

/// A frame's JSON written as text: fixed pieces, escaped strings and numbers. A stream is mostly
/// one small frame per token whose keys never change, so its encoders write those frames this
/// way rather than build a `Value` each time; each format's tests hold them byte for byte to
/// what [`frame`] writes from the `Value`.
pub(crate) struct FrameText(Vec<u8>);

impl FrameText {
    /// An empty frame with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self(Vec::with_capacity(capacity))
    }

    /// JSON text, as is.
    pub(crate) fn raw(&mut self, json: &str) -> &mut Self {
        self.0.extend_from_slice(json.as_bytes());
        self
    }

    /// A JSON string.
    pub(crate) fn string(&mut self, text: &str) -> &mut Self {
        // Writing to a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut self.0, text);
        self
    }

    /// A JSON number.
    pub(crate) fn number(&mut self, n: u64) -> &mut Self {
        use std::io::Write as _;
        let _ = write!(self.0, "{n}");
        self
    }

    pub(crate) fn frame(self, event: Option<&'static str>) -> SseFrame {
        SseFrame {
            event,
            // Only `str` pieces went in.
            data: String::from_utf8(self.0).unwrap_or_default(),
        }
    }
}

/// A JSON value (a `Value`, or a typed frame) as an SSE frame.
pub(crate) fn frame<T: serde::Serialize + ?Sized>(
    event: Option<&'static str>,
    data: &T,
) -> SseFrame {
    SseFrame {
        event,
        // Every frame has string keys only, which is all that can make serialization fail.
        data: serde_json::to_string(data).unwrap_or_default(),
    }
}
