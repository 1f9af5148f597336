//! OpenAI chat completions (`chat.completion[.chunk]`) and completions (`text_completion`).

use serde_json::{Value, json};

use super::{Format, FrameText, frame};
use crate::api::Api;
use crate::error::ApiError;
use crate::ir::Block;
use crate::reply::{Reply, ReplyMeta, SseFrame, Step, Usage};

/// Which of the two OpenAI APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    Chat,
    Completion,
}

impl Flavor {
    fn api(self) -> Api {
        match self {
            Flavor::Chat => Api::ChatCompletions,
            Flavor::Completion => Api::Completions,
        }
    }

    fn object(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Flavor::Chat, true) => "chat.completion.chunk",
            (Flavor::Chat, false) => "chat.completion",
            (Flavor::Completion, _) => "text_completion",
        }
    }

    /// One choice: chat's `delta` (stream) or `message` (body); completions' `text`.
    fn choice(self, streaming: bool, content: Value, finish_reason: Option<&str>) -> Value {
        let mut choice = json!({"index": 0});
        match self {
            Flavor::Chat if streaming => choice["delta"] = content,
            Flavor::Chat => choice["message"] = content,
            Flavor::Completion => choice["text"] = content,
        }
        choice["logprobs"] = Value::Null;
        choice["finish_reason"] = finish_reason.into();
        choice
    }
}

/// OpenAI's `usage`.
pub(crate) fn usage_json(usage: &Usage) -> Value {
    let mut json = json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    });
    if let Some(reasoning) = usage.reasoning_tokens {
        json["completion_tokens_details"] = json!({ "reasoning_tokens": reasoning });
    }
    json
}

fn envelope(flavor: Flavor, streaming: bool, meta: &ReplyMeta, choices: Vec<Value>) -> Value {
    json!({
        "id": flavor.api().object_id(&meta.request_id),
        "object": flavor.object(streaming),
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    })
}

/// One streamed chunk, as [`envelope`] writes it.
#[derive(serde::Serialize)]
struct StreamChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [StreamChoice<'a>; 1],
}

/// Its choice, as [`Flavor::choice`] writes it for a stream.
struct StreamChoice<'a> {
    content_key: &'static str,
    content: &'a Value,
    finish_reason: Option<&'a str>,
}

impl serde::Serialize for StreamChoice<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("index", &0)?;
        map.serialize_entry(self.content_key, self.content)?;
        map.serialize_entry("logprobs", &())?;
        map.serialize_entry("finish_reason", &self.finish_reason)?;
        map.end()
    }
}

/// The full body: `chat.completion` or `text_completion`.
pub(crate) fn body(flavor: Flavor, reply: &Reply, meta: &ReplyMeta) -> Value {
    let content = match flavor {
        Flavor::Completion => reply.text().into(),
        Flavor::Chat => {
            let text = reply.text();
            let mut message = json!({
                "role": "assistant",
                "content": if text.is_empty() { Value::Null } else { text.into() },
            });
            let reasoning = reply.reasoning();
            if !reasoning.is_empty() {
                message["reasoning_content"] = reasoning.into();
            }
            let calls: Vec<Value> = reply
                .blocks()
                .iter()
                .filter_map(|b| match b {
                    Block::ToolCall {
                        id,
                        name,
                        arguments,
                    } => Some(json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    })),
                    _ => None,
                })
                .collect();
            if !calls.is_empty() {
                message["tool_calls"] = calls.into();
            }
            message
        }
    };
    let finish = reply.finish_reason();
    let choice = flavor.choice(false, content, Some(finish.as_openai()));
    let mut body = envelope(flavor, false, meta, vec![choice]);
    body["usage"] = usage_json(&reply.usage());
    body
}

/// What follows the content of a chunk that does not finish the choice.
const OPEN_CHOICE_TAIL: &str = r#","logprobs":null,"finish_reason":null}]}"#;

/// The streaming format of chat completions and completions.
#[derive(Debug)]
pub(crate) struct ChunkFormat {
    flavor: Flavor,
    finish_sent: bool,
    /// Every chunk's bytes before its content (`{"id":...,"choices":[{"index":0,"delta":`),
    /// once the first token's chunk has cut it (see [`ChunkFormat::token_chunk`]).
    head: Option<String>,
}

impl ChunkFormat {
    pub(crate) fn new(flavor: Flavor) -> Self {
        Self {
            flavor,
            finish_sent: false,
            head: None,
        }
    }

    /// A chunk carrying one piece of text: the chat delta `{key: text}`, or with no key the
    /// completion's `text`. A stream is mostly these, one per token, so each is the envelope cut
    /// once from a chunk [`chunk`](Self::chunk) wrote with a null content, the escaped text and
    /// the fixed tail: byte for byte what `chunk` writes, without writing the envelope again.
    fn token_chunk(&mut self, meta: &ReplyMeta, key: Option<&str>, text: &str) -> SseFrame {
        let head = match &self.head {
            Some(head) => head,
            None => {
                let mut null = self.chunk(meta, Value::Null, None).data;
                null.truncate(null.len() - "null".len() - OPEN_CHOICE_TAIL.len());
                self.head.insert(null)
            }
        };
        let mut data = FrameText::with_capacity(head.len() + text.len() + 64);
        data.raw(head);
        match key {
            Some(key) => data.raw("{\"").raw(key).raw("\":").string(text).raw("}"),
            None => data.string(text),
        };
        data.raw(OPEN_CHOICE_TAIL);
        data.frame(None)
    }

