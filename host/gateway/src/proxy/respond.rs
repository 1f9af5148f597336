//! The response half of the pipeline: streaming (or not) the engine's answer back, and the
//! booking whose `Drop` releases the router's load, counts the request and writes its trace line.

use super::{Endpoint, Parsed};
use crate::error::GatewayError;
use crate::metrics::{EndpointLabels, RequestLabels, worker_label};
use crate::server::Shared;
use crate::sse::{Finish, SseTap, Usage};
use crate::trace::{Ending, RequestDraft};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_core::router::{Decision, Outcome, RequestId};
use switchyard_core::worker::Rank;

pub(super) async fn respond(
    upstream: reqwest::Response,
    parsed: Parsed,
    mut booking: Booking,
) -> Result<Response, GatewayError> {
    let status = upstream.status();
    let content_type = upstream.headers().get(header::CONTENT_TYPE).cloned();
    if !status.is_success() {
        let body = upstream.bytes().await.unwrap_or_default();
        return Err(GatewayError::Engine {
            status,
            body,
            content_type,
        });
    }
    let worker = HeaderValue::from_str(&booking.rank.to_string()).ok();
    booking.answered = true;
    let capture_text = booking
        .shared
        .trace
        .as_ref()
        .is_some_and(|t| t.include_content());
    let mut response = if parsed.stream {
        let tap = SseTap::new(!parsed.wants_stream_usage);
        let state = StreamState {
            chunks: upstream.bytes_stream().boxed(),
            tap: if capture_text {
                tap.capturing_text()
            } else {
                tap
            },
            booking,
            done: false,
        };
        let mut r = Response::new(Body::from_stream(futures::stream::unfold(
            state,
            StreamState::next,
        )));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        let body = upstream
            .bytes()
            .await
            .map_err(|e| GatewayError::Upstream(format!("engine response interrupted: {e}")))?;
        booking.first_byte();
        booking.completed = true;
        if let Ok(json) = serde_json::from_slice::<Value>(&body) {
            booking.usage = json.get("usage").and_then(Usage::from_json);
            if booking.trace.is_some() {
                booking.finish = Finish::from_response(&json, capture_text);
            }
        }
        let mut r = Response::new(Body::from(body));
        if let Some(ct) = content_type {
            r.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        r
    };
    if let Some(worker) = worker {
        response.headers_mut().insert("x-switchyard-worker", worker);
    }
    Ok(response)
}

/// A streaming response in flight. Dropping it (the client went away) drops the engine's stream,
/// which cancels the request there, and the booking, which releases the router's load and gets
/// what the tap read.
struct StreamState {
    chunks: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    tap: SseTap,
    booking: Booking,
    done: bool,
}

impl StreamState {
    async fn next(mut self) -> Option<(Result<Bytes, reqwest::Error>, Self)> {
        while !self.done {
            match self.chunks.next().await {
                Some(Ok(chunk)) => {
                    self.booking.first_byte();
                    let before = self.tap.token_events();
                    let out = self.tap.feed(&chunk);
                    self.booking.tokens(self.tap.token_events() - before);
                    if !out.is_empty() {
                        return Some((Ok(out), self));
                    }
                }
                Some(Err(e)) => {
                    self.booking.status = StatusCode::BAD_GATEWAY.as_u16();
                    self.done = true;
                    return Some((Err(e), self));
                }
                None => {
                    self.done = true;
                    self.booking.completed = true;
                    let rest = self.tap.finish();
                    if !rest.is_empty() {
                        return Some((Ok(rest), self));
                    }
                }
            }
        }
        None
    }
}

impl Drop for StreamState {
    fn drop(&mut self) {
        // Runs before the booking's own drop, however the stream ended.
        self.booking.usage = self.tap.usage();
        self.booking.finish = self.tap.take_finish();
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
    endpoint: Endpoint,
    started: Instant,
    ttft: Option<Duration>,
    first_byte_seen: bool,
    status: u16,
    usage: Option<Usage>,
    /// A response was handed to the client: count it when the request ends.
    answered: bool,
    /// The whole response reached the client.
    completed: bool,
    finish: Finish,
    /// Set once the request is sent, when tracing is on.
    pub(super) trace: Option<Box<RequestDraft>>,
}

impl Booking {
    pub(super) fn new(
        shared: Arc<Shared>,
        id: RequestId,
        endpoint: Endpoint,
        decision: &Decision,
        session_id: Option<String>,
        started: Instant,
    ) -> Self {
        let label = worker_label(decision.rank);
        let bs = u64::from(shared.config.router.block_size);
        shared.metrics.decisions.get_or_create(&label).inc();
        shared
            .metrics
            .routed_overlap_tokens
            .get_or_create(&label)
            .inc_by(u64::from(decision.overlap.device) * bs);
        Self {
            shared,
            id,
            rank: decision.rank,
            candidate_index: decision.candidate_index,
            session_id,
            endpoint,
            started,
            ttft: None,
            first_byte_seen: false,
            status: 200,
            usage: None,
            answered: false,
            completed: false,
            finish: Finish::default(),
            trace: None,
        }
    }

    /// A chunk carried `events` streamed events with tokens.
    fn tokens(&mut self, events: u64) {
        if let Some(draft) = &mut self.trace {
            draft.tokens(Instant::now(), events);
        }
    }

    fn first_byte(&mut self) {
        if !self.first_byte_seen {
            if let Some(draft) = &mut self.trace {
                draft.first_byte(Instant::now());
            }
            self.first_byte_seen = true;
            self.ttft = Some(self.started.elapsed());
            self.shared.first_token(self.id);
            self.shared
                .metrics
                .ttft
                .get_or_create(&EndpointLabels {
                    endpoint: self.endpoint.path().into(),
                })
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Drop for Booking {
    fn drop(&mut self) {
        self.shared.finish(self.id);
        if !self.answered {
            return; // failed attempts and engine errors are counted by `handle`
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
                endpoint: self.endpoint.path().into(),
                status: self.status,
            })
            .inc();
        m.latency
            .get_or_create(&EndpointLabels {
                endpoint: self.endpoint.path().into(),
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
