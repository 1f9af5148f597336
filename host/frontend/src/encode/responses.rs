//! OpenAI Responses API: the `response` object and its event stream.
//!
//! Each reply block is one output item: reasoning (`reasoning_text` content, the raw reasoning;
//! the summary stays empty), an assistant `message` with one `output_text` part, or a
//! `function_call`. Events follow openai-python's typed stream (`ResponseStreamEvent`); each
//! carries `sequence_number`.

use serde_json::{Map, Value, json};

use super::{Format, FrameText, frame, typed};
use crate::api::Api;
use crate::error::{ApiError, ErrorKind};
use crate::ir::{Block, CUSTOM_TOOL_INPUT, ToolOrigin};
use crate::reply::{FinishReason, Reply, ReplyMeta, SseFrame, Step, Usage};
use crate::responses::seal_reasoning;

/// The Responses API's `usage`.
fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens.unwrap_or(0)},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

/// The id of output item `n`.
fn item_id(block: &Block, meta: &ReplyMeta, n: usize) -> String {
    let prefix = match block {
        Block::Thinking { .. } => "rs",
        Block::ToolCall { .. } => "fc",
        _ => "msg",
    };
    format!("{prefix}_{}_{n}", meta.request_id)
}

/// The content part of a text or reasoning item.
fn part(block: &Block, done: bool) -> Value {
    match block {
        Block::Thinking { text, .. } => {
            json!({"type": "reasoning_text", "text": if done { text.as_str() } else { "" }})
        }
        Block::Text { text } => json!({
            "type": "output_text",
            "text": if done { text.as_str() } else { "" },
            "annotations": [],
            "logprobs": [],
        }),
        _ => Value::Null,
    }
}

/// Output item `n`: as first announced (`done` false: empty) or complete.
fn item(block: &Block, meta: &ReplyMeta, n: usize, done: bool) -> Value {
    let id = item_id(block, meta, n);
    let status = if done { "completed" } else { "in_progress" };
    let parts = if done {
        vec![part(block, true)]
    } else {
        Vec::new()
    };
    match block {
        Block::Thinking { text, .. } => {
            let summary = if done && meta.reasoning_summary && !text.is_empty() {
                // No summariser runs: the summary is the reasoning itself.
                json!([{"type": "summary_text", "text": text}])
            } else {
                json!([])
            };
            let mut item = json!({
                "id": id, "type": "reasoning", "summary": summary, "content": parts,
                "status": status,
            });
            if done && meta.encrypted_reasoning {
                item["encrypted_content"] = seal_reasoning(text).into();
            }
            item
        }
        Block::ToolCall {
            id: call_id,
            name,
            arguments,
        } => match meta.tool_origin(name) {
            ToolOrigin::Custom => json!({
                "id": id, "type": "custom_tool_call", "status": status, "call_id": call_id,
                "name": name, "input": if done { custom_input(arguments) } else { String::new() },
            }),
            ToolOrigin::Namespaced { namespace, name } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id,
                "namespace": namespace, "name": name,
                "arguments": if done { arguments.as_str() } else { "" },
            }),
            ToolOrigin::Function => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": if done { arguments.as_str() } else { "" },
            }),
        },
        _ => json!({
            "id": id, "type": "message", "status": status, "role": "assistant", "content": parts,
        }),
    }
}

/// A custom tool's freeform input from the arguments the model wrote (`{"input": "..."}`); any
/// other shape is passed as the text the model wrote.
fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut args)) => match args.remove(CUSTOM_TOOL_INPUT) {
            Some(Value::String(input)) => input,
            _ => arguments.to_owned(),
        },
        _ => arguments.to_owned(),
    }
}

/// `error.code` of a failed response: the request's fault is never a `server_error`.
fn failure_code(error: &ApiError) -> String {
    match error.kind {
        ErrorKind::InvalidRequest
        | ErrorKind::Authentication
        | ErrorKind::NotFound
        | ErrorKind::RequestTooLarge => error
            .code
            .clone()
            .unwrap_or_else(|| "invalid_prompt".into()),
        ErrorKind::RateLimited => "rate_limit_exceeded".into(),
        ErrorKind::Overloaded | ErrorKind::Upstream | ErrorKind::Internal => "server_error".into(),
    }
}

