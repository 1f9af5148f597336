//! Gateway configuration: the TOML file a user writes (`RawConfig`) and the validated `Config`.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_core::admission::{
    AdmissionConfig, AdmissionPolicy, NATIVE_ADMISSION, ThunderAgent, ThunderAgentConfig,
    native_admission,
};
use switchyard_core::programs::ProgramConfig;
pub use switchyard_core::router::EngineStream;
use switchyard_core::router::queue::{QueueConfig, QueueOrder};
use switchyard_core::router::{CostWeights, RouterConfig};

/// The file as written (`switchyard.toml`); every field but `workers` (or `discovery`) has a
/// default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Listener and request limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// The model every worker serves.
    #[serde(default)]
    pub model: ModelConfig,
    /// Routing settings.
    #[serde(default)]
    pub router: RawRouterConfig,
    /// Client API state: the Responses API's store and per-session tokenization.
    #[serde(default)]
    pub frontend: FrontendConfig,
    /// Session-aware admission (programs, pauses, holds).
    #[serde(default)]
    pub admission: AdmissionSettings,
    /// The router queue: when requests wait for a worker with room.
    #[serde(default)]
    pub queue: QueueSettings,
    /// Engines behind the gateway; none (and no `discovery`) means the embedded default
    /// (in-process mock engines).
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// Engines found at run time (Kubernetes EndpointSlices), beside `workers`; absent: none.
    pub discovery: Option<crate::discovery::DiscoveryConfig>,
    /// The request trace; absent: nothing is traced.
    pub trace: Option<TraceConfig>,
    /// Wasm policies (routing, admission, KV hints); absent: `router.policy` (native) routes,
    /// admission admits all, no KV hints.
    pub policies: Option<crate::policies::PoliciesConfig>,
    /// Soft state shared with the other gateway replicas over NATS; absent: none.
    pub cluster: Option<ClusterConfig>,
    /// A shared KV pool (G4) the workers read from; absent: none.
    pub kv_pool: Option<KvPoolConfig>,
    /// How KV hints are produced and delivered (the policy is `[policies] kv_hints`).
    #[serde(default)]
    pub kv_hints: KvHintsConfig,
}

/// The KV-hint path (`[kv_hints]`): lifecycle events from live traffic go to the
/// `[policies] kv_hints` policy; its hints reach the workers whose `kv_hints` says how.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvHintsConfig {
    /// How often the policy is asked again, with no new events, while a session waits on a
    /// tool (so it can act at a predicted time). Default: 100 ms.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// A harness's prefetch hook (`POST /v1/agent/prefetch`) brings a session's blocks back
    /// this long before the request it announces, to cover the transfer. Default: 300 ms.
    #[serde(with = "humantime_serde")]
    pub prefetch_lead: Duration,
    /// Sessions the session-prefix index tracks (least recently seen dropped first).
    /// Default: 16,384.
    pub sessions: usize,
    /// Longest to wait for a worker's answer to an envelope. Default: 2 s.
    #[serde(with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// Longest to wait for a llama.cpp slot save, restore or erase (`llama-slots` workers): a
    /// save or restore moves the slot's whole KV through a file, tens of MB for a few thousand
    /// tokens, which a busy machine takes seconds to write. Default: 30 s.
    #[serde(with = "humantime_serde")]
    pub slot_timeout: Duration,
    /// Requests of a session that thinks carry `kv_transfer_params.max_offload_tokens` = their
    /// prompt to workers that take hints: chat templates drop past turns' thinking, so the KV
    /// of an answer (its thinking and everything hashed after it) is never reused, and is not
    /// written to lower tiers (the mock engine also evicts it first). Only for models whose
    /// template drops past thinking (DeepSeek-R1; Qwen3 once a new user turn starts): where the
    /// harness resends it (Anthropic tool loops) it is reused and the cap would cost hits.
    /// Default: false.
    pub ephemeral_thinking: bool,
}

impl Default for KvHintsConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(100),
            prefetch_lead: Duration::from_millis(300),
            sessions: switchyard_core::kv_hints::sessions::DEFAULT_SESSION_CAPACITY,
            delivery_timeout: Duration::from_secs(2),
            slot_timeout: Duration::from_secs(30),
            ephemeral_thinking: false,
        }
    }
}

/// How a worker takes KV hints (`[[workers]] kv_hints`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HintDelivery {
    /// It takes none: its hints are counted as rejected.
    #[default]
    None,
    /// `POST /v1/kv_hints` with the envelope as soon as the hint is made; the worker answers
    /// each action's outcome (the mock engine).
    Endpoint,
    /// The envelope rides on the next request routed to the worker, as its `kv_hints` field
    /// (the request field vLLM merged); the outcome is unknown, counted as deferred.
    Request,
    /// llama.cpp's `llama-server` started with `--slot-save-path` (one directory shared by the
    /// servers of a host): sessions are pinned to slots (`id_slot`), a demote saves the
    /// session's slot to a file and frees the slot, a prefetch (or a request reaching a server
    /// whose slots lack the session) restores the file first. Needs `kind = "openai"`.
    #[serde(rename = "llama-slots")]
    LlamaSlots,
}

/// A shared KV pool the workers write through to and fetch from (`switchyard kv-pool`, or
/// Mooncake Store's master): the gateway indexes it from its event stream, and credits a worker
/// for the pool's run beyond the worker's own prefix (`router.weights.shared_credit`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPoolConfig {
    /// ZMQ endpoint of the pool's event PUB (Mooncake format), e.g. `tcp://127.0.0.1:5600`.
    pub kv_events: String,
    /// ZMQ endpoint of its replay socket; without it, lost messages clear the pool's entries.
    pub replay: Option<String>,
}

