//! A simulated inference engine: continuous batching, chunked prefill and a prefix-cached paged
//! KV cache, with step times from a fitted model instead of a GPU.
//!
//! The model is a plain state machine: the driver adds and cancels requests, calls
//! [`EngineModel::step`], advances its clock by the returned duration and only then delivers the
//! step's tokens and events. The mock engine drives it with tokio timers, the simulator with a
//! virtual clock; neither changes what the engine computes.
//!
//! Scheduling follows vLLM's v1 scheduler with one simplification: admission reserves every block
//! a request can need (prompt and output), so running requests are never preempted; a request that
//! does not fit waits, first come first served, until finished requests free blocks.
//!
//! Loads are asynchronous, as with vLLM's KV connector loading in the background (a request in
//! `WAITING_FOR_REMOTE_KVS`, LMCache, NIXL): a request whose prefix comes from the host, the disk
//! or the pool gets its device blocks at admission and is parked until its load completes, while
//! the others keep stepping. Each tier has one link into the device (PCIe for the host, the
//! disk's, the NIC for the pool): loads on the same link queue behind each other (a busy-until
//! clock per link), at the tier's bandwidth. A request that hits device blocks still being
//! loaded (by another request's load or a prefetch hint) waits for them too. When only parked
//! requests are left, a step computes nothing and lasts until the first load completes (at most
//! [`LOAD_POLL`], so that arrivals meanwhile are admitted on time).
//!
//! With [`EngineConfig::host_tier`] the device cache gets a host tier behind it (`tiers`, on
//! `switchyard-kvbm`'s block pool): computed blocks are written through, a prefix the device
//! lost is loaded back at the tier's bandwidth (asynchronously, see above), and the events
//! carry each tier as vLLM's `medium`. Without it nothing differs. [`EngineConfig::disk_tier`] puts a disk tier (G3)
//! behind the host tier: what the host evicts is written to disk, and a prefix found only there
//! is loaded at the disk's bandwidth.
//!
//! With [`EngineConfig::pool`] the engine also reads from and writes to a shared pool (G4) that
//! its driver owns (see "Driving a shared pool" below). Without it nothing differs either.
//!
//! [`EngineModel::apply_hints`] executes KV hints (the `switchyard.kv.*` actions of a
//! `kv_hints` envelope: demote, prefetch, evict, pin, retain, ephemeral) on these tiers, now in
//! model time; their movements come out of the next step like any other. Hints change where
//! bytes live, never what a request computes.
//!
//! ```
//! use switchyard_core::engine::{EngineConfig, EngineModel, EngineRequest};
//!
//! let mut engine = EngineModel::new(EngineConfig::default())?;
//! engine.add_request(EngineRequest {
//!     id: 1,
//!     prompt: (0..100).collect(),
//!     max_tokens: 2,
//!     pool_prefix_blocks: 0,
//!     pool_prefix_start: 0,
//!     max_offload_tokens: None,
//! })?;
//! let mut tokens = Vec::new();
//! while engine.has_work() {
//!     let step = engine.step();
//!     assert!(!step.duration.is_zero());
//!     tokens.extend(step.outputs);
//! }
//! assert_eq!(tokens.len(), 2);
//! assert!(tokens[0].first && tokens[1].finished);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Driving a shared pool
//!
//! The pool is shared by every worker, so it is the driver's (the simulator keeps one in
//! process, the mock engine talks to `switchyard kv-pool`); the model stays pure:
//!
//! 1. **Arrival.** Hash the prompt with the engine's hashes ([`KvCache::hash_blocks`] on
//!    [`EngineModel::cache`]), ask the pool which leading blocks it holds, and pass that count
//!    as [`EngineRequest::pool_prefix_blocks`]. A driver that moves bytes fetches them now (or
//!    later, before it applies the step's transfers) and keeps them by hash; it need fetch only
//!    the run past what the engine holds itself ([`EngineModel::held_prefix`]), and says where
//!    that run starts ([`EngineRequest::pool_prefix_start`]).
//! 2. **Admission.** Blocks after the device prefix and the host tier's run, up to that count,
//!    are loaded: they count as `cached_tokens`, the request waits
//!    `blocks x block_bytes / bandwidth` on the pool's link (the others keep stepping), they
//!    become device blocks (a `GPU` store event), and the admitting step lists a
//!    [`KvTransfer::Fetched`] `{ hash, slot }` per block: write the fetched bytes of `hash`
//!    into device slot `slot`.
//! 3. **Write-through.** Every block the device computes is listed, after its
//!    [`KvTransfer::Computed`], as a [`KvTransfer::Publish`] `{ hash, parent, from, token_ids }`:
//!    read the block from `from` and put it into the pool (the put is idempotent; it is off the
//!    request path, so the model charges no time). Blocks a request fetched from the pool or
//!    loaded from the host are not published again.
//!
//! Transfers are in step order: apply them in the order given, once the step's duration has
//! passed, before the next step (a slot named by one is valid until then).

