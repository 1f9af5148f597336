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
    /// The agent harness that sent it (`claude-code`, `codex`, `opencode`, `other`).
    pub harness: &'static str,
}

/// Labels of a session-cache tokenization.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabels {
    /// `hit`, `miss` or `fallback`.
    pub outcome: &'static str,
    /// The agent harness of the session.
    pub harness: &'static str,
}

/// Labels naming a tool type.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolTypeLabels {
    /// The tool's `type` (`web_search`, `web_search_20250305`, ...).
    pub kind: String,
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

/// Labels of a KV-hint action and what became of it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HintLabels {
    /// `demote`, `prefetch`, `pin`, `retain`, `evict`, `ephemeral`.
    pub action: &'static str,
    /// `worker.dp_rank`.
    pub worker: String,
    /// `accepted`, `clipped`, `deferred`, `rejected`, `missing`.
    pub outcome: &'static str,
}

/// Labels naming a session lifecycle event.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LifecycleLabels {
    /// `turn_end_with_tool_call`, `tool_result`, `subagent_spawn`, ...
    pub kind: &'static str,
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
    /// Prompt tokens the router expected the worker to fetch from the shared KV pool.
    pub routed_shared_tokens: Family<WorkerLabels, Counter>,
    /// Attempts retried on another worker after a failure before the first byte.
    pub retries: Counter,
    /// Engine connections of the answer pool: opened, and requests sent on a kept one.
    pub(crate) upstream_connections: crate::upstream::ConnectionCounters,
    /// Picked requests the proxy served elsewhere than picked (endpoint-picker mode).
    pub epp_served_elsewhere: Counter,
    /// 1 while a worker rank passes its health check.
    pub worker_healthy: Family<WorkerLabels, Gauge>,
    /// 1 while a worker rank is drained through the admin API (no new requests).
    pub worker_draining: Family<WorkerLabels, Gauge>,
    /// Requests in flight per worker rank, as the router books them.
    pub in_flight: Family<WorkerLabels, Gauge>,
    /// Uncached prompt tokens booked per worker rank whose prefill has not ended in the
    /// router's view (no first token, no stored event of the prompt's end, no predicted end
    /// passed yet).
    pub prefill_tokens: Family<WorkerLabels, Gauge>,
    /// Requests whose client did not stream that the engine was asked to answer whole
    /// (`[server] engine_stream`), per worker rank.
    pub whole_answers: Family<WorkerLabels, Counter>,
    /// Trace lines dropped because the writer was behind or failing.
    pub trace_dropped: Counter,
    /// Stored responses the Responses store's journal could not write (kept in memory only).
    pub response_journal_errors: Counter,
    /// Configuration reloads, by outcome (`applied`, `refused`).
    pub config_reloads: Family<OutcomeLabels, Counter>,
    /// Requests with `cache_control`, by what became of the pin (`sent`, `unsupported`).
    pub cache_pins: Family<OutcomeLabels, Counter>,
    /// Speculative prefills of a next turn, by outcome (`sent`, `failed`).
    pub speculative_prefills: Family<OutcomeLabels, Counter>,
    /// Prompt tokens of chat requests the session cache spared the tokenizer.
    pub reused_prompt_tokens: Counter,
    /// Chat requests tokenized through the session cache, by outcome (`hit`, `miss`,
    /// `fallback`) and harness.
    pub session_tokenizations: Family<SessionLabels, Counter>,
    /// Hosted tools offered by clients that no engine can run, left out of prompts, by type.
    pub dropped_tools: Family<ToolTypeLabels, Counter>,
    /// Booking messages over NATS, by direction (`sent`, `received`, `dropped`).
    pub cluster_messages: Family<DirectionLabels, Counter>,
    /// 1 while the NATS connection of `[cluster]` is up.
    pub cluster_connected: Gauge,
    /// KV-hint actions by type, worker and outcome.
    pub kv_hints: Family<HintLabels, Counter>,
    /// Blocks those actions named (or acted on, when the worker answered).
    pub kv_hint_blocks: Family<HintLabels, Counter>,
    /// Envelopes a worker did not answer (unreachable, an error status, a bad reply).
    pub kv_hint_delivery_failures: Family<WorkerLabels, Counter>,
    /// Session lifecycle events seen in live traffic, by kind.
    pub kv_lifecycle_events: Family<LifecycleLabels, Counter>,
}

/// Labels of the cluster's message counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DirectionLabels {
    /// `sent`, `received` or `dropped`.
    pub direction: &'static str,
}

