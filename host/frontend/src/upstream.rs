//! Reading an engine's OpenAI-compatible answer (chat completion chunks, completion chunks, or a
//! whole body) as [`ReplyEvent`]s.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use switchyard_parsers::ParsedEvent;

use crate::error::{ApiError, ErrorKind};
use crate::reply::{FinishReason, ReplyEvent, Usage};

/// Decodes one engine stream's chunks (`chat.completion.chunk` or `text_completion`) into reply
/// events, assembling tool calls that arrive in pieces.
#[derive(Debug, Clone)]
pub struct UpstreamChatDecoder {
    request_id: String,
    /// Tool calls by the engine's index.
    calls: Vec<Call>,
    started_calls: usize,
}

#[derive(Debug, Clone)]
struct Call {
    engine_index: u64,
    id: Option<String>,
    name: Option<String>,
    /// Our index once started (the name is known).
    index: Option<usize>,
    /// Arguments that came before the name.
    pending: String,
}

// === impl UpstreamChatDecoder ===

impl UpstreamChatDecoder {
    /// A decoder for one engine stream; `request_id` makes the ids of tool calls the engine left
    /// without one unique (`call_<request_id>_<n>`).
    pub fn new(request_id: &str) -> Self {
        Self {
            request_id: request_id.to_owned(),
            calls: Vec::new(),
            started_calls: 0,
        }
    }

    /// Decodes the `data` of one server-sent event (`[DONE]` yields nothing).
    pub fn decode_data(&mut self, data: &str) -> Result<Vec<ReplyEvent>, ApiError> {
        let data = data.trim();
        if data == "[DONE]" || data.is_empty() {
            return Ok(Vec::new());
        }
        // The fast path: read only the fields used, borrowing the text (an engine streams a
        // chunk per token, so a `Value` tree per chunk was most of the gateway's relay cost).
        // Anything it does not take as is (an error chunk, an unexpected type) goes through the
        // `Value` path, which is the reference: both give the same events for what both accept.
        if let Ok(chunk) = serde_json::from_str::<ChunkView<'_>>(data)
            && !chunk.is_error()
        {
            let mut events = Vec::new();
            if let Some(choice) = chunk.first_choice() {
                if let Some(delta) = &choice.delta {
                    let calls = delta.tool_calls.as_deref();
                    self.content(
                        delta.reasoning(),
                        delta.content.as_deref(),
                        calls,
                        &mut events,
                    );
                }
                self.choice_end(
                    choice.text.as_deref(),
                    choice.finish_reason.as_deref(),
                    choice.stop_reason.as_ref(),
                    &mut events,
                );
            }
            if let Some(usage) = chunk.usage.as_ref().and_then(usage_of) {
                events.push(ReplyEvent::Usage(usage));
            }
            return Ok(events);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| upstream(format!("engine sent an unreadable chunk: {e}")))?;
        self.decode_chunk(&chunk)
    }

    /// Decodes one chunk. An error chunk (`{"error": ...}` or `{"object": "error"}`) is an `Err`.
    pub fn decode_chunk(&mut self, chunk: &Value) -> Result<Vec<ReplyEvent>, ApiError> {
        check_error(chunk)?;
        let mut events = Vec::new();
        if let Some(choice) = first_choice(chunk) {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            self.content_of(delta, &mut events);
            self.choice_end_of(choice, &mut events);
        }
        if let Some(usage) = usage(chunk) {
            events.push(ReplyEvent::Usage(usage));
        }
        Ok(events)
    }

    /// Decodes a whole (non-streamed) `chat.completion` or `text_completion` body.
    pub fn decode_response(&mut self, body: &Value) -> Result<Vec<ReplyEvent>, ApiError> {
        check_error(body)?;
        let mut events = Vec::new();
        if let Some(choice) = first_choice(body) {
            if let Some(message) = choice.get("message") {
                self.content_of(message, &mut events);
            }
            if let Some(Value::String(text)) = choice.get("text") {
                push_text(ParsedEvent::Text, text, &mut events);
            }
            events.push(ReplyEvent::Finish {
                reason: finish_reason_of(choice).unwrap_or(FinishReason::Stop),
            });
        }
        if let Some(usage) = usage(body) {
            events.push(ReplyEvent::Usage(usage));
        }
        Ok(events)
    }

