//! Endpoint-picker mode: the gateway's decision for a request that another proxy forwards itself
//! (Envoy, as the data plane of the Gateway API Inference Extension). The same frontends,
//! tokenizer, admission, index, router and policies decide as for a request this gateway proxies;
//! only the transport differs. The pick holds the request's booking until the proxy reports the
//! response's end, so loads and admission see picked requests exactly as proxied ones.

use super::respond::Booking;
use super::{Received, admit, decide, do_not_queue, let_in, note_routed, prepare, route_request};
use crate::agent::AgentContext;
use crate::config::EngineKind;
use crate::error::{GatewayError, Refusal};
use crate::fleet::Member;
use crate::server::Shared;
use axum::http::HeaderMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use switchyard_core::hash::SequenceHash;
use switchyard_core::router::{RequestId, RouteRequest};
use switchyard_core::worker::Rank;
use switchyard_frontend::Api;

/// Picks endpoints for requests forwarded by someone else; cheap to clone.
#[derive(Debug, Clone)]
pub struct Picker {
    shared: Arc<Shared>,
}

/// A request's routing decision, held until its response ends (drop it then).
pub struct Pick {
    /// Where to send it, best first, as `ip:port`.
    pub endpoints: Vec<String>,
    /// Headers the forwarded request must carry (the data-parallel rank, for engines that take
    /// it as a header).
    pub headers: Vec<(&'static str, String)>,
    /// The client API, for the error shape of anything answered later.
    pub api: Api,
    /// What it was routed with, to book it again where it was served if not where picked.
    hashes: Vec<SequenceHash>,
    tokens: u32,
    expected_output_tokens: Option<u32>,
    booking: Booking,
    _permit: super::Permits,
}

impl Picker {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The client API served at `path` (query string ignored), or `None` for paths the picker
    /// does not decide (health checks, model lists): those go on unrouted.
    pub fn api(path: &str) -> Option<Api> {
        let path = path.split('?').next().unwrap_or(path);
        [
            Api::ChatCompletions,
            Api::Completions,
            Api::Responses,
            Api::Messages,
        ]
        .into_iter()
        .find(|api| api.path() == path)
    }

    /// The largest request body the gateway takes (`[server] max_body_bytes`).
    pub fn max_body_bytes(&self) -> usize {
        self.shared.live().config.server.max_body_bytes
    }

    /// Whether any worker can take a request now (the picker's readiness).
    pub fn ready(&self) -> bool {
        self.shared.router().ranks().any(|(_, healthy)| healthy)
    }

    /// The ranks of the workers whose endpoint is not one of `subset` (`ip:port`).
    fn outside(&self, subset: &[String]) -> Vec<Rank> {
        self.shared
            .fleet
            .members()
            .iter()
            .filter(|m| !endpoint(m).is_some_and(|e| subset.contains(&e)))
            .flat_map(|m| m.upstream.ranks().collect::<Vec<_>>())
            .collect()
    }

    /// The rank serving at `endpoint` (a worker's first rank: the proxy cannot say which).
    fn rank_of(&self, endpoint_addr: &str) -> Option<Rank> {
        self.shared
            .fleet
            .members()
            .iter()
            .find(|m| endpoint(m).is_some_and(|e| e == endpoint_addr))
            .and_then(|m| m.upstream.ranks().next())
    }

    /// Decide where the request goes: decoded, tokenized, admitted and routed as the gateway
    /// does its own. `subset`, when the proxy sent one, limits the choice to those endpoints (an
    /// empty or unknown subset: no worker, 503). Refusals carry the API's own error shape.
    /// `None`: a request the picker cannot place better than the proxy's own balancing (a
    /// Responses request chaining a `previous_response_id` that some engine stored).
    pub async fn pick(
        &self,
        api: Api,
        headers: &HeaderMap,
        body: &[u8],
        subset: Option<&[String]>,
    ) -> Result<Option<Pick>, Refusal> {
        self.decide(api, headers, body, subset)
            .await
            .map_err(|err| {
                let shared = &self.shared;
                shared.metrics.reject(err.reason());
                if matches!(err, GatewayError::Internal(_)) {
                    tracing::error!(error = %err, "pick failed");
                }
                err.into_refusal(api)
            })
    }