/// In-flight load shared between gateway replicas over NATS Core (`[cluster]`): each replica
/// publishes its bookings and adds the others' to its view of every worker. Soft state: a lost
/// server or message only loses that signal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The NATS server(s), e.g. `nats://127.0.0.1:4222` (comma-separated for several).
    pub nats_url: String,
    /// Replicas sharing load: the subject is `switchyard.<name>.bookings`. Default: `default`.
    #[serde(default = "default_cluster_name")]
    pub name: String,
    /// This replica's id (its own messages are ignored). Default: random at each start.
    pub replica_id: Option<String>,
    /// A peer's booking is forgotten this long after it was announced if no `finished` came.
    /// Default: 30 s.
    #[serde(default = "default_cluster_booking_ttl", with = "humantime_serde")]
    pub booking_ttl: Duration,
    /// Booking changes waiting to be published; more are dropped (and counted), never waited
    /// for. Default: 8,192.
    #[serde(default = "default_cluster_buffer")]
    pub buffer: usize,
}

fn default_cluster_name() -> String {
    "default".into()
}
fn default_cluster_booking_ttl() -> Duration {
    Duration::from_secs(30)
}
fn default_cluster_buffer() -> usize {
    8192
}

impl ClusterConfig {
    /// The subject booking changes go to.
    pub fn subject(&self) -> String {
        format!("switchyard.{}.bookings", self.name)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: &str| Err(ConfigError::Invalid(format!("cluster.{msg}")));
        if self.nats_url.trim().is_empty() {
            return invalid("nats_url must not be empty");
        }
        let token = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !token(&self.name) {
            return invalid("name must be letters, digits, '-' or '_'");
        }
        if self.replica_id.as_deref().is_some_and(|id| id.is_empty()) {
            return invalid("replica_id must not be empty");
        }
        if self.booking_ttl.is_zero() || self.buffer == 0 {
            return invalid("booking_ttl and buffer must be positive");
        }
        Ok(())
    }
}

/// Listener and request limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default: 127.0.0.1.
    pub host: String,
    /// Port to listen on. Default: 8000.
    pub port: u16,
    /// Largest request body accepted; agent prompts are large. Default: 32 MiB.
    pub max_body_bytes: usize,
    /// Longest an upstream request may take in total. Default: 10 minutes.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest gap between two pieces of an engine's answer once its response has begun; beyond
    /// it the answer ends with an error (an error event in a stream) and its load is released,
    /// so an engine that stalls mid-answer cannot hold a client forever. Default: 5 minutes
    /// (Envoy's `stream_idle_timeout`).
    #[serde(with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// Longest to wait for an engine to accept a connection. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How often each worker's `/health` is probed. Default: 2 s.
    #[serde(with = "humantime_serde")]
    pub health_interval: Duration,
    /// Requests (streams included) the gateway holds at once; beyond it, a 503 with
    /// `Retry-After` in the client API's shape. Bounds memory and file descriptors under a
    /// flood. Default: 10,000.
    pub max_concurrent_requests: usize,
    /// On shutdown (SIGTERM, Ctrl-C), how long requests in flight may take to finish after the
    /// listener closes; streams still running then end with an error event in their API's shape.
    /// Default: 30 s (Kubernetes' default grace).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Keys a client must present on the client APIs (`Authorization: Bearer <key>`, or
    /// Anthropic's `x-api-key: <key>`); a request without one of them gets a 401 in its API's
    /// shape. Empty (the default): the APIs are open. A reload applies a new list at once.
    pub api_keys: Vec<ApiKeyConfig>,
    /// TLS on the client listener (`[server.tls]`: `cert_file`, `key_file`, read again when
    /// either changes on disk, and `client_ca_file` for mTLS); absent: plain HTTP.
    pub tls: Option<switchyard_tls::ServerTls>,
    /// A PEM file of CA certificates trusted for `https://` engines and pools, beside the
    /// system's roots (engines with certificates of a private CA). Default: the system's only.
    pub upstream_ca_file: Option<PathBuf>,
    /// The gateway's own certificate and key (PEM), presented to `https://` engines and pools
    /// that ask for a client certificate (mutual TLS): `[server.upstream_identity]` with
    /// `cert_file` and `key_file`. Default: none.
    pub upstream_identity: Option<switchyard_tls::ClientIdentity>,
    /// Most idle keep-alive connections kept open to one engine, in each of the gateway's two
    /// pools (answers from plain `http://` engines; probes, hints and `https://` engines);
    /// beyond it a connection that finishes its answer is closed. After a burst of N
    /// concurrent requests the idle pool otherwise holds N connections (and file descriptors)
    /// per engine for 90 s. Default: 1,024 (Envoy's default `max_connections` per cluster).
    pub upstream_max_idle_per_engine: usize,
    /// When engines are asked to stream an answer the client did not ask to stream. Default:
    /// `auto`.
    pub engine_stream: EngineStream,
}

/// One `[[server.api_keys]]` entry: where a client API key comes from.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key itself.
    pub key: Option<String>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// A file holding the key (trailing whitespace and newline trimmed), e.g. a mounted
    /// Kubernetes Secret.
    pub key_file: Option<PathBuf>,
    /// Most requests (streams included) this key may have in flight; beyond it a 429 with
    /// `Retry-After`, so one runaway agent cannot take the whole gateway. Default: no limit
    /// but the gateway's own.
    pub max_in_flight: Option<usize>,
    /// Most tokens (prompt and completion) this key may use per minute; beyond it a 429 with
    /// `Retry-After` until the minute's refill pays for what it overdrew. Default: no limit.
    pub tokens_per_minute: Option<u64>,
}