mod cache;
mod hints;
mod tiers;
mod timing;

pub use cache::{BlockTable, CacheEvent, ENGINE_SEED, KvCache, StoredBlock};
pub use hints::{HintsError, PIN_BUDGET_DIVISOR};
pub use tiers::{
    DEFAULT_BLOCK_BYTES, DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH, DEFAULT_POOL_BANDWIDTH,
    DiskTierConfig, HostTierConfig, KvTransfer, PoolTierConfig, TierStats,
};
pub use timing::StepTiming;

use crate::hash::token_bytes;
use switchyard_kvbm::Tick;
use tiers::{HostTier, PoolTier};

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Engine settings (vLLM's names where vLLM has one).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block (`--block-size`).
    pub block_size: usize,
    /// KV blocks on the device (`num_gpu_blocks`).
    pub num_blocks: usize,
    /// Most requests running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (`--max-num-batched-tokens`); longer prefills are chunked.
    pub max_batched_tokens: usize,
    /// Token ids the engine generates from; callers exclude special tokens.
    pub output_vocab: Range<u32>,
    /// Step time model.
    pub timing: StepTiming,
    /// A host-memory tier (G2) behind the device cache: device blocks are written through to
    /// it, and a prefix the device evicted is loaded back at its bandwidth instead of being
    /// recomputed. Default `None`: the device cache alone.
    pub host_tier: Option<HostTierConfig>,
    /// A disk tier (G3) behind the host tier (requires one): what the host evicts is written to
    /// it, and a prefix found only there is loaded at its bandwidth. Default `None`.
    pub disk_tier: Option<DiskTierConfig>,
    /// A shared pool (G4) behind the device and host tiers, owned by the driver: what the
    /// request's [`EngineRequest::pool_prefix_blocks`] says the pool holds is loaded at its
    /// bandwidth, and computed blocks are handed out to publish. Default `None`: no pool (the
    /// field is ignored).
    pub pool: Option<PoolTierConfig>,
    /// Seed of the block hashes the engine names its blocks by (in its cache and its KV
    /// events). Default [`ENGINE_SEED`]: not the router's ([`crate::hash::HASH_SEED`]), as a
    /// real engine's hashes are not, so the events go through the ingestor's translation.
    pub hash_seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            num_blocks: 16_384,
            max_num_seqs: 256,
            max_batched_tokens: 8_192,
            output_vocab: 1_000..30_000,
            timing: StepTiming::default(),
            host_tier: None,
            disk_tier: None,
            pool: None,
            hash_seed: ENGINE_SEED,
        }
    }
}

impl EngineConfig {
    /// Check the settings once, before an engine is built.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |what| Err(ConfigError(what));
        if self.block_size == 0 {
            return fail("block_size must be positive");
        }
        if self.num_blocks == 0 || self.num_blocks >= u32::MAX as usize {
            return fail("num_blocks must be between 1 and 2^32 - 2");
        }
        if self.max_num_seqs == 0 {
            return fail("max_num_seqs must be positive");
        }
        if self.max_batched_tokens == 0 {
            return fail("max_batched_tokens must be positive");
        }
        if self.output_vocab.is_empty() {
            return fail("output_vocab must not be empty");
        }
        if let Some(host) = &self.host_tier {
            host.validate(self.num_blocks).map_err(ConfigError)?;
        }
        if let Some(disk) = &self.disk_tier {
            disk.validate(self.host_tier.as_ref().map(|h| h.block_bytes))
                .map_err(ConfigError)?;
        }
        if let Some(pool) = &self.pool {
            pool.validate(self.host_tier.as_ref())
                .map_err(ConfigError)?;
        }
        Ok(())
    }
}