    fn chunk(&self, meta: &ReplyMeta, content: Value, finish_reason: Option<&str>) -> SseFrame {
        // Written from borrowed fields (the same keys, in the same order, as `envelope` and
        // `Flavor::choice`), not built as a `Value` tree.
        let chunk = StreamChunk {
            id: &self.flavor.api().object_id(&meta.request_id),
            object: self.flavor.object(true),
            created: meta.created,
            model: &meta.model,
            choices: [StreamChoice {
                content_key: match self.flavor {
                    Flavor::Chat => "delta",
                    Flavor::Completion => "text",
                },
                content: &content,
                finish_reason,
            }],
        };
        frame(None, &chunk)
    }

    fn finish_chunk(&mut self, reply: &Reply, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        if self.finish_sent {
            return;
        }
        self.finish_sent = true;
        let empty = match self.flavor {
            Flavor::Chat => json!({}),
            Flavor::Completion => json!(""),
        };
        out.push(self.chunk(meta, empty, Some(reply.finish_reason().as_openai())));
    }
}

impl Format for ChunkFormat {
    fn start(&mut self, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        if self.flavor == Flavor::Chat {
            out.push(self.chunk(meta, json!({"role": "assistant", "content": ""}), None));
        }
    }

    fn step(&mut self, reply: &Reply, step: Step<'_>, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        let (n, delta) = match step {
            Step::Open(n) => (n, None),
            Step::Delta(n, delta) => (n, Some(delta)),
            Step::Close(_) => return,
        };
        let content = match (self.flavor, reply.blocks().get(n), delta) {
            (Flavor::Completion, Some(Block::Text { .. }), Some(d)) => {
                return out.push(self.token_chunk(meta, None, d));
            }
            (Flavor::Chat, Some(Block::Text { .. }), Some(d)) => {
                return out.push(self.token_chunk(meta, Some("content"), d));
            }
            (Flavor::Chat, Some(Block::Thinking { .. }), Some(d)) => {
                return out.push(self.token_chunk(meta, Some("reasoning_content"), d));
            }
            (Flavor::Chat, Some(Block::ToolCall { id, name, .. }), None) => json!({"tool_calls": [{
                "index": reply.call_ordinal(n).unwrap_or(0),
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            (Flavor::Chat, Some(Block::ToolCall { .. }), Some(d)) => json!({"tool_calls": [{
                "index": reply.call_ordinal(n).unwrap_or(0),
                "function": {"arguments": d},
            }]}),
            // Completions have no place for reasoning or tool calls.
            _ => return,
        };
        out.push(self.chunk(meta, content, None));
    }

    fn finished(&mut self, reply: &Reply, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        self.finish_chunk(reply, meta, out);
    }

    fn end(&mut self, reply: &Reply, meta: &ReplyMeta, out: &mut Vec<SseFrame>) {
        self.finish_chunk(reply, meta, out);
        if meta.include_usage {
            let mut chunk = envelope(self.flavor, true, meta, Vec::new());
            chunk["usage"] = usage_json(&reply.usage());
            out.push(frame(None, &chunk));
        }
        out.push(done());
    }

    fn fail(&mut self, _: &Reply, _: &ReplyMeta, error: &ApiError, out: &mut Vec<SseFrame>) {
        out.push(frame(None, &error.to_openai_json()));
        out.push(done());
    }
}

fn done() -> SseFrame {
    SseFrame {
        event: None,
        data: "[DONE]".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed chunk writes exactly the bytes the `Value` envelope does.
    #[test]
    fn a_streamed_chunk_is_the_envelope_byte_for_byte() {
        let meta = ReplyMeta::new("r1", 1_700_000_000, "m \"quoted\"");
        for flavor in [Flavor::Chat, Flavor::Completion] {
            let format = ChunkFormat::new(flavor);
            for (content, finish) in [
                (json!({"content": "hé\n\"x\""}), None),
                (json!({}), Some("stop")),
                (json!("text"), Some("length")),
                (
                    json!({"tool_calls": [{"index": 0, "id": "c", "type": "function"}]}),
                    None,
                ),
            ] {
                let typed = format.chunk(&meta, content.clone(), finish);
                let choice = flavor.choice(true, content, finish);
                let reference = envelope(flavor, true, &meta, vec![choice]).to_string();
                assert_eq!(typed.data, reference);
            }
        }
    }

    /// A token's chunk, spliced into the envelope, is the chunk `chunk` writes, whatever the
    /// text holds (quotes, escapes, control characters, non-ASCII) and however the model is named.
    #[test]
    fn a_tokens_chunk_is_the_chunk_byte_for_byte() {
        for model in ["m", "m \"quoted\" \\ é"] {
            let meta = ReplyMeta::new("r\"1", 1_700_000_000, model);
            for text in ["", "hé\n\"x\"", "\u{1}\t\\", "🦀 </s>"] {
                let mut chat = ChunkFormat::new(Flavor::Chat);
                for key in ["content", "reasoning_content"] {
                    let spliced = chat.token_chunk(&meta, Some(key), text);
                    let written = chat.chunk(&meta, json!({ key: text }), None);
                    assert_eq!(spliced, written, "{model} {text:?}");
                }
                let mut completion = ChunkFormat::new(Flavor::Completion);
                let spliced = completion.token_chunk(&meta, None, text);
                assert_eq!(spliced, completion.chunk(&meta, json!(text), None));
            }
        }
    }
}
