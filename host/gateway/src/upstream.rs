//! The engines behind the gateway: addressing, the pooled HTTP clients and health checks.

mod http1;

pub(crate) use http1::{ConnectionCounters, EngineRequest, Http1Pool, IDLE_TIMEOUT};

use crate::config::{EngineKind, UpstreamMode, WorkerConfig};
use crate::metrics::{Metrics, worker_label};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::router::Router;
use switchyard_core::worker::{Rank, WorkerId};
use tokio_util::sync::CancellationToken;

/// One engine server.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its id in the router.
    pub id: WorkerId,
    /// Base URL without a trailing slash.
    pub base_url: String,
    /// Engine kind.
    pub kind: EngineKind,
    /// Data-parallel ranks.
    pub dp_size: u32,
    /// Whether it publishes KV events (else: approximate mode).
    pub publishes_events: bool,
    /// What the gateway sends it.
    pub mode: UpstreamMode,
    /// Where a plain `http://` engine is, for [`Http1Pool`]; `None` for `https://` (reqwest).
    plain: Option<PlainHttp>,
}

impl Upstream {
    /// From configuration entry number `index`.
    pub fn new(index: usize, config: &WorkerConfig) -> Self {
        Self {
            id: WorkerId(index as u32),
            base_url: config.url.trim_end_matches('/').to_string(),
            kind: config.kind,
            dp_size: config.dp_size,
            publishes_events: config.kv_events.is_some(),
            mode: config.upstream,
            plain: plain_http(&config.url),
        }
    }

    /// All ranks of this worker.
    pub fn ranks(&self) -> impl Iterator<Item = Rank> + '_ {
        (0..self.dp_size).map(|dp| Rank {
            worker: self.id,
            dp_rank: dp,
        })
    }

    /// Build the request that sends `body` to rank `dp_rank` at `path`.
    pub fn request(
        &self,
        client: &reqwest::Client,
        path: &str,
        dp_rank: u32,
        mut body: serde_json::Value,
    ) -> reqwest::RequestBuilder {
        let mut builder = client.post(format!("{}{path}", self.base_url));
        match self.address_rank(dp_rank) {
            Some(Addressed::Field(name, value)) => body[name] = value.into(),
            Some(Addressed::Header(name, value)) => builder = builder.header(name, value),
            None => {}
        }
        builder.json(&body)
    }

    /// The request of [`Self::request`] for [`Http1Pool`], when the engine is plain `http://`.
    pub(crate) fn plain_request(
        &self,
        path: &str,
        dp_rank: u32,
        body: &serde_json::Value,
    ) -> Option<Result<EngineRequest, serde_json::Error>> {
        let plain = self.plain.as_ref()?;
        let mut headers = Vec::new();
        let body = match self.address_rank(dp_rank) {
            Some(Addressed::Header(name, value)) => {
                headers.push((name, value));
                serde_json::to_vec(body)
            }
            Some(Addressed::Field(name, value)) => {
                let mut body = body.clone();
                body[name] = value.into();
                serde_json::to_vec(&body)
            }
            None => serde_json::to_vec(body),
        };
        Some(body.map(|body| EngineRequest {
            authority: plain.authority.clone(),
            host: plain.host.clone(),
            path: format!("{}{path}", plain.prefix),
            headers,
            body: body.into(),
        }))
    }

    /// How rank `dp_rank` is addressed, each engine its own way; `None` with one rank.
    fn address_rank(&self, dp_rank: u32) -> Option<Addressed> {
        if self.dp_size <= 1 {
            return None;
        }
        Some(match self.kind {
            EngineKind::Sglang => Addressed::Field("data_parallel_rank", dp_rank),
            _ => Addressed::Header("x-data-parallel-rank", dp_rank.to_string()),
        })
    }
}

/// Where a request names its data-parallel rank.
enum Addressed {
    Field(&'static str, u32),
    Header(&'static str, String),
}

/// The head of an engine's answer and its body as it arrives, from either client.
pub(crate) struct EngineResponse {
    pub(crate) status: reqwest::StatusCode,
    pub(crate) content_type: Option<reqwest::header::HeaderValue>,
    pub(crate) body: Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>,
}

impl EngineResponse {
    /// The whole body (an error answer), or what came of it before a failure.
    pub(crate) async fn bytes(mut self) -> Bytes {
        let mut all = BytesMut::new();
        while let Some(Ok(piece)) = self.body.next().await {
            all.extend_from_slice(&piece);
        }
        all.freeze()
    }
}

impl From<reqwest::Response> for EngineResponse {
    fn from(response: reqwest::Response) -> Self {
        Self {
            status: response.status(),
            content_type: response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .cloned(),
            body: Box::pin(response.bytes_stream().map_err(|e| e.to_string())),
        }
    }
}

/// A plain `http://` engine's address.
#[derive(Debug, Clone)]
struct PlainHttp {
    /// `host:port` to connect to.
    authority: String,
    /// The `Host` header: the URL's host, and its port if it names one (as reqwest sends it).
    host: String,
    /// The URL's path, without a trailing slash, before every request path.
    prefix: String,
}

fn plain_http(url: &str) -> Option<PlainHttp> {
    let url = reqwest::Url::parse(url).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let host = url.host()?;
    Some(PlainHttp {
        authority: format!("{host}:{}", url.port_or_known_default()?),
        host: match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        },
        prefix: url.path().trim_end_matches('/').to_owned(),
    })
}

/// Probe every worker's `/health` each `interval`; failing workers are taken out of routing until
/// they pass again (drained ones stay out).
pub async fn health_loop(
    fleet: Arc<crate::fleet::Fleet>,
    router: Arc<Mutex<Router>>,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let workers = fleet.members();
        let probes = workers.iter().map(|w| {
            let probe = client
                .get(format!("{}/health", w.upstream.base_url))
                .timeout(interval.max(Duration::from_secs(1)))
                .send();
            async move { matches!(probe.await, Ok(r) if r.status().is_success()) }
        });
        let results = futures::future::join_all(probes).await;
        let passed = results.iter().filter(|&&healthy| healthy).count();
        tracing::debug!(workers = results.len(), passed, "health probes answered");
        let mut router = router.lock().unwrap_or_else(|e| e.into_inner());
        for (worker, healthy) in workers.iter().zip(results) {
            worker.set_probe_passed(healthy);
            for rank in worker.upstream.ranks() {
                // A drained worker passes its probes but takes nothing new.
                router.set_healthy(rank, worker.routable());
                metrics
                    .worker_healthy
                    .get_or_create(&worker_label(rank))
                    .set(healthy as i64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::plain_http;

    #[test]
    fn a_plain_engine_url_gives_where_to_connect_the_host_header_and_the_path_prefix() {
        let parts = |url| plain_http(url).map(|p| (p.authority, p.host, p.prefix));
        let owned = |a: &str, h: &str, p: &str| Some((a.into(), h.into(), p.into()));
        assert_eq!(
            parts("http://127.0.0.1:8000/"),
            owned("127.0.0.1:8000", "127.0.0.1:8000", "")
        );
        assert_eq!(
            parts("http://engine/v1beta/"),
            owned("engine:80", "engine", "/v1beta")
        );
        assert_eq!(parts("http://[::1]:9/x"), owned("[::1]:9", "[::1]:9", "/x"));
        assert_eq!(parts("https://engine:443"), None);
        assert_eq!(parts("not a url"), None);
    }
}