/// An invalid [`EngineConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid engine config: {0}")]
pub struct ConfigError(&'static str);

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The prompt has no token.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_tokens` is 0.
    #[error("max_tokens must be at least 1")]
    NoOutput,
    /// Prompt and output need more blocks than the whole cache holds.
    #[error("request needs {needed} KV blocks, the engine has {capacity}")]
    TooLong {
        /// Blocks the request needs.
        needed: usize,
        /// Blocks of the engine.
        capacity: usize,
    },
    /// A request with this id is already in the engine.
    #[error("request {0} is already in the engine")]
    DuplicateId(u64),
}

/// A request to generate `max_tokens` tokens after `prompt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRequest {
    /// The caller's id, unique among requests in the engine.
    pub id: u64,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate (at least 1); generation always runs to this length.
    pub max_tokens: u32,
    /// Where the run of the prompt's blocks (engine hashes, [`KvCache::hash_blocks`]) that the
    /// shared pool holds ends, as the driver looked it up at arrival: the pool holds blocks
    /// `pool_prefix_start..pool_prefix_blocks`. 0 without a pool; ignored unless
    /// [`EngineConfig::pool`] is set.
    pub pool_prefix_blocks: usize,
    /// The first of those blocks whose bytes the driver fetched: one that moves bytes skips
    /// what the engine held at arrival ([`EngineModel::held_prefix`]). The pool serves the
    /// request only if its device and lower tiers still reach this block at admission (else it
    /// recomputes past them). 0 for a driver that fetches the whole run, or keeps no bytes.
    pub pool_prefix_start: usize,
    /// vLLM's `kv_transfer_params.max_offload_tokens`: blocks that end past this many tokens
    /// of the sequence are neither written through to the host tier nor published to the pool,
    /// and are evicted first once free. The client does not expect to reuse them (a thinking
    /// span the chat template drops from the next turn). `None`: no limit.
    pub max_offload_tokens: Option<u64>,
}

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenOut {
    /// Request id.
    pub id: u64,
    /// The token.
    pub token: u32,
    /// The request's first token (its prefill just ended).
    pub first: bool,
    /// The request's last token; the request has left the engine.
    pub finished: bool,
}

/// A request that left the queue and started running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Request id.
    pub id: u64,
    /// Prompt tokens found in the prefix cache (vLLM's `cached_tokens`).
    pub cached_tokens: usize,
}

/// What one step did. The driver lets `duration` pass before it acts on the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// Simulated time the step takes.
    pub duration: Duration,
    /// Cache changes, oldest first.
    pub events: Vec<CacheEvent>,
    /// Tokens generated.
    pub outputs: Vec<TokenOut>,
    /// Requests admitted in this step.
    pub admitted: Vec<Admitted>,
    /// KV bytes the step moved, in order (only with a host tier or a pool): a driver with real
    /// slabs replays them, a driver of a pool fetches and publishes.
    pub transfers: Vec<KvTransfer>,
}

/// Gauges and counters behind vLLM's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Requests running (`vllm:num_requests_running`).
    pub running: usize,
    /// Requests queued (`vllm:num_requests_waiting`).
    pub waiting: usize,
    /// Fraction of KV blocks in use (`vllm:kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// Blocks in the device prefix cache (in use or free but reusable): what its KV events
    /// describe.
    pub cached_blocks: usize,
    /// Prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries`).
    pub prefix_queries: u64,
    /// Of those, tokens found (`vllm:prefix_cache_hits`).
    pub prefix_hits: u64,
    /// Prompt tokens of admitted requests (`vllm:prompt_tokens`).
    pub prompt_tokens: u64,
    /// Tokens generated (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Requests that ran to completion (`vllm:request_success`).
    pub finished: u64,
    /// The lower tiers' counters (all zero without a host tier or a pool).
    pub tiers: TierStats,
}

#[derive(Debug)]
struct Waiting {
    request: EngineRequest,
    hashes: Vec<u64>,
}

#[derive(Debug)]
struct Running {
    id: u64,
    /// Prompt, then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    /// Tokens whose KV is written; during decode the last sampled token is not yet.
    computed: usize,
    /// Seeds the output tokens, so that equal prompts produce equal text.
    seed: u64,
    /// Model time its loaded prefix is on the device: it computes nothing before.
    ready_at: Duration,
    table: BlockTable,
    /// Full blocks that may be offloaded ([`EngineRequest::max_offload_tokens`]); the ones after
    /// them are ephemeral.
    offload_blocks: usize,
    /// Blocks of `table` already marked ephemeral or below the limit.
    marked_blocks: usize,
}

/// The simulated engine.
#[derive(Debug)]
pub struct EngineModel {
    config: EngineConfig,
    cache: KvCache,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    stats: EngineStats,
    host: Option<HostTier>,
    pool: Option<PoolTier>,
    /// Simulated time: the sum of the step durations so far (the host tier's clock).
    clock: Duration,
    /// Pins of KV hints, and what hints did since the last step.
    hints: hints::HintState,
    /// When each tier's link into the device is free again.
    links: Links,
    /// Device blocks being loaded, and the model time each is there (pruned as time passes).
    loading: FxHashMap<u64, Duration>,
}

/// Longest step that computes nothing and only waits for a load: a driver's arrivals meanwhile
/// are admitted no later than this.
pub const LOAD_POLL: Duration = Duration::from_millis(5);

