//! OpenAI response bodies and SSE streams for the generations of one request.

use crate::api::ApiError;
use crate::driver::{Generation, Progress};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use switchyard_parsers::{CallEmission, OutputParser, ParsedEvent};
use switchyard_tokenizer::ModelTokenizer;

/// Unscripted, the engine always runs to the requested length (it never samples EOS).
const FINISH_LENGTH: &str = "length";

/// Which API answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// Seconds since the Unix epoch, for `created`.
pub(crate) fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the engine answers with, beyond its pseudo-random tokens.
#[derive(Debug, Clone, Default)]
pub(crate) struct Output {
    /// Tokens to answer with instead ([`crate::script`]); the answer then ends with `stop`.
    pub(crate) script: Option<Vec<u32>>,
    /// Reasoning parser for chat answers (`reasoning_content`), like vLLM's `--reasoning-parser`.
    pub(crate) reasoning_parser: Option<String>,
    /// Tool-call parser for chat answers (`tool_calls`), like vLLM's `--tool-call-parser`.
    pub(crate) tool_parser: Option<String>,
    /// The answer ends before the output limit (scripted, or at its natural length): `stop`
    /// rather than `length`.
    pub(crate) stops_on_its_own: bool,
}

/// The response to one request: its identity and what its choices produced so far.
#[derive(Debug)]
pub(crate) struct Answer {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    tokenizer: ModelTokenizer,
    prompt_tokens: usize,
    output: Output,
}

/// One choice (one prompt's generation) in progress.
#[derive(Debug)]
struct Choice {
    text: Detokenizer,
    /// Splits chat text into content, reasoning and tool calls; `None` for raw text.
    parser: Option<OutputParser>,
    cached_tokens: usize,
    completion_tokens: usize,
    tool_calls: usize,
    finished: bool,
}

/// A choice's whole answer, for non-streaming responses.
#[derive(Debug, Default)]
struct Collected {
    content: String,
    reasoning: String,
    /// `(id, name, arguments)` of each tool call.
    calls: Vec<(String, String, String)>,
}

// === impl Answer ===

impl Answer {
    pub(crate) fn new(
        kind: Kind,
        model: &str,
        tokenizer: ModelTokenizer,
        prompt_tokens: usize,
        output: Output,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Self {
            kind,
            id: format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            created: unix_seconds(),
            model: model.to_owned(),
            tokenizer,
            prompt_tokens,
            output,
        }
    }

