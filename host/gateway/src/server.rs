//! Assembling the gateway: shared state, background tasks and the HTTP routes.

use crate::admission::{Admission, AdmissionCollector};
use crate::agent::AgentContext;
use crate::cluster::Cluster;
use crate::config::{Config, ConfigError, WorkerConfig};
use crate::error::GatewayError;
use crate::events::EventMetrics;
use crate::fleet::{Fleet, FleetError, Source};
use crate::index::{IndexReader, index_channel};
use crate::key_tokens::KeyTokens;
use crate::metrics::{Metrics, RequestLabels, worker_label};
use crate::policies::{PolicyMetrics, PolicyRuntime};
use crate::proxy::{count_tokens, handle, read_body};
use crate::queue::{Queue, Routed};
use crate::trace::{TraceSink, parse_tool_events};
use crate::upstream::health_loop;
use arc_swap::ArcSwap;
use axum::Router as HttpRouter;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_core::admission::RankUtilization;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::SHARED_POOL;
use switchyard_core::router::{
    Outcome, RequestId, RouteRequest, Router, RoutingPolicy, native_policy,
};
use switchyard_core::worker::Rank;
use switchyard_frontend::{Api, ResponseStore};
use switchyard_kv_events::ingest::WireFormat;
use switchyard_kv_events::subscriber::{SubscriberConfig, SubscriberStats, run_subscriber};
use switchyard_tokenizer::{ModelTokenizer, SessionCache};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The context window assumed when neither the config nor the tokenizer names one.
const DEFAULT_CONTEXT_LENGTH: u32 = 32_768;

/// The configuration in force and what is derived from it; a reload swaps it whole, and readers
/// never wait for that.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) config: Config,
    /// Other names clients may use for the model (`[model] aliases`).
    pub(crate) model_aliases: globset::GlobSet,
    /// The model's context window, in tokens.
    pub(crate) context_length: u32,
    /// `[[server.api_keys]]`, resolved (empty: the client APIs are open).
    api_keys: Vec<ClientKey>,
}

/// A client API key and, with its limits, its requests in flight and its tokens per minute.
#[derive(Debug)]
struct ClientKey {
    secret: String,
    in_flight: Option<(usize, Arc<tokio::sync::Semaphore>)>,
    tokens: Option<Arc<KeyTokens>>,
}

/// What a client's key lets a request hold: one of the key's places in flight (`max_in_flight`)
/// and its token budget to charge (`tokens_per_minute`).
#[derive(Debug, Default)]
pub(crate) struct KeyPass {
    /// Held, never read: dropping it frees the place.
    _in_flight: Option<OwnedSemaphorePermit>,
    pub(crate) tokens: Option<Arc<KeyTokens>>,
}

impl Live {
    /// What `config` makes; a key that `previous` already had, with the same limits, keeps its
    /// count of requests in flight and its token budget across the reload.
    pub(crate) fn new(
        config: Config,
        tokenizer: &ModelTokenizer,
        previous: Option<&Live>,
    ) -> Result<Live, ConfigError> {
        let mut api_keys = Vec::new();
        for (i, key) in config.server.api_keys.iter().enumerate() {
            let secret = key.resolve(&format!("server.api_keys[{i}]"))?;
            let was = previous
                .into_iter()
                .flat_map(|p| &p.api_keys)
                .find(|k| k.secret == secret);
            let in_flight = was
                .and_then(|k| k.in_flight.clone())
                .filter(|(limit, _)| Some(*limit) == key.max_in_flight)
                .or_else(|| {
                    key.max_in_flight
                        .map(|limit| (limit, Arc::new(tokio::sync::Semaphore::new(limit))))
                });
            let tokens = was
                .and_then(|k| k.tokens.clone())
                .filter(|t| Some(t.per_minute()) == key.tokens_per_minute)
                .or_else(|| {
                    key.tokens_per_minute
                        .map(|limit| Arc::new(KeyTokens::new(limit, Instant::now())))
                });
            api_keys.push(ClientKey {
                secret,
                in_flight,
                tokens,
            });
        }
        Ok(Live {
            api_keys,
            model_aliases: config.model.alias_matcher()?,
            context_length: config
                .model
                .context_length
                .or(tokenizer.model_max_length())
                .unwrap_or(DEFAULT_CONTEXT_LENGTH),
            config,
        })
    }