impl std::fmt::Debug for ApiKeyConfig {
    /// Never the key itself: configurations are logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("key_env", &self.key_env)
            .field("key_file", &self.key_file)
            .field("max_in_flight", &self.max_in_flight)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .finish()
    }
}

impl ApiKeyConfig {
    fn source(&self) -> crate::secrets::Source<'_> {
        crate::secrets::Source {
            names: ["key", "key_env", "key_file"],
            inline: self.key.as_deref(),
            env: self.key_env.as_deref(),
            file: self.key_file.as_ref(),
        }
    }

    /// The key, read from wherever it is (`field` names the entry in errors).
    pub(crate) fn resolve(&self, field: &str) -> Result<String, ConfigError> {
        self.source().resolve(field)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            max_body_bytes: 32 << 20,
            request_timeout: Duration::from_secs(600),
            stream_idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(30),
            max_concurrent_requests: 10_000,
            api_keys: Vec::new(),
            tls: None,
            upstream_ca_file: None,
            upstream_identity: None,
            engine_stream: EngineStream::Auto,
            upstream_max_idle_per_engine: 1024,
        }
    }
}

/// The model every worker serves.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Name clients put in `model`. Default: the tokenizer directory's name.
    pub name: Option<String>,
    /// Directory with `tokenizer.json` and `tokenizer_config.json`. Default: the embedded
    /// SmolLM2-135M-Instruct tokenizer.
    pub path: Option<PathBuf>,
    /// How the model writes tool calls (a parser name: `hermes`, `qwen3_coder`, `llama3_json`,
    /// ...), for workers in `tokens` mode, where the gateway parses the model's text itself.
    /// Default: `hermes`.
    pub tool_parser: Option<String>,
    /// How the model writes its reasoning (`qwen3`, `deepseek_r1`, `gpt_oss`, ...), for workers
    /// in `tokens` mode. Default: none (thinking stays in the text).
    pub reasoning_parser: Option<String>,
    /// Other names clients may ask for, as globs (`*` any run, `?` one character): harnesses
    /// that insist on their own model names (`claude-*`, `gpt-5*`) reach this model. Replies
    /// name the served model.
    pub aliases: Vec<String>,
    /// The model's context window in tokens. A request without an output limit may generate up to
    /// the rest of it, as on vLLM; a longer prompt is refused. Default: the tokenizer's
    /// `model_max_length`, else 32,768.
    pub context_length: Option<u32>,
}

impl ModelConfig {
    /// The tool-call parser of `tokens` mode.
    pub fn tool_parser(&self) -> &str {
        self.tool_parser.as_deref().unwrap_or("hermes")
    }

    /// The aliases as one matcher; a bad glob is a configuration error.
    pub fn alias_matcher(&self) -> Result<globset::GlobSet, ConfigError> {
        let mut set = globset::GlobSetBuilder::new();
        for alias in &self.aliases {
            let glob = globset::GlobBuilder::new(alias)
                .literal_separator(false)
                .build()
                .map_err(|e| ConfigError::Invalid(format!("model.aliases: {e}")))?;
            set.add(glob);
        }
        set.build()
            .map_err(|e| ConfigError::Invalid(format!("model.aliases: {e}")))
    }
}

/// The router queue (`[queue]`): requests wait in the gateway only while every worker they may go
/// to is over a threshold. No threshold (the default): nothing ever waits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSettings {
    /// Order of waiting requests: `fcfs` (priority is a head start), `lcfs`, `wspt` (weighted
    /// shortest uncached prefill first). The active routing policy's `queue-key` overrides it.
    /// Default: `fcfs`.
    pub order: String,
    /// A worker is saturated with more uncached prompt tokens than this in prefill (e.g. a few
    /// times the engine's max batched tokens; too low a value starves the engines).
    pub max_prefill_tokens: Option<u64>,
    /// A worker is saturated with this many requests in flight.
    pub max_requests: Option<u32>,
    /// Most requests waiting; more are refused with 429. Default: 1,024.
    pub capacity: usize,
    /// `Retry-After` of the 429 sent to `x-switchyard-do-not-queue` callers. Default: 1 s.
    #[serde(with = "humantime_serde")]
    pub retry_after: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        let core = QueueConfig::default();
        Self {
            order: core.order.name().into(),
            max_prefill_tokens: core.max_prefill_tokens,
            max_requests: core.max_requests,
            capacity: core.capacity,
            retry_after: core.retry_after,
        }
    }
}

impl QueueSettings {
    /// The core queue's settings.
    pub fn core(&self) -> Result<QueueConfig, ConfigError> {
        let order = QueueOrder::ALL
            .into_iter()
            .find(|o| o.name() == self.order)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "queue.order: unknown order {:?} (known: fcfs, lcfs, wspt)",
                    self.order
                ))
            })?;
        Ok(QueueConfig {
            order,
            max_prefill_tokens: self.max_prefill_tokens,
            max_requests: self.max_requests,
            capacity: self.capacity,
            retry_after: self.retry_after,
            ..QueueConfig::default()
        })
    }
}

