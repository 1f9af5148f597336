//! The response half of the pipeline: the engine's stream read as reply events, re-encoded for
//! the client's API (streaming) or gathered into one body, and the booking whose `Drop` releases
//! the router's load, counts the request and writes its trace line.

use super::engine::ReplyDecoder;
use super::prepare::{Request, Turn};
use super::speculative::Speculation;
use crate::admission::Ticket;
use crate::agent::Harness;
use crate::error::GatewayError;
use crate::hints::llama_slots::SlotLease;
use crate::key_tokens::KeyTokens;
use crate::metrics::{EndpointLabels, RequestLabels, worker_label};
use crate::server::Shared;
use crate::sse::{Finish, SseReader, ToolCall, Usage};
use crate::trace::{Ending, RequestDraft};
use crate::upstream::EngineResponse;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::Stream;
use futures::StreamExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_core::programs::{ThinkingSpan, TurnEnd, Usage as ProgramUsage};
use switchyard_core::router::{Decision, Outcome, RequestId, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_frontend::{
    Api, ApiError, Block, ErrorKind, JournalWrite, Reply, ReplyEvent, ReplyMeta, ResponsesRequest,
    SseFrame, StreamEncoder,
};

/// Answer the client from the engine's answer: streamed, or `whole` (one body).
pub(super) async fn respond(
    upstream: EngineResponse,
    turn: Turn,
    (decoder, whole): (ReplyDecoder, bool),
    meta: ReplyMeta,
    mut booking: Booking,
) -> Result<Response, GatewayError> {
    let status = upstream.status;
    if !status.is_success() {
        let content_type = upstream.content_type.clone();
        let body = upstream.bytes().await;
        return Err(GatewayError::Engine {
            status,
            body,
            content_type,
        });
    }
    let worker = HeaderValue::from_str(&booking.rank.to_string()).ok();
    booking.answered = true;
    let speculation = match turn.request.conversation() {
        Some(conversation) if turn.request.hints().speculative_prefill => {
            Some(Speculation::new(conversation.clone(), booking.rank))
        }
        _ => None,
    };
    let (stream, _) = turn.request.streaming();
    let api = turn.api;
    let responses = match turn.request {
        Request::Responses(r) if r.store => Some(r),
        _ => None,
    };
    let mut answer = Answer {
        chunks: upstream.body,
        reader: SseReader::default(),
        whole: whole.then(BytesMut::new),
        decoder,
        reply: Reply::new(),
        responses,
        speculation,
        response_id: api.object_id(&meta.request_id),
        journal: None,
        booking,
        ended: false,
    };
    let mut response = if stream {
        let state = Streaming {
            encoder: api.stream_encoder(meta),
            answer,
            started: false,
        };
        let mut r = Response::new(Body::from_stream(futures::stream::unfold(
            state,
            Streaming::next,
        )));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        while let Some(events) = answer.next_events().await {
            events?;
        }
        axum::Json(api.response_body(&answer.reply, &meta)).into_response()
    };
    if let Some(worker) = worker {
        response.headers_mut().insert("x-switchyard-worker", worker);
    }
    Ok(response)
}

/// An engine answer being read. Dropping it (the client went away) drops the engine's stream,
/// which cancels the request there, and the booking, which releases the router's load.
struct Answer {
    chunks: Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>,
    reader: SseReader,
    /// The engine's whole answer as it arrives, when it was not asked to stream.
    whole: Option<BytesMut>,
    decoder: ReplyDecoder,
    /// Everything answered so far.
    reply: Reply,
    /// A Responses API request to store once complete.
    responses: Option<ResponsesRequest>,
    /// The next turn to warm once complete.
    speculation: Option<Speculation>,
    response_id: String,
    /// The stored response's journal line, until it is written.
    journal: Option<JournalWrite>,
    booking: Booking,
    ended: bool,
}

impl Answer {
    /// The next events (already added to `reply`), or `None` at the end. An error ends it.
    async fn next_events(&mut self) -> Option<Result<Vec<ReplyEvent>, GatewayError>> {
        let idle = self.booking.shared.live().config.server.stream_idle_timeout;
        while !self.ended {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, self.chunks.next()) => match next {
                    Ok(next) => next,
                    // A stalled engine: end with an error event rather than hang the client.
                    Err(_) => {
                        self.ended = true;
                        self.booking.status = StatusCode::GATEWAY_TIMEOUT.as_u16();
                        return Some(Err(GatewayError::Stalled { idle }));
                    }
                },
                // The drain deadline passed: end with an error event rather than a cut.
                () = self.booking.shared.stopping.cancelled() => {
                    self.ended = true;
                    self.booking.status = StatusCode::SERVICE_UNAVAILABLE.as_u16();
                    return Some(Err(GatewayError::Stopping));
                }
            };
            let data = match next {
                Some(Ok(chunk)) => {
                    if let Some(whole) = &mut self.whole {
                        whole.extend_from_slice(&chunk);
                        continue;
                    }
                    match self.reader.push(&chunk) {
                        Ok(data) => data,
                        Err(e) => {
                            self.ended = true;
                            self.booking.status = StatusCode::BAD_GATEWAY.as_u16();
                            return Some(Err(GatewayError::Upstream(e.to_string())));
                        }
                    }
                }
                Some(Err(e)) => {
                    self.ended = true;
                    self.booking.status = StatusCode::BAD_GATEWAY.as_u16();
                    return Some(Err(GatewayError::Upstream(format!(
                        "engine response interrupted: {e}"
                    ))));
                }
                None => {
                    self.ended = true;
                    let out = match self.whole.take() {
                        Some(whole) => {
                            self.booking.prefill_over();
                            self.decoder.whole(&whole).map_err(GatewayError::from)
                        }
                        None => {
                            let events = self.reader.finish().into_iter().collect::<Vec<_>>();
                            self.decode(&events)
                        }
                    };
                    let out = out.and_then(|mut out| {
                        out.extend(self.decoder.finish());
                        self.complete(&out)?;
                        Ok(out)
                    });
                    self.journaled().await;
                    if out.is_err() {
                        self.booking.status = StatusCode::BAD_GATEWAY.as_u16();
                    }
                    return Some(out);
                }
            };
            match self.decode(&data) {
                Ok(out) if out.is_empty() => continue,
                Ok(out) => {
                    self.booking.first_byte();
                    self.booking.tokens(out.len() as u64);
                    for event in &out {
                        self.reply.push(event);
                    }
                    return Some(Ok(out));
                }
                Err(e) => {
                    self.ended = true;
                    self.booking.status = StatusCode::BAD_GATEWAY.as_u16();
                    return Some(Err(e));
                }
            }
        }
        None
    }

    fn decode(&mut self, data: &[String]) -> Result<Vec<ReplyEvent>, GatewayError> {
        let mut out = Vec::new();
        for data in data {
            out.extend(self.decoder.data(data)?);
        }
        Ok(out)
    }

    /// The engine's stream ended: the reply is whole, unless the engine broke off.
    fn complete(&mut self, last: &[ReplyEvent]) -> Result<(), GatewayError> {
        for event in last {
            self.reply.push(event);
        }
        if !self.reply.is_finished() {
            return Err(GatewayError::Upstream(
                "the engine ended its stream before the generation finished".into(),
            ));
        }
        self.booking.completed = true;
        if let Some(speculation) = self.speculation.take() {
            speculation.send(self.booking.shared.clone(), &self.reply);
        }
        if let Some(request) = self.responses.take() {
            let transcript = request.transcript(&self.reply);
            let inserted = self
                .booking
                .shared
                .responses()
                .insert(std::mem::take(&mut self.response_id), transcript);
            self.journal = inserted.journal;
        }
        Ok(())
    }

    /// Waits for the stored response's journal line, if any: the client learns the response is
    /// complete (and may name it in its next turn) only once a crash can no longer lose it. The
    /// journal's thread writes it; this task only awaits, holding no lock.
    async fn journaled(&mut self) {
        let Some(write) = self.journal.take() else {
            return;
        };
        if let Err(e) = write.written().await {
            self.booking.shared.metrics.response_journal_errors.inc();
            tracing::warn!(error = %e, "responses store: the journal failed; the response is kept in memory");
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        // Runs before the booking's own drop, however the answer ended.
        let usage = self.reply.usage();
        self.booking.usage = Some(Usage {
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            completion_tokens: usage.completion_tokens,
        });
        self.booking.finish = finish(&self.reply, self.booking.capture_text());
        // Only the hint path, which follows sessions, uses the span.
        if self.booking.session_id.is_some() {
            let tokenizer = &self.booking.shared.tokenizer;
            self.booking.thinking = thinking_spans(self.reply.blocks(), |text| {
                clamp_u32(tokenizer.encode(text, false).map_or(0, |t| t.len()) as u64)
            });
        }
    }
}

