//! `/admin/workers`: the fleet's members with their state (`GET`, read role), and workers added
//! (`POST`) or removed (`DELETE ?url=`) at run time (write role) as members of source `admin`.
//! An added worker is checked exactly as a `[[workers]]` entry is and joins cold; a removed one
//! leaves as one dropped from the file does. Members of the file or of discovery are theirs to
//! change: deleting one is a 409.
//!
//! `/admin/workers/drain?url=` drains any member (`POST`) or takes it back (`DELETE`), write role:
//! a drained worker stays in the fleet, finishes what it runs and gets nothing new, so it can be
//! stopped or upgraded without failing a request; its sessions move to the others (a
//! `llama-slots` worker hands their KV over through the slot directory).

use super::{check, runtime};
use crate::config::{HintDelivery, WorkerConfig};
use crate::error::GatewayError;
use crate::fleet::{Member, Source};
use crate::policies::AdminRole;
use crate::server::Shared;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use switchyard_core::router::Router;

const PATH: &str = "/admin/workers";

/// One member as the API shows it.
#[derive(Debug, Serialize)]
struct MemberView {
    /// Its worker id (ids are never reused).
    id: u32,
    source: Source,
    /// Its entry, in the shape of a `[[workers]]` table.
    #[serde(flatten)]
    config: WorkerConfig,
    /// Drained: no new requests (its ranks are listed unhealthy meanwhile).
    draining: bool,
    ranks: Vec<RankView>,
}

/// One data-parallel rank of a member.
#[derive(Debug, Serialize)]
struct RankView {
    /// `worker.dp_rank`, as in the metrics' `worker` label.
    rank: String,
    healthy: bool,
    /// Requests booked on it now.
    in_flight: u32,
    /// Its KV-event stream; absent for a worker without events (approximate mode).
    events: Option<EventsView>,
}

#[derive(Debug, Serialize)]
struct EventsView {
    connected: bool,
    messages: u64,
    gaps: u64,
    replays: u64,
    restarts: u64,
    clears: u64,
}

impl MemberView {
    fn new(member: &Member, router: &Router) -> Self {
        let ranks = member
            .upstream
            .ranks()
            .map(|rank| {
                let healthy = router
                    .ranks()
                    .any(|(listed, healthy)| listed == rank && healthy);
                let events = member
                    .events
                    .iter()
                    .find(|(r, _)| *r == rank)
                    .map(|(_, stats)| {
                        let s = stats.snapshot();
                        EventsView {
                            connected: s.connected,
                            messages: s.messages,
                            gaps: s.gaps,
                            replays: s.replays,
                            restarts: s.restarts,
                            clears: s.clears,
                        }
                    });
                RankView {
                    rank: crate::metrics::worker_label(rank).worker,
                    healthy,
                    in_flight: router.load(rank).requests,
                    events,
                }
            })
            .collect();
        Self {
            id: member.upstream.id.0,
            source: member.source,
            config: member.config.clone(),
            draining: member.draining(),
            ranks,
        }
    }
}

/// `DELETE /admin/workers?url=...`, and the drain's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UrlQuery {
    /// The worker's URL, as listed.
    url: String,
}

/// 401/403 unless the caller's token has `needed`.
fn authorize(
    shared: &Shared,
    headers: &HeaderMap,
    needed: AdminRole,
    what: &str,
) -> Result<(), GatewayError> {
    check(&runtime(shared, PATH)?.admin_tokens, headers, needed, what)
}

/// `GET /admin/workers`: every member, in id order.
pub(super) async fn list(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&shared, &headers, AdminRole::Read, "GET /admin/workers") {
        return e.into_response();
    }
    let members = shared.fleet.members();
    let router = shared.router();
    let workers: Vec<MemberView> = members
        .iter()
        .map(|m| MemberView::new(m, &router))
        .collect();
    drop(router);
    axum::Json(serde_json::json!({ "workers": workers })).into_response()
}

/// `POST /admin/workers`: one worker entry (JSON, the shape of a `[[workers]]` table) joins.
pub(super) async fn add(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let result = (|| {
        authorize(&shared, &headers, AdminRole::Write, "POST /admin/workers")?;
        let worker = parse_worker(&body)?;
        let block_size = shared.live().config.router.block_size;
        worker
            .validate("worker", block_size)
            .map_err(crate::fleet::FleetError::from)?;
        let member = shared
            .fleet
            .add(Source::Admin, worker, &shared.router, &shared.metrics)?;
        Ok::<_, GatewayError>(MemberView::new(&member, &shared.router()))
    })();
    match result {
        Ok(view) => (StatusCode::CREATED, axum::Json(view)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /admin/workers?url=...`: an admin-added worker leaves.
pub(super) async fn remove(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<UrlQuery>, QueryRejection>,
) -> Response {
    let result = (|| {
        authorize(&shared, &headers, AdminRole::Write, "DELETE /admin/workers")?;
        let Query(query) = query.map_err(|e| {
            GatewayError::BadRequest(format!("{PATH}: give the worker as ?url=...: {e}"))
        })?;
        let member =
            shared
                .fleet
                .remove(Source::Admin, &query.url, &shared.router, &shared.metrics)?;
        Ok::<_, GatewayError>(serde_json::json!({
            "removed": member.upstream.base_url,
            "id": member.upstream.id.0,
        }))
    })();
    match result {
        Ok(json) => axum::Json(json).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /admin/workers/drain?url=...`: the worker gets no new requests.
pub(super) async fn drain(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<UrlQuery>, QueryRejection>,
) -> Response {
    set_draining(&shared, &headers, query, true)
}

/// `DELETE /admin/workers/drain?url=...`: the worker takes requests again.
pub(super) async fn undrain(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    query: Result<Query<UrlQuery>, QueryRejection>,
) -> Response {
    set_draining(&shared, &headers, query, false)
}

fn set_draining(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    query: Result<Query<UrlQuery>, QueryRejection>,
    draining: bool,
) -> Response {
    let method = if draining { "POST" } else { "DELETE" };
    let result = (|| {
        authorize(
            shared,
            headers,
            AdminRole::Write,
            &format!("{method} {PATH}/drain"),
        )?;
        let Query(query) = query.map_err(|e| {
            GatewayError::BadRequest(format!("{PATH}/drain: give the worker as ?url=...: {e}"))
        })?;
        let member =
            shared
                .fleet
                .set_draining(&query.url, draining, &shared.router, &shared.metrics)?;
        if draining && member.config.kv_hints == HintDelivery::LlamaSlots {
            // Its sessions' KV to the slot directory now, while the server is surely up.
            tokio::spawn(crate::hints::llama_slots::save_drained(
                shared.clone(),
                member.upstream.id,
            ));
        }
        Ok::<_, GatewayError>(MemberView::new(&member, &shared.router()))
    })();
    match result {
        Ok(view) => axum::Json(view).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A worker entry from JSON; a mistake names its field (`worker.dp_size: invalid type...`).
fn parse_worker(body: &[u8]) -> Result<WorkerConfig, GatewayError> {
    let mut json = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            GatewayError::BadRequest(format!("worker: {inner}"))
        } else {
            GatewayError::BadRequest(format!("worker.{path}: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests;