    /// Whether a client request may use the APIs: no keys are configured, or it carries one of
    /// them as `Authorization: Bearer <key>` (OpenAI's SDKs) or `x-api-key: <key>` (Anthropic's).
    pub(crate) fn admits(&self, headers: &HeaderMap) -> Result<(), GatewayError> {
        self.client_key(headers).map(|_| ())
    }

    /// Like [`Live::admits`], and within the key's limits: one of its places when it has
    /// `max_in_flight` (held while the request, its stream included, lasts), tokens left when
    /// it has `tokens_per_minute`.
    pub(crate) fn key_pass(&self, headers: &HeaderMap) -> Result<KeyPass, GatewayError> {
        let Some(key) = self.client_key(headers)? else {
            return Ok(KeyPass::default());
        };
        if let Some(tokens) = &key.tokens {
            tokens
                .admit(Instant::now())
                .map_err(|retry_after| GatewayError::KeyTokens {
                    limit: tokens.per_minute(),
                    retry_after,
                })?;
        }
        let in_flight = match &key.in_flight {
            Some((limit, places)) => Some(
                places
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| GatewayError::KeyLimit { limit: *limit })?,
            ),
            None => None,
        };
        Ok(KeyPass {
            _in_flight: in_flight,
            tokens: key.tokens.clone(),
        })
    }

    /// The key the request carries: `None` when the APIs are open, a 401 when it is not one of
    /// them. Every key is compared, in constant time.
    fn client_key(&self, headers: &HeaderMap) -> Result<Option<&ClientKey>, GatewayError> {
        if self.api_keys.is_empty() {
            return Ok(None);
        }
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let given = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let found = given.and_then(|given| {
            let keys = self.api_keys.iter().map(|k| k.secret.as_str());
            crate::secrets::matches(keys, given.as_bytes())
                .zip(&self.api_keys)
                .fold(None, |found, (matched, key)| {
                    found.or(matched.then_some(key))
                })
        });
        found.map(Some).ok_or(GatewayError::InvalidApiKey)
    }
}

/// State shared by every request.
#[derive(Debug)]
pub struct Shared {
    live: ArcSwap<Live>,
    pub(crate) tokenizer: ModelTokenizer,
    pub(crate) model_name: String,
    pub(crate) hasher: BlockHasher,
    /// The engines, as they come and go.
    pub(crate) fleet: Arc<Fleet>,
    pub(crate) client: reqwest::Client,
    /// Engine answers from plain `http://` engines (see `upstream::Http1Pool`).
    pub(crate) answers: Arc<crate::upstream::Http1Pool>,
    pub(crate) metrics: Arc<Metrics>,
    /// Where finished requests are recorded, when tracing is on.
    pub(crate) trace: Option<TraceSink>,
    /// Wasm routing policies, when `[policies]` is configured.
    pub(crate) policies: Option<PolicyRuntime>,
    /// Session-aware admission: programs, pauses, held requests.
    pub(crate) admission: Admission,
    /// Requests waiting for a worker with room.
    pub(crate) queue: Queue,
    /// Cancelled when the drain deadline passes: streams still running end with an error event.
    pub(crate) stopping: CancellationToken,
    /// One permit per request the gateway may hold (`[server] max_concurrent_requests`).
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
    /// Each live session's last prompt, so its next turn tokenizes only what it added.
    pub(crate) sessions: SessionCache,
    /// Responses API answers kept for `previous_response_id`.
    responses: Mutex<ResponseStore>,
    /// Sessions' lifecycle and lineage for the KV-hint path.
    pub(crate) hints: crate::hints::Hints,
    /// Prefix of the ids clients see (`chatcmpl-<prefix><n>`): unique across restarts.
    id_prefix: String,
    pub(crate) router: Arc<Mutex<Router>>,
    /// Where this replica's booking changes go for the others, when `[cluster]` is on.
    cluster: Option<Cluster>,
    index: IndexReader,
    /// The router's clock starts here.
    epoch: Instant,
    next_request: AtomicU64,
}

impl Shared {
    /// The configuration in force (a reload may replace it between two calls).
    pub(crate) fn live(&self) -> arc_swap::Guard<Arc<Live>> {
        self.live.load()
    }