/// The reply's thinking spans in the answer's tokens (re-tokenized: engines report no count).
/// A span's offset counts the tokens of what the answer said before it (text, tool calls);
/// adjacent thinking blocks are one span, and what follows the last span is not tokenized.
/// `tokens` counts a text's tokens.
fn thinking_spans(blocks: &[Block], tokens: impl Fn(&str) -> u32) -> Vec<ThinkingSpan> {
    let mut spans: Vec<ThinkingSpan> = Vec::new();
    let mut offset = 0u32;
    // What the answer said since the last span, counted only if another span follows.
    let mut said = String::new();
    for block in blocks {
        match block {
            Block::Thinking { text, .. } if !text.is_empty() => {
                if !said.is_empty() {
                    offset = offset.saturating_add(tokens(&said));
                    said.clear();
                }
                let length = tokens(text);
                match spans.last_mut() {
                    Some(last) if last.offset.saturating_add(last.tokens) == offset => {
                        last.tokens = last.tokens.saturating_add(length);
                    }
                    _ => spans.push(ThinkingSpan {
                        offset,
                        tokens: length,
                    }),
                }
                offset = offset.saturating_add(length);
            }
            Block::Text { text } => said.push_str(text),
            Block::ToolCall {
                name, arguments, ..
            } => {
                said.push_str(name);
                said.push_str(arguments);
            }
            _ => {}
        }
    }
    spans
}