/// Quiet steps timed but not run yet ([`EngineModel::plan_quiet`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietPlan {
    /// How many steps.
    pub steps: usize,
    /// The engine's clock when it was made: the first step's start.
    from: Duration,
    /// The last step's start.
    last_start: Duration,
    /// The last step's end.
    end: Duration,
}

impl QuietPlan {
    /// How long the steps take together.
    pub fn duration(&self) -> Duration {
        self.end - self.from
    }
}

/// The links loads take into the device, one per tier: when each is free again (model time).
/// A load starts when its link is free, so loads on one link queue; different links overlap.
#[derive(Debug, Default)]
pub(crate) struct Links {
    host: Duration,
    disk: Duration,
    pool: Duration,
}

impl Links {
    /// Queue a transfer of `time` on `link` at `now`; returns when it completes.
    fn queue(link: &mut Duration, now: Duration, time: Duration) -> Duration {
        if time.is_zero() {
            return now;
        }
        *link = (*link).max(now) + time;
        *link
    }

    pub(crate) fn host(&mut self, now: Duration, time: Duration) -> Duration {
        Self::queue(&mut self.host, now, time)
    }

    pub(crate) fn disk(&mut self, now: Duration, time: Duration) -> Duration {
        Self::queue(&mut self.disk, now, time)
    }

    fn pool(&mut self, now: Duration, time: Duration) -> Duration {
        Self::queue(&mut self.pool, now, time)
    }
}

// === impl EngineModel ===