    /// Put `live` in force.
    pub(crate) fn replace_live(&self, live: Live) {
        self.live.store(Arc::new(live));
    }

    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// The id clients see for request `id`.
    pub(crate) fn request_id(&self, id: RequestId) -> String {
        format!("{}{:x}", self.id_prefix, id.0)
    }

    /// The Responses API's store (plain data: a panic elsewhere cannot corrupt it).
    pub(crate) fn responses(&self) -> std::sync::MutexGuard<'_, ResponseStore> {
        self.responses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every rank's load and capacity, as admission policies see them.
    pub(crate) fn utilization(&self) -> Vec<RankUtilization> {
        let live = self.live();
        let router = self.router();
        router
            .ranks()
            .map(|(rank, healthy)| {
                let load = router.load(rank);
                let capacity = self
                    .fleet
                    .get(rank.worker)
                    .and_then(|m| m.config.kv_capacity_tokens)
                    .unwrap_or(0);
                let used = load.decode_blocks * u64::from(live.config.router.block_size);
                RankUtilization {
                    rank,
                    kv_usage: if capacity == 0 {
                        0.0
                    } else {
                        (used as f64 / capacity as f64).min(1.0) as f32
                    },
                    active_requests: load.requests,
                    queue_depth: 0,
                    healthy,
                    kv_capacity_tokens: capacity,
                }
            })
            .collect()
    }

    /// The published KV index.
    pub(crate) fn index(&self) -> &IndexReader {
        &self.index
    }