/// How the reply ended, for the trace.
fn finish(reply: &Reply, capture_text: bool) -> Finish {
    Finish {
        finish_reason: reply
            .is_finished()
            .then(|| reply.finish_reason().as_openai().to_owned()),
        tool_calls: reply
            .blocks()
            .iter()
            .filter_map(|b| match b {
                Block::ToolCall { id, name, .. } => Some(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                }),
                _ => None,
            })
            .collect(),
        text: if capture_text {
            reply.text()
        } else {
            String::new()
        },
    }
}

/// A streaming answer: engine events re-encoded as the client API's server-sent events.
struct Streaming {
    encoder: Box<dyn StreamEncoder>,
    answer: Answer,
    started: bool,
}

impl Streaming {
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Self)> {
        loop {
            let events = self.answer.next_events().await?;
            // The opening frames (`message_start`, `response.created`) go out with the engine's
            // first answer: until then the client sees nothing, as with the engine itself.
            let mut frames = if self.started {
                Vec::new()
            } else {
                self.started = true;
                self.encoder.start()
            };
            match events {
                Ok(events) => frames.extend(events.iter().flat_map(|e| self.encoder.push(e))),
                // Headers are gone: the error travels in the stream, in the API's shape.
                Err(err) => frames.extend(self.encoder.fail(&api_error(&err))),
            }
            if self.answer.ended && self.answer.booking.completed {
                frames.extend(self.encoder.finish());
            }
            if !frames.is_empty() {
                return Some((Ok(bytes(frames)), self));
            }
        }
    }
}