/// Session-aware admission (`[admission]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSettings {
    /// The admission policy: `none` (request-level, the default), `thunder-agent`, `continuum`,
    /// `autellix`.
    pub policy: String,
    /// How often the policy reviews programs and held requests are offered again. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub tick_interval: Duration,
    /// Longest a request is held; then it is released and its program resumed. Default: 30 min.
    #[serde(with = "humantime_serde")]
    pub max_hold: Duration,
    /// A program idle this long is forgotten. Default: 10 min.
    #[serde(with = "humantime_serde")]
    pub program_idle: Duration,
    /// ThunderAgent: pause programs when a worker's utilization reaches this. Default: 0.95.
    pub pause_threshold: f64,
    /// ThunderAgent: pause until utilization is down to this. Default: 0.80.
    pub pause_target: f64,
    /// ThunderAgent: resume only at `pause_threshold - resume_hysteresis` or below. Default: 0.10.
    pub resume_hysteresis: f64,
    /// ThunderAgent: weight of a program's tokens while its tool runs. Default: 1.0.
    pub acting_weight: f64,
    /// ThunderAgent: half-life of a tool-calling program's tokens on the resume side. Default:
    /// 1 s (the reference); an hour stops the re-pausing that section (g) of
    /// docs/benchmarks.md measured past 32 sessions.
    #[serde(with = "humantime_serde")]
    pub decay_half_life: Duration,
    /// ThunderAgent: a paused program waits this long for its own worker, where its KV is,
    /// before it may resume elsewhere. Default: 0 (at once, the reference).
    #[serde(with = "humantime_serde")]
    pub migrate_after: Duration,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        let core = AdmissionConfig::default();
        let thunder = ThunderAgentConfig::default();
        Self {
            policy: "none".into(),
            tick_interval: core.tick_interval,
            max_hold: core.max_hold,
            program_idle: core.programs.idle_expiry,
            pause_threshold: thunder.pause_threshold,
            pause_target: thunder.pause_target,
            resume_hysteresis: thunder.resume_hysteresis,
            acting_weight: thunder.acting_weight,
            decay_half_life: thunder.decay_half_life,
            migrate_after: thunder.migrate_after,
        }
    }
}

impl AdmissionSettings {
    /// The controller's settings.
    pub fn controller(&self) -> AdmissionConfig {
        AdmissionConfig {
            tick_interval: self.tick_interval,
            max_hold: self.max_hold,
            programs: ProgramConfig {
                idle_expiry: self.program_idle,
            },
        }
    }

    /// The native policy these settings name, with their parameters.
    pub fn native_policy(&self) -> Result<Box<dyn AdmissionPolicy>, ConfigError> {
        if self.policy == "thunder-agent" {
            return Ok(Box::new(ThunderAgent::new(ThunderAgentConfig {
                tick_interval: self.tick_interval,
                pause_threshold: self.pause_threshold,
                pause_target: self.pause_target,
                resume_hysteresis: self.resume_hysteresis,
                acting_weight: self.acting_weight,
                decay_half_life: self.decay_half_life,
                migrate_after: self.migrate_after,
                ..ThunderAgentConfig::default()
            })));
        }
        native_admission(&self.policy).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "admission.policy: unknown policy {:?} (known: {})",
                self.policy,
                NATIVE_ADMISSION.join(", ")
            ))
        })
    }
}

/// Client API state (`[frontend]`), all of it bounded.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrontendConfig {
    /// Responses API answers kept for `previous_response_id`. Default: 10,000.
    pub response_store_entries: usize,
    /// Most bytes of conversation text the Responses store keeps. Default: 256 MiB.
    pub response_store_bytes: u64,
    /// A directory where the Responses store journals what it keeps, so that
    /// `previous_response_id` survives a restart or a crash (read back at start; about twice
    /// `response_store_bytes` on disk at most). Default: none (memory only).
    pub response_store_dir: Option<PathBuf>,
    /// Sessions whose last prompt is kept for incremental tokenization; 0 turns it off.
    /// Default: 1,024.
    pub session_cache_sessions: usize,
    /// Most memory those prompts take. Default: 512 MiB.
    pub session_cache_bytes: u64,
    /// A session idle this long loses its cached prompt. Default: 10 min.
    #[serde(with = "humantime_serde")]
    pub session_idle: Duration,
    /// Prompts kept per session, so that a harness's side requests (titles, summaries) do not
    /// push out the conversation. Default: 4.
    pub session_prompts: usize,
    /// System-prompt lines that change between sessions without changing the model's task, by
    /// prefix: such a line is removed before rendering, so sessions share their system prompt's
    /// KV cache. Default: Claude Code's `x-anthropic-billing-header:` line; `[]` keeps every line.
    pub volatile_system_lines: Vec<String>,
}

impl Default for FrontendConfig {
    fn default() -> Self {
        let sessions = switchyard_tokenizer::SessionCacheConfig::default();
        Self {
            response_store_entries: 10_000,
            response_store_bytes: 256 << 20,
            response_store_dir: None,
            session_cache_sessions: sessions.max_sessions,
            session_cache_bytes: sessions.max_bytes,
            session_idle: sessions.idle_ttl,
            session_prompts: sessions.prompts_per_session,
            volatile_system_lines: vec!["x-anthropic-billing-header:".into()],
        }
    }
}

impl FrontendConfig {
    /// The tokenizer's session cache settings.
    pub fn session_cache(&self) -> switchyard_tokenizer::SessionCacheConfig {
        switchyard_tokenizer::SessionCacheConfig {
            max_sessions: self.session_cache_sessions,
            max_bytes: self.session_cache_bytes,
            idle_ttl: self.session_idle,
            prompts_per_session: self.session_prompts,
        }
    }
}

