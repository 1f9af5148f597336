//! What the gateway sends an engine, and how it reads the answer back as reply events.
//!
//! Engines stream, with usage, when the client streams, and otherwise when the router needs the
//! first token to learn that the prefill ended (`[server] engine_stream`,
//! `Decision::engine_streams`): the gateway then sees the first token and the engine's
//! cached-token count, and re-encodes the stream into the client's API or aggregates it into one
//! body. Otherwise the engine's whole answer is read here in one piece.

use super::prepare::{Request, Turn};
use crate::config::{EngineKind, UpstreamMode};
use crate::upstream::Upstream;
use serde_json::{Value, json};
use switchyard_frontend::{
    ApiError, Completion, Conversation, ErrorKind, FinishReason, Prompt, ReplyEvent,
    UpstreamChatDecoder, to_chat_request, to_completion_request,
};
use switchyard_parsers::{CallEmission, OutputParser, ParsedEvent, UnknownParser};

/// Template variables only the gateway's own template rendering uses.
const TEMPLATE_ONLY: &[&str] = &["chat_template_kwargs"];

/// What became of a request's `cache_control`, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// The request asked for none.
    None,
    /// Sent to an engine that pins prefixes.
    Sent,
    /// The engine has no pin API: ignored.
    Unsupported,
}

/// The path and body for `upstream`; `priority` is the request's after admission's adjustments,
/// `whole` asks for the engine's answer in one piece instead of a stream.
pub(crate) fn request(
    turn: &Turn,
    upstream: &Upstream,
    (priority, whole): (i32, bool),
) -> (&'static str, Value, Pin) {
    let (path, mut body) = match (&turn.request, upstream.mode) {
        (Request::Completion(completion), _) => {
            ("/v1/completions", to_completion_request(completion))
        }
        (Request::Chat(conversation), UpstreamMode::Chat) => {
            ("/v1/chat/completions", to_chat_request(conversation))
        }
        (Request::Responses(responses), UpstreamMode::Chat) => (
            "/v1/chat/completions",
            to_chat_request(&responses.conversation),
        ),
        (Request::Chat(conversation), UpstreamMode::Tokens) => {
            ("/v1/completions", token_request(conversation, &turn.tokens))
        }
        (Request::Responses(responses), UpstreamMode::Tokens) => (
            "/v1/completions",
            token_request(&responses.conversation, &turn.tokens),
        ),
    };
    if whole && let Some(fields) = body.as_object_mut() {
        fields.insert("stream".into(), false.into());
        fields.remove("stream_options");
    }
    // No limit from the client means "until the model stops or the context is full".
    if body.get("max_tokens").is_none() && body.get("max_completion_tokens").is_none() {
        body["max_tokens"] = turn.default_max_tokens.into();
    }
    if turn.request.hints().priority.is_some() || priority != 0 {
        set_priority(&mut body, upstream.kind, priority);
    }
    let pin = match turn.request.cache_control() {
        None => Pin::None,
        Some(cache) if upstream.kind == EngineKind::Mock => {
            body["nvext"] = json!({"cache_control": {
                "type": "ephemeral",
                "ttl": format!("{}s", cache.ttl.as_secs()),
            }});
            Pin::Sent
        }
        Some(_) => Pin::Unsupported,
    };
    (path, body, pin)
}

/// A completions request with the prompt the router hashed, token for token.
fn token_request(conversation: &Conversation, tokens: &[u32]) -> Value {
    let mut extra = conversation.extra.clone();
    extra.retain(|key, _| !TEMPLATE_ONLY.contains(&key.as_str()));
    to_completion_request(&Completion {
        model: conversation.model.clone(),
        prompt: Prompt::Tokens(tokens.to_vec()),
        sampling: conversation.sampling.clone(),
        stream: true,
        include_usage: true,
        hints: conversation.hints,
        cache_control: conversation.cache_control,
        extra,
    })
}

/// The client's priority (higher = more important) in the engine's own polarity
/// (engine-protocols.md section 3): vLLM and the mock schedule lower values first, SGLang higher
/// values; TensorRT-LLM and generic servers have no per-request priority.
fn set_priority(body: &mut Value, kind: EngineKind, priority: i32) {
    match kind {
        EngineKind::Vllm | EngineKind::Mock => body["priority"] = (-i64::from(priority)).into(),
        EngineKind::Sglang => body["priority"] = priority.into(),
        EngineKind::Trtllm | EngineKind::Openai => {}
    }
}

/// Reads one engine stream as reply events. In `tokens` mode the engine returns raw text, which
/// the model's reasoning and tool-call parsers split here, incrementally.
#[derive(Debug)]
pub(crate) struct ReplyDecoder {
    chunks: UpstreamChatDecoder,
    parser: Option<OutputParser>,
    tool_calls: bool,
    finished: bool,
}

impl ReplyDecoder {
    /// A decoder for a chat-shaped request (`parse` in `tokens` mode) or a completion. A
    /// client that is not streaming gets only well-formed calls (`CallEmission::Complete`); a
    /// streaming one sees each call as it is written.
    pub(crate) fn new(
        request_id: &str,
        parse: bool,
        streaming: bool,
        (reasoning_parser, tool_parser): (Option<&str>, Option<&str>),
    ) -> Result<Self, UnknownParser> {
        let emission = if streaming {
            CallEmission::Streaming
        } else {
            CallEmission::Complete
        };
        let ids = format!("call_{request_id}_");
        let parser = parse
            .then(|| OutputParser::with_emission(reasoning_parser, tool_parser, &ids, emission))
            .transpose()?;
        Ok(Self {
            chunks: UpstreamChatDecoder::new(request_id),
            parser,
            tool_calls: false,
            finished: false,
        })
    }

