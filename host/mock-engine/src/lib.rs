//! An OpenAI-compatible mock inference engine.
//!
//! It serves `/v1/chat/completions` and `/v1/completions` like vLLM does, with a real tokenizer
//! and chat template, a real prefix-cached paged KV cache and real KV events (vLLM's ZMQ wire
//! format), but it computes nothing: [`switchyard_core::engine::EngineModel`] says how long each
//! step would take and which tokens come out, and the engine task sleeps that long (divided by
//! [`MockEngineConfig::speedup`]). The gateway starts several in-process as its embedded default;
//! `switchyard mock-engine` runs one as a process.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use switchyard_mock_engine::{MockEngineConfig, spawn};
//! use switchyard_tokenizer::ModelTokenizer;
//! use tokio_util::sync::CancellationToken;
//!
//! let shutdown = CancellationToken::new();
//! let config = MockEngineConfig { kv_events: Some("tcp://127.0.0.1:0".into()), ..Default::default() };
//! let engine = spawn(config, ModelTokenizer::embedded_default()?, shutdown.clone()).await?;
//! println!("serving on {}, KV events on {:?}", engine.base_url(), engine.kv_events_endpoint());
//! shutdown.cancel();
//! engine.stopped().await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod api;
mod driver;
mod hints;
mod length;
mod metrics;
mod pool;
mod respond;
mod script;
mod tiers;

pub use length::AnswerLength;
pub use pool::PoolSettings;
pub use switchyard_core::engine::{DiskTierConfig, HostTierConfig};

use axum::serve::ListenerExt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use switchyard_core::engine::{ConfigError, EngineConfig, EngineModel, PoolTierConfig};
use switchyard_core::hash::BlockHasher;
use switchyard_kv_events::publisher::Publisher;
use switchyard_kv_events::wire::Encoding;
use switchyard_tokenizer::ModelTokenizer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Batches the replay socket keeps (vLLM's default `buffer_steps`).
const REPLAY_BUFFER_STEPS: usize = 10_000;

/// Settings of one mock engine.
#[derive(Debug, Clone, PartialEq)]
pub struct MockEngineConfig {
    /// Address to listen on. Default 127.0.0.1.
    pub host: IpAddr,
    /// Port to listen on; 0 picks a free one (see [`MockEngineHandle::addr`]). Default 0.
    pub port: u16,
    /// Model name served in responses and `/v1/models`; `None` uses the tokenizer's name.
    pub served_model_name: Option<String>,
    /// Tokens per KV block. Default 16, vLLM's.
    pub block_size: usize,
    /// KV blocks of the simulated device. Default 16,384.
    pub num_blocks: usize,
    /// Most requests running at once. Default 256.
    pub max_num_seqs: usize,
    /// Most tokens per step; longer prefills are chunked. Default 8,192.
    pub max_batched_tokens: usize,
    /// Most output tokens of one request, whatever it asks. Default 4,096.
    pub max_tokens_cap: u32,
    /// Simulated time runs this many times faster than real time. Default 1; tests use 100 or more.
    pub speedup: f64,
    /// ZMQ endpoint of the KV event publisher, e.g. `tcp://127.0.0.1:0` (port 0 picks one) or
    /// `tcp://*:5557`. `None` publishes nothing, like an engine without `--kv-events-config`.
    pub kv_events: Option<String>,
    /// ZMQ endpoint of the replay socket, e.g. `tcp://127.0.0.1:0`; `None` for no replay.
    /// Only used with `kv_events`.
    pub replay_endpoint: Option<String>,
    /// Payload encoding of the events: vLLM's arrays (default) or its newer maps.
    pub encoding: Encoding,
    /// Data-parallel rank written into every event batch; `None` writes nil. Default `Some(0)`.
    pub dp_rank: Option<u32>,
    /// The model's tool-call format (a `switchyard-parsers` name): scripted tool calls are written
    /// in it and chat answers are parsed with it, like vLLM's `--tool-call-parser`. Default
    /// `hermes`.
    pub tool_parser: String,
    /// Reasoning parser of chat answers (`reasoning_content`), like vLLM's `--reasoning-parser`;
    /// `None` leaves thinking in the content. Default `qwen3` (`<think>` at the start only).
    pub reasoning_parser: Option<String>,
    /// How long unscripted answers are when the output limit does not cut them first.
    pub answer_length: AnswerLength,
    /// A host-memory KV tier (G2) behind the device blocks: blocks are written through to it
    /// and a prefix the device lost is loaded back at its bandwidth, with `block_bytes` real
    /// bytes per block moved between the tiers' slabs, and `CPU` events published. Default
    /// `None`: the device cache alone.
    pub host_tier: Option<HostTierConfig>,
    /// A disk tier (G3) behind the host tier, in a slot file under the directory given: what the
    /// host evicts is written there (checksummed records, kvbm's `DiskStore`) and loaded back at
    /// its bandwidth, with `STORAGE` events. Needs `host_tier`. Default `None`.
    pub disk_tier: Option<(DiskTierConfig, PathBuf)>,
    /// A shared KV pool (`switchyard kv-pool`) behind the device and host tiers: the leading
    /// prompt blocks it holds are fetched at arrival and loaded at its bandwidth, computed blocks
    /// are written through to it. Blocks are `block_bytes` each (the host tier's, when there is
    /// one). Default `None`.
    pub pool: Option<(PoolSettings, u64)>,
    /// Serve `POST /debug/kv_events` (lose event batches, silence the replay socket) for fault
    /// tests. Default `false`.
    pub fault_switches: bool,
}

impl Default for MockEngineConfig {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            served_model_name: None,
            block_size: engine.block_size,
            num_blocks: engine.num_blocks,
            max_num_seqs: engine.max_num_seqs,
            max_batched_tokens: engine.max_batched_tokens,
            max_tokens_cap: 4_096,
            speedup: 1.0,
            kv_events: None,
            replay_endpoint: None,
            encoding: Encoding::Map,
            dp_rank: Some(0),
            tool_parser: "hermes".to_owned(),
            reasoning_parser: Some("qwen3".to_owned()),
            answer_length: AnswerLength::default(),
            host_tier: None,
            disk_tier: None,
            pool: None,
            fault_switches: false,
        }
    }
}