/// Routing settings as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRouterConfig {
    /// Routing policy: `kv-cost` (default) or `round-robin`.
    pub policy: String,
    /// Sampling temperature over costs; 0 picks the cheapest. Default: 0.
    pub temperature: f64,
    /// Cost weights (device/host/disk credit, prefill load scale).
    pub weights: CostWeights,
    /// How long a decision's predicted blocks stand in for engine events. Default: 2 s.
    #[serde(with = "humantime_serde")]
    pub booking_ttl: Duration,
    /// How long blocks are assumed cached on workers without KV events. Default: 120 s.
    #[serde(with = "humantime_serde")]
    pub approx_ttl: Duration,
    /// Most predicted blocks per rank in approximate mode. Default: 1,048,576.
    pub approx_max_blocks: usize,
    /// Attempts per request when engines fail before the first byte. Default: 3.
    pub max_attempts: u32,
}

impl Default for RawRouterConfig {
    fn default() -> Self {
        let core = RouterConfig::default();
        Self {
            policy: "kv-cost".into(),
            temperature: core.temperature,
            weights: core.weights,
            booking_ttl: core.booking_ttl,
            approx_ttl: core.approx_ttl,
            approx_max_blocks: core.approx_max_blocks,
            max_attempts: 3,
        }
    }
}

/// Which engine a worker runs; decides wire details such as data-parallel addressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM.
    Trtllm,
    /// Switchyard's mock engine.
    Mock,
    /// Any other OpenAI-compatible server (llama.cpp's `llama-server`, ...).
    Openai,
}

/// One engine server: a `[[workers]]` table, or the JSON body of `POST /admin/workers`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// HTTP base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Engine kind. Default: vllm.
    #[serde(default = "default_kind")]
    pub kind: EngineKind,
    /// ZMQ endpoint of the engine's KV-event publisher (rank 0; rank r uses port + r). Absent:
    /// the worker is routed in approximate mode.
    pub kv_events: Option<String>,
    /// ZMQ endpoint of the engine's replay socket (rank 0; rank r uses port + r).
    pub replay: Option<String>,
    /// Data-parallel ranks. Default: 1.
    #[serde(default = "one")]
    pub dp_size: u32,
    /// KV cache capacity of each rank in tokens (GPU blocks x block size), for admission's
    /// utilization; absent: unknown (utilization-based admission cannot pause on this worker).
    pub kv_capacity_tokens: Option<u64>,
    /// KV block size in tokens. Default: 16.
    #[serde(default = "sixteen")]
    pub block_size: u32,
    /// What the gateway sends the engine. Default: `chat`.
    #[serde(default)]
    pub upstream: UpstreamMode,
    /// How it takes KV hints. Default: `none`.
    #[serde(default)]
    pub kv_hints: HintDelivery,
}

/// What the gateway sends a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamMode {
    /// Chat completions: the engine applies its chat template and its tool and reasoning
    /// parsers. Works with any OpenAI-compatible engine.
    #[default]
    Chat,
    /// Token ids to `/v1/completions`: the gateway renders the chat template, tokenizes, and
    /// parses tool calls and reasoning itself, so the prompt the engine caches is exactly the one
    /// the router hashed.
    Tokens,
}

/// The request trace sink (`[trace]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// A directory (existing, or written with a trailing `/`) that gets `trace-<ms>-<n>.jsonl.gz`
    /// segments, or a file prefix that gets `<prefix>-<ms>-<n>.jsonl.gz`.
    pub path: PathBuf,
    /// A segment is closed and the next one started once it holds this many bytes on disk.
    /// Default: 64 MiB.
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    /// Compress segments. Default: true.
    #[serde(default = "yes")]
    pub gzip: bool,
    /// Also record request bodies and completion text. Default: false.
    #[serde(default)]
    pub include_content: bool,
    /// Records waiting for the writer; more are dropped (and counted), never waited for.
    /// Default: 10,000.
    #[serde(default = "default_trace_buffer")]
    pub buffer: usize,
}

fn default_segment_bytes() -> u64 {
    64 << 20
}
fn default_trace_buffer() -> usize {
    10_000
}
fn yes() -> bool {
    true
}
pub(crate) fn default_kind() -> EngineKind {
    EngineKind::Vllm
}
pub(crate) fn one() -> u32 {
    1
}
pub(crate) fn sixteen() -> u32 {
    16
}

// === impl WorkerConfig ===

impl WorkerConfig {
    /// Most data-parallel ranks one worker may have.
    pub const MAX_DP_SIZE: u32 = 1024;