/// The `response` object: its own fields, then the request's echoed ones, then `usage`.
///
/// It borrows the echoed fields and writes them as they are: for Codex they are most of the
/// object (its tool definitions, ~19 KB), and a stream writes the object three times.
#[derive(Debug)]
struct ResponseObject<'a> {
    /// `id` through `tools`; an echoed field of the same name takes its value, in its place.
    head: [(&'static str, Value); 11],
    echo: &'a Map<String, Value>,
    usage: Value,
}

impl ResponseObject<'_> {
    /// The object's `status`.
    fn status(&self) -> Option<&str> {
        let (_, status) = self.head.iter().find(|(key, _)| *key == "status")?;
        status.as_str()
    }
}

impl serde::Serialize for ResponseObject<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in &self.head {
            map.serialize_entry(key, self.echo.get(*key).unwrap_or(value))?;
        }
        let own = |key: &str| key == "usage" || self.head.iter().any(|(k, _)| *k == key);
        for (key, value) in self.echo.iter().filter(|(key, _)| !own(key)) {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("usage", &self.usage)?;
        map.end()
    }
}

/// The `response` object. `final_state` false: the in-progress object of the opening events.
fn response<'a>(
    reply: &Reply,
    meta: &'a ReplyMeta,
    final_state: bool,
    error: Option<&ApiError>,
) -> ResponseObject<'a> {
    let incomplete = match reply.finish_reason() {
        FinishReason::Length => Some("max_output_tokens"),
        FinishReason::ContentFilter => Some("content_filter"),
        _ => None,
    };
    let status = match (final_state, error, incomplete) {
        (false, _, _) => "in_progress",
        (true, Some(_), _) => "failed",
        (true, None, Some(_)) => "incomplete",
        (true, None, None) => "completed",
    };
    let output: Vec<Value> = if final_state {
        reply
            .blocks()
            .iter()
            .enumerate()
            .map(|(n, b)| item(b, meta, n, true))
            .collect()
    } else {
        Vec::new()
    };
    let incomplete_details = match incomplete.filter(|_| final_state && error.is_none()) {
        Some(reason) => json!({ "reason": reason }),
        None => Value::Null,
    };
    let error = error.map_or(
        Value::Null,
        |e| json!({"code": failure_code(e), "message": e.message}),
    );
    ResponseObject {
        head: [
            ("id", Api::Responses.object_id(&meta.request_id).into()),
            ("object", "response".into()),
            ("created_at", meta.created.into()),
            ("status", status.into()),
            ("error", error),
            ("incomplete_details", incomplete_details),
            ("model", meta.model.as_str().into()),
            ("output", output.into()),
            // Required by the typed clients even when the gateway echoes nothing.
            ("parallel_tool_calls", true.into()),
            ("tool_choice", "auto".into()),
            ("tools", json!([])),
        ],
        echo: &meta.echo,
        usage: if final_state {
            usage_json(&reply.usage())
        } else {
            Value::Null
        },
    }
}

/// The full (non-streaming) body.
pub(crate) fn body(reply: &Reply, meta: &ReplyMeta) -> Value {
    // Only string keys, so this cannot fail.
    serde_json::to_value(response(reply, meta, true, None)).unwrap_or_default()
}

const OUTPUT_TEXT_DELTA: &str = "response.output_text.delta";
const FUNCTION_CALL_ARGUMENTS_DELTA: &str = "response.function_call_arguments.delta";

/// The Responses API's event stream.
#[derive(Debug, Default)]
pub(crate) struct EventFormat {
    sequence: u64,
}

