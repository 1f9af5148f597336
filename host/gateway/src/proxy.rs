//! The request pipeline: body -> tokens -> routing decision -> engine -> response.
//!
//! One function per stage. The router's booking is released by `Booking`'s `Drop`, so a client
//! that disconnects (its response future or stream dropped) releases the load and, by dropping the
//! upstream request, cancels it at the engine. The same `Drop` writes the request's trace line.

use crate::admission::Admission;
use crate::agent::AgentContext;
use crate::error::GatewayError;
use crate::metrics::RequestLabels;
use crate::queue::Routed;
use crate::server::Shared;
use crate::trace::{RequestDraft, RequestFacts, WorkerRef};
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use switchyard_core::admission::AdmissionRequest;
use switchyard_core::hash::SequenceHash;
use switchyard_core::router::{Decision, PolicyRequest, RequestId, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_frontend::{Api, ReplyMeta};

mod engine;
mod prepare;
mod respond;
mod speculative;

pub(crate) use engine::Pin;
use engine::ReplyDecoder;
pub(crate) use prepare::count_tokens;
use prepare::{Request, Turn, prepare};
use respond::{Booking, respond};

/// When a request arrived, on the monotonic and the wall clock.
#[derive(Debug, Clone, Copy)]
struct Received {
    at: Instant,
    wall: SystemTime,
}

/// Serve one request end to end, counting it whatever happens; errors answer in `api`'s shape.
pub async fn handle(shared: Arc<Shared>, api: Api, headers: &HeaderMap, body: Body) -> Response {
    let received = Received {
        at: Instant::now(),
        wall: SystemTime::now(),
    };
    let agent = AgentContext::from_headers(headers);
    let harness = agent.harness;
    // Callers that prefer to back off get a 429 instead of waiting in the router queue.
    let do_not_queue = headers
        .get("x-switchyard-do-not-queue")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    // Held until the response body is done (a stream's end), so it bounds streams too.
    let admitted = shared.live().admits(headers).and_then(|()| {
        shared
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| GatewayError::Overloaded {
                limit: shared.live().config.server.max_concurrent_requests,
            })
    });
    let result = match admitted {
        Ok(permit) => proxy(&shared, api, body, (agent, do_not_queue), received)
            .await
            .map(|response| {
                response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _held = &permit;
                        frame
                    }))
                })
            }),
        Err(overloaded) => Err(overloaded),
    };
    match result {
        Ok(response) => response,
        Err(err) => {
            shared.metrics.reject(err.reason());
            if matches!(err, GatewayError::Internal(_)) {
                tracing::error!(error = %err, "request failed");
            }
            let response = err.into_api_response(api);
            shared
                .metrics
                .requests
                .get_or_create(&RequestLabels {
                    endpoint: api.path().into(),
                    status: response.status().as_u16(),
                    harness: harness.as_str(),
                })
                .inc();
            response
        }
    }
}