    /// Check this entry as every source of workers must (the file, the admin API, discovery):
    /// `field` names it in errors (`workers[2]`), `block_size` is the one the index uses.
    pub fn validate(&self, field: &str, block_size: u32) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return invalid(format!(
                "{field}.url must be an http(s) URL, got {:?}",
                self.url
            ));
        }
        if self.block_size == 0 || self.dp_size == 0 {
            return invalid(format!("{field}: block_size and dp_size must be positive"));
        }
        // Each rank is a router candidate, an index owner and a subscription: a typo's billions
        // would hang the start filling memory.
        if self.dp_size > Self::MAX_DP_SIZE {
            return invalid(format!(
                "{field}.dp_size is {}, over {} ranks",
                self.dp_size,
                Self::MAX_DP_SIZE
            ));
        }
        // Our hashes are per block size: one index needs one block size.
        if self.block_size != block_size {
            return invalid(format!(
                "{field}.block_size is {} but the index uses {block_size}: all workers of a model share one block size",
                self.block_size
            ));
        }
        if self.replay.is_some() && self.kv_events.is_none() {
            return invalid(format!("{field}: replay without kv_events"));
        }
        if self.kv_hints == HintDelivery::LlamaSlots {
            if self.kind != EngineKind::Openai {
                return invalid(format!(
                    "{field}.kv_hints = \"llama-slots\" is for llama.cpp's llama-server: it needs kind = \"openai\", not {}",
                    serde_json::to_string(&self.kind).unwrap_or_default()
                ));
            }
            if self.dp_size != 1 {
                return invalid(format!(
                    "{field}.kv_hints = \"llama-slots\" needs dp_size = 1 (llama-server has one rank)"
                ));
            }
        }
        // Every rank's endpoint must exist (rank r listens on port + r).
        for (name, endpoint) in [("kv_events", &self.kv_events), ("replay", &self.replay)] {
            if let Some(endpoint) = endpoint
                && let Err(ConfigError::Invalid(why)) = rank_endpoint(endpoint, self.dp_size - 1)
            {
                return invalid(format!("{field}.{name}: {why}"));
            }
        }
        Ok(())
    }
}

/// A configuration the gateway can run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listener address.
    pub listen: SocketAddr,
    /// Listener and request limits.
    pub server: ServerConfig,
    /// Model settings.
    pub model: ModelConfig,
    /// Router core settings.
    pub router: RouterConfig,
    /// Client API state.
    pub frontend: FrontendConfig,
    /// Session-aware admission.
    pub admission: AdmissionSettings,
    /// The router queue.
    pub queue: QueueSettings,
    /// Routing policy name.
    pub policy: String,
    /// Attempts per request.
    pub max_attempts: u32,
    /// Engines of the file (empty only with discovery).
    pub workers: Vec<WorkerConfig>,
    /// Engines found at run time, if configured.
    pub discovery: Option<crate::discovery::DiscoveryConfig>,
    /// The request trace, if on.
    pub trace: Option<TraceConfig>,
    /// Wasm policies (routing, admission, KV hints), if configured.
    pub policies: Option<crate::policies::PoliciesConfig>,
    /// Load shared with other replicas over NATS, if configured.
    pub cluster: Option<ClusterConfig>,
    /// The shared KV pool whose events the gateway indexes, if configured.
    pub kv_pool: Option<KvPoolConfig>,
    /// The KV-hint path.
    pub kv_hints: KvHintsConfig,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: toml::de::Error,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

// === impl RawConfig ===

impl RawConfig {
    /// Read and parse a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Self, ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let kubernetes = raw.discovery.as_ref().and_then(|d| d.kubernetes.as_ref());
        if let Some(kubernetes) = kubernetes {
            kubernetes.validate()?;
        }
        // The index's block size: the first worker's, else discovery's template's.
        let block_size = match (raw.workers.first(), kubernetes) {
            (Some(first), _) => first.block_size,
            (None, Some(kubernetes)) => kubernetes.worker.block_size,
            (None, None) => return invalid("no workers".into()),
        };
        for (i, w) in raw.workers.iter().enumerate() {
            w.validate(&format!("workers[{i}]"), block_size)?;
        }
        if let Some(kubernetes) = kubernetes
            && kubernetes.worker.block_size != block_size
        {
            return invalid(format!(
                "discovery.kubernetes.worker.block_size is {} but workers[0] uses {block_size}: all workers of a model share one block size",
                kubernetes.worker.block_size
            ));
        }
        if switchyard_core::router::native_policy(&raw.router.policy).is_none() {
            return invalid(format!(
                "unknown router.policy {:?} (known: kv-cost, round-robin)",
                raw.router.policy
            ));
        }
        if !(raw.router.temperature >= 0.0 && raw.router.temperature.is_finite()) {
            return invalid("router.temperature must be >= 0".into());
        }
        if raw.server.max_body_bytes == 0 || raw.server.max_concurrent_requests == 0 {
            return invalid(
                "server.max_body_bytes and server.max_concurrent_requests must be positive".into(),
            );
        }
        if let Some(trace) = &raw.trace
            && (trace.segment_bytes == 0 || trace.buffer == 0)
        {
            return invalid("trace.segment_bytes and trace.buffer must be positive".into());
        }
        if let Some(policies) = &raw.policies {
            policies.validate()?;
        }
        if let Some(cluster) = &raw.cluster {
            cluster.validate()?;
        }
        for (i, key) in raw.server.api_keys.iter().enumerate() {
            key.source().validate(&format!("server.api_keys[{i}]"))?;
        }
        if let Some(pool) = &raw.kv_pool {
            let zmq = |e: &str| e.starts_with("tcp://") || e.starts_with("ipc://");
            if !zmq(&pool.kv_events) || pool.replay.as_deref().is_some_and(|r| !zmq(r)) {
                return invalid(
                    "kv_pool.kv_events and kv_pool.replay must be ZMQ endpoints (tcp://host:port)"
                        .into(),
                );
            }
        }
        if raw.kv_hints.tick.is_zero() || raw.kv_hints.sessions == 0 {
            return invalid("kv_hints.tick and kv_hints.sessions must be positive".into());
        }
        raw.admission.native_policy()?;
        raw.model.alias_matcher()?;
        if raw.model.context_length == Some(0) {
            return invalid("model.context_length must be positive".into());
        }
        raw.queue.core()?;
        // Unknown parser names fail here, not on the first request.
        switchyard_parsers::OutputParser::new(
            raw.model.reasoning_parser.as_deref(),
            raw.model.tool_parser.as_deref(),
            "",
        )
        .map_err(|e| ConfigError::Invalid(format!("model: {e}")))?;
        let listen = format!("{}:{}", raw.server.host, raw.server.port)
            .parse()
            .or_else(|_| format!("[{}]:{}", raw.server.host, raw.server.port).parse())
            .map_err(|_| ConfigError::Invalid(format!("bad server.host {:?}", raw.server.host)))?;
        Ok(Config {
            listen,
            router: RouterConfig {
                block_size,
                weights: raw.router.weights,
                temperature: raw.router.temperature,
                booking_ttl: raw.router.booking_ttl,
                approx_ttl: raw.router.approx_ttl,
                approx_max_blocks: raw.router.approx_max_blocks,
                engine_stream: raw.server.engine_stream,
                ..RouterConfig::default()
            },
            frontend: raw.frontend,
            admission: raw.admission,
            queue: raw.queue,
            policy: raw.router.policy,
            max_attempts: raw.router.max_attempts.max(1),
            server: raw.server,
            model: raw.model,
            workers: raw.workers,
            discovery: raw.discovery,
            trace: raw.trace,
            policies: raw.policies,
            cluster: raw.cluster,
            kv_pool: raw.kv_pool,
            kv_hints: raw.kv_hints,
        })
    }
}