impl EngineModel {
    /// An idle engine with an empty cache.
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut cache = KvCache::with_seed(config.block_size, config.num_blocks, config.hash_seed);
        let host = config
            .host_tier
            .clone()
            .map(|host| HostTier::new(host, config.disk_tier.clone()));
        let pool = config.pool.clone().map(PoolTier::new);
        if host.is_some() || pool.is_some() {
            cache.log_stored();
        }
        Ok(Self {
            cache,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: EngineStats::default(),
            host,
            pool,
            clock: Duration::ZERO,
            hints: hints::HintState::default(),
            links: Links::default(),
            loading: FxHashMap::default(),
        })
    }

    /// Settings in force.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The KV cache, to inspect.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// How many leading blocks of `hashes` (engine hashes of a prompt) the engine holds now on
    /// its device or, after those, in its host and disk tiers: what a driver need not fetch
    /// from the shared pool ([`EngineRequest::pool_prefix_start`]). Touches nothing.
    pub fn held_prefix(&self, hashes: &[u64]) -> usize {
        let device = self.cache.cached_prefix(hashes);
        let lower = self
            .host
            .as_ref()
            .map_or(0, |h| h.held_run(&hashes[device..]));
        device + lower
    }

    /// Whether steps report KV events (on from the start, as a vLLM with `--kv-events-config`).
    /// A driver that subscribes to nothing turns them off: the same steps, without copying
    /// every stored block's tokens into an event nobody reads.
    pub fn publish_events(&mut self, on: bool) {
        self.cache.publish_events(on);
    }

    /// Simulated time so far: the step durations, plus idle time a driver let pass
    /// ([`EngineModel::advance_clock_to`]). Hint pins expire by it.
    pub fn clock(&self) -> Duration {
        self.clock
    }

    /// Let simulated time reach `now` with nothing computed: a driver whose engine sat idle
    /// (the simulator's clock, or real time for the mock engine) keeps hint pins expiring on
    /// time. An earlier `now` changes nothing.
    pub fn advance_clock_to(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
    }

    /// Queue a request; it is admitted by a later [`EngineModel::step`].
    pub fn add_request(&mut self, request: EngineRequest) -> Result<(), RequestError> {
        if request.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if request.max_tokens == 0 {
            return Err(RequestError::NoOutput);
        }
        let needed = self.blocks_needed(&request);
        if needed > self.config.num_blocks {
            return Err(RequestError::TooLong {
                needed,
                capacity: self.config.num_blocks,
            });
        }
        if self.waiting.iter().any(|w| w.request.id == request.id)
            || self.running.iter().any(|r| r.id == request.id)
        {
            return Err(RequestError::DuplicateId(request.id));
        }
        let hashes = self.cache.hash_blocks(&request.prompt);
        self.waiting.push_back(Waiting { request, hashes });
        Ok(())
    }

    /// Drop a queued or running request; its computed blocks stay cached. `false` if unknown.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(pos) = self.waiting.iter().position(|w| w.request.id == id) {
            self.waiting.remove(pos);
            return true;
        }
        if let Some(pos) = self.running.iter().position(|r| r.id == id) {
            let seq = self.running.remove(pos);
            self.cache.release(seq.table);
            return true;
        }
        false
    }

    /// Pin the cached prefix of `prompt` (prompt caching across an agent's tool call): the
    /// returned table holds a reference on each of its blocks, so eviction skips them until
    /// [`EngineModel::unpin`]. Pins only what is cached now: call it once the prompt's prefill is
    /// done.
    pub fn pin(&mut self, prompt: &[u32]) -> BlockTable {
        let hashes = self.cache.hash_blocks(prompt);
        let cached = self.cache.cached_prefix(&hashes);
        // Taking only cached blocks reserves nothing, so this cannot fail for lack of room.
        self.cache.allocate(&hashes, cached).unwrap_or_default()
    }

    /// Release a [`EngineModel::pin`]: its blocks become evictable again (they stay cached).
    pub fn unpin(&mut self, pin: BlockTable) {
        self.cache.release(pin);
    }

    /// Drop every cached block and every hint pin; refused (`false`) while requests run or
    /// [`EngineModel::pin`]s hold blocks. The next step reports it.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let only_hint_pins = self.cache.used_blocks() == self.hints.pinned_blocks();
        if !(self.running.is_empty() && only_hint_pins) {
            return false;
        }
        self.hints.release_all(&mut self.cache);
        if !self.cache.reset() {
            return false;
        }
        if let Some(host) = &mut self.host {
            host.reset();
        }
        self.loading.clear();
        true
    }

    /// Whether [`EngineModel::step`] has anything to do. When not, the driver waits for input.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty()
            || !self.waiting.is_empty()
            || self.cache.has_events()
            || self.hints.has_pending()
    }

    /// Current gauges and counters.
    pub fn stats(&self) -> EngineStats {
        let mut tiers = self.host.as_ref().map(HostTier::stats).unwrap_or_default();
        if let Some(pool) = &self.pool {
            tiers += pool.stats();
        }
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.cache.usage(),
            cached_blocks: self.cache.cached_len(),
            tiers,
            ..self.stats
        }
    }

    /// Run one forward pass: running requests first (decodes and unfinished prefills, in
    /// admission order), then new requests from the queue while the token budget, the sequence
    /// limit and the KV blocks allow.
    pub fn step(&mut self) -> Step {
        let mut budget = self.config.max_batched_tokens;
        self.hints.expire(&mut self.cache, self.clock);
        // What hints did since the last step comes first, in order.
        let mut pass = Pass {
            events: std::mem::take(&mut self.hints.events),
            transfers: std::mem::take(&mut self.hints.transfers),
            ..Pass::default()
        };
        let mut outputs = Vec::new();
        let vocab = self.config.output_vocab.clone();
        let now = Tick(self.clock.as_nanos() as u64);
        let clock = self.clock;
        self.loading.retain(|_, ready| *ready > clock);
        for seq in &mut self.running {
            if seq.ready_at > clock {
                // Still loading: the others step without it.
                continue;
            }
            budget -= advance(
                &mut self.cache,
                seq,
                budget,
                &vocab,
                &mut pass,
                &mut outputs,
            );
            sync_tiers(
                &mut self.cache,
                &mut self.host,
                &mut self.pool,
                &mut pass,
                now,
                seq,
            );
        }
        let mut admitted = Vec::new();
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(mut seq) = self
                .admit_next(&mut pass, now)
                .or_else(|| self.admit_past_pins(&mut pass, now))
            else {
                break;
            };
            admitted.push(Admitted {
                id: seq.id,
                cached_tokens: seq.computed,
            });
            if seq.ready_at > clock {
                // Parked until its load completes; it holds its blocks and a sequence slot.
                self.running.push(seq);
                continue;
            }
            budget -= advance(
                &mut self.cache,
                &mut seq,
                budget,
                &vocab,
                &mut pass,
                &mut outputs,
            );
            sync_tiers(
                &mut self.cache,
                &mut self.host,
                &mut self.pool,
                &mut pass,
                now,
                &mut seq,
            );
            self.running.push(seq);
        }

        let kv_tokens: usize = self.running.iter().map(|s| s.computed).sum();
        let mut duration = self.step_duration(pass.prefill_tokens, pass.decoding, kv_tokens);
        if pass.prefill_tokens == 0 && !pass.decoding {
            // Nothing to compute: wait for the first load to complete (polling for arrivals).
            let next_ready = self
                .running
                .iter()
                .map(|s| s.ready_at)
                .filter(|&ready| ready > clock)
                .min();
            if let Some(ready) = next_ready {
                duration = (ready - clock).min(LOAD_POLL);
            }
        }
        self.clock += duration;

        self.stats.generation_tokens += outputs.len() as u64;
        for out in outputs.iter().filter(|o| o.finished) {
            if let Some(pos) = self.running.iter().position(|s| s.id == out.id) {
                let seq = self.running.remove(pos);
                self.cache.release(seq.table);
                self.stats.finished += 1;
            }
        }
        let mut events = pass.events;
        if self.cache.publishes_events() {
            events.extend(self.cache.take_events());
        } else {
            // The tiers' and hints' own events go the same way.
            events.clear();
        }
        Step {
            duration,
            events,
            outputs,
            admitted,
            transfers: pass.transfers,
        }
    }

    /// How many of the next steps are *quiet*: each decodes one token of every running request
    /// and nothing else. Nothing waits, loads, is pinned or has events or transfers to report,
    /// and no request finishes, fills a block or takes a new one. A quiet step changes nothing
    /// outside the engine but time and the requests' (uncounted) tokens, so a simulator may
    /// skip from the first to the last and run them at once ([`EngineModel::run_quiet`]).
    pub fn quiet_steps(&self) -> usize {
        if self.running.is_empty()
            || !self.waiting.is_empty()
            || self.running.len() > self.config.max_batched_tokens
            || self.hints.has_pending()
            || self.hints.pinned_blocks() > 0
            || self.cache.has_events()
        {
            return 0;
        }
        let block_size = self.config.block_size;
        self.running
            .iter()
            .map(|seq| {
                let decoding = seq.computed >= seq.prompt_len && seq.ready_at <= self.clock;
                if !decoding {
                    return 0;
                }
                let generated = seq.tokens.len() - seq.prompt_len;
                // Step i writes the KV of `computed + i` tokens and samples token
                // `generated + i`: quiet while that is not the last, fits the blocks held and
                // completes none.
                let before_last = seq.max_tokens.saturating_sub(generated + 1);
                let held = seq.table.len() * block_size - seq.computed;
                let unfilled =
                    ((seq.table.hashes().len() + 1) * block_size).saturating_sub(seq.computed + 1);
                before_last.min(held).min(unfilled)
            })
            .min()
            .unwrap_or(0)
    }

    /// How long each of the next `steps` steps takes, all of them quiet
    /// ([`EngineModel::quiet_steps`]), without running them.
    pub fn quiet_durations(&self, steps: usize) -> impl Iterator<Item = Duration> + '_ {
        let kv_tokens: usize = self.running.iter().map(|s| s.computed).sum();
        let batch = self.running.len();
        (1..=steps).map(move |i| self.step_duration(0, true, kv_tokens + i * batch))
    }

    /// The next `steps` steps, all of them quiet ([`EngineModel::quiet_steps`]), timed once so
    /// that a driver can wait for their end and then run them.
    pub fn plan_quiet(&self, steps: usize) -> QuietPlan {
        let (mut last_start, mut end) = (self.clock, self.clock);
        for step in self.quiet_durations(steps) {
            last_start = end;
            end += step;
        }
        QuietPlan {
            steps,
            from: self.clock,
            last_start,
            end,
        }
    }

    /// Run the quiet steps of `plan`: exactly what as many calls of [`EngineModel::step`] do,
    /// without the outputs nobody needs (no first token, no last).
    ///
    /// # Panics
    /// If the engine changed since the plan was made, or the plan has more steps than
    /// [`EngineModel::quiet_steps`].
    pub fn run_quiet(&mut self, plan: QuietPlan) {
        let steps = plan.steps;
        assert!(
            plan.from == self.clock && steps <= self.quiet_steps(),
            "not that many quiet steps from here"
        );
        if steps == 0 {
            return;
        }
        // Step by step, only the clock depends on the step before; each request's tokens and
        // the loads done by the last step's start do not, so they are brought up to date once.
        self.loading.retain(|_, ready| *ready > plan.last_start);
        let vocab = self.config.output_vocab.clone();
        for seq in &mut self.running {
            // `advance` of decodes that neither take nor fill a block: the cache's write has
            // nothing to do.
            seq.computed += steps;
            let generated = seq.tokens.len() - seq.prompt_len;
            let seed = seq.seed;
            seq.tokens
                .extend((generated..generated + steps).map(|at| output_token(seed, at, &vocab)));
        }
        self.clock = plan.end;
        self.stats.generation_tokens += (steps * self.running.len()) as u64;
    }

    /// How long a step takes that prefills `prefill_tokens`, decodes or not, and holds
    /// `kv_tokens` of KV once it is written: [`EngineModel::step`] and quiet runs alike.
    fn step_duration(&self, prefill_tokens: usize, decoding: bool, kv_tokens: usize) -> Duration {
        let capacity = (self.config.num_blocks * self.config.block_size) as f64;
        self.config
            .timing
            .step(prefill_tokens, decoding, kv_tokens as f64 / capacity)
    }

    /// Blocks a request can occupy: the last generated token is never fed back, so its KV is never
    /// written.
    fn blocks_needed(&self, request: &EngineRequest) -> usize {
        (request.prompt.len() + request.max_tokens as usize - 1).div_ceil(self.config.block_size)
    }

    /// With nothing running, nothing will free blocks but hint pins: release them, the soonest
    /// to expire first, until the head of the queue fits (pins never wedge the engine).
    fn admit_past_pins(&mut self, pass: &mut Pass, now: Tick) -> Option<Running> {
        if !self.running.is_empty() || self.waiting.is_empty() {
            return None;
        }
        while self.hints.release_soonest(&mut self.cache) {
            if let Some(seq) = self.admit_next(pass, now) {
                return Some(seq);
            }
        }
        None
    }

    /// Move the head of the queue to running if its blocks fit. The part of its prefix that the
    /// device lacks is loaded into it from the host tier, then the disk tier, then the shared
    /// pool, in that order (the nearest copy first), each on its tier's link: the request is
    /// ready once every load it needs, and every device block it hits that is still loading,
    /// is there.
    fn admit_next(&mut self, pass: &mut Pass, now: Tick) -> Option<Running> {
        let head = self.waiting.front()?;
        let block_size = self.config.block_size;
        // At least the last prompt token is computed, to sample the first output from.
        let reusable = (head.request.prompt.len() - 1) / block_size;
        let mut table = self
            .cache
            .allocate(&head.hashes[..reusable], self.blocks_needed(&head.request))?;
        let device_blocks = table.hashes().len();
        let mut ready_at = table
            .hashes()
            .iter()
            .filter_map(|hash| self.loading.get(hash))
            .fold(self.clock, |ready, &at| ready.max(at));
        let onboard = match &self.host {
            Some(host) => host.lookup(&head.hashes[device_blocks..reusable], now),
            None => Vec::new(),
        };
        let disk_start = device_blocks + onboard.len();
        let from_disk = match &self.host {
            Some(host) => host.disk_lookup(&head.hashes[disk_start..reusable], now),
            None => Vec::new(),
        };
        let near = disk_start + from_disk.len();
        let fetched = match &self.pool {
            // The pool's run is usable from where the nearer tiers end, if its bytes start
            // there or before.
            Some(_) if head.request.pool_prefix_start <= near => head
                .request
                .pool_prefix_blocks
                .min(reusable)
                .saturating_sub(near),
            _ => 0,
        };
        let Waiting { request, hashes } = self.waiting.pop_front()?;
        table.know(hashes);
        let device_cached = device_blocks * block_size;
        let cached = (near + fetched) * block_size;
        if cached > device_cached {
            // The loaded blocks are cached in the device like computed ones (a GPU store
            // event); their bytes come from the host slots and the pool, not from a forward
            // pass.
            pass.events.extend(self.cache.take_events());
            self.cache.write(&mut table, &request.prompt[..cached]);
            for (index, block) in onboard.iter().enumerate() {
                if let Some(slot) = table.slot(device_blocks + index) {
                    pass.transfers.push(KvTransfer::Copy {
                        hash: block.hash().0,
                        from: (crate::worker::Tier::Host, block.id().0),
                        to: (crate::worker::Tier::Device, slot),
                    });
                }
            }
            for (index, block) in from_disk.iter().enumerate() {
                if let Some(slot) = table.slot(disk_start + index) {
                    pass.transfers.push(KvTransfer::Copy {
                        hash: block.hash().0,
                        from: (crate::worker::Tier::Disk, block.id().0),
                        to: (crate::worker::Tier::Device, slot),
                    });
                }
            }
            for (index, &hash) in table.known().iter().enumerate().skip(near).take(fetched) {
                if let Some(slot) = table.slot(index) {
                    pass.transfers.push(KvTransfer::Fetched { hash, slot });
                }
            }
            // Loaded, not computed: nothing to publish. The host's copies are only refreshed;
            // what came from disk or the pool is written through to the host like any device
            // block.
            let stored = self.cache.take_stored();
            pass.events.extend(self.cache.take_events());
            let clock = self.clock;
            if let Some(host) = &mut self.host {
                host.write_through(stored, now, &mut pass.events, &mut pass.transfers);
                let time = host.charge_onboard(onboard.len(), block_size);
                ready_at = ready_at.max(self.links.host(clock, time));
                let time = host.charge_disk_onboard(from_disk.len(), block_size);
                ready_at = ready_at.max(self.links.disk(clock, time));
            }
            if let Some(pool) = self.pool.as_mut().filter(|_| fetched > 0) {
                let time = pool.charge_fetch(fetched, block_size);
                ready_at = ready_at.max(self.links.pool(clock, time));
            }
            if ready_at > clock {
                // A request admitted before the load completes that hits these waits too.
                for &hash in &table.known()[device_blocks..near + fetched] {
                    self.loading.insert(hash, ready_at);
                }
            }
        }
        drop((onboard, from_disk));
        self.stats.prefix_queries += request.prompt.len() as u64;
        self.stats.prefix_hits += device_cached as u64;
        self.stats.prompt_tokens += request.prompt.len() as u64;
        // The outputs go after the prompt: room for them now, not a copy of the prompt later.
        let mut tokens = request.prompt;
        tokens.reserve_exact(request.max_tokens as usize);
        Some(Running {
            id: request.id,
            prompt_len: tokens.len(),
            max_tokens: request.max_tokens as usize,
            computed: cached,
            seed: prompt_seed(&tokens),
            ready_at,
            tokens,
            table,
            offload_blocks: request
                .max_offload_tokens
                .map_or(usize::MAX, |t| t as usize / self.config.block_size),
            marked_blocks: 0,
        })
    }
}

