//! Anthropic messages: the `message` object and its event stream.
//!
//! Usage follows Anthropic's split: `input_tokens` excludes cached tokens, which are
//! `cache_read_input_tokens`; nothing is reported as written to the cache. `message_start`
//! carries the gateway's own prompt count (the engine reports at the end); `message_delta`
//! carries the engine's final counts.

use serde_json::{Value, json};

use super::{Format, frame, typed};
use crate::api::Api;
use crate::error::ApiError;
use crate::ir::Block;
use crate::reply::{FinishReason, Reply, ReplyMeta, SseFrame, Step, Usage};

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    })
}

/// `stop_reason` and `stop_sequence`.
fn stop(reply: &Reply) -> (&'static str, Value) {
    match reply.finish_reason() {
        FinishReason::Stop => ("end_turn", Value::Null),
        FinishReason::Length => ("max_tokens", Value::Null),
        FinishReason::ToolCalls => ("tool_use", Value::Null),
        FinishReason::StopSequence(s) => ("stop_sequence", s.into()),
        FinishReason::ContentFilter => ("refusal", Value::Null),
    }
}

/// A content block: as first announced (`done` false: empty) or complete.
fn content_block(block: &Block, done: bool) -> Value {
    match block {
        Block::Thinking { text, signature } => json!({
            "type": "thinking",
            "thinking": if done { text.as_str() } else { "" },
            "signature": signature.as_deref().unwrap_or_default(),
        }),
        Block::ToolCall {
            id,
            name,
            arguments,
        } => {
            // Anthropic's input is an object; arguments that are not one (cut off by the length
            // limit) become an empty input.
            let input = match serde_json::from_str::<Value>(arguments) {
                Ok(v @ Value::Object(_)) if done => v,
                _ => json!({}),
            };
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Block::Text { text } => {
            json!({"type": "text", "text": if done { text.as_str() } else { "" }})
        }
        _ => Value::Null,
    }
}

fn message(meta: &ReplyMeta, content: Vec<Value>, stop: (Value, Value), usage: Value) -> Value {
    json!({
        "id": Api::Messages.object_id(&meta.request_id),
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop.0,
        "stop_sequence": stop.1,
        "usage": usage,
    })
}

/// The full (non-streaming) body.
pub(crate) fn body(reply: &Reply, meta: &ReplyMeta) -> Value {
    let content = reply
        .blocks()
        .iter()
        .map(|b| content_block(b, true))
        .filter(|b| !b.is_null())
        .collect();
    let (reason, sequence) = stop(reply);
    message(
        meta,
        content,
        (reason.into(), sequence),
        usage_json(&reply.usage()),
    )
}

/// Anthropic's event stream.
#[derive(Debug, Default)]
pub(crate) struct EventFormat;

fn event(kind: &'static str, fields: Value, out: &mut Vec<SseFrame>) {
    out.push(frame(Some(kind), &typed(kind, fields)));
}

impl Format for EventFormat {
    fn start(&mut self, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let usage = Usage {
            prompt_tokens: meta.prompt_tokens.unwrap_or(0),
            ..Usage::default()
        };
        let opening = message(
            meta,
            Vec::new(),
            (Value::Null, Value::Null),
            usage_json(&usage),
        );
        event("message_start", json!({ "message": opening }), out);
        event("ping", json!({}), out);
    }

    fn step(&mut self, reply: &Reply, step: Step<'_>, _: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let n = match step {
            Step::Open(n) | Step::Delta(n, _) | Step::Close(n) => n,
        };
        let Some(block) = reply.blocks().get(n) else {
            return;
        };
        match step {
            Step::Open(_) => {
                let start = json!({"index": n, "content_block": content_block(block, false)});
                event("content_block_start", start, out);
            }
            Step::Delta(_, d) => {
                let delta = match block {
                    Block::Thinking { .. } => json!({"type": "thinking_delta", "thinking": d}),
                    Block::ToolCall { .. } => {
                        json!({"type": "input_json_delta", "partial_json": d})
                    }
                    _ => json!({"type": "text_delta", "text": d}),
                };
                event(
                    "content_block_delta",
                    json!({"index": n, "delta": delta}),
                    out,
                );
            }
            Step::Close(_) => event("content_block_stop", json!({ "index": n }), out),
        }
    }

    fn end(&mut self, reply: &Reply, _: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let (reason, sequence) = stop(reply);
        let delta = json!({
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_json(&reply.usage()),
        });
        event("message_delta", delta, out);
        event("message_stop", json!({}), out);
    }

    fn fail(&mut self, _: &Reply, _: &ReplyMeta, error: &ApiError, out: &mut Vec<SseFrame>) {
        let mut body = error.to_anthropic_json();
        // The body's own `type` ("error") is the event's type.
        if let Some(object) = body.as_object_mut() {
            object.remove("type");
        }
        event("error", body, out);
    }
}