/// Endpoint of data-parallel rank `dp_rank` given rank 0's (`tcp://host:port` -> port + rank).
pub fn rank_endpoint(base: &str, dp_rank: u32) -> Result<String, ConfigError> {
    if dp_rank == 0 {
        return Ok(base.to_string());
    }
    let (head, port) = base
        .rsplit_once(':')
        .ok_or_else(|| ConfigError::Invalid(format!("endpoint {base:?} has no port")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| ConfigError::Invalid(format!("endpoint {base:?} has no numeric port")))?;
    // Checked: a port near the top plus the rank overflowed (a panic in debug builds).
    let port = u16::try_from(dp_rank)
        .ok()
        .and_then(|rank| port.checked_add(rank))
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "endpoint {base:?}: port + rank {dp_rank} is past 65535"
            ))
        })?;
    Ok(format!("{head}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::try_from(
            toml::from_str::<RawConfig>(text).map_err(|e| ConfigError::Invalid(e.to_string()))?,
        )
    }

    /// The annotated example users copy stays valid as the configuration grows.
    #[test]
    fn the_annotated_example_is_valid() {
        let c = parse(include_str!("../../../examples/switchyard.toml")).unwrap();
        assert_eq!(c.workers.len(), 3);
        assert_eq!(c.workers[0].upstream, UpstreamMode::Tokens);
        assert_eq!(c.workers[1].upstream, UpstreamMode::Chat);
        assert_eq!(c.admission.policy, "thunder-agent");
        assert_eq!(c.admission.migrate_after, Duration::from_secs(60));
        assert_eq!(c.queue.max_prefill_tokens, Some(32768));
        assert_eq!(c.model.tool_parser(), "hermes");
    }

    /// ThunderAgent's settings are read, durations in humantime, and make a policy.
    #[test]
    fn thunder_agent_settings_parse() {
        let c = parse(
            "[admission]\npolicy = \"thunder-agent\"\nacting_weight = 0.5\n\
             decay_half_life = \"1h\"\nmigrate_after = \"90s\"\n\
             [[workers]]\nurl = \"http://127.0.0.1:9000\"\n",
        )
        .unwrap();
        assert_eq!(c.admission.acting_weight, 0.5);
        assert_eq!(c.admission.decay_half_life, Duration::from_secs(3600));
        assert_eq!(c.admission.migrate_after, Duration::from_secs(90));
        assert_eq!(c.admission.native_policy().unwrap().name(), "thunder-agent");
        let bad =
            "[admission]\nmigrate_after = \"soon\"\n[[workers]]\nurl = \"http://127.0.0.1:9000\"\n";
        assert!(parse(bad).is_err());
    }

    #[test]
    fn bad_admission_queue_and_parser_names_are_refused() {
        let workers = "[[workers]]\nurl = \"http://127.0.0.1:9000\"\n";
        for (section, field) in [
            ("[admission]\npolicy = \"fifo\"\n", "admission.policy"),
            ("[queue]\norder = \"random\"\n", "queue.order"),
            ("[model]\ntool_parser = \"nope\"\n", "tool-call parser"),
        ] {
            let err = parse(&format!("{section}{workers}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let c = parse("[[workers]]\nurl = \"http://127.0.0.1:9000\"\n").unwrap();
        assert_eq!(c.listen.port(), 8000);
        assert_eq!(c.router.block_size, 16);
        assert_eq!(c.workers[0].kind, EngineKind::Vllm);
        assert_eq!(c.server.max_body_bytes, 32 << 20);
        assert_eq!(c.server.engine_stream, EngineStream::Auto);
    }

    #[test]
    fn full_file() {
        let c = parse(
            r#"
            [server]
            port = 9100
            request_timeout = "30s"
            engine_stream = "as-client"
            [router]
            policy = "round-robin"
            approx_ttl = "5m"
            weights = { host_credit = 0.5 }
            [[workers]]
            url = "http://a:1"
            kind = "sglang"
            kv_events = "tcp://a:5557"
            replay = "tcp://a:5558"
            dp_size = 2
            block_size = 32
            "#,
        )
        .unwrap();
        assert_eq!(c.server.request_timeout, Duration::from_secs(30));
        assert_eq!(c.server.engine_stream, EngineStream::AsClient);
        assert_eq!(c.router.approx_ttl, Duration::from_secs(300));
        assert_eq!(c.router.weights.host_credit, 0.5);
        assert_eq!(c.router.weights.device_credit, 1.0);
        assert_eq!(c.router.block_size, 32);
        assert_eq!(c.policy, "round-robin");
        assert!(c.trace.is_none());
    }

    #[test]
    fn trace_section_defaults() {
        let c = parse("[trace]\npath = \"/tmp/t/\"\n[[workers]]\nurl = \"http://a\"\n").unwrap();
        let t = c.trace.unwrap();
        assert_eq!(t.path, PathBuf::from("/tmp/t/"));
        assert_eq!((t.segment_bytes, t.buffer), (64 << 20, 10_000));
        assert!(t.gzip && !t.include_content);
    }

    #[test]
    fn mistakes_are_named() {
        for (text, needle) in [
            ("", "no workers"),
            ("[[workers]]\nurl = \"a:1\"", "http(s) URL"),
            (
                "[[workers]]\nurl = \"http://a\"\n[[workers]]\nurl = \"http://b\"\nblock_size = 64",
                "share one block size",
            ),
            (
                "[router]\npolicy = \"magic\"\n[[workers]]\nurl = \"http://a\"",
                "unknown router.policy",
            ),
            (
                "[[workers]]\nurl = \"http://a\"\nbogus = 1",
                "unknown field",
            ),
            (
                "[server]\nengine_stream = \"never\"\n[[workers]]\nurl = \"http://a\"",
                "unknown variant `never`, expected one of `auto`, `always`, `as-client`",
            ),
            (
                "[server]\napi_keys = [{ key = \"a\", key_env = \"B\" }]\n[[workers]]\nurl = \"http://a\"",
                "server.api_keys[0]: give exactly one of key, key_env, key_file (found 2)",
            ),
            (
                "[kv_pool]\nkv_events = \"http://pool:5600\"\n[[workers]]\nurl = \"http://a\"",
                "kv_pool.kv_events and kv_pool.replay must be ZMQ endpoints",
            ),
            (
                "[trace]\npath = \"t\"\nbuffer = 0\n[[workers]]\nurl = \"http://a\"",
                "trace.segment_bytes and trace.buffer",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn discovery_alone_is_a_fleet_and_shares_the_block_size() {
        let discovered = "[discovery.kubernetes]\nservice = \"vllm\"\nport = \"http\"\n[discovery.kubernetes.worker]\nblock_size = 32\n";
        let c = parse(discovered).unwrap();
        assert!(c.workers.is_empty());
        assert_eq!(c.router.block_size, 32);
        let err = parse(&format!("{discovered}[[workers]]\nurl = \"http://a\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("discovery.kubernetes.worker.block_size is 32 but workers[0] uses 16"),
            "{err}"
        );
    }

    /// The example's commented `[discovery.kubernetes]` section, uncommented, is valid too.
    #[test]
    fn the_examples_discovery_section_is_valid() {
        let example = include_str!("../../../examples/switchyard.toml");
        let start = example
            .find("# [discovery.kubernetes]")
            .expect("the example documents discovery");
        let section: String = example[start..]
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches('#').trim_start()))
            .collect();
        let c = parse(&section).unwrap();
        let kubernetes = c.discovery.unwrap().kubernetes.unwrap();
        assert_eq!(kubernetes.service, "vllm");
        assert_eq!(kubernetes.kv_events_port, Some(5557));
    }

    #[test]
    fn llama_slots_is_for_llama_server_workers_with_one_rank() {
        let worker = |extra: &str| {
            format!("[[workers]]\nurl = \"http://a\"\nkv_hints = \"llama-slots\"\n{extra}")
        };
        let c = parse(&worker("kind = \"openai\"\n")).unwrap();
        assert_eq!(c.workers[0].kv_hints, HintDelivery::LlamaSlots);
        for (text, needle) in [
            (
                worker(""),
                "workers[0].kv_hints = \"llama-slots\" is for llama.cpp's llama-server: it needs kind = \"openai\", not \"vllm\"",
            ),
            (
                worker("kind = \"openai\"\ndp_size = 2\n"),
                "workers[0].kv_hints = \"llama-slots\" needs dp_size = 1",
            ),
            (
                "[[workers]]\nurl = \"http://a\"\nkv_hints = \"llama_slots\"\n".to_owned(),
                "unknown variant `llama_slots`, expected one of `none`, `endpoint`, `request`, `llama-slots`",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_worker_has_at_most_1024_ranks() {
        let worker = |dp: u32| format!("[[workers]]\nurl = \"http://a\"\ndp_size = {dp}\n");
        assert_eq!(parse(&worker(1024)).unwrap().workers[0].dp_size, 1024);
        let err = parse(&worker(u32::MAX)).unwrap_err().to_string();
        assert!(
            err.contains("workers[0].dp_size is 4294967295, over 1024 ranks"),
            "{err}"
        );
    }

    #[test]
    fn rank_endpoints_add_the_rank_to_the_port() {
        assert_eq!(rank_endpoint("tcp://h:5557", 0).unwrap(), "tcp://h:5557");
        assert_eq!(rank_endpoint("tcp://h:5557", 3).unwrap(), "tcp://h:5560");
        assert!(rank_endpoint("tcp://h", 1).is_err());
    }
}