/// The frames of one engine read in one buffer: one write to the client.
fn bytes(frames: Vec<SseFrame>) -> Bytes {
    let mut out = Vec::with_capacity(frames.iter().map(SseFrame::wire_len).sum());
    for frame in &frames {
        frame.write_to(&mut out);
    }
    Bytes::from(out)
}

fn api_error(err: &GatewayError) -> ApiError {
    match err {
        GatewayError::Api(e) => e.clone(),
        other => ApiError::new(ErrorKind::Upstream, other.to_string()),
    }
}

/// A routed request's claim on its rank; released (and measured, and traced) when dropped.
pub(super) struct Booking {
    shared: Arc<Shared>,
    id: RequestId,
    rank: Rank,
    /// Where the rank stood among the policy's candidates, for its `observe` feedback.
    candidate_index: usize,
    session_id: Option<String>,
    /// The harness said this is the session's last request.
    pub(super) session_final: bool,
    harness: Harness,
    api: Api,
    started: Instant,
    ttft: Option<Duration>,
    first_byte_seen: bool,
    /// The engine streams its answer: the first bytes are its first token (else they are the
    /// whole answer, and the router ends the prefill load by itself).
    pub(super) engine_streams: bool,
    status: u16,
    usage: Option<Usage>,
    /// A response was handed to the client: count it when the request ends.
    answered: bool,
    /// The whole response reached the client.
    completed: bool,
    finish: Finish,
    /// The answer's thinking spans (only for session requests).
    thinking: Vec<ThinkingSpan>,
    /// Set once the request is sent, when tracing is on.
    pub(super) trace: Option<Box<RequestDraft>>,
    /// The request's place in admission, told how it ended.
    pub(super) admission: Option<Ticket>,
    /// The llama.cpp slot it runs on (`llama-slots` workers).
    pub(super) slot: Option<SlotLease>,
    /// The client key's token budget, charged the completion (`tokens_per_minute`).
    pub(super) key_tokens: Option<Arc<KeyTokens>>,
}

impl Booking {
    pub(super) fn new(
        shared: Arc<Shared>,
        id: RequestId,
        api: Api,
        decision: &Decision,
        (session_id, harness): (Option<String>, Harness),
        started: Instant,
    ) -> Self {
        let label = worker_label(decision.rank);
        let bs = u64::from(shared.live().config.router.block_size);
        shared.metrics.decisions.get_or_create(&label).inc();
        shared
            .metrics
            .routed_overlap_tokens
            .get_or_create(&label)
            .inc_by(u64::from(decision.overlap.device) * bs);
        if decision.shared_blocks > 0 {
            shared
                .metrics
                .routed_shared_tokens
                .get_or_create(&label)
                .inc_by(u64::from(decision.shared_blocks) * bs);
        }
        Self {
            shared,
            id,
            rank: decision.rank,
            candidate_index: decision.candidate_index,
            session_id,
            session_final: false,
            harness,
            api,
            started,
            ttft: None,
            first_byte_seen: false,
            engine_streams: decision.engine_streams,
            status: 200,
            usage: None,
            answered: false,
            completed: false,
            finish: Finish::default(),
            thinking: Vec::new(),
            trace: None,
            admission: None,
            slot: None,
            key_tokens: None,
        }
    }

    /// Traces keep the generated text.
    fn capture_text(&self) -> bool {
        self.shared
            .trace
            .as_ref()
            .is_some_and(|t| t.include_content())
    }

    /// A chunk carried `events` streamed events with tokens.
    fn tokens(&mut self, events: u64) {
        if let Some(draft) = &mut self.trace {
            draft.tokens(Instant::now(), events);
        }
    }

