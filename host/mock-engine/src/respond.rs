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
use switchyard_tokenizer::ModelTokenizer;

/// The engine always runs to the requested length (it never samples EOS).
const FINISH_REASON: &str = "length";

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

/// The response to one request: its identity and what its choices produced so far.
#[derive(Debug)]
pub(crate) struct Answer {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    tokenizer: ModelTokenizer,
    prompt_tokens: usize,
}

/// One choice (one prompt's generation) in progress.
#[derive(Debug)]
struct Choice {
    text: Detokenizer,
    cached_tokens: usize,
    completion_tokens: usize,
    finished: bool,
}

// === impl Answer ===

impl Answer {
    pub(crate) fn new(
        kind: Kind,
        model: &str,
        tokenizer: ModelTokenizer,
        prompt_tokens: usize,
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
        }
    }

    /// Wait for every generation and answer with one JSON body.
    pub(crate) async fn collect(self, generations: Vec<Generation>) -> Result<Response, ApiError> {
        let (mut events, mut choices) = self.start(generations);
        let mut texts = vec![String::new(); choices.len()];
        while let Some((index, progress)) = events.next().await {
            texts[index].push_str(&choices[index].apply(progress));
        }
        if !choices.iter().all(|c| c.finished) {
            return Err(ApiError::unavailable());
        }
        let body: Vec<Value> = texts
            .iter()
            .enumerate()
            .map(|(index, text)| match self.kind {
                Kind::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": null,
                    "finish_reason": FINISH_REASON,
                }),
                Kind::Completion => json!({
                    "index": index,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": FINISH_REASON,
                }),
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
    pub(crate) fn stream(self, generations: Vec<Generation>, include_usage: bool) -> Response {
        let (events, choices) = self.start(generations);
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
        Sse::new(chunks).into_response()
    }

    /// Merge the generations' progress, tagged with their choice index.
    fn start(
        &self,
        generations: Vec<Generation>,
    ) -> (BoxStream<'static, (usize, Progress)>, Vec<Choice>) {
        let choices = generations
            .iter()
            .map(|_| Choice {
                text: Detokenizer::new(self.tokenizer.clone()),
                cached_tokens: 0,
                completion_tokens: 0,
                finished: false,
            })
            .collect();
        let tagged = generations
            .into_iter()
            .enumerate()
            .map(|(index, generation)| generation.map(move |p| (index, p)));
        (stream::select_all(tagged).boxed(), choices)
    }

    /// The SSE chunk one step of progress produces, if any.
    fn on_progress(&self, choice: &mut Choice, index: usize, progress: Progress) -> Option<Event> {
        let admitted = matches!(progress, Progress::Admitted { .. });
        let text = choice.apply(progress);
        let finish = choice.finished.then_some(FINISH_REASON);
        let body = match self.kind {
            // Chat streams open with the assistant's role.
            Kind::Chat if admitted => json!({
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }),
            _ if admitted || (text.is_empty() && finish.is_none()) => return None,
            Kind::Chat => json!({
                "index": index,
                "delta": {"content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": null,
                "finish_reason": finish,
            }),
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

// === impl Choice ===

impl Choice {
    /// Record `progress`; returns the text it adds.
    fn apply(&mut self, progress: Progress) -> String {
        match progress {
            Progress::Admitted { cached_tokens } => {
                self.cached_tokens = cached_tokens;
                String::new()
            }
            Progress::Token { token, finished } => {
                self.completion_tokens += 1;
                self.finished = finished;
                self.text.push(token, finished)
            }
        }
    }
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