/// Labels of counters split by outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What happened.
    pub outcome: &'static str,
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
            routed_shared_tokens: Family::default(),
            retries: Counter::default(),
            upstream_connections: Default::default(),
            epp_served_elsewhere: Counter::default(),
            worker_healthy: Family::default(),
            worker_draining: Family::default(),
            in_flight: Family::default(),
            prefill_tokens: Family::default(),
            whole_answers: Family::default(),
            trace_dropped: Counter::default(),
            response_journal_errors: Counter::default(),
            config_reloads: Family::default(),
            cache_pins: Family::default(),
            speculative_prefills: Family::default(),
            reused_prompt_tokens: Counter::default(),
            session_tokenizations: Family::default(),
            dropped_tools: Family::default(),
            cluster_messages: Family::default(),
            cluster_connected: Gauge::default(),
            kv_hints: Family::default(),
            kv_hint_blocks: Family::default(),
            kv_hint_delivery_failures: Family::default(),
            kv_lifecycle_events: Family::default(),
            registry: Mutex::new(Registry::default()),
        };
        registry.register("requests", "Requests answered", m.requests.clone());
        registry.register(
            "kv_hint_actions",
            "KV-hint actions by type, worker and outcome",
            m.kv_hints.clone(),
        );
        registry.register(
            "kv_hint_blocks",
            "Blocks named or acted on by KV-hint actions",
            m.kv_hint_blocks.clone(),
        );
        registry.register(
            "kv_hint_delivery_failures",
            "KV-hint envelopes a worker did not answer",
            m.kv_hint_delivery_failures.clone(),
        );
        registry.register(
            "kv_lifecycle_events",
            "Session lifecycle events seen in live traffic",
            m.kv_lifecycle_events.clone(),
        );
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
            "routed_shared_tokens",
            "Prompt tokens the router expected fetched from the shared KV pool (beyond the worker's own prefix)",
            m.routed_shared_tokens.clone(),
        );
        registry.register(
            "upstream_retries",
            "Attempts retried on another worker",
            m.retries.clone(),
        );
        registry.register(
            "upstream_connections_opened",
            "Connections opened to plain http:// engines for answers",
            m.upstream_connections.opened.clone(),
        );
        registry.register(
            "upstream_connections_reused",
            "Answers requested on a kept connection to a plain http:// engine",
            m.upstream_connections.reused.clone(),
        );
        registry.register(
            "epp_served_elsewhere",
            "Picked requests the proxy served on another endpoint than the one picked",
            m.epp_served_elsewhere.clone(),
        );
        registry.register(
            "worker_healthy",
            "1 while the worker passes its health check",
            m.worker_healthy.clone(),
        );
        registry.register(
            "worker_draining",
            "1 while the worker is drained: it passes its health check but gets no new requests",
            m.worker_draining.clone(),
        );
        registry.register(
            "worker_in_flight",
            "Requests booked on the worker",
            m.in_flight.clone(),
        );
        registry.register(
            "worker_prefill_tokens",
            "Uncached prompt tokens booked on the worker whose prefill has not ended (the \
             router heard of no first token and no KV event of the prompt's last block, and \
             the end its learnt prefill pace predicts has not come)",
            m.prefill_tokens.clone(),
        );
        registry.register(
            "engine_whole_answers",
            "Requests the engine was asked to answer whole rather than stream (the client \
             did not stream, and the router hears of the prefill's end otherwise)",
            m.whole_answers.clone(),
        );
        registry.register(
            "trace_dropped",
            "Trace lines dropped (writer behind or failing)",
            m.trace_dropped.clone(),
        );
        registry.register(
            "response_journal_errors",
            "Stored responses the Responses store's journal failed to write (kept in memory only)",
            m.response_journal_errors.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads, by outcome (applied, or refused as invalid)",
            m.config_reloads.clone(),
        );
        registry.register(
            "cache_pins",
            "Requests with cache_control, by outcome (sent to the engine, or unsupported by it)",
            m.cache_pins.clone(),
        );
        registry.register(
            "speculative_prefills",
            "Next-turn prefixes sent ahead (nvext.agent_hints.speculative_prefill), by outcome",
            m.speculative_prefills.clone(),
        );
        registry.register(
            "reused_prompt_tokens",
            "Prompt tokens taken from the session tokenization cache",
            m.reused_prompt_tokens.clone(),
        );
        registry.register(
            "session_tokenizations",
            "Chat prompts tokenized through the session cache, by outcome and harness",
            m.session_tokenizations.clone(),
        );
        registry.register(
            "dropped_tools",
            "Hosted tools (web search, code interpreter, ...) left out of prompts: no engine runs them",
            m.dropped_tools.clone(),
        );
        registry.register(
            "cluster_messages",
            "Booking messages shared with other replicas over NATS, by direction (sent, received, dropped)",
            m.cluster_messages.clone(),
        );
        registry.register(
            "cluster_connected",
            "1 while the NATS connection of [cluster] is up",
            m.cluster_connected.clone(),
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

    /// Count what became of a request's `cache_control`.
    pub(crate) fn pin(&self, pin: crate::proxy::Pin) {
        let outcome = match pin {
            crate::proxy::Pin::None => return,
            crate::proxy::Pin::Sent => "sent",
            crate::proxy::Pin::Unsupported => "unsupported",
        };
        self.cache_pins
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Count a speculative prefill.
    pub(crate) fn speculative_prefill(&self, outcome: &'static str) {
        self.speculative_prefills
            .get_or_create(&OutcomeLabels { outcome })
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
