//! The request pipeline: body -> tokens -> routing decision -> engine -> response.
//!
//! One function per stage. The router's booking is released by `Booking`'s `Drop`, so a client
//! that disconnects (its response future or stream dropped) releases the load and, by dropping the
//! upstream request, cancels it at the engine. The same `Drop` writes the request's trace line.

use crate::admission::{Admission, Ticket};
use crate::agent::AgentContext;
use crate::config::HintDelivery;
use crate::error::GatewayError;
use crate::hints::llama_slots::{self, SlotLease};
use crate::key_tokens::KeyTokens;
use crate::metrics::RequestLabels;
use crate::queue::{Queue, Routed};
use crate::server::{KeyPass, Shared};
use crate::trace::{RequestDraft, RequestFacts, WorkerRef};
use crate::upstream::EngineResponse;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use switchyard_core::admission::{AdmissionRequest, Release};
use switchyard_core::hash::SequenceHash;
use switchyard_core::kv_hints::sessions::RoutedTurn;
use switchyard_core::router::{Decision, PolicyRequest, RequestId, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_frontend::{Api, ReplyMeta};
use tokio::sync::OwnedSemaphorePermit;

mod engine;
mod pick;
mod prepare;
mod respond;
mod speculative;

pub(crate) use engine::Pin;
use engine::ReplyDecoder;
pub use pick::{Pick, Picker};
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
    let do_not_queue = do_not_queue(headers);
    // Held until the response body is done (a stream's end), so it bounds streams too.
    let result = match let_in(&shared, headers) {
        Ok(permits) => {
            let key_tokens = permits.key.tokens.clone();
            proxy(
                &shared,
                api,
                body,
                (agent, do_not_queue),
                received,
                key_tokens,
            )
            .await
            .map(|response| {
                response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _held = &permits;
                        frame
                    }))
                })
            })
        }
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

/// What a request holds while it lasts: one of the gateway's in-flight permits and what its
/// key lets it hold.
#[derive(Debug)]
pub(crate) struct Permits {
    _gateway: OwnedSemaphorePermit,
    key: KeyPass,
}

/// A client's key checked and the request's permits taken, or why not.
fn let_in(shared: &Shared, headers: &HeaderMap) -> Result<Permits, GatewayError> {
    let key = shared.live().key_pass(headers)?;
    let gateway =
        shared
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| GatewayError::Overloaded {
                limit: shared.live().config.server.max_concurrent_requests,
            })?;
    Ok(Permits {
        _gateway: gateway,
        key,
    })
}