    /// Wait for every generation and answer with one JSON body.
    pub(crate) async fn collect(self, generations: Vec<Generation>) -> Result<Response, ApiError> {
        let (mut events, mut choices) = self.start(generations, CallEmission::Complete)?;
        let mut collected: Vec<Collected> = choices.iter().map(|_| Collected::default()).collect();
        while let Some((index, progress)) = events.next().await {
            let events = self.apply(&mut choices[index], progress);
            collected[index].add(events);
        }
        if !choices.iter().all(|c| c.finished) {
            return Err(ApiError::unavailable());
        }
        let body: Vec<Value> = collected
            .into_iter()
            .zip(&choices)
            .enumerate()
            .map(|(index, (out, choice))| {
                let finish = self.finish_reason(choice);
                match self.kind {
                    Kind::Chat => json!({
                        "index": index,
                        "message": out.message(),
                        "logprobs": null,
                        "finish_reason": finish,
                    }),
                    Kind::Completion => json!({
                        "index": index,
                        "text": out.content,
                        "logprobs": null,
                        "finish_reason": finish,
                    }),
                }
            })
            .collect();
        let object = match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        };
        Ok(axum::Json(json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": body,
            "usage": self.usage(&choices),
        }))
        .into_response())
    }

    /// Answer with server-sent events: a chunk per token, the usage if asked, then `[DONE]`.
    /// Dropping the body (the client left) drops the generations, which cancels them.
    pub(crate) fn stream(
        self,
        generations: Vec<Generation>,
        include_usage: bool,
    ) -> Result<Response, ApiError> {
        let (events, choices) = self.start(generations, CallEmission::Streaming)?;
        let state = Some((self, events, choices));
        let chunks = stream::unfold(state, move |state| async move {
            let (answer, mut events, mut choices) = state?;
            match events.next().await {
                Some((index, progress)) => {
                    let chunk = answer.on_progress(&mut choices[index], index, progress);
                    Some((chunk.into_iter().collect(), Some((answer, events, choices))))
                }
                None if choices.iter().all(|c| c.finished) => {
                    let mut last = Vec::new();
                    if include_usage {
                        last.push(answer.envelope(json!([]), Some(answer.usage(&choices))));
                    }
                    last.push(Event::default().data("[DONE]"));
                    Some((last, None))
                }
                // The engine stopped mid-way: end without `[DONE]`, so the client sees a failure.
                None => None,
            }
        });
        let chunks = chunks.flat_map(stream::iter).map(Ok::<_, Infallible>);
        Ok(Sse::new(chunks).into_response())
    }

    /// Merge the generations' progress, tagged with their choice index; `emission` says whether
    /// tool calls stream as they are written or come whole.
    #[allow(
        clippy::type_complexity,
        reason = "a stream and its choices, used once"
    )]
    fn start(
        &self,
        generations: Vec<Generation>,
        emission: CallEmission,
    ) -> Result<(BoxStream<'static, (usize, Progress)>, Vec<Choice>), ApiError> {
        let choices = (0..generations.len())
            .map(|index| {
                let parser = match self.kind {
                    Kind::Chat => Some(
                        OutputParser::with_emission(
                            self.output.reasoning_parser.as_deref(),
                            self.output.tool_parser.as_deref(),
                            &format!("call_{}_{index}_", self.id),
                            emission,
                        )
                        .map_err(ApiError::bad_request)?,
                    ),
                    Kind::Completion => None,
                };
                Ok(Choice {
                    text: Detokenizer::new(self.tokenizer.clone()),
                    parser,
                    cached_tokens: 0,
                    completion_tokens: 0,
                    tool_calls: 0,
                    finished: false,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        let tagged = generations
            .into_iter()
            .enumerate()
            .map(|(index, generation)| generation.map(move |p| (index, p)));
        Ok((stream::select_all(tagged).boxed(), choices))
    }

    /// Record `progress` on `choice`; returns what it adds to the answer.
    fn apply(&self, choice: &mut Choice, progress: Progress) -> Vec<ParsedEvent> {
        let text = match progress {
            Progress::Admitted { cached_tokens } => {
                choice.cached_tokens = cached_tokens;
                return Vec::new();
            }
            Progress::Token { token, finished } => {
                // A script replaces the engine's pseudo-random tokens, position by position.
                let token = self
                    .output
                    .script
                    .as_ref()
                    .and_then(|s| s.get(choice.completion_tokens).copied())
                    .unwrap_or(token);
                choice.completion_tokens += 1;
                choice.finished = finished;
                choice.text.push(token, finished)
            }
        };
        let mut events = match choice.parser.as_mut() {
            Some(parser) => parser.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![ParsedEvent::Text(text)],
        };
        if choice.finished
            && let Some(parser) = choice.parser.as_mut()
        {
            events.extend(parser.finish());
        }
        choice.tool_calls += events
            .iter()
            .filter(|e| matches!(e, ParsedEvent::ToolCallStart { .. }))
            .count();
        events
    }

    fn finish_reason(&self, choice: &Choice) -> &'static str {
        match (self.output.stops_on_its_own, choice.tool_calls) {
            (false, _) => FINISH_LENGTH,
            (true, 0) => "stop",
            (true, _) => "tool_calls",
        }
    }

    /// The SSE chunk one step of progress produces, if any.
    fn on_progress(&self, choice: &mut Choice, index: usize, progress: Progress) -> Option<Event> {
        let admitted = matches!(progress, Progress::Admitted { .. });
        let events = self.apply(choice, progress);
        let finish = choice.finished.then(|| self.finish_reason(choice));
        let body = match self.kind {
            // Chat streams open with the assistant's role.
            Kind::Chat if admitted => json!({
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }),
            _ if admitted || (events.is_empty() && finish.is_none()) => return None,
            Kind::Chat => json!({
                "index": index,
                "delta": chat_delta(events),
                "logprobs": null,
                "finish_reason": finish,
            }),
            Kind::Completion => {
                let mut out = Collected::default();
                out.add(events);
                json!({
                    "index": index,
                    "text": out.content,
                    "logprobs": null,
                    "finish_reason": finish,
                })
            }
        };
        Some(self.envelope(json!([body]), None))
    }

    /// A streamed chunk around `choices`.
    fn envelope(&self, choices: Value, usage: Option<Value>) -> Event {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        Event::default().data(chunk.to_string())
    }

    fn usage(&self, choices: &[Choice]) -> Value {
        let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
        let cached: usize = choices.iter().map(|c| c.cached_tokens).sum();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }
}

// === impl Collected ===

impl Collected {
    fn add(&mut self, events: Vec<ParsedEvent>) {
        for event in events {
            match event {
                ParsedEvent::Text(text) => self.content.push_str(&text),
                ParsedEvent::Reasoning(text) => self.reasoning.push_str(&text),
                ParsedEvent::ToolCallStart { id, name, .. } => {
                    self.calls.push((id, name, String::new()));
                }
                ParsedEvent::ToolCallArguments { index, delta } => {
                    if let Some(call) = self.calls.get_mut(index) {
                        call.2.push_str(&delta);
                    }
                }
            }
        }
    }

    /// The chat `message` of a non-streaming answer.
    fn message(self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = self.reasoning.into();
        }
        if !self.calls.is_empty() {
            message["tool_calls"] = self
                .calls
                .into_iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        message
    }
}

/// One chat `delta` carrying `events`, as vLLM writes them: `content`, `reasoning_content`,
/// `tool_calls` (the first piece of a call names it; later pieces carry argument text).
fn chat_delta(events: Vec<ParsedEvent>) -> Value {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            ParsedEvent::Text(text) => content.push_str(&text),
            ParsedEvent::Reasoning(text) => reasoning.push_str(&text),
            ParsedEvent::ToolCallStart { index, id, name } => calls.push(json!({
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            })),
            ParsedEvent::ToolCallArguments { index, delta } => {
                calls.push(json!({"index": index, "function": {"arguments": delta}}));
            }
        }
    }
    let mut delta = serde_json::Map::new();
    if !content.is_empty() {
        delta.insert("content".into(), content.into());
    }
    if !reasoning.is_empty() {
        delta.insert("reasoning_content".into(), reasoning.into());
    }
    if !calls.is_empty() {
        delta.insert("tool_calls".into(), calls.into());
    }
    Value::Object(delta)
}

/// Turns tokens into text as they come, holding back bytes of an incomplete UTF-8 character
/// (vLLM's incremental detokenization: decode a short window, emit what the new token added).
#[derive(Debug)]
struct Detokenizer {
    tokenizer: ModelTokenizer,
    tokens: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of the text already emitted.
    read: usize,
}

impl Detokenizer {
    fn new(tokenizer: ModelTokenizer) -> Self {
        Self {
            tokenizer,
            tokens: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Text `token` adds; on the `last` token nothing is held back.
    fn push(&mut self, token: u32, last: bool) -> String {
        self.tokens.push(token);
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, true).unwrap_or_default();
        let before = decode(&self.tokens[self.prefix..self.read]);
        let after = decode(&self.tokens[self.prefix..]);
        if !last && (after.len() <= before.len() || after.ends_with('\u{FFFD}')) {
            return String::new();
        }
        self.prefix = self.read;
        self.read = self.tokens.len();
        after.get(before.len()..).unwrap_or_default().to_owned()
    }
}