/// Work of one pass, for its duration.
#[derive(Debug, Default)]
struct Pass {
    prefill_tokens: usize,
    decoding: bool,
    /// Events so far, in order (with a host tier, device and host events interleave).
    events: Vec<CacheEvent>,
    transfers: Vec<KvTransfer>,
}

/// After `seq` computed: its blocks past its offload limit are evicted first; with a host tier
/// or a pool, move the device's events so far into the pass, record the blocks just computed,
/// publish them and write them through, except the ephemeral ones.
fn sync_tiers(
    cache: &mut KvCache,
    host: &mut Option<HostTier>,
    pool: &mut Option<PoolTier>,
    pass: &mut Pass,
    now: Tick,
    seq: &mut Running,
) {
    // The blocks computed since the last call that are past the limit.
    let computed = seq.table.hashes().len();
    let from = seq.offload_blocks.max(seq.marked_blocks).min(computed);
    seq.marked_blocks = computed;
    let ephemeral = &seq.table.hashes()[from..];
    for &hash in ephemeral {
        cache.evict_first(hash);
    }
    if host.is_none() && pool.is_none() {
        return;
    }
    pass.events.extend(cache.take_events());
    let mut stored = cache.take_stored();
    if !ephemeral.is_empty() {
        let before = stored.len();
        stored.retain(|b| !ephemeral.contains(&b.hash));
        if let Some(host) = host {
            host.skipped_ephemeral((before - stored.len()) as u64);
        }
    }
    pass.transfers
        .extend(stored.iter().map(|b| KvTransfer::Computed {
            hash: b.hash,
            slot: b.slot,
        }));
    if let Some(pool) = pool {
        pool.publish(&stored, &mut pass.transfers);
    }
    if let Some(host) = host {
        host.write_through(stored, now, &mut pass.events, &mut pass.transfers);
    }
}