    /// The events of one server-sent event's `data`.
    pub(crate) fn data(&mut self, data: &str) -> Result<Vec<ReplyEvent>, ApiError> {
        let events = self.chunks.decode_data(data)?;
        self.parse(events)
    }

    /// The events of an engine's whole (not streamed) answer.
    pub(crate) fn whole(&mut self, body: &[u8]) -> Result<Vec<ReplyEvent>, ApiError> {
        let body: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::new(
                ErrorKind::Upstream,
                format!("engine sent an unreadable answer: {e}"),
            )
        })?;
        let events = self.chunks.decode_response(&body)?;
        self.parse(events)
    }

    /// In `tokens` mode, the engine's text split by the model's parsers.
    fn parse(&mut self, events: Vec<ReplyEvent>) -> Result<Vec<ReplyEvent>, ApiError> {
        let Some(parser) = &mut self.parser else {
            return Ok(events);
        };
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            match event {
                ReplyEvent::Output(ParsedEvent::Text(text)) => {
                    out.extend(parser.push(&text).into_iter().map(ReplyEvent::Output));
                }
                ReplyEvent::Finish { reason } => {
                    out.extend(parser.finish().into_iter().map(ReplyEvent::Output));
                    self.tool_calls |= out.iter().any(is_call);
                    self.finished = true;
                    // The engine stopped on its own after writing calls: the turn ends in them.
                    let reason = match reason {
                        FinishReason::Stop if self.tool_calls => FinishReason::ToolCalls,
                        reason => reason,
                    };
                    out.push(ReplyEvent::Finish { reason });
                }
                other => out.push(other),
            }
        }
        self.tool_calls |= out.iter().any(is_call);
        Ok(out)
    }

    /// The stream ended: whatever the parser still holds.
    pub(crate) fn finish(&mut self) -> Vec<ReplyEvent> {
        match &mut self.parser {
            Some(parser) if !self.finished => {
                self.finished = true;
                parser
                    .finish()
                    .into_iter()
                    .map(ReplyEvent::Output)
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

fn is_call(event: &ReplyEvent) -> bool {
    matches!(event, ReplyEvent::Output(ParsedEvent::ToolCallStart { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion_chunk(text: &str, finish: Option<&str>) -> String {
        json!({"object": "text_completion",
               "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
        .to_string()
    }

    /// An answer in the mock model's format: reasoning, text, then a hermes tool call.
    const THOUGHT_AND_CALL: &str = "<think>plan</think>Sure.<tool_call>{\"name\": \"ls\", \"arguments\": {\"d\": 1}}</tool_call>";

    /// The reply `events` make, checked to be [`THOUGHT_AND_CALL`] parsed.
    fn parsed_thought_and_call(events: &[ReplyEvent]) -> switchyard_frontend::Reply {
        let mut reply = switchyard_frontend::Reply::new();
        for event in events {
            reply.push(event);
        }
        assert_eq!(reply.reasoning(), "plan");
        assert_eq!(reply.text(), "Sure.");
        assert!(reply.has_tool_calls());
        assert_eq!(reply.finish_reason(), FinishReason::ToolCalls);
        reply
    }

    #[test]
    fn tokens_mode_parses_calls_split_across_chunks() {
        let mut decoder =
            ReplyDecoder::new("7", true, true, (Some("qwen3"), Some("hermes"))).unwrap();
        let mut events = Vec::new();
        let chars: Vec<char> = THOUGHT_AND_CALL.chars().collect();
        for piece in chars.chunks(3) {
            let piece: String = piece.iter().collect();
            events.extend(decoder.data(&completion_chunk(&piece, None)).unwrap());
        }
        events.extend(decoder.data(&completion_chunk("", Some("stop"))).unwrap());
        events.extend(decoder.finish());
        parsed_thought_and_call(&events);
    }

    #[test]
    fn a_whole_answer_is_parsed_like_its_stream() {
        let body = json!({"object": "text_completion",
                          "choices": [{"index": 0, "text": THOUGHT_AND_CALL, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 9, "completion_tokens": 20}});
        let mut decoder =
            ReplyDecoder::new("7", true, false, (Some("qwen3"), Some("hermes"))).unwrap();
        let mut events = decoder.whole(body.to_string().as_bytes()).unwrap();
        events.extend(decoder.finish());
        let reply = parsed_thought_and_call(&events);
        assert_eq!(reply.usage().completion_tokens, 20);
        let error = decoder.whole(b"data: {}").unwrap_err();
        assert!(error.message.contains("unreadable answer"), "{error:?}");
    }

    #[test]
    fn chat_mode_passes_engine_events_through() {
        let mut decoder = ReplyDecoder::new("7", false, true, (None, None)).unwrap();
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": "<think>x</think>"},
                                        "finish_reason": "stop"}]});
        let events = decoder.data(&chunk.to_string()).unwrap();
        assert_eq!(
            events,
            [
                ReplyEvent::Output(ParsedEvent::Text("<think>x</think>".into())),
                ReplyEvent::Finish {
                    reason: FinishReason::Stop
                }
            ]
        );
    }

    #[test]
    fn priority_follows_each_engines_polarity() {
        for (kind, expected) in [
            (EngineKind::Vllm, json!(-5)),
            (EngineKind::Sglang, json!(5)),
            (EngineKind::Trtllm, Value::Null),
        ] {
            let mut body = json!({});
            set_priority(&mut body, kind, 5);
            assert_eq!(body["priority"], expected, "{kind:?}");
        }
    }
}