    /// Reasoning, text and tool calls of a chat `delta` or `message` (a `Value`).
    fn content_of(&mut self, delta: &Value, events: &mut Vec<ReplyEvent>) {
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|key| delta.get(key).and_then(Value::as_str));
        let text = delta.get("content").and_then(Value::as_str);
        let calls = delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice);
        self.content(reasoning, text, calls, events);
    }

    /// Reasoning, text and tool calls of a chat `delta` or `message`, in that order.
    fn content(
        &mut self,
        reasoning: Option<&str>,
        text: Option<&str>,
        calls: Option<&[Value]>,
        events: &mut Vec<ReplyEvent>,
    ) {
        if let Some(reasoning) = reasoning {
            push_text(ParsedEvent::Reasoning, reasoning, events);
        }
        if let Some(text) = text {
            push_text(ParsedEvent::Text, text, events);
        }
        for (position, call) in calls.unwrap_or_default().iter().enumerate() {
            self.tool_call(position, call, events);
        }
    }

    /// A streamed choice's completion text and finish reason (a `Value`).
    fn choice_end_of(&mut self, choice: &Value, events: &mut Vec<ReplyEvent>) {
        let text = choice.get("text").and_then(Value::as_str);
        let reason = choice.get("finish_reason").and_then(Value::as_str);
        self.choice_end(text, reason, choice.get("stop_reason"), events);
    }

    /// A streamed choice's completion text and finish reason.
    fn choice_end(
        &mut self,
        text: Option<&str>,
        finish_reason: Option<&str>,
        stop_reason: Option<&Value>,
        events: &mut Vec<ReplyEvent>,
    ) {
        if let Some(text) = text {
            push_text(ParsedEvent::Text, text, events);
        }
        if let Some(reason) = finish_reason.map(|r| parse_finish_reason(r, stop_reason)) {
            events.push(ReplyEvent::Finish { reason });
        }
    }

    fn tool_call(&mut self, position: usize, call: &Value, events: &mut Vec<ReplyEvent>) {
        let engine_index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let slot = match self
            .calls
            .iter()
            .position(|c| c.engine_index == engine_index)
        {
            Some(slot) => slot,
            None => {
                self.calls.push(Call {
                    engine_index,
                    id: None,
                    name: None,
                    index: None,
                    pending: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let function = call.get("function").unwrap_or(&Value::Null);
        let arguments = match function.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            // Some servers send the arguments as an object.
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => String::new(),
        };
        let Some(state) = self.calls.get_mut(slot) else {
            return;
        };
        if let Some(Value::String(id)) = call.get("id") {
            state.id.get_or_insert_with(|| id.clone());
        }
        if let Some(Value::String(name)) = function.get("name")
            && !name.is_empty()
        {
            state.name.get_or_insert_with(|| name.clone());
        }
        match (state.index, &state.name) {
            (Some(index), _) => {
                if !arguments.is_empty() {
                    events.push(
                        ParsedEvent::ToolCallArguments {
                            index,
                            delta: arguments,
                        }
                        .into(),
                    );
                }
            }
            (None, Some(name)) => {
                let index = self.started_calls;
                self.started_calls += 1;
                state.index = Some(index);
                let id = state
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{}_{index}", self.request_id));
                events.push(
                    ParsedEvent::ToolCallStart {
                        index,
                        id,
                        name: name.clone(),
                    }
                    .into(),
                );
                let delta = std::mem::take(&mut state.pending) + &arguments;
                if !delta.is_empty() {
                    events.push(ParsedEvent::ToolCallArguments { index, delta }.into());
                }
            }
            (None, None) => state.pending.push_str(&arguments),
        }
    }
}

fn push_text(make: fn(String) -> ParsedEvent, text: &str, events: &mut Vec<ReplyEvent>) {
    if !text.is_empty() {
        events.push(ReplyEvent::Output(make(text.to_owned())));
    }
}

fn first_choice(body: &Value) -> Option<&Value> {
    body.get("choices")?
        .as_array()?
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}

fn finish_reason_of(choice: &Value) -> Option<FinishReason> {
    let reason = choice.get("finish_reason")?.as_str()?;
    Some(parse_finish_reason(reason, choice.get("stop_reason")))
}

fn parse_finish_reason(reason: &str, stop_reason: Option<&Value>) -> FinishReason {
    match reason {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        // vLLM names the stop string that matched (or the stop token id) in `stop_reason`.
        _ => match stop_reason {
            Some(Value::String(s)) => FinishReason::StopSequence(s.clone()),
            _ => FinishReason::Stop,
        },
    }
}

fn usage(body: &Value) -> Option<Usage> {
    usage_of(body.get("usage")?)
}

fn usage_of(usage: &Value) -> Option<Usage> {
    let usage = usage.as_object()?;
    let count = |v: Option<&Value>| v.and_then(Value::as_u64);
    Some(Usage {
        prompt_tokens: count(usage.get("prompt_tokens")).unwrap_or(0),
        completion_tokens: count(usage.get("completion_tokens")).unwrap_or(0),
        cached_tokens: count(
            usage
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens")),
        )
        .unwrap_or(0),
        reasoning_tokens: count(
            usage
                .get("completion_tokens_details")
                .and_then(|d| d.get("reasoning_tokens")),
        ),
    })
}

fn check_error(body: &Value) -> Result<(), ApiError> {
    let error = match body.get("error") {
        Some(error) if !error.is_null() => error,
        _ if body.get("object").and_then(Value::as_str) == Some("error") => body,
        _ => return Ok(()),
    };
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    Err(upstream(format!("engine error: {message}")))
}

/// The fields of a streamed chunk the decoder reads, borrowed from its text; see
/// [`UpstreamChatDecoder::decode_data`]. Unknown fields are skipped; a field of an unexpected
/// type (an index that is not an integer) fails the whole view, which sends the chunk down the
/// `Value` path.
#[derive(Deserialize)]
struct ChunkView<'a> {
    /// Present and not null: an error chunk (read on the `Value` path).
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default, borrow)]
    object: Option<Text<'a>>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChoiceView<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<DeltaView<'a>>,
    #[serde(default, borrow)]
    text: Option<Text<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Text<'a>>,
    #[serde(default)]
    stop_reason: Option<Value>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default, borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
}