    /// The router's and admission's clock: time since the gateway started.
    pub(crate) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(crate) fn router(&self) -> std::sync::MutexGuard<'_, Router> {
        // The router holds plain data: a panic elsewhere cannot leave it half-updated in a way
        // that matters more than refusing all traffic would.
        self.router.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on the router with the index and the clock (the router's lock held: keep it short).
    pub(crate) fn with_router<T>(
        &self,
        f: impl FnOnce(&mut Router, &switchyard_core::index::KvIndex, Duration) -> T,
    ) -> T {
        let now = self.now();
        let mut router = self.router();
        let result = self.index.read(|index| f(&mut router, index, now));
        self.share_bookings(&mut router);
        result
    }

    /// Hand the router's booking changes to the cluster (never waits); nothing without one.
    fn share_bookings(&self, router: &mut Router) {
        if let Some(cluster) = &self.cluster {
            cluster.publish(router.take_deltas());
        }
    }

    /// Route `request` now, or queue it while every worker it may go to is saturated.
    pub(crate) fn route(
        self: &Arc<Self>,
        id: RequestId,
        request: &RouteRequest<'_>,
        do_not_queue: bool,
    ) -> Result<Routed, GatewayError> {
        if !self.queue.is_enabled() {
            let decision =
                self.with_router(|router, index, now| router.route(id, request, index, now));
            return Ok(Routed::Now(decision?));
        }
        Queue::submit(self, id, request, do_not_queue)
    }

    /// Requests booked on `rank` (the trace's queue depth until engines report queues).
    pub(crate) fn in_flight(&self, rank: Rank) -> u32 {
        self.router().load(rank).requests
    }

    pub(crate) fn first_token(&self, id: RequestId) {
        let now = self.now();
        {
            let mut router = self.router();
            router.first_token(id, now);
            self.share_bookings(&mut router);
        }
        Queue::drain(self);
    }

    /// Ranks stored these device blocks (their KV events): end the prefill loads of the
    /// requests whose prompts end there.
    fn blocks_stored(&self, stored: &[(Rank, SequenceHash)]) {
        let now = self.now();
        {
            let mut router = self.router();
            if !router.blocks_stored(stored.iter().copied(), now) {
                return;
            }
            self.share_bookings(&mut router);
        }
        Queue::drain(self);
    }

    /// Tell the routing policy how a request it placed went.
    pub(crate) fn observe(&self, outcome: &Outcome) {
        self.router().observe(outcome);
    }

    pub(crate) fn finish(&self, id: RequestId) {
        let now = self.now();
        {
            let mut router = self.router();
            router.finish(id, now);
            self.share_bookings(&mut router);
        }
        Queue::drain(self);
    }

    /// Make `workers` the members of `source`, each checked as a `[[workers]]` entry.
    pub(crate) fn reconcile_workers(
        &self,
        source: Source,
        workers: &[WorkerConfig],
    ) -> Result<bool, FleetError> {
        let block_size = self.live().config.router.block_size;
        for (i, worker) in workers.iter().enumerate() {
            worker.validate(&format!("{source} worker {i}"), block_size)?;
        }
        self.fleet
            .reconcile(source, workers, &self.router, &self.metrics)
    }

    /// The worker refused a connection: skip all its ranks until its health check passes.
    pub(crate) fn mark_unreachable(&self, rank: Rank) {
        let Some(member) = self.fleet.get(rank.worker) else {
            return; // it left meanwhile
        };
        let mut router = self.router();
        for r in member.upstream.ranks() {
            router.set_healthy(r, false);
            self.metrics
                .worker_healthy
                .get_or_create(&worker_label(r))
                .set(0);
        }
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct GatewayHandle {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    tasks: TaskTracker,
}

impl GatewayHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL: `https://` with `[server.tls]`, else `http://`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Decides for requests another proxy forwards (endpoint-picker mode).
    pub fn picker(&self) -> crate::proxy::Picker {
        crate::proxy::Picker::new(self.shared.clone())
    }

    /// The model name clients ask for.
    pub fn model_name(&self) -> &str {
        &self.shared.model_name
    }

    /// Put a new configuration in force where it can be without a restart: the file as read
    /// again, or why it could not be read or validated. One that does not validate changes
    /// nothing (see [`crate::reload`]); either way the attempt is counted.
    pub fn reload(
        &self,
        config: Result<Config, ConfigError>,
    ) -> Result<crate::Reloaded, ConfigError> {
        crate::reload::reload(&self.shared, config)
    }

    /// Make `workers` the members of `source` (discovery calls this with what it found): each
    /// is checked as a `[[workers]]` entry, and nothing changes if one is refused (see
    /// `Fleet::reconcile`). Returns whether anything changed.
    pub fn reconcile_workers(
        &self,
        source: Source,
        workers: &[WorkerConfig],
    ) -> Result<bool, FleetError> {
        self.shared.reconcile_workers(source, workers)
    }

    /// The source of the member at `url`, if one is.
    pub fn member_source(&self, url: &str) -> Option<Source> {
        self.shared.fleet.find(url).map(|m| m.source)
    }

    /// Wait until it has shut down: the shutdown token was cancelled, the requests in flight
    /// finished (or the drain deadline passed), and the background work stopped.
    pub async fn wait(&self) {
        self.tasks.wait().await;
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration is inconsistent.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
    /// The trace's first segment could not be created.
    #[error("cannot write the trace at {path}: {source}")]
    Trace {
        /// The configured path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The listener's certificate, key or client CA could not be used.
    #[error("server.tls: {0}")]
    Tls(#[source] switchyard_tls::TlsError),
    /// The upstream CA file or client certificate could not be used.
    #[error("server.upstream_ca_file / upstream_identity: {0}")]
    UpstreamTls(#[source] switchyard_tls::TlsError),
    /// The Responses store's directory could not be used.
    #[error("frontend.response_store_dir {path}: {source}")]
    ResponseStore {
        /// The configured directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The client for engines and pools: `https://` URLs are verified against the system's roots
/// and `upstream_ca_file`'s certificates, and shown `upstream_identity` when they ask for one.
fn upstream_client(config: &crate::config::ServerConfig) -> Result<reqwest::Client, StartError> {
    let builder = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .pool_idle_timeout(crate::upstream::IDLE_TIMEOUT)
        .pool_max_idle_per_host(config.upstream_max_idle_per_engine)
        .tcp_nodelay(true);
    let tls = switchyard_tls::ClientTls {
        ca_file: config.upstream_ca_file.clone(),
        identity: config.upstream_identity.clone(),
    };
    Ok(tls
        .apply(builder)
        .map_err(StartError::UpstreamTls)?
        .build()?)
}

/// The Responses store: in memory, or journaled in `response_store_dir` and read back from it.
fn response_store(config: &crate::config::FrontendConfig) -> Result<ResponseStore, StartError> {
    let (entries, bytes) = (config.response_store_entries, config.response_store_bytes);
    let Some(dir) = &config.response_store_dir else {
        return Ok(ResponseStore::new(entries, bytes));
    };
    let (store, found) =
        ResponseStore::open(dir, entries, bytes).map_err(|source| StartError::ResponseStore {
            path: dir.clone(),
            source,
        })?;
    tracing::info!(
        dir = %dir.display(),
        read = found.responses,
        kept = store.len(),
        segments = found.segments,
        "responses store: read back",
    );
    if found.torn_lines > 0 {
        tracing::warn!(
            dir = %dir.display(),
            lines = found.torn_lines,
            bytes = found.torn_bytes,
            "responses store: skipped a last line cut off when the gateway stopped mid-write",
        );
    }
    if found.unreadable_lines > 0 {
        tracing::warn!(
            dir = %dir.display(),
            lines = found.unreadable_lines,
            "responses store: skipped lines that do not parse",
        );
    }
    Ok(store)
}

/// Start the gateway: index writer, event subscribers, health checks and the HTTP server.
pub async fn start(
    config: Config,
    tokenizer: ModelTokenizer,
    shutdown: CancellationToken,
) -> Result<GatewayHandle, StartError> {
    let tasks = TaskTracker::new();
    let metrics = Arc::new(Metrics::new());
    // `shutdown` starts the drain; the background work (index, events, health checks, trace)
    // stops only once the last request is done, since in-flight requests still use it.
    let background = CancellationToken::new();
    let (ops, index, writer) = index_channel(background.clone());

    let model_name = config
        .model
        .name
        .clone()
        .unwrap_or_else(|| tokenizer.name().to_string());
    let policies = match &config.policies {
        Some(p) => Some(PolicyRuntime::start(p, &config.policy, &model_name)?),
        None => None,
    };
    let policy: Box<dyn RoutingPolicy> = match &policies {
        Some(runtime) => {
            metrics.register_collector(Box::new(PolicyMetrics {
                registry: runtime.registry.clone(),
            }));
            Box::new(runtime.policy())
        }
        None => native_policy(&config.policy).ok_or_else(|| {
            crate::config::ConfigError::Invalid(format!("unknown policy {}", config.policy))
        })?,
    };
    let mut router = Router::new(config.router.clone(), policy);
    let cluster = config.cluster.as_ref().map(|c| {
        router.record_deltas(true);
        Cluster::new(c, metrics.clone())
    });
    let (cluster, cluster_tasks) = cluster.unzip();
    let router = Arc::new(Mutex::new(router));
    let fleet = Arc::new(Fleet::new(ops.clone(), tasks.clone(), background.clone()));
    fleet
        .reconcile(Source::Config, &config.workers, &router, &metrics)
        .map_err(ConfigError::from)?;
    let pool_events = config.kv_pool.as_ref().map(|pool| {
        let stats = Arc::new(SubscriberStats::default());
        let subscriber = SubscriberConfig {
            rank: SHARED_POOL,
            block_size: config.router.block_size,
            endpoint: pool.kv_events.clone(),
            replay_endpoint: pool.replay.clone(),
            bind: false,
            topic: String::new(),
            format: WireFormat::Mooncake,
            engine_names: None,
        };
        tasks.spawn(run_subscriber(
            subscriber,
            ops,
            stats.clone(),
            background.clone(),
        ));
        stats
    });
    metrics.register_collector(Box::new(EventMetrics {
        fleet: fleet.clone(),
        pool: pool_events,
        index: index.clone(),
    }));

    let client = upstream_client(&config.server)?;
    let answers = crate::upstream::Http1Pool::new(
        config.server.connect_timeout,
        config.server.upstream_max_idle_per_engine,
        metrics.upstream_connections.clone(),
    );
    let trace = match &config.trace {
        Some(t) => {
            let (sink, writer) =
                TraceSink::open(t, metrics.trace_dropped.clone()).map_err(|source| {
                    StartError::Trace {
                        path: t.path.clone(),
                        source,
                    }
                })?;
            let stop = background.clone();
            let writer = tokio::task::spawn_blocking(move || writer.run(stop));
            tasks.spawn(async move {
                let _ = writer.await;
            });
            Some(sink)
        }
        None => None,
    };
    let shared = Arc::new(Shared {
        hasher: BlockHasher::new(config.router.block_size as usize),
        fleet,
        queue: Queue::new(config.queue.core()?),
        stopping: CancellationToken::new(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(
            config.server.max_concurrent_requests,
        )),
        admission: Admission::new(
            config.admission.controller(),
            // A Wasm or native policy named in `[policies] admission` (hot-swapped by the
            // registry), else `[admission] policy`.
            crate::policies::admission_policy(policies.as_ref(), config.admission.native_policy()?),
        ),
        sessions: SessionCache::new(config.frontend.session_cache()),
        hints: crate::hints::Hints::new(&config.kv_hints),
        responses: Mutex::new(response_store(&config.frontend)?),
        id_prefix: format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ),
        router,
        cluster,
        metrics,
        trace,
        policies,
        client,
        answers,
        model_name: model_name.clone(),
        live: ArcSwap::from_pointee(Live::new(config, &tokenizer, None)?),
        tokenizer,
        index,
        epoch: Instant::now(),
        next_request: AtomicU64::new(1),
    });

    let writer = writer.spawn({
        let shared = Arc::downgrade(&shared);
        move |stored| {
            if let Some(shared) = shared.upgrade() {
                shared.blocks_stored(stored);
            }
        }
    });
    tasks.spawn(async move {
        let _ = writer.await;
    });
    tasks.spawn(expire_sessions(shared.clone(), background.clone()));
    tasks.spawn(crate::hints::run(shared.clone(), background.clone()));
    if let Some(cluster) = cluster_tasks {
        cluster.spawn(shared.clone(), &tasks, background.clone());
    }
    tasks.spawn(crate::admission::run_ticker(
        shared.clone(),
        background.clone(),
    ));
    shared
        .metrics
        .register_collector(Box::new(AdmissionCollector(Arc::downgrade(&shared))));
    tasks.spawn(health_loop(
        shared.fleet.clone(),
        shared.router.clone(),
        shared.client.clone(),
        shared.metrics.clone(),
        shared.live().config.server.health_interval,
        background.clone(),
    ));

    let addr = shared.live().config.listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    let tls = shared.live().config.server.tls.clone();
    let handle_shared = shared.clone();
    let app = routes(shared.clone());
    match &tls {
        Some(config) => {
            let listener =
                switchyard_tls::TlsListener::new(listener, config).map_err(StartError::Tls)?;
            tasks.spawn(serve(listener, app, shared, shutdown, background))
        }
        // Token-sized SSE writes must not wait for delayed ACKs (Nagle's algorithm).
        None => tasks.spawn(serve(
            listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            app,
            shared,
            shutdown,
            background,
        )),
    };
    tasks.close();
    Ok(GatewayHandle {
        addr,
        tls: tls.is_some(),
        shared: handle_shared,
        tasks,
    })
}

/// Serves `app` on `listener` until shutdown, then drains: stop accepting, close idle
/// connections, let in-flight requests finish for up to `drain_timeout`; then the streams still
/// running end with an error event in their API's shape, and what is left after a moment more
/// is cut. Last, the background work stops.
async fn serve<L>(
    listener: L,
    app: axum::Router,
    draining: Arc<Shared>,
    shutdown: CancellationToken,
    background: CancellationToken,
) where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .into_future();
    tokio::pin!(served);
    let deadline = async {
        shutdown.cancelled().await;
        let drain_timeout = draining.live().config.server.drain_timeout;
        tokio::time::sleep(drain_timeout).await;
        drain_timeout
    };
    let ended = tokio::select! {
        served = &mut served => Some(served),
        drain_timeout = deadline => {
            tracing::warn!(?drain_timeout, "ending the requests still in flight at the drain deadline");
            draining.stopping.cancel();
            tokio::time::timeout(Duration::from_secs(2), &mut served).await.ok()
        }
    };
    if let Some(Err(e)) = ended {
        tracing::error!(error = %e, "http server stopped");
    }
    // The Responses journal's queued lines (a client that left before its end did not wait for
    // its own) reach the disk before the gateway says it stopped; a request still running after
    // the cut stores in memory only.
    let closing = draining.responses().close_journal();
    if let Some(closing) = closing
        && let Err(e) = closing.written().await
    {
        tracing::warn!(error = %e, "responses store: the journal failed as it closed");
    }
    background.cancel();
}

/// Drop idle sessions' cached prompts now and then, so their memory goes back even when no
/// request comes to push them out.
async fn expire_sessions(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {
                shared.sessions.evict_expired(Instant::now());
            }
        }
    }
}

fn routes(shared: Arc<Shared>) -> HttpRouter {
    HttpRouter::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/v1/messages", post(messages))
        .route(COUNT_TOKENS_PATH, post(messages_count_tokens))
        .route("/", get(root))
        .route("/v1/agent/tool_events", post(tool_events))
        .route("/v1/agent/prefetch", post(crate::hints::prefetch_hook))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(crate::admin::routes())
        .fallback(not_found)
        .with_state(shared)
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(shared, Api::ChatCompletions, &headers, body).await
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(shared, Api::Completions, &headers, body).await
}

async fn responses(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    handle(shared, Api::Responses, &headers, body).await
}

async fn messages(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    handle(shared, Api::Messages, &headers, body).await
}

/// Anthropic's token counter: the prompt `/v1/messages` would send, counted, nothing generated.
async fn messages_count_tokens(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let limit = shared.live().config.server.max_body_bytes;
    let admitted = shared.live().admits(&headers);
    let counted = match admitted {
        Err(err) => Err(err),
        Ok(()) => read_body(body, limit).await,
    };
    let counted = match counted {
        Ok(bytes) => count_tokens(&shared, &bytes).await,
        Err(err) => Err(err),
    };
    let response = match counted {
        Ok(body) => axum::Json(body).into_response(),
        Err(err) => {
            shared.metrics.reject(err.reason());
            err.into_api_response(Api::Messages)
        }
    };
    shared
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            endpoint: COUNT_TOKENS_PATH.into(),
            status: response.status().as_u16(),
            harness: AgentContext::from_headers(&headers).harness.as_str(),
        })
        .inc();
    response
}

const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// `GET /` and `HEAD /`: what this is, for harness probes and people with a browser.
async fn root(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(serde_json::json!({
        "service": "switchyard",
        "model": shared.model_name,
        "endpoints": ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
            COUNT_TOKENS_PATH, "/v1/models", "/health", "/metrics"],
    }))
    .into_response()
}

/// Harness tool events into the trace: `{"recorded": n}` (0 while tracing is off).
async fn tool_events(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let limit = shared.live().config.server.max_body_bytes;
    if let Err(err) = shared.live().admits(&headers) {
        return err.into_api_response(Api::ChatCompletions);
    }
    let bytes = match read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(err) => return err.into_response(),
    };
    let context = AgentContext::from_headers(&headers);
    let lines = match parse_tool_events(&bytes, &context, std::time::SystemTime::now()) {
        Ok(lines) => lines,
        Err(message) => return GatewayError::BadRequest(message).into_response(),
    };
    let recorded = match &shared.trace {
        Some(sink) => lines
            .into_iter()
            .map(|l| sink.record(l))
            .filter(|ok| *ok)
            .count(),
        None => 0,
    };
    axum::Json(serde_json::json!({"recorded": recorded})).into_response()
}

