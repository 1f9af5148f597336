//! The request pipeline: body -> tokens -> routing decision -> engine -> response.
//!
//! One function per stage. The router's booking is released by `Booking`'s `Drop`, so a client
//! that disconnects (its response future or stream dropped) releases the load and, by dropping the
//! upstream request, cancels it at the engine.

use crate::error::GatewayError;
use crate::metrics::{EndpointLabels, RejectLabels, RequestLabels, worker_label};
use crate::server::Shared;
use crate::sse::{SseTap, Usage};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use switchyard_core::router::{Decision, RequestId, RouteError, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_tokenizer::ChatTemplateInput;

/// The OpenAI endpoints the gateway proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/completions`.
    Completions,
}

impl Endpoint {
    /// The path, as sent to engines too.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// Serve one request end to end, counting it whatever happens.
pub async fn handle(shared: Arc<Shared>, endpoint: Endpoint, body: Body) -> Response {
    let started = Instant::now();
    match proxy(&shared, endpoint, body, started).await {
        Ok(response) => response,
        Err(err) => {
            shared
                .metrics
                .rejected
                .get_or_create(&RejectLabels {
                    reason: err.reason().into(),
                })
                .inc();
            if matches!(err, GatewayError::Internal(_)) {
                tracing::error!(error = %err, "request failed");
            }
            let response = err.into_response();
            shared
                .metrics
                .requests
                .get_or_create(&RequestLabels {
                    endpoint: endpoint.path().into(),
                    status: response.status().as_u16(),
                })
                .inc();
            response
        }
    }
}

/// A parsed request, ready to route.
struct Parsed {
    body: Value,
    tokens: Vec<u32>,
    stream: bool,
    /// The client asked for the usage chunk of a stream.
    wants_stream_usage: bool,
    expected_output_tokens: Option<u32>,
}

async fn proxy(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    body: Body,
    started: Instant,
) -> Result<Response, GatewayError> {
    let bytes = read_body(body, shared.config.server.max_body_bytes).await?;
    let parsed = parse(shared, endpoint, &bytes).await?;
    let hashes = shared.hasher.sequence(&parsed.tokens);
    let id = RequestId(shared.next_request_id());
    let mut excluded: Vec<Rank> = Vec::new();
    let mut last_failure = String::new();
    for attempt in 0..shared.config.max_attempts {
        let request = RouteRequest {
            hashes: &hashes,
            tokens: parsed.tokens.len() as u32,
            expected_output_tokens: parsed.expected_output_tokens,
            exclude: &excluded,
            ..RouteRequest::default()
        };
        let decision = match shared.route(id, &request) {
            Ok(d) => d,
            Err(RouteError::NoHealthyWorker) => {
                if attempt > 0 {
                    tracing::warn!(%last_failure, "every worker failed or is unhealthy");
                }
                return Err(GatewayError::NoHealthyWorker);
            }
            Err(RouteError::Rejected { reason }) => return Err(GatewayError::Rejected(reason)),
            Err(e @ RouteError::BadSelection { .. }) => {
                return Err(GatewayError::Internal(e.to_string()));
            }
        };
        tracing::debug!(
            request = id.0,
            worker = %decision.rank,
            overlap_blocks = decision.overlap.device,
            event_blocks = decision.indexed.device,
            cost = ?decision.cost,
            "routed"
        );
        let booking = Booking::new(shared.clone(), id, endpoint, &decision, started);
        match send(shared, endpoint, &parsed, &decision).await {
            Ok(upstream) => return respond(upstream, parsed, booking).await,
            Err(failure) => {
                // Nothing reached the client yet: try the next best worker.
                tracing::warn!(worker = %decision.rank, error = %failure, "engine failed before answering; retrying");
                shared.mark_unreachable(decision.rank);
                shared.metrics.retries.inc();
                excluded.push(decision.rank);
                last_failure = format!("worker {}: {failure}", decision.rank);
                drop(booking);
            }
        }
    }
    Err(GatewayError::Upstream(last_failure))
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let too_large = std::error::Error::source(&err)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            GatewayError::TooLarge { limit }
        } else {
            GatewayError::BadRequest(format!("cannot read request body: {err}"))
        }
    })
}

async fn parse(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    bytes: &[u8],
) -> Result<Parsed, GatewayError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::BadRequest(format!("invalid JSON body: {e}")))?;
    let object = body
        .as_object()
        .ok_or_else(|| GatewayError::BadRequest("request body must be a JSON object".into()))?;
    match object.get("model") {
        Some(Value::String(model)) if *model == shared.model_name => {}
        Some(Value::String(model)) => return Err(GatewayError::UnknownModel(model.clone())),
        Some(_) => return Err(GatewayError::BadRequest("`model` must be a string".into())),
        None => return Err(GatewayError::BadRequest("`model` is required".into())),
    }
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::BadRequest(
                "`stream` must be a boolean".into(),
            ));
        }
    };
    let wants_stream_usage = object
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let expected_output_tokens = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| object.get(*k).and_then(Value::as_u64))
        .or_else(|| {
            body.pointer("/nvext/agent_hints/osl")
                .and_then(Value::as_u64)
        })
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    let tokens = tokenize(shared, endpoint, &body).await?;
    Ok(Parsed {
        body,
        tokens,
        stream,
        wants_stream_usage,
        expected_output_tokens,
    })
}