/// Give `seq` up to `budget` tokens of this pass: a prefill chunk, or one decode. Returns the
/// tokens used.
fn advance(
    cache: &mut KvCache,
    seq: &mut Running,
    budget: usize,
    vocab: &Range<u32>,
    pass: &mut Pass,
    outputs: &mut Vec<TokenOut>,
) -> usize {
    let used = if seq.computed < seq.prompt_len {
        let chunk = (seq.prompt_len - seq.computed).min(budget);
        pass.prefill_tokens += chunk;
        chunk
    } else {
        let decode = budget.min(1);
        pass.decoding |= decode > 0;
        decode
    };
    if used == 0 {
        return 0;
    }
    seq.computed += used;
    cache.write(&mut seq.table, &seq.tokens[..seq.computed]);
    if seq.computed == seq.tokens.len() {
        // The pass reached the newest token: sample the next one.
        let generated = seq.tokens.len() - seq.prompt_len;
        let token = output_token(seq.seed, generated, vocab);
        seq.tokens.push(token);
        outputs.push(TokenOut {
            id: seq.id,
            token,
            first: generated == 0,
            finished: generated + 1 == seq.max_tokens,
        });
    }
    used
}

/// The seed of a prompt's output tokens: xxh3 of its tokens' little-endian bytes.
fn prompt_seed(prompt: &[u32]) -> u64 {
    xxh3_64_with_seed(&token_bytes(prompt), ENGINE_SEED)
}

/// Deterministic pseudo-text: a function of the prompt and the position only.
fn output_token(seed: u64, position: usize, vocab: &Range<u32>) -> u32 {
    let span = u64::from(vocab.end - vocab.start);
    let draw = xxh3_64_with_seed(&(position as u64).to_le_bytes(), seed);
    vocab.start + (draw % span) as u32
}

#[cfg(test)]
mod tests;
