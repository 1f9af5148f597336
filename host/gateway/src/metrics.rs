//! Prometheus metrics of the gateway (`GET /metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Mutex;

/// Labels of a finished request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// API path, e.g. `/v1/chat/completions`.
    pub endpoint: String,
    /// HTTP status answered.
    pub status: u16,
}

/// Labels naming one worker rank (`worker.dp_rank`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    /// `worker.dp_rank`.
    pub worker: String,
}

/// Labels of a rejected request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// Why (see `GatewayError::reason`).
    pub reason: String,
}

/// Labels naming an endpoint.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// API path.
    pub endpoint: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// All gateway metrics; cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Requests answered, by endpoint and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Requests refused before reaching an engine, by reason.
    pub rejected: Family<RejectLabels, Counter>,
    /// End-to-end latency.
    pub latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    /// Time to first token (first streamed byte from the engine).
    pub ttft: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    /// Routing decisions per worker rank.
    pub decisions: Family<WorkerLabels, Counter>,
    /// Prompt tokens sent per worker rank.
    pub prompt_tokens: Family<WorkerLabels, Counter>,
    /// Prefix-hit tokens the engines reported (`cached_tokens`).
    pub prefix_hit_tokens: Family<WorkerLabels, Counter>,
    /// Prefix tokens the router expected to hit (events and bookings).
    pub routed_overlap_tokens: Family<WorkerLabels, Counter>,
    /// Attempts retried on another worker after a failure before the first byte.
    pub retries: Counter,
    /// 1 while a worker rank passes its health check.
    pub worker_healthy: Family<WorkerLabels, Gauge>,
    /// Requests in flight per worker rank, as the router books them.
    pub in_flight: Family<WorkerLabels, Gauge>,
    /// Trace lines dropped because the writer was behind or failing.
    pub trace_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Create and register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        let m = Self {
            requests: Family::default(),
            rejected: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            ttft: Family::new_with_constructor(latency_histogram),
            decisions: Family::default(),
            prompt_tokens: Family::default(),
            prefix_hit_tokens: Family::default(),
            routed_overlap_tokens: Family::default(),
            retries: Counter::default(),
            worker_healthy: Family::default(),
            in_flight: Family::default(),
            trace_dropped: Counter::default(),
            registry: Mutex::new(Registry::default()),
        };
        registry.register("requests", "Requests answered", m.requests.clone());
        registry.register(
            "rejected",
            "Requests refused before reaching an engine",
            m.rejected.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "End-to-end request latency",
            m.latency.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time to the engine's first byte",
            m.ttft.clone(),
        );
        registry.register(
            "routing_decisions",
            "Routing decisions per worker rank",
            m.decisions.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens sent per worker rank",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "prefix_hit_tokens",
            "Prompt tokens the engine reported cached",
            m.prefix_hit_tokens.clone(),
        );
        registry.register(
            "routed_overlap_tokens",
            "Prompt tokens the router expected cached",
            m.routed_overlap_tokens.clone(),
        );
        registry.register(
            "upstream_retries",
            "Attempts retried on another worker",
            m.retries.clone(),
        );
        registry.register(
            "worker_healthy",
            "1 while the worker passes its health check",
            m.worker_healthy.clone(),
        );
        registry.register(
            "worker_in_flight",
            "Requests booked on the worker",
            m.in_flight.clone(),
        );
        registry.register(
            "trace_dropped",
            "Trace lines dropped (writer behind or failing)",
            m.trace_dropped.clone(),
        );
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = registry;
        m
    }

    /// Count a request refused before reaching an engine.
    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&RejectLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Register extra metrics computed at scrape time (KV-event ingestion).
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register_collector(collector);
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// The label of a rank.
pub fn worker_label(rank: switchyard_core::worker::Rank) -> WorkerLabels {
    WorkerLabels {
        worker: rank.to_string(),
    }
}