    /// A response head with `status` went to the client.
    pub(super) fn answered(&mut self, status: u16) {
        self.answered = true;
        self.status = status;
    }

    /// The whole response went to the client.
    pub(super) fn completed(&mut self) {
        self.completed = true;
    }

    /// Move the claim to where `request` pins it: the request was served elsewhere than routed.
    /// Nowhere to book (that rank is unhealthy or gone): its load goes uncounted.
    pub(super) fn rebook(&mut self, request: &RouteRequest<'_>) {
        self.shared.finish(self.id);
        let id = self.id;
        let booked = self
            .shared
            .with_router(|router, index, now| router.route(id, request, index, now));
        if let Ok(decision) = booked {
            self.rank = decision.rank;
            self.candidate_index = decision.candidate_index;
        }
    }

    /// The engine's first answer bytes arrived: when it streams, its prefill is over and the
    /// TTFT is known.
    pub(super) fn first_byte(&mut self) {
        if !self.first_byte_seen {
            self.prefill_over();
            if !self.engine_streams {
                return;
            }
            self.ttft = Some(self.started.elapsed());
            self.shared
                .metrics
                .ttft
                .get_or_create(&EndpointLabels {
                    endpoint: self.api.path().into(),
                })
                .observe(self.started.elapsed().as_secs_f64());
        }
    }