/// Whether the caller asked for a 429 rather than a wait in the router queue.
fn do_not_queue(headers: &HeaderMap) -> bool {
    headers
        .get("x-switchyard-do-not-queue")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

async fn proxy(
    shared: &Arc<Shared>,
    api: Api,
    body: Body,
    (mut agent, do_not_queue): (AgentContext, bool),
    received: Received,
    key_tokens: Option<Arc<KeyTokens>>,
) -> Result<Response, GatewayError> {
    let limit = shared.live().config.server.max_body_bytes;
    let bytes = read_body(body, limit).await?;
    let mut turn = prepare(shared, api, &bytes, &mut agent).await?;
    // The prompt counts once it is known; the completion when it ends (`Booking`).
    if let Some(budget) = &key_tokens {
        budget.charge(turn.tokens.len() as u64, Instant::now());
    }
    let hashes = shared.hasher.sequence(&turn.tokens);
    let id = RequestId(shared.next_request_id());
    let (release, ticket) = admit(shared, id, &turn, &agent).await;
    let mut ticket = Some(ticket);
    let mut excluded: Vec<Rank> = Vec::new();
    let mut last_failure = String::new();
    let max_attempts = shared.live().config.max_attempts;
    for attempt in 0..max_attempts {
        let request = route_request(&turn, &hashes, &agent, &release, &excluded);
        let decision = match decide(shared, id, &request, do_not_queue).await {
            Ok(d) => d,
            Err(GatewayError::NoHealthyWorker) if attempt > 0 => {
                tracing::warn!(%last_failure, "every worker failed or is unhealthy");
                return Err(GatewayError::NoHealthyWorker);
            }
            Err(e) => return Err(e),
        };
        let routed = Instant::now();
        note_routed(shared, &agent, &decision, (&hashes, turn.tokens.len()));
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
        booking.session_final = agent.session_final;
        booking.key_tokens = key_tokens.clone();
        if let Some(ticket) = &ticket {
            ticket.started(decision.rank);
        }
        let session = agent.session_id.as_deref();
        let whole = !decision.engine_streams;
        if whole {
            let label = crate::metrics::worker_label(decision.rank);
            shared.metrics.whole_answers.get_or_create(&label).inc();
        }
        match send(shared, &turn, &decision, (release.priority, session, whole)).await {
            Ok((upstream, parse, slot)) => {
                booking.slot = slot;
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
                return respond(upstream, turn, (decoder, whole), meta, booking).await;
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

/// Offer the request to session-aware admission: a paused program's request waits here, before
/// routing, until admission lets it go.
async fn admit(
    shared: &Arc<Shared>,
    id: RequestId,
    turn: &Turn,
    agent: &AgentContext,
) -> (Release, Ticket) {
    let hints = turn.request.hints();
    Admission::admit(
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
    .await
}

/// What the router is asked for an admitted request, never on a rank in `excluded`.
fn route_request<'a>(
    turn: &Turn,
    hashes: &'a [SequenceHash],
    agent: &'a AgentContext,
    release: &Release,
    excluded: &'a [Rank],
) -> RouteRequest<'a> {
    RouteRequest {
        hashes,
        tokens: turn.tokens.len() as u32,
        expected_output_tokens: turn.request.expected_output_tokens(),
        client_streams: turn.request.streaming().0,
        exclude: excluded,
        session_id: agent.session_id.as_deref(),
        parent_session_id: agent.parent_session_id.as_deref(),
        priority: release.priority,
        // Admission's placement holds unless that worker already failed this request.
        pinned_rank: release.rank.filter(|r| !excluded.contains(r)),
        ..RouteRequest::default()
    }
}

/// Route now, or wait in the router queue until a worker has room.
async fn decide(
    shared: &Arc<Shared>,
    id: RequestId,
    request: &RouteRequest<'_>,
    do_not_queue: bool,
) -> Result<Decision, GatewayError> {
    let decision = match shared.route(id, request, do_not_queue)? {
        Routed::Now(decision) => decision,
        Routed::Later(waiting) => waiting.decision().await?,
    };
    if let Some(due) = decision.prefill_due {
        Queue::drain_at(shared, due);
    }
    Ok(decision)
}

/// Tell the hint path where a session's request went (its lineage there is this prompt).
fn note_routed(
    shared: &Shared,
    agent: &AgentContext,
    decision: &Decision,
    (hashes, prompt_tokens): (&[SequenceHash], usize),
) {
    if let Some(session_id) = agent.session_id.as_deref() {
        let turn = RoutedTurn {
            session_id,
            parent_session_id: agent.parent_session_id.as_deref(),
            rank: decision.rank,
            hashes,
            prompt_tokens: prompt_tokens as u64,
        };
        shared.hints.routed(turn, shared.now());
    }
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

/// Set vLLM's `kv_transfer_params.max_offload_tokens` to `tokens` (a lower cap already there
/// stays; a malformed field is replaced).
fn cap_offload(body: &mut Value, tokens: u64) {
    let Some(body) = body.as_object_mut() else {
        return;
    };
    let params = body
        .entry("kv_transfer_params")
        .or_insert_with(|| json!({}));
    if !params.is_object() {
        *params = json!({});
    }
    let cap = params["max_offload_tokens"]
        .as_u64()
        .map_or(tokens, |c| c.min(tokens));
    params["max_offload_tokens"] = json!(cap);
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

/// Send to the chosen rank; also says whether the answer is raw text to parse (`tokens` mode),
/// and the llama.cpp slot the request holds (`llama-slots` workers). `Err` only when nothing
/// came back (connect error, timeout before the response head): then another worker may be
/// tried.
async fn send(
    shared: &Arc<Shared>,
    turn: &Turn,
    decision: &Decision,
    (priority, session, whole): (i32, Option<&str>, bool),
) -> Result<(EngineResponse, bool, Option<SlotLease>), String> {
    let Some(member) = shared.fleet.get(decision.rank.worker) else {
        return Err("the worker left the fleet".into());
    };
    let upstream = &member.upstream;
    let (path, mut body, pin) = engine::request(turn, upstream, (priority, whole));
    let mut slot = None;
    match member.config.kv_hints {
        HintDelivery::Request => {
            if let Some(envelope) = shared.hints.riding(decision.rank)
                && let Ok(field) = serde_json::to_value(envelope)
            {
                body["kv_hints"] = field;
            }
        }
        // The session's slot, its saved KV restored there first when the slot lacks it.
        HintDelivery::LlamaSlots => {
            if let Some(session) = session {
                slot = llama_slots::before_request(shared, &member, decision.rank, session).await;
            }
            if let Some(slot) = &slot {
                body["id_slot"] = slot.slot().into();
            }
        }
        HintDelivery::None | HintDelivery::Endpoint => {}
    }
    // A thinking session's answer will not be reused: keep it out of the lower tiers (vLLM's
    // field; a llama.cpp slot has no tiers).
    if matches!(
        member.config.kv_hints,
        HintDelivery::Endpoint | HintDelivery::Request
    ) && shared.live().config.kv_hints.ephemeral_thinking
        && session.is_some_and(|s| shared.hints.thinks(s))
    {
        cap_offload(&mut body, turn.tokens.len() as u64);
    }
    shared.metrics.pin(pin);
    let parse = path == "/v1/completions" && turn.request.conversation().is_some();
    let timeout = shared.live().config.server.request_timeout;
    let dp_rank = decision.rank.dp_rank;
    let response = match upstream.plain_request(path, dp_rank, &body) {
        Some(request) => {
            let request = request.map_err(|e| format!("encoding the engine request: {e}"))?;
            shared.answers.post(request, timeout).await?
        }
        None => EngineResponse::from(
            upstream
                .request(&shared.client, path, dp_rank, body)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| e.to_string())?,
        ),
    };
    Ok((response, parse, slot))
}

#[cfg(test)]
mod tests {
    use super::cap_offload;
    use serde_json::json;

    #[test]
    fn the_offload_cap_is_set_kept_lower_or_replaces_a_bad_field() {
        let mut body = json!({"prompt": [1, 2]});
        cap_offload(&mut body, 2);
        assert_eq!(body["kv_transfer_params"], json!({"max_offload_tokens": 2}));
        let mut body = json!({"kv_transfer_params": {"max_offload_tokens": 1, "other": true}});
        cap_offload(&mut body, 2);
        assert_eq!(
            body["kv_transfer_params"],
            json!({"max_offload_tokens": 1, "other": true})
        );
        let mut body = json!({"kv_transfer_params": "nonsense"});
        cap_offload(&mut body, 2);
        assert_eq!(body["kv_transfer_params"], json!({"max_offload_tokens": 2}));
    }
}