async fn models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(err) = shared.live().admits(&headers) {
        return err.into_api_response(Api::ChatCompletions);
    }
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{"id": shared.model_name, "object": "model", "created": 0, "owned_by": "switchyard"}],
    }))
    .into_response()
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let router = shared.router();
    let healthy = router.ranks().filter(|(_, ok)| *ok).count();
    let total = router.ranks().count();
    drop(router);
    let status = if healthy > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let state = if healthy > 0 { "ok" } else { "unavailable" };
    (
        status,
        axum::Json(
            serde_json::json!({"status": state, "workers_healthy": healthy, "workers": total}),
        ),
    )
        .into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    {
        let now = shared.now();
        let mut router = shared.router();
        // Loads whose predicted end has passed are over now, not at the next decision.
        if router.end_due_prefills(now) {
            shared.share_bookings(&mut router);
        }
        for (rank, _) in router.ranks() {
            let label = worker_label(rank);
            let load = router.load(rank);
            let metrics = &shared.metrics;
            metrics
                .in_flight
                .get_or_create(&label)
                .set(i64::from(load.requests));
            metrics
                .prefill_tokens
                .get_or_create(&label)
                .set(i64::try_from(load.prefill_tokens).unwrap_or(i64::MAX));
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

async fn not_found(State(shared): State<Arc<Shared>>, uri: axum::http::Uri) -> Response {
    let err = GatewayError::NoSuchEndpoint(uri.path().to_string());
    shared.metrics.reject(err.reason());
    err.into_response()
}