async fn proxy(
    shared: &Arc<Shared>,
    api: Api,
    body: Body,
    (mut agent, do_not_queue): (AgentContext, bool),
    received: Received,
) -> Result<Response, GatewayError> {
    let limit = shared.live().config.server.max_body_bytes;
    let bytes = read_body(body, limit).await?;
    let mut turn = prepare(shared, api, &bytes, &mut agent).await?;
    let hashes = shared.hasher.sequence(&turn.tokens);
    let id = RequestId(shared.next_request_id());
    let hints = turn.request.hints();
    // A paused program's request waits here, before routing, until admission lets it go.
    let (release, ticket) = Admission::admit(
        shared,
        AdmissionRequest {
            id,
            request: PolicyRequest {
                tokens: turn.tokens.len() as u32,
                session_id: agent.session_id.as_deref(),
                parent_session_id: agent.parent_session_id.as_deref(),
                priority: hints.priority.unwrap_or(0),
                osl: turn.request.expected_output_tokens(),
                ..PolicyRequest::default()
            },
            session_final: agent.session_final,
        },
    )
    .await;
    let mut ticket = Some(ticket);
    let mut excluded: Vec<Rank> = Vec::new();
    let mut last_failure = String::new();
    let max_attempts = shared.live().config.max_attempts;
    for attempt in 0..max_attempts {
        let request = RouteRequest {
            hashes: &hashes,
            tokens: turn.tokens.len() as u32,
            expected_output_tokens: turn.request.expected_output_tokens(),
            exclude: &excluded,
            session_id: agent.session_id.as_deref(),
            parent_session_id: agent.parent_session_id.as_deref(),
            priority: release.priority,
            // Admission's placement holds unless that worker already failed this request.
            pinned_rank: release.rank.filter(|r| !excluded.contains(r)),
            ..RouteRequest::default()
        };
        let decision = match shared.route(id, &request, do_not_queue) {
            Ok(Routed::Now(decision)) => Ok(decision),
            Ok(Routed::Later(waiting)) => waiting.decision().await,
            Err(e) => Err(e),
        };
        let decision = match decision {
            Ok(d) => d,
            Err(GatewayError::NoHealthyWorker) if attempt > 0 => {
                tracing::warn!(%last_failure, "every worker failed or is unhealthy");
                return Err(GatewayError::NoHealthyWorker);
            }
            Err(e) => return Err(e),
        };
        let routed = Instant::now();
        tracing::debug!(
            request = id.0,
            session = agent.session_id.as_deref(),
            worker = %decision.rank,
            overlap_blocks = decision.overlap.device,
            event_blocks = decision.indexed.device,
            shared_blocks = decision.shared_blocks,
            cost = ?decision.cost,
            "routed"
        );
        let mut booking = Booking::new(
            shared.clone(),
            id,
            api,
            &decision,
            (agent.session_id.clone(), agent.harness),
            received.at,
        );
        if let Some(ticket) = &ticket {
            ticket.started(decision.rank);
        }
        match send(shared, &turn, &decision, release.priority).await {
            Ok((upstream, parse)) => {
                let request_id = shared.request_id(id);
                let streaming = turn.request.streaming().0;
                let decoder = {
                    let live = shared.live();
                    let model = &live.config.model;
                    let parsers = (model.reasoning_parser.as_deref(), Some(model.tool_parser()));
                    ReplyDecoder::new(&request_id, parse, streaming, parsers)
                        .map_err(|e| GatewayError::Internal(e.to_string()))?
                };
                let meta = reply_meta(shared, &turn, request_id, received);
                let routed_at = (received, routed);
                booking.admission = ticket.take();
                booking.trace =
                    trace_draft(shared, id, agent, routed_at, &decision, &mut turn, hashes);
                return respond(upstream, turn, decoder, meta, booking).await;
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

/// What the client API's encoder is told about the request it answers.
fn reply_meta(shared: &Shared, turn: &Turn, request_id: String, received: Received) -> ReplyMeta {
    let created = crate::trace::record::unix_ms(received.wall) / 1000;
    // The Responses API's meta also carries its echoed fields, tool shapes and reasoning items.
    let mut meta = match &turn.request {
        Request::Responses(responses) => responses.reply_meta(request_id, created),
        _ => ReplyMeta::new(request_id, created, String::new()),
    };
    meta.model = shared.model_name.clone();
    meta.include_usage = turn.request.streaming().1;
    meta.prompt_tokens = Some(turn.tokens.len() as u64);
    meta
}

/// The trace's view of a routed request, when tracing is on.
fn trace_draft(
    shared: &Shared,
    id: RequestId,
    agent: AgentContext,
    (received, routed): (Received, Instant),
    decision: &Decision,
    turn: &mut Turn,
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
            url: shared
                .fleet
                .get(rank.worker)
                .map(|m| m.upstream.base_url.clone())
                .unwrap_or_default(),
        },
        // Others booked on the rank when this one was placed.
        queue_depth: shared.in_flight(rank).saturating_sub(1),
        block_size: shared.live().config.router.block_size,
        prompt_tokens: turn.tokens.len() as u64,
        hashes: hashes.into_iter().map(|h| h.0).collect(),
        // Already sent: the body is not needed any more.
        body: sink
            .include_content()
            .then(|| std::mem::take(&mut turn.body)),
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

/// Send to the chosen rank; also says whether the answer is raw text to parse (`tokens` mode).
/// `Err` only when nothing came back (connect error, timeout before the response head): then
/// another worker may be tried.
async fn send(
    shared: &Arc<Shared>,
    turn: &Turn,
    decision: &Decision,
    priority: i32,
) -> Result<(reqwest::Response, bool), String> {
    let Some(member) = shared.fleet.get(decision.rank.worker) else {
        return Err("the worker left the fleet".into());
    };
    let upstream = &member.upstream;
    let (path, body, pin) = engine::request(turn, upstream, priority);
    shared.metrics.pin(pin);
    let parse = path == "/v1/completions" && turn.request.conversation().is_some();
    let timeout = shared.live().config.server.request_timeout;
    let response = upstream
        .request(&shared.client, path, decision.rank.dp_rank, body)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok((response, parse))
}