    /// The engine answered. A streamed answer's first token ends its prefill load in the
    /// router (and teaches it the rank's prefill pace); a whole answer's end says nothing of
    /// when its first token came, so the router ends that load by itself.
    fn prefill_over(&mut self) {
        if !self.first_byte_seen {
            if let Some(draft) = &mut self.trace {
                draft.first_byte(Instant::now());
            }
            self.first_byte_seen = true;
            if self.engine_streams {
                self.shared.first_token(self.id);
            }
        }
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Drop for Booking {
    fn drop(&mut self) {
        self.shared.finish(self.id);
        // The slot is free again before the hint path hears the turn ended (and may save it).
        drop(self.slot.take());
        if let (Some(budget), Some(usage)) = (&self.key_tokens, self.usage) {
            budget.charge(usage.completion_tokens, Instant::now());
        }
        let end = TurnEnd {
            usage: self.usage.map(|u| ProgramUsage {
                prompt_tokens: clamp_u32(u.prompt_tokens),
                completion_tokens: clamp_u32(u.completion_tokens),
            }),
            tool_call: !self.finish.tool_calls.is_empty(),
            tool_name: self.finish.tool_calls.last().map(|c| c.name.clone()),
            thinking: std::mem::take(&mut self.thinking),
        };
        if let Some(ticket) = self.admission.take() {
            // The program's state follows how its turn ended: a tool call makes it ACTING.
            ticket.finished(&end);
        }
        if !self.answered {
            return; // failed attempts and engine errors are counted by `handle`
        }
        // The hint path sees the turns that reached the client whole.
        if let Some(session_id) = &self.session_id
            && self.completed
            && self.status < 400
        {
            let now = self.shared.now();
            let last = self.session_final;
            self.shared.hints.turn_ended(session_id, &end, last, now);
        }
        if !self.first_byte_seen {
            self.status = 499; // the client left before the engine answered
        }
        // Learning policies (the bandit) learn from what happened.
        self.shared.observe(&Outcome {
            rank: self.rank,
            candidate_index: self.candidate_index,
            session_id: self.session_id.take(),
            ttft: self.ttft,
            itl: None,
            cached_tokens: self.usage.map_or(0, |u| clamp_u32(u.cached_tokens)),
            prompt_tokens: self.usage.map_or(0, |u| clamp_u32(u.prompt_tokens)),
            output_tokens: self.usage.map_or(0, |u| clamp_u32(u.completion_tokens)),
            error: (self.status >= 400).then(|| format!("status {}", self.status)),
        });
        let m = &self.shared.metrics;
        let label = worker_label(self.rank);
        if let Some(usage) = self.usage {
            m.prompt_tokens
                .get_or_create(&label)
                .inc_by(usage.prompt_tokens);
            m.prefix_hit_tokens
                .get_or_create(&label)
                .inc_by(usage.cached_tokens);
        }
        m.requests
            .get_or_create(&RequestLabels {
                endpoint: self.api.path().into(),
                status: self.status,
                harness: self.harness.as_str(),
            })
            .inc();
        m.latency
            .get_or_create(&EndpointLabels {
                endpoint: self.api.path().into(),
            })
            .observe(self.started.elapsed().as_secs_f64());
        if let (Some(draft), Some(sink)) = (self.trace.take(), &self.shared.trace) {
            let ending = if self.status == StatusCode::BAD_GATEWAY.as_u16() {
                Ending::EngineError
            } else if self.completed {
                Ending::Complete
            } else {
                Ending::ClientLeft
            };
            let finish = std::mem::take(&mut self.finish);
            sink.record(draft.finish(Instant::now(), self.usage, finish, ending));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking(text: &str) -> Block {
        Block::Thinking {
            text: text.into(),
            signature: None,
        }
    }

    fn text(text: &str) -> Block {
        Block::Text { text: text.into() }
    }

    /// A word a token.
    fn words(text: &str) -> u32 {
        text.split_whitespace().count() as u32
    }

    #[test]
    fn each_thinking_span_starts_after_what_the_answer_said_before_it() {
        let blocks = [
            thinking("a b c"),
            // Adjacent blocks (a signature boundary) are one span.
            thinking("d e"),
            text("one two three four "),
            Block::ToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: " {\"path\": \"x\"}".into(),
            },
            thinking("f g h i"),
            text("the answer after the last span is never counted"),
        ];
        assert_eq!(
            thinking_spans(&blocks, words),
            [
                ThinkingSpan {
                    offset: 0,
                    tokens: 5
                },
                // 5 tokens of thinking, 4 of text, 3 of the call (name and arguments).
                ThinkingSpan {
                    offset: 12,
                    tokens: 4
                },
            ]
        );
        // An answer that only speaks, or whose thinking came back empty, did not think.
        assert!(thinking_spans(&[text("hi"), thinking("")], words).is_empty());
    }

    proptest::proptest! {
        /// Whatever the answer's blocks, the spans are in order, apart (adjacent thinking is
        /// one span), hold every thinking token, and end within the answer.
        #[test]
        fn spans_are_ordered_apart_and_hold_all_the_thinking(
            blocks in proptest::collection::vec((0u8..3, 0usize..6), 0..12),
        ) {
            let blocks: Vec<Block> = blocks
                .into_iter()
                .map(|(kind, n)| {
                    let body = "w ".repeat(n);
                    match kind {
                        0 => thinking(&body),
                        1 => text(&body),
                        _ => Block::ToolCall {
                            id: "c".into(),
                            name: "t ".into(),
                            arguments: body,
                        },
                    }
                })
                .collect();
            let spans = thinking_spans(&blocks, words);
            let all: u32 = blocks.iter().map(|b| match b {
                Block::Thinking { text, .. } | Block::Text { text } => words(text),
                Block::ToolCall { name, arguments, .. } => words(name) + words(arguments),
                _ => 0,
            }).sum();
            let thought: u32 = blocks.iter().map(|b| match b {
                Block::Thinking { text, .. } => words(text),
                _ => 0,
            }).sum();
            proptest::prop_assert_eq!(spans.iter().map(|s| s.tokens).sum::<u32>(), thought);
            for pair in spans.windows(2) {
                proptest::prop_assert!(pair[0].offset + pair[0].tokens < pair[1].offset, "{spans:?}");
            }
            if let Some(last) = spans.last() {
                proptest::prop_assert!(last.offset + last.tokens <= all);
            }
        }
    }
}