/// A string borrowed from the chunk unless it holds escapes. (serde borrows a `Cow<str>` field
/// only when it is not wrapped: as `Option<Cow<str>>` every string would be copied.)
struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;

        impl<'de> serde::de::Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text.to_owned())))
            }

            fn visit_string<E>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(text)))
            }
        }

        deserializer.deserialize_str(TextVisitor)
    }
}

impl ChunkView<'_> {
    /// What [`check_error`] refuses: left to the `Value` path.
    fn is_error(&self) -> bool {
        self.error.is_some() || self.object.as_deref() == Some("error")
    }

    /// The choice [`first_choice`] picks.
    fn first_choice(&self) -> Option<&ChoiceView<'_>> {
        self.choices
            .as_ref()?
            .iter()
            .find(|c| c.index.unwrap_or(0) == 0)
    }
}

impl DeltaView<'_> {
    fn reasoning(&self) -> Option<&str> {
        self.reasoning_content
            .as_deref()
            .or(self.reasoning.as_deref())
    }
}

fn upstream(message: String) -> ApiError {
    ApiError::new(ErrorKind::Upstream, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunk(delta: Value) -> Value {
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    }

    #[test]
    fn tool_calls_assemble_across_chunks() {
        let mut d = UpstreamChatDecoder::new("r1");
        let mut events = Vec::new();
        for c in [
            chunk(json!({"role": "assistant", "content": ""})),
            chunk(json!({"reasoning_content": "hm"})),
            // Arguments before the name (some engines) wait for it.
            chunk(json!({"tool_calls": [{"index": 3, "function": {"arguments": "{\"a\""}}]})),
            chunk(
                json!({"tool_calls": [{"index": 3, "id": "x", "type": "function", "function": {"name": "f"}}]}),
            ),
            chunk(json!({"tool_calls": [{"index": 3, "function": {"arguments": ":1}"}}]})),
            chunk(
                json!({"tool_calls": [{"index": 4, "function": {"name": "g", "arguments": "{}"}}]}),
            ),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": null}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 8}}}),
        ] {
            events.extend(d.decode_chunk(&c).unwrap());
        }
        let out = |e: ParsedEvent| ReplyEvent::Output(e);
        assert_eq!(
            events,
            vec![
                out(ParsedEvent::Reasoning("hm".into())),
                out(ParsedEvent::ToolCallStart {
                    index: 0,
                    id: "x".into(),
                    name: "f".into()
                }),
                out(ParsedEvent::ToolCallArguments {
                    index: 0,
                    delta: "{\"a\"".into()
                }),
                out(ParsedEvent::ToolCallArguments {
                    index: 0,
                    delta: ":1}".into()
                }),
                out(ParsedEvent::ToolCallStart {
                    index: 1,
                    id: "call_r1_1".into(),
                    name: "g".into()
                }),
                out(ParsedEvent::ToolCallArguments {
                    index: 1,
                    delta: "{}".into()
                }),
                ReplyEvent::Finish {
                    reason: FinishReason::Stop
                },
                ReplyEvent::Usage(Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    cached_tokens: 8,
                    reasoning_tokens: None
                }),
            ]
        );
    }

    #[test]
    fn finish_reasons_and_completions_text() {
        let mut d = UpstreamChatDecoder::new("r");
        let events = d
            .decode_data(r#"{"object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop","stop_reason":"END"}]}"#)
            .unwrap();
        assert_eq!(
            events,
            vec![
                ReplyEvent::Output(ParsedEvent::Text("hi".into())),
                ReplyEvent::Finish {
                    reason: FinishReason::StopSequence("END".into())
                },
            ]
        );
        assert!(d.decode_data("[DONE]").unwrap().is_empty());
        let length =
            d.decode_data(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#);
        assert_eq!(
            length.unwrap(),
            vec![ReplyEvent::Finish {
                reason: FinishReason::Length
            }]
        );
    }

    #[test]
    fn errors_and_garbage() {
        let mut d = UpstreamChatDecoder::new("r");
        let err = d
            .decode_data(r#"{"error": {"message": "boom"}}"#)
            .unwrap_err();
        assert_eq!(err.status, 502);
        assert!(err.message.contains("boom"));
        assert!(
            d.decode_data(r#"{"object":"error","message":"bad"}"#)
                .is_err()
        );
        assert!(d.decode_data("not json").is_err());
        for junk in [
            json!(null),
            json!([]),
            json!({"choices": 3}),
            json!({"choices": [{"delta": {"tool_calls": [1, null, {"function": 3}]}}]}),
        ] {
            assert!(d.decode_chunk(&junk).is_ok());
        }
    }

    #[test]
    fn whole_body() {
        let mut d = UpstreamChatDecoder::new("r");
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let events = d.decode_response(&body).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(
            events[3],
            ReplyEvent::Finish {
                reason: FinishReason::ToolCalls
            }
        );
    }

    mod fast_path {
        use super::*;
        use proptest::prelude::*;

        /// A field value: mostly what engines send, sometimes the wrong type or null.
        fn text() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => "[a-z \\n\"é]{0,6}".prop_map(Value::from),
                1 => Just(Value::Null),
                1 => (0u8..3).prop_map(Value::from),
            ]
        }

        fn call() -> impl Strategy<Value = Value> {
            (0u64..3, text(), text(), text()).prop_map(|(index, id, name, args)| {
                json!({"index": index, "id": id, "function": {"name": name, "arguments": args}})
            })
        }

        fn chunk() -> impl Strategy<Value = Value> {
            let delta = (
                text(),
                text(),
                text(),
                proptest::option::of(proptest::collection::vec(call(), 0..3)),
            )
                .prop_map(|(content, reasoning, reasoning_content, calls)| {
                    let mut delta = json!({
                        "content": content,
                        "reasoning": reasoning,
                        "reasoning_content": reasoning_content,
                    });
                    if let Some(calls) = calls {
                        delta["tool_calls"] = Value::from(calls);
                    }
                    delta
                });
            let choice = (
                prop_oneof![
                    Just(json!(0)),
                    Just(json!(1)),
                    Just(json!("0")),
                    Just(Value::Null),
                    Just(json!(-1)),
                    Just(json!(0.0)),
                ],
                delta,
                text(),
                text(),
                text(),
            )
                .prop_map(|(index, delta, text, finish, stop)| {
                    json!({"index": index, "delta": delta, "text": text,
                           "finish_reason": finish, "stop_reason": stop})
                });
            (
                proptest::collection::vec(choice, 0..3),
                prop_oneof![8 => Just(Value::Null), 1 => Just(json!({"message": "boom"}))],
                prop_oneof![6 => Just(json!("chat.completion.chunk")), 1 => Just(json!("error")), 1 => Just(json!(7))],
                prop_oneof![Just(Value::Null), Just(json!({"prompt_tokens": 3, "completion_tokens": 2}))],
            )
                .prop_map(|(choices, error, object, usage)| {
                    json!({"object": object, "choices": choices, "error": error, "usage": usage})
                })
        }

        proptest! {
            /// The borrowed view and the `Value` path give the same events, chunk after chunk
            /// (tool calls keep state across chunks).
            #[test]
            fn decodes_exactly_as_the_value_path(chunks in proptest::collection::vec(chunk(), 1..6)) {
                let mut fast = UpstreamChatDecoder::new("r");
                let mut reference = UpstreamChatDecoder::new("r");
                for chunk in &chunks {
                    let got = fast.decode_data(&chunk.to_string());
                    let want = reference.decode_chunk(chunk);
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}