/// Why a mock engine did not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum MockEngineError {
    /// The engine settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `speedup` is not a positive finite number.
    #[error("speedup must be positive and finite, got {0}")]
    Speedup(f64),
    /// The tokenizer has no ordinary (non-special) token to generate.
    #[error("the tokenizer has no ordinary token to generate")]
    NoOutputVocabulary,
    /// The HTTP listener could not bind, or the server failed.
    #[error("HTTP server: {0}")]
    Http(#[from] std::io::Error),
    /// The KV event publisher could not bind.
    #[error("KV event publisher: {0}")]
    Publisher(#[source] switchyard_kv_events::Error),
    /// A parser name is unknown.
    #[error(transparent)]
    Parser(#[from] switchyard_parsers::UnknownParser),
    /// The KV tiers' memory could not be set up.
    #[error("KV tier storage: {0}")]
    Storage(#[from] switchyard_kvbm::StorageError),
    /// The shared pool's address or settings are unusable.
    #[error("KV pool: {0}")]
    Pool(#[from] switchyard_kv_pool::PoolError),
    /// The pool protocol carries block sizes in 32 bits.
    #[error("KV blocks of {0} bytes are too large for the shared pool (at most 4 GiB)")]
    PoolBlockBytes(u64),
    /// A task of the engine panicked.
    #[error("mock engine task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A running mock engine. It stops when the `shutdown` token given to [`spawn`] is cancelled.
#[derive(Debug)]
pub struct MockEngineHandle {
    addr: SocketAddr,
    kv_events_endpoint: Option<String>,
    replay_endpoint: Option<String>,
    server: JoinHandle<std::io::Result<()>>,
    engine: JoinHandle<()>,
}

impl MockEngineHandle {
    /// Address the HTTP server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Bound endpoint of the KV event publisher (the actual port), if events are published.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events_endpoint.as_deref()
    }

    /// Bound endpoint of the replay socket, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Wait until the engine has stopped: the server drained its connections and the engine task
    /// ended.
    pub async fn stopped(self) -> Result<(), MockEngineError> {
        self.engine.await?;
        self.server.await??;
        Ok(())
    }
}

/// Start a mock engine: bind its HTTP listener and event sockets, start its engine task.
pub async fn spawn(
    config: MockEngineConfig,
    tokenizer: ModelTokenizer,
    shutdown: CancellationToken,
) -> Result<MockEngineHandle, MockEngineError> {
    if !(config.speedup.is_finite() && config.speedup > 0.0) {
        return Err(MockEngineError::Speedup(config.speedup));
    }
    // Refuse unknown parser names at start, not on the first request.
    switchyard_parsers::OutputParser::new(
        config.reasoning_parser.as_deref(),
        Some(&config.tool_parser),
        "",
    )?;
    let model = EngineModel::new(EngineConfig {
        block_size: config.block_size,
        num_blocks: config.num_blocks,
        max_num_seqs: config.max_num_seqs,
        max_batched_tokens: config.max_batched_tokens,
        output_vocab: output_vocab(&tokenizer).ok_or(MockEngineError::NoOutputVocabulary)?,
        host_tier: config.host_tier.clone(),
        disk_tier: config.disk_tier.as_ref().map(|(disk, _)| disk.clone()),
        pool: config
            .pool
            .as_ref()
            .map(|(settings, block_bytes)| PoolTierConfig {
                block_bytes: *block_bytes,
                bandwidth_bytes_per_s: settings.bandwidth_bytes_per_s,
            }),
        ..EngineConfig::default()
    })?;
    let block_bytes = config
        .host_tier
        .as_ref()
        .map(|h| h.block_bytes)
        .or(config.pool.as_ref().map(|(_, bytes)| *bytes));
    let slabs = match block_bytes {
        Some(bytes) => Some(tiers::TierSlabs::new(
            config.num_blocks,
            config.host_tier.as_ref().map(|h| h.num_blocks),
            config
                .disk_tier
                .as_ref()
                .map(|(disk, dir)| (disk.num_blocks, dir.as_path())),
            bytes,
        )?),
        None => None,
    };
    let pool = match &config.pool {
        Some((settings, block_bytes)) => {
            let block_bytes = u32::try_from(*block_bytes)
                .map_err(|_| MockEngineError::PoolBlockBytes(*block_bytes))?;
            Some(Arc::new(pool::PoolLink::start(
                settings,
                BlockHasher::with_seed(config.block_size, model.config().hash_seed),
                block_bytes,
                shutdown.clone(),
            )?))
        }
        None => None,
    };
    let sink = match &config.kv_events {
        Some(endpoint) => {
            let publisher = Publisher::bind(
                endpoint,
                config.replay_endpoint.as_deref(),
                config.encoding,
                REPLAY_BUFFER_STEPS,
            )
            .await
            .map_err(MockEngineError::Publisher)?;
            Some(driver::EventSink {
                publisher,
                block_size: config.block_size as u32,
                dp_rank: config.dp_rank,
            })
        }
        None => None,
    };
    let kv_events_endpoint = sink.as_ref().map(|s| s.publisher.endpoint());
    let replay_endpoint = sink.as_ref().and_then(|s| s.publisher.replay_endpoint());
    let faults = sink
        .as_ref()
        .filter(|_| config.fault_switches)
        .map(|s| s.publisher.faults());
    let listener = tokio::net::TcpListener::bind((config.host, config.port)).await?;
    let addr = listener.local_addr()?;

    let tier_memory = slabs.as_ref().map(|s| s.memory()).unwrap_or_default();
    let pool_counters = pool.as_ref().map(|p| p.counters.clone());
    let hint_counters = Arc::new(hints::HintCounters::default());
    let capabilities =
        hints::Capabilities::new(config.host_tier.is_some(), config.disk_tier.is_some());
    let attached = driver::Attachments {
        slabs,
        sink,
        pool,
        hints: hint_counters.clone(),
    };
    let (engine, engine_task) = driver::start(model, attached, config.speedup, shutdown.clone());
    let model_name = config
        .served_model_name
        .unwrap_or_else(|| tokenizer.name().to_owned());
    let registry = metrics::registry(
        engine.stats(),
        pool_counters,
        hint_counters,
        tier_memory,
        &model_name,
        config.block_size,
        config.num_blocks,
    );
    let app = api::router(Arc::new(api::AppState {
        engine,
        tokenizer,
        model: model_name,
        max_tokens_cap: config.max_tokens_cap,
        registry,
        tool_parser: config.tool_parser,
        reasoning_parser: config.reasoning_parser,
        answer_length: config.answer_length,
        hint_capabilities: capabilities,
        faults,
    }));
    let server = tokio::spawn(async move {
        // Token-sized SSE writes must not wait for delayed ACKs (Nagle's algorithm).
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    });
    Ok(MockEngineHandle {
        addr,
        kv_events_endpoint,
        replay_endpoint,
        server,
        engine: engine_task,
    })
}

/// The longest run of ordinary token ids: generated text never contains a special token.
fn output_vocab(tokenizer: &ModelTokenizer) -> Option<Range<u32>> {
    let vocab = tokenizer.vocab_size();
    let mut best = 0..0;
    let mut start = 0;
    for id in 0..=vocab {
        if id == vocab || tokenizer.is_special(id) {
            if id - start > best.end - best.start {
                best = start..id;
            }
            start = id + 1;
        }
    }
    (!best.is_empty()).then_some(best)
}