    async fn decide(
        &self,
        api: Api,
        headers: &HeaderMap,
        body: &[u8],
        subset: Option<&[String]>,
    ) -> Result<Option<Pick>, GatewayError> {
        let shared = &self.shared;
        if api == Api::Responses && chains_a_stored_response(body) {
            // The engine answering keeps the conversation, not this picker.
            return Ok(None);
        }
        let received = Received {
            at: Instant::now(),
            wall: SystemTime::now(),
        };
        let permit = let_in(shared, headers)?;
        let limit = shared.live().config.server.max_body_bytes;
        if body.len() > limit {
            return Err(GatewayError::TooLarge { limit });
        }
        let mut agent = AgentContext::from_headers(headers);
        let turn = prepare(shared, api, body, &mut agent).await?;
        let hashes = shared.hasher.sequence(&turn.tokens);
        let id = RequestId(shared.next_request_id());
        let (release, ticket) = admit(shared, id, &turn, &agent).await;
        let excluded = subset.map(|s| self.outside(s)).unwrap_or_default();
        let request = route_request(&turn, &hashes, &agent, &release, &excluded);
        let decision = decide(shared, id, &request, do_not_queue(headers)).await?;
        let member = shared
            .fleet
            .get(decision.rank.worker)
            .ok_or(GatewayError::NoHealthyWorker)?;
        let endpoint = endpoint(&member).ok_or_else(|| {
            GatewayError::Internal(format!(
                "worker {} has no ip:port endpoint for a proxy to dial",
                member.upstream.base_url
            ))
        })?;
        tracing::debug!(
            request = id.0,
            session = agent.session_id.as_deref(),
            worker = %decision.rank,
            %endpoint,
            overlap_blocks = decision.overlap.device,
            "picked"
        );
        note_routed(shared, &agent, &decision, (&hashes, turn.tokens.len()));
        ticket.started(decision.rank);
        let mut booking = Booking::new(
            shared.clone(),
            id,
            api,
            &decision,
            (agent.session_id.clone(), agent.harness),
            received.at,
        );
        booking.admission = Some(ticket);
        // Envoy forwards the client's body as it is: the engine streams as the client asked.
        booking.engine_streams = request.client_streams;
        let tokens = request.tokens;
        let expected_output_tokens = request.expected_output_tokens;
        Ok(Some(Pick {
            endpoints: vec![endpoint],
            headers: rank_headers(&member, decision.rank),
            api,
            hashes,
            tokens,
            expected_output_tokens,
            booking,
            _permit: permit,
        }))
    }
}

impl std::fmt::Debug for Pick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pick")
            .field("endpoints", &self.endpoints)
            .field("headers", &self.headers)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl Pick {
    /// The proxy received the response head: `status`, from `served` (`ip:port`, when it says).
    /// A request served elsewhere than picked (the proxy fell back) moves its booking there.
    pub fn answered(&mut self, picker: &Picker, status: u16, served: Option<&str>) {
        if let Some(served) = served
            && !self.endpoints.iter().any(|e| e == served)
        {
            picker.shared.metrics.epp_served_elsewhere.inc();
            if let Some(rank) = picker.rank_of(served) {
                let request = RouteRequest {
                    hashes: &self.hashes,
                    tokens: self.tokens,
                    expected_output_tokens: self.expected_output_tokens,
                    pinned_rank: Some(rank),
                    ..RouteRequest::default()
                };
                self.booking.rebook(&request);
            }
        }
        self.booking.answered(status);
    }

    /// The first bytes of the response body went by (prefill is done).
    pub fn first_byte(&mut self) {
        self.booking.first_byte();
    }

    /// The whole response went by.
    pub fn completed(&mut self) {
        self.booking.completed();
    }
}

/// Whether a Responses body continues a stored response (`previous_response_id`).
fn chains_a_stored_response(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Chained {
        previous_response_id: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Chained>(body).is_ok_and(|c| c.previous_response_id.is_some())
}

/// A worker's `host:port`, as a proxy dials it (`[v6]:port` for IPv6).
fn endpoint(member: &Member) -> Option<String> {
    let url = reqwest::Url::parse(&member.upstream.base_url).ok()?;
    let host = url.host()?;
    Some(format!("{host}:{}", url.port_or_known_default()?))
}

/// How the forwarded request names its data-parallel rank: vLLM-style engines read a header;
/// SGLang wants a body field, which the picker does not rewrite (run one worker per rank).
fn rank_headers(member: &Member, rank: Rank) -> Vec<(&'static str, String)> {
    match member.upstream.kind {
        _ if member.upstream.dp_size <= 1 => Vec::new(),
        EngineKind::Sglang => Vec::new(),
        _ => vec![("x-data-parallel-rank", rank.dp_rank.to_string())],
    }
}