/// The prompt's tokens, exactly as the engine will see them.
async fn tokenize(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    body: &Value,
) -> Result<Vec<u32>, GatewayError> {
    let bad = |msg: &str| Err(GatewayError::BadRequest(msg.into()));
    match endpoint {
        Endpoint::ChatCompletions => {
            let Some(messages) = body.get("messages").and_then(Value::as_array) else {
                return bad("`messages` must be an array");
            };
            if messages.is_empty() {
                return bad("`messages` must not be empty");
            }
            if messages.iter().any(|m| !m.is_object()) {
                return bad("each message must be an object");
            }
            let tools = match body.get("tools") {
                None | Some(Value::Null) => None,
                Some(Value::Array(tools)) => Some(tools.clone()),
                Some(_) => return bad("`tools` must be an array"),
            };
            let extra = match body.get("chat_template_kwargs") {
                None | Some(Value::Null) => None,
                Some(Value::Object(kwargs)) => Some(kwargs.clone()),
                Some(_) => return bad("`chat_template_kwargs` must be an object"),
            };
            let add_generation_prompt = body
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let messages = messages.clone();
            let tokenizer = shared.tokenizer.clone();
            // Templates and tokenizers of 100K-token prompts take milliseconds: off the reactor.
            tokio::task::spawn_blocking(move || {
                tokenizer.encode_chat(&ChatTemplateInput {
                    messages: &messages,
                    tools: tools.as_deref(),
                    add_generation_prompt,
                    extra: extra.as_ref(),
                })
            })
            .await
            .map_err(|e| GatewayError::Internal(e.to_string()))?
            .map_err(|e| GatewayError::BadRequest(format!("cannot render the chat template: {e}")))
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(Value::String(text)) => {
                let (tokenizer, text) = (shared.tokenizer.clone(), text.clone());
                tokio::task::spawn_blocking(move || tokenizer.encode(&text, true))
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))?
                    .map_err(|e| {
                        GatewayError::BadRequest(format!("cannot tokenize the prompt: {e}"))
                    })
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                if let Some(ids) = token_ids(items) {
                    return Ok(ids);
                }
                // A batch of prompts: route by the first (they go to one engine together).
                match &items[0] {
                    Value::String(text) => shared.tokenizer.encode(text, true).map_err(|e| {
                        GatewayError::BadRequest(format!("cannot tokenize the prompt: {e}"))
                    }),
                    Value::Array(inner) => token_ids(inner).ok_or_else(|| {
                        GatewayError::BadRequest("`prompt` token ids must be integers".into())
                    }),
                    _ => bad("`prompt` must be a string, a list of token ids, or a list of those"),
                }
            }
            _ => bad("`prompt` must be a string, a list of token ids, or a list of those"),
        },
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// Send to the chosen rank. `Err` only when nothing came back (connect error, timeout before the
/// response head): then another worker may be tried.
async fn send(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    parsed: &Parsed,
    decision: &Decision,
) -> Result<reqwest::Response, reqwest::Error> {
    let upstream = &shared.workers[decision.rank.worker.0 as usize];
    let mut body = parsed.body.clone();
    if parsed.stream && !parsed.wants_stream_usage {
        // We need the engine's usage (cached tokens) for metrics; the tap hides it again.
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    upstream
        .request(&shared.client, endpoint.path(), decision.rank.dp_rank, body)
        .timeout(shared.config.server.request_timeout)
        .send()
        .await
}

async fn respond(
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
    let mut response = if parsed.stream {
        let state = StreamState {
            chunks: upstream.bytes_stream().boxed(),
            tap: SseTap::new(!parsed.wants_stream_usage),
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
        booking.usage = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("usage").and_then(Usage::from_json));
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
/// which cancels the request there, and the booking, which releases the router's load.
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
                    let out = self.tap.feed(&chunk);
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
                    let rest = self.tap.finish();
                    self.booking.usage = self.tap.usage();
                    if !rest.is_empty() {
                        return Some((Ok(rest), self));
                    }
                }
            }
        }
        None
    }
}

/// A routed request's claim on its rank; released (and measured) when dropped.
struct Booking {
    shared: Arc<Shared>,
    id: RequestId,
    rank: Rank,
    endpoint: Endpoint,
    started: Instant,
    first_byte_seen: bool,
    status: u16,
    usage: Option<Usage>,
    /// A response was handed to the client: count it when the request ends.
    answered: bool,
}

impl Booking {
    fn new(
        shared: Arc<Shared>,
        id: RequestId,
        endpoint: Endpoint,
        decision: &Decision,
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
            endpoint,
            started,
            first_byte_seen: false,
            status: 200,
            usage: None,
            answered: false,
        }
    }

    fn first_byte(&mut self) {
        if !self.first_byte_seen {
            self.first_byte_seen = true;
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

impl Drop for Booking {
    fn drop(&mut self) {
        self.shared.finish(self.id);
        if !self.answered {
            return; // failed attempts and engine errors are counted by `handle`
        }
        if !self.first_byte_seen {
            self.status = 499; // the client left before the engine answered
        }
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
    }
}