impl EventFormat {
    fn event(&mut self, kind: &'static str, fields: Value, out: &mut Vec<SseFrame>) {
        let mut event = typed(kind, fields);
        event["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        out.push(frame(Some(kind), &event));
    }
}

impl EventFormat {
    /// The delta event of a text, reasoning or function call item: one per token, written as
    /// text (see [`FrameText`]), byte for byte what [`event`](Self::event) writes from the
    /// `Value` (`type`, the item's place, `delta`, `logprobs` for text, `sequence_number`).
    fn delta(&mut self, kind: &'static str, id: &str, n: usize, d: &str) -> SseFrame {
        self.written(kind, d.len() + id.len() + 128, |data| {
            data.raw(r#","item_id":"#)
                .string(id)
                .raw(r#","output_index":"#)
                .number(n as u64);
            // A function call's arguments are no content part.
            if kind != FUNCTION_CALL_ARGUMENTS_DELTA {
                data.raw(r#","content_index":0"#);
            }
            data.raw(r#","delta":"#).string(d);
            if kind == OUTPUT_TEXT_DELTA {
                data.raw(r#","logprobs":[]"#);
            }
        })
    }

    /// An event that carries the `response` object, given as JSON text: written around it, byte
    /// for byte what [`event`](Self::event) writes from `{"response": ...}`.
    fn with_response(&mut self, kind: &'static str, response: &str) -> SseFrame {
        self.written(kind, response.len() + 64, |data| {
            data.raw(r#","response":"#).raw(response);
        })
    }

    /// An event written as text: its `type`, the fields `fields` writes, its `sequence_number`.
    fn written(
        &mut self,
        kind: &'static str,
        capacity: usize,
        fields: impl FnOnce(&mut FrameText),
    ) -> SseFrame {
        let mut data = FrameText::with_capacity(capacity + kind.len());
        data.raw(r#"{"type":""#).raw(kind).raw("\"");
        fields(&mut data);
        data.raw(r#","sequence_number":"#)
            .number(self.sequence)
            .raw("}");
        self.sequence += 1;
        data.frame(Some(kind))
    }
}

/// `value` as JSON text.
fn json_text(value: &impl serde::Serialize) -> String {
    // Only string keys, so this cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

impl Format for EventFormat {
    fn start(&mut self, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let opening = json_text(&response(&Reply::new(), meta, false, None));
        out.push(self.with_response("response.created", &opening));
        out.push(self.with_response("response.in_progress", &opening));
    }

    fn step(&mut self, reply: &Reply, step: Step<'_>, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let n = match step {
            Step::Open(n) | Step::Delta(n, _) | Step::Close(n) => n,
        };
        let Some(block) = reply.blocks().get(n) else {
            return;
        };
        let id = item_id(block, meta, n);
        // The item's place, then `key`; the second in its content part (built only for the
        // events that are not a token's delta).
        let at = |key: &str, value: Value| {
            let mut v = json!({"item_id": id, "output_index": n});
            v[key] = value;
            v
        };
        let in_part = |key: &str, value: Value| {
            let mut v = json!({"item_id": id, "output_index": n, "content_index": 0});
            v[key] = value;
            v
        };
        match (step, block) {
            (Step::Open(_), _) => {
                let item = item(block, meta, n, false);
                self.event(
                    "response.output_item.added",
                    json!({"output_index": n, "item": item}),
                    out,
                );
                if !matches!(block, Block::ToolCall { .. }) {
                    let part = in_part("part", part(block, false));
                    self.event("response.content_part.added", part, out);
                }
            }
            (Step::Delta(_, d), Block::Text { .. }) => {
                out.push(self.delta(OUTPUT_TEXT_DELTA, &id, n, d));
            }
            (Step::Delta(_, d), Block::Thinking { .. }) => {
                out.push(self.delta("response.reasoning_text.delta", &id, n, d));
            }
            // A custom tool's input is known once its arguments are complete.
            (Step::Delta(_, d), Block::ToolCall { name, .. })
                if *meta.tool_origin(name) != ToolOrigin::Custom =>
            {
                out.push(self.delta(FUNCTION_CALL_ARGUMENTS_DELTA, &id, n, d));
            }
            (Step::Close(_), Block::Text { text }) => {
                let mut done = in_part("text", text.as_str().into());
                done["logprobs"] = json!([]);
                self.event("response.output_text.done", done, out);
                self.event(
                    "response.content_part.done",
                    in_part("part", part(block, true)),
                    out,
                );
            }
            (Step::Close(_), Block::Thinking { text, .. }) => {
                let done = in_part("text", text.as_str().into());
                self.event("response.reasoning_text.done", done, out);
                self.event(
                    "response.content_part.done",
                    in_part("part", part(block, true)),
                    out,
                );
            }
            (
                Step::Close(_),
                Block::ToolCall {
                    name, arguments, ..
                },
            ) => match meta.tool_origin(name) {
                ToolOrigin::Custom => {
                    let done = at("input", custom_input(arguments).into());
                    self.event("response.custom_tool_call_input.done", done, out);
                }
                origin => {
                    let short = match origin {
                        ToolOrigin::Namespaced { name, .. } => name,
                        _ => name,
                    };
                    let mut done = at("name", short.as_str().into());
                    done["arguments"] = arguments.as_str().into();
                    self.event("response.function_call_arguments.done", done, out);
                }
            },
            _ => {}
        }
        if let Step::Close(_) = step {
            let item = item(block, meta, n, true);
            self.event(
                "response.output_item.done",
                json!({"output_index": n, "item": item}),
                out,
            );
        }
    }

    fn end(&mut self, reply: &Reply, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let response = response(reply, meta, true, None);
        let kind = if response.status() == Some("incomplete") {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.with_response(kind, &json_text(&response)));
    }

    fn fail(&mut self, reply: &Reply, meta: &ReplyMeta, error: &ApiError, out: &mut Vec<SseFrame>) {
        let response = json_text(&response(reply, meta, true, Some(error)));
        out.push(self.with_response("response.failed", &response));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The old way, a `Map` built in order, where an echoed field replaces the default of the
    /// same name in its place.
    fn response_as_map(object: &ResponseObject<'_>) -> Value {
        let mut map = Map::new();
        for (key, value) in &object.head {
            map.insert((*key).into(), value.clone());
        }
        for (key, value) in object.echo {
            map.insert(key.clone(), value.clone());
        }
        map.insert("usage".into(), object.usage.clone());
        Value::Object(map)
    }

    /// The borrowed `response` object writes what the `Map` did, key order included, and the
    /// events that carry it are the frames [`EventFormat::event`] writes from their `Value`.
    #[test]
    fn the_response_object_and_its_events_are_their_values_byte_for_byte() {
        let mut meta = ReplyMeta::new("r1", 7, "m");
        for (key, value) in [
            ("instructions", json!("be \"brief\"")),
            ("metadata", json!({"k": "v"})),
            ("parallel_tool_calls", json!(false)),
            ("store", json!(true)),
            ("tools", json!([{"type": "function", "name": "ls"}])),
            ("tool_choice", json!("auto")),
        ] {
            Arc::make_mut(&mut meta.echo).insert(key.into(), value);
        }
        let mut reply = Reply::new();
        let _ = reply.apply(&switchyard_parsers::ParsedEvent::Text("hi".into()).into());
        let failed = ApiError::new(ErrorKind::Internal, "x");
        for (final_state, error) in [(false, None), (true, None), (true, Some(&failed))] {
            let object = response(&reply, &meta, final_state, error);
            let reference = response_as_map(&object);
            assert_eq!(json_text(&object), json_text(&reference));
            let kind = "response.completed";
            let mut expected = Vec::new();
            EventFormat { sequence: 3 }.event(
                kind,
                json!({ "response": reference }),
                &mut expected,
            );
            let written = EventFormat { sequence: 3 }.with_response(kind, &json_text(&object));
            assert_eq!([written], expected.as_slice());
        }
    }

    /// A token's delta event, written as text, is the frame [`EventFormat::event`] writes from
    /// its `Value`, sequence number included, whatever the text and the item id hold.
    #[test]
    fn a_tokens_delta_is_its_value_byte_for_byte() {
        for kind in [
            OUTPUT_TEXT_DELTA,
            "response.reasoning_text.delta",
            FUNCTION_CALL_ARGUMENTS_DELTA,
        ] {
            for (id, n) in [("msg_r_0", 0), ("fc_\"r\"_7", 7)] {
                for d in ["", "hé\n\"x\"", "\u{1}\t\\", "{\"a\":"] {
                    let mut fields = json!({"item_id": id, "output_index": n});
                    if kind != FUNCTION_CALL_ARGUMENTS_DELTA {
                        fields["content_index"] = 0.into();
                    }
                    fields["delta"] = d.into();
                    if kind == OUTPUT_TEXT_DELTA {
                        fields["logprobs"] = json!([]);
                    }
                    let mut reference = Vec::new();
                    EventFormat { sequence: 41 }.event(kind, fields, &mut reference);
                    let written = EventFormat { sequence: 41 }.delta(kind, id, n, d);
                    assert_eq!([written], reference.as_slice());
                }
            }
        }
    }
}
