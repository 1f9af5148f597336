//! The request pipeline: body -> tokens -> routing decision -> engine -> response.
//!
//! One function per stage. The router's booking is released by `Booking`'s `Drop`, so a client
//! that disconnects (its response future or stream dropped) releases the load and, by dropping the
//! upstream request, cancels it at the engine. The same `Drop` writes the request's trace line.

use crate::agent::AgentContext;
use crate::error::GatewayError;
use crate::metrics::RequestLabels;
use crate::server::Shared;
use crate::trace::{RequestDraft, RequestFacts, WorkerRef};
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use switchyard_core::hash::SequenceHash;
use switchyard_core::router::{Decision, RequestId, RouteError, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_tokenizer::ChatTemplateInput;

mod respond;

use respond::{Booking, respond};

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

/// When a request arrived, on the monotonic and the wall clock.
#[derive(Debug, Clone, Copy)]
struct Received {
    at: Instant,
    wall: SystemTime,
}

/// Serve one request end to end, counting it whatever happens.
pub async fn handle(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let received = Received {
        at: Instant::now(),
        wall: SystemTime::now(),
    };
    let agent = AgentContext::from_headers(headers);
    match proxy(&shared, endpoint, body, agent, received).await {
        Ok(response) => response,
        Err(err) => {
            shared.metrics.reject(err.reason());
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
    agent: AgentContext,
    received: Received,
) -> Result<Response, GatewayError> {
    let bytes = read_body(body, shared.config.server.max_body_bytes).await?;
    let mut parsed = parse(shared, endpoint, &bytes).await?;
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
            session_id: agent.session_id.as_deref(),
            parent_session_id: agent.parent_session_id.as_deref(),
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
        let routed = Instant::now();
        tracing::debug!(
            request = id.0,
            session = agent.session_id.as_deref(),
            worker = %decision.rank,
            overlap_blocks = decision.overlap.device,
            event_blocks = decision.indexed.device,
            cost = ?decision.cost,
            "routed"
        );
        let mut booking = Booking::new(
            shared.clone(),
            id,
            endpoint,
            &decision,
            agent.session_id.clone(),
            received.at,
        );
        match send(shared, endpoint, &parsed, &decision).await {
            Ok(upstream) => {
                let routed_at = (received, routed);
                booking.trace =
                    trace_draft(shared, id, agent, routed_at, &decision, &mut parsed, hashes);
                return respond(upstream, parsed, booking).await;
            }
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

/// The trace's view of a routed request, when tracing is on.
fn trace_draft(
    shared: &Shared,
    id: RequestId,
    agent: AgentContext,
    (received, routed): (Received, Instant),
    decision: &Decision,
    parsed: &mut Parsed,
    hashes: Vec<SequenceHash>,
) -> Option<Box<RequestDraft>> {
    let sink = shared.trace.as_ref()?;
    let rank = decision.rank;
    Some(Box::new(RequestDraft::new(RequestFacts {
        request_id: id.0,
        model: shared.model_name.clone(),
        agent,
        received: received.at,
        received_at: received.wall,
        routed,
        worker: WorkerRef {
            id: rank.to_string(),
            url: shared.workers[rank.worker.0 as usize].base_url.clone(),
        },
        // Others booked on the rank when this one was placed.
        queue_depth: shared.in_flight(rank).saturating_sub(1),
        block_size: shared.config.router.block_size,
        prompt_tokens: parsed.tokens.len() as u64,
        hashes: hashes.into_iter().map(|h| h.0).collect(),
        // Already sent: the body is not needed any more.
        body: sink
            .include_content()
            .then(|| std::mem::take(&mut parsed.body)),
    })))
}

/// Read a request body up to `limit` bytes (413 past it).
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
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
