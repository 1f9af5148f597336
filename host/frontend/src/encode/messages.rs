//! Anthropic messages: the `message` object and its event stream.
//!
//! Usage follows Anthropic's split: `input_tokens` excludes cached tokens, which are
//! `cache_read_input_tokens`; nothing is reported as written to the cache. `message_start`
//! carries the gateway's own prompt count (the engine reports at the end); `message_delta`
//! carries the engine's final counts.

use serde_json::{Value, json};

use super::{Format, FrameText, frame, typed};
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

/// A `content_block_delta`: one per token, written as text (see [`FrameText`]), byte for byte
/// the `Value` `{"type", "index", "delta": {"type", <key>: d}}` would write.
fn block_delta(block: &Block, n: usize, d: &str) -> SseFrame {
    let (kind, key) = match block {
        Block::Thinking { .. } => ("thinking_delta", "thinking"),
        Block::ToolCall { .. } => ("input_json_delta", "partial_json"),
        _ => ("text_delta", "text"),
    };
    let mut data = FrameText::with_capacity(d.len() + 96);
    data.raw(r#"{"type":"content_block_delta","index":"#)
        .number(n as u64)
        .raw(r#","delta":{"type":""#)
        .raw(kind)
        .raw(r#"",""#)
        .raw(key)
        .raw(r#"":"#)
        .string(d)
        .raw("}}");
    data.frame(Some("content_block_delta"))
}

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
            Step::Delta(_, d) => out.push(block_delta(block, n, d)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A token's delta, written as text, is the frame its `Value` writes, for every kind of
    /// block and whatever the text holds.
    #[test]
    fn a_tokens_delta_is_its_value_byte_for_byte() {
        let text = Block::Text { text: "x".into() };
        let thinking = Block::Thinking {
            text: "x".into(),
            signature: None,
        };
        let call = Block::ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: String::new(),
        };
        for (block, kind, key) in [
            (&text, "text_delta", "text"),
            (&thinking, "thinking_delta", "thinking"),
            (&call, "input_json_delta", "partial_json"),
        ] {
            for n in [0, 12] {
                for d in ["", "hé\n\"x\"", "\u{1}\t\\", "{\"a\":"] {
                    let mut reference = Vec::new();
                    let delta = json!({"index": n, "delta": {"type": kind, key: d}});
                    event("content_block_delta", delta, &mut reference);
                    assert_eq!([block_delta(block, n, d)], reference.as_slice());
                }
            }
        }
    }
}
