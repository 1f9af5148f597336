//! The engines behind the gateway: addressing, the pooled HTTP client and health checks.

use crate::config::{EngineKind, UpstreamMode, WorkerConfig};
use crate::metrics::{Metrics, worker_label};
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
        if self.dp_size > 1 {
            // Each engine addresses data-parallel ranks its own way.
            match self.kind {
                EngineKind::Sglang => body["data_parallel_rank"] = dp_rank.into(),
                _ => builder = builder.header("x-data-parallel-rank", dp_rank.to_string()),
            }
        }
        builder.json(&body)
    }
}

/// Probe every worker's `/health` each `interval`; failing workers are taken out of routing until
/// they pass again.
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
        let mut router = router.lock().unwrap_or_else(|e| e.into_inner());
        for (worker, healthy) in workers.iter().zip(results) {
            for rank in worker.upstream.ranks() {
                router.set_healthy(rank, healthy);
                metrics
                    .worker_healthy
                    .get_or_create(&worker_label(rank))
                    .set(healthy as i64);
            }
        }
    }
}
