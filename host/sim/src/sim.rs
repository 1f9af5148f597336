//! The discrete-event simulation: sessions, the router and simulated workers on a virtual clock.
//!
//! Every decision is the gateway's: requests are hashed with [`BlockHasher`], offered to the
//! gateway's [`AdmissionController`] (programs from the workload's sessions; each request but a
//! session's last ends with a tool call, and the last is `session-final`), and what it releases is
//! placed by [`Router::route`], through the [`RouterQueue`] when one is configured; `first_token`
//! and `finish` are called when the engine's tokens arrive, as the gateway's stream does; the index
//! changes only through the workers' published KV events. The simulator itself decides nothing but
//! *when* things happen.
//!
//! With [`SimConfig::replicas`] above one, several gateway replicas share the fleet: each is its
//! own `Router` (bookings and load of its own decisions only), `KvIndex` (fed by every worker's
//! events, as each replica subscribes to every engine) and `AdmissionController`; a load balancer
//! model ([`ReplicaAffinity`]) picks the replica of each request. With
//! [`IndexMode::Approximate`] no replica hears events: each indexes the ranks from its own
//! decisions (the router's approximate mode).
//!
//! With [`SimConfig::kv_hints`] (or [`Simulation::with_kv_hint_policies`]) each replica also
//! runs the gateway's KV-hint path on the virtual clock (`sim/hints.rs`): lifecycle events from
//! its traffic, its policy's hints resolved into block actions, applied to the engines.

mod hints;

use crate::metrics::{Outcome, RequestRecord};
use crate::pool::SharedPool;
use crate::queue::EventQueue;
use crate::tokens;
use crate::worker::{Published, QuietRun, SimWorker};
use crate::workload::{SpawnTree, Workload};
use std::collections::{HashMap, HashSet, VecDeque};
use std::str::FromStr;
use std::time::Duration;
use switchyard_core::admission::{
    AdmissionConfig, AdmissionController, AdmissionMetrics, AdmissionPolicy, AdmissionRequest,
    ParamError, RankUtilization, Release, native_admission_spec,
};
use switchyard_core::engine::{
    EngineConfig, EngineModel, EngineRequest, KvTransfer, Step, TierStats, TokenOut,
};
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::KvIndex;
use switchyard_core::index::flat::U64Map;
use switchyard_core::kv_hints::params::native_kv_hints_spec;
use switchyard_core::kv_hints::sessions::RoutedTurn;
use switchyard_core::programs::{TurnEnd, Usage};
use switchyard_core::router::queue::{
    QueueConfig, QueueStats, QueuedRequest, RouterQueue, Submitted,
};
use switchyard_core::router::{
    Decision, PolicyRequest, RequestId, RouteRequest, Router, RouterConfig, RoutingPolicy,
    native_policy,
};
use switchyard_core::worker::Rank;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// How the load balancer in front of the replicas picks one for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaAffinity {
    /// Sticky: a stable hash (xxh3) of the root session's id, modulo the replicas, so a session
    /// and its sub-agents always meet one replica (what Envoy's header hash does, without
    /// Maglev's minimal movement when the replica count changes: it does not change here).
    #[default]
    Session,
    /// Each request to a replica drawn from a seeded hash of its id (a connection-level
    /// balancer that does not look at the session).
    Random,
    /// Each request to the next replica, in send order.
    RoundRobin,
}

impl ReplicaAffinity {
    /// The name `FromStr` reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Random => "random",
            Self::RoundRobin => "round-robin",
        }
    }
}

impl FromStr for ReplicaAffinity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "session" => Ok(Self::Session),
            "random" => Ok(Self::Random),
            "round-robin" => Ok(Self::RoundRobin),
            _ => Err(format!(
                "`{s}` is not a replica affinity (session, random, round-robin)"
            )),
        }
    }
}

/// What the replicas' KV indexes learn from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexMode {
    /// Every worker's KV events (and the shared pool's), delivered to every replica.
    #[default]
    Events,
    /// No events: every rank is approximate, each replica predicting blocks from its own
    /// routing decisions (what a cache-aware router without engine events does).
    Approximate,
}

impl IndexMode {
    /// The name `FromStr` reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::Approximate => "approximate",
        }
    }
}

impl FromStr for IndexMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "events" => Ok(Self::Events),
            "approximate" => Ok(Self::Approximate),
            _ => Err(format!("`{s}` is not an index mode (events, approximate)")),
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Simulated workers (one rank each).
    pub workers: usize,
    /// Every worker's engine; its `block_size` must be the workload's.
    pub engine: EngineConfig,
    /// Blocks of the shared pool (G4) of all workers; requires the engines' `pool` settings
    /// (its bandwidth), as they require it. `None`: no pool.
    pub pool_blocks: Option<usize>,
    /// Router settings; `block_size` and `seed` are taken from the engine and `seed` below.
    pub router: RouterConfig,
    /// Routing policy, by its native name (`kv-cost`, `round-robin`).
    pub policy: String,
    /// Admission policy: a native name (`none`, `thunder-agent`, `continuum`, `autellix`) with
    /// optional parameters, `name[:key=value]*` (e.g. `thunder-agent:decay_half_life=10s`).
    pub admission: String,
    /// The admission controller's settings (tick, longest hold, program idle expiry).
    pub admission_config: AdmissionConfig,
    /// The router queue; `None`: released requests go straight to the engines' own queues.
    pub queue: Option<QueueConfig>,
    /// Longest gap between two requests of a session; longer ones (a user away) are cut to it.
    pub max_gap: Option<Duration>,
    /// Most root sessions in flight; later arrivals wait, first come first served.
    pub concurrency: Option<usize>,
    /// Arrival times and gaps are divided by this.
    pub speedup: f64,
    /// How long a KV event batch takes from the engine to the index.
    pub event_delay: Duration,
    /// How often each worker's KV utilization is sampled.
    pub sample_interval: Duration,
    /// Seeds the router's tie-breaking.
    pub seed: u64,
    /// Gateway replicas over the fleet, each with its own router, index and admission.
    pub replicas: usize,
    /// How requests are spread over the replicas.
    pub replica_affinity: ReplicaAffinity,
    /// What the replicas' indexes learn from.
    pub index: IndexMode,
    /// KV-hint policy, a native spec: a strategy (`demote-on-tool-call`, `subagent-reclaim`,
    /// `share-to-subagent`, `compaction-evict`, `no-hints`) with optional parameters,
    /// `name[:key=value]*`, several joined by `+`. Each replica runs the gateway's hint path
    /// with its own instance. `None`: no hint path at all.
    pub kv_hints: Option<String>,
    /// How often a replica asks its KV-hint policy while some session waits on a tool (the
    /// gateway's `[kv_hints] tick`), besides whenever lifecycle events arrive.
    pub kv_hints_tick: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            engine: EngineConfig::default(),
            pool_blocks: None,
            router: RouterConfig::default(),
            policy: "kv-cost".to_owned(),
            admission: "none".to_owned(),
            admission_config: AdmissionConfig::default(),
            queue: None,
            max_gap: None,
            concurrency: None,
            speedup: 1.0,
            event_delay: Duration::from_millis(5),
            sample_interval: Duration::from_secs(1),
            seed: 0x5717_c4ad,
            replicas: 1,
            replica_affinity: ReplicaAffinity::Session,
            index: IndexMode::Events,
            kv_hints: None,
            kv_hints_tick: Duration::from_millis(100),
        }
    }
}

/// Why a simulation could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Not a native policy.
    #[error("unknown routing policy `{0}`")]
    UnknownPolicy(String),
    /// Not a native admission policy, or a bad parameter.
    #[error(transparent)]
    Admission(#[from] ParamError),
    /// Not a native KV-hint strategy, or a bad parameter.
    #[error("kv hints: {0}")]
    KvHints(ParamError),
    /// The engine settings are invalid.
    #[error(transparent)]
    Engine(#[from] switchyard_core::engine::ConfigError),
    /// The workload's block size differs from the engine's.
    #[error("the workload has {workload}-token blocks, the engines {engine}; convert the workload")]
    BlockSize {
        /// Workload block size.
        workload: u32,
        /// Engine block size.
        engine: usize,
    },
    /// Nothing to run or nowhere to run it.
    #[error("invalid setting: {0}")]
    Invalid(&'static str),
    /// The workload holds what no simulation could run ([`Workload::check`]).
    #[error(transparent)]
    Workload(#[from] crate::workload::WorkloadError),
}

/// Slowest replay `speedup`: a trace of [`MAX_TRACE_SPAN`](crate::workload::MAX_TRACE_SPAN)
/// stretched by it stays well inside the clock's 584 years.
pub(crate) const MIN_SPEEDUP: f64 = 0.01;

#[derive(Debug)]
enum Event {
    /// A root session's first request is due (subject to the concurrency cap).
    Arrive(usize),
    /// Send request `request` of session `session`.
    Send { session: usize, request: usize },
    /// Worker `w` may start a step.
    Wake(usize),
    /// Worker `w`'s step in progress (or quiet run) ends: the `n`th step end queued for it,
    /// stale unless it is the last one ([`SimWorker::step_ends`]).
    StepEnd(usize, u64),
    /// A KV event message reaches the index.
    KvEvents(usize, Published),
    /// Replica `r`'s admission controller's periodic work is due.
    AdmissionTick(usize),
    /// Replica `r`'s KV-hint path has events to show its policy, or a tick is due.
    Hints(usize),
}

/// A request admission or the router queue still holds: what the engine will need.
#[derive(Debug)]
struct Pending {
    prompt: Vec<u32>,
    hashes: Vec<SequenceHash>,
    max_tokens: u32,
}

#[derive(Debug, Default)]
struct SessionState {
    /// Joining children still running.
    pending_joins: usize,
    /// When the session may take its next step (its last request's or joined children's end).
    ready: Duration,
    /// Index of the request in flight, or of the last one finished.
    current: usize,
    /// The request `current` is in flight.
    in_flight: bool,
    /// The session's last prompt, while it has requests to send.
    last: Option<SessionPrompt>,
}

/// A session's last prompt, from which its next one, which resends it, is built
/// ([`Simulation::prompt`]). The default is no prompt (no whole blocks).
#[derive(Debug, Default)]
struct SessionPrompt {
    /// The request it was.
    request: usize,
    /// Its blocks that were whole: their tokens are a function of their ids alone.
    whole_blocks: usize,
    tokens: Vec<u32>,
    hashes: Vec<SequenceHash>,
}

/// One gateway replica: what a `switchyard serve` process holds.
#[derive(Debug)]
struct Replica {
    router: Router,
    /// Its own copy of the index, from the same events.
    index: KvIndex,
    admission: AdmissionController,
    router_queue: Option<RouterQueue>,
    /// When its next `AdmissionTick` event is due, if one is scheduled.
    tick_at: Option<Duration>,
    /// Its KV-hint path, with [`SimConfig::kv_hints`].
    hints: Option<hints::ReplicaHints>,
}

/// How many blocks ahead a probe of [`Simulation`]'s set of computed blocks is prefetched.
const PROBES_AHEAD: usize = 8;

/// One run of a workload under one configuration.
#[derive(Debug)]
pub struct Simulation<'w> {
    workload: &'w Workload,
    config: SimConfig,
    replicas: Vec<Replica>,
    /// Each session's root session (itself for roots).
    root_of: Vec<usize>,
    /// Requests sent so far, for [`ReplicaAffinity::RoundRobin`].
    sent: u64,
    /// Requests sent and not yet in an engine (held by admission, or in the router queue).
    pending: HashMap<u64, Pending>,
    /// Requests in engines that answer whole (`RouterConfig::engine_stream`): their first tokens
    /// do not reach the router.
    whole_answers: HashSet<u64>,
    /// How many requests were answered whole.
    whole_answered: u64,
    hasher: BlockHasher,
    workers: Vec<SimWorker>,
    /// The shared pool, with `SimConfig::pool_blocks`.
    pool: Option<SharedPool>,
    queue: EventQueue<Event>,
    sessions: Vec<SessionState>,
    /// Children of each session by the request that spawns them.
    children: HashMap<(usize, usize), Vec<usize>>,
    parent_of: Vec<Option<usize>>,
    roots_in_flight: usize,
    roots_waiting: VecDeque<usize>,
    records: Vec<RequestRecord>,
    /// Prompt hashes of requests not admitted yet, for the recompute count.
    unadmitted: HashMap<u64, Vec<SequenceHash>>,
    /// Every block some worker has computed, to tell recomputation from first computation
    /// (millions of keys on a long trace: the index's open-addressing table).
    computed: U64Map<()>,
    recomputed_tokens: u64,
    kv_samples: Vec<Vec<f64>>,
    next_sample: Duration,
    /// Whether engines may run quiet steps at once ([`EngineModel::quiet_steps`]): not while
    /// a router queue or a KV-hint path watches every step end (the hint path counts queued
    /// events to know when to stop ticking).
    quiet_runs: bool,
    /// The worker whose step end is being handled, if that is the event in hand.
    ending: Option<usize>,
    /// `Hints` events in the queue: ticks stop once nothing else is.
    queued_hint_rounds: usize,
}

impl<'w> Simulation<'w> {
    /// A simulation of `workload` under `config`, ready to [`run`](Self::run).
    pub fn new(workload: &'w Workload, config: SimConfig) -> Result<Self, SimError> {
        let policies = (0..config.replicas.max(1))
            .map(|_| {
                native_policy(&config.policy)
                    .ok_or_else(|| SimError::UnknownPolicy(config.policy.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::with_replica_policies(workload, config, policies, None)
    }

    /// A simulation whose router uses `policy` (a Wasm component, or an instrumented one);
    /// `config.policy` is ignored and the report names `policy.name()`. Admission is the native
    /// policy `config.admission`. One replica only (see [`Self::with_replica_policies`]).
    pub fn with_policy(
        workload: &'w Workload,
        config: SimConfig,
        policy: Box<dyn RoutingPolicy>,
    ) -> Result<Self, SimError> {
        Self::with_replica_policies(workload, config, vec![policy], None)
    }

    /// A simulation with explicit routing and admission policies (Wasm components, or
    /// instrumented ones); `config.policy` and `config.admission` are ignored and the report
    /// names the policies. One replica only (see [`Self::with_replica_policies`]).
    pub fn with_policies(
        workload: &'w Workload,
        config: SimConfig,
        policy: Box<dyn RoutingPolicy>,
        admission: Box<dyn AdmissionPolicy>,
    ) -> Result<Self, SimError> {
        Self::with_replica_policies(workload, config, vec![policy], Some(vec![admission]))
    }

    /// A simulation with one routing policy instance per replica (`config.replicas` of them,
    /// each replica's router owning its own), and one admission policy per replica or, with
    /// `None`, the native `config.admission` for each. The report names the first replica's
    /// policies (a native admission policy by its spec, parameters included).
    pub fn with_replica_policies(
        workload: &'w Workload,
        mut config: SimConfig,
        policies: Vec<Box<dyn RoutingPolicy>>,
        admissions: Option<Vec<Box<dyn AdmissionPolicy>>>,
    ) -> Result<Self, SimError> {
        if config.replicas == 0 {
            return Err(SimError::Invalid("replicas must be positive"));
        }
        if policies.len() != config.replicas
            || admissions
                .as_ref()
                .is_some_and(|a| a.len() != config.replicas)
        {
            return Err(SimError::Invalid(
                "one routing (and admission) policy per replica",
            ));
        }
        let admissions = match admissions {
            Some(admissions) => {
                config.admission = admissions[0].name().to_owned();
                admissions
            }
            // The report keeps the spec, parameters included, to tell variants apart.
            None => (0..config.replicas)
                .map(|_| {
                    native_admission_spec(&config.admission, config.admission_config.tick_interval)
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        config.policy = policies[0].name().to_owned();
        Self::build(workload, config, policies, admissions)
    }

    fn build(
        workload: &'w Workload,
        config: SimConfig,
        policies: Vec<Box<dyn RoutingPolicy>>,
        admissions: Vec<Box<dyn AdmissionPolicy>>,
    ) -> Result<Self, SimError> {
        if workload.block_size as usize != config.engine.block_size {
            return Err(SimError::BlockSize {
                workload: workload.block_size,
                engine: config.engine.block_size,
            });
        }
        if config.workers == 0 || config.concurrency == Some(0) {
            return Err(SimError::Invalid(
                "workers and concurrency must be positive",
            ));
        }
        if !(config.speedup.is_finite() && config.speedup >= MIN_SPEEDUP) {
            return Err(SimError::Invalid(
                "speedup must be a number of at least 0.01",
            ));
        }
        workload.check()?;
        if config.sample_interval.is_zero() {
            return Err(SimError::Invalid("sample_interval must be positive"));
        }
        let pool = match (config.pool_blocks, &config.engine.pool) {
            (Some(blocks), Some(_)) => Some(
                SharedPool::new(blocks, workload.block_size)
                    .map_err(|_| SimError::Invalid("pool_blocks must be between 1 and 2^32 - 2"))?,
            ),
            (None, None) => None,
            _ => {
                return Err(SimError::Invalid(
                    "a shared pool needs both pool_blocks and the engines' pool settings",
                ));
            }
        };
        let approximate = config.index == IndexMode::Approximate;
        let mut hint_policies = match &config.kv_hints {
            Some(spec) => {
                if config.kv_hints_tick.is_zero() {
                    return Err(SimError::Invalid("kv_hints_tick must be positive"));
                }
                (0..config.replicas)
                    .map(|_| native_kv_hints_spec(spec).map(Some))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(SimError::KvHints)?
            }
            None => (0..config.replicas).map(|_| None).collect(),
        };
        let replicas: Vec<Replica> = policies
            .into_iter()
            .zip(admissions)
            .enumerate()
            .map(|(r, (policy, admission))| {
                let router_config = RouterConfig {
                    block_size: workload.block_size,
                    // Replica 0 keeps the seed: one replica is the simulator without replicas.
                    seed: config.seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    ..config.router.clone()
                };
                let mut router = Router::new(router_config, policy);
                for w in 0..config.workers {
                    router.add_rank(Rank::new(w as u32, 0), approximate);
                }
                Replica {
                    router,
                    index: KvIndex::new(),
                    admission: AdmissionController::new(config.admission_config.clone(), admission),
                    router_queue: config.queue.clone().map(RouterQueue::new),
                    tick_at: None,
                    hints: hint_policies[r].take().map(hints::ReplicaHints::new),
                }
            })
            .collect();
        let mut workers = Vec::with_capacity(config.workers);
        for w in 0..config.workers {
            let rank = Rank::new(w as u32, 0);
            workers.push(SimWorker::new(
                rank,
                EngineModel::new(config.engine.clone())?,
            ));
        }
        let SpawnTree {
            roots,
            children,
            parent_of,
        } = workload.spawn_tree();
        let root_of = (0..workload.sessions.len())
            .map(|mut s| {
                while let Some(parent) = parent_of[s] {
                    s = parent;
                }
                s
            })
            .collect();
        let mut queue = EventQueue::new();
        for root in roots {
            let session = &workload.sessions[root];
            let first_gap = session.requests.first().map_or(Duration::ZERO, |r| r.gap);
            let at = (session.start + first_gap).div_f64(config.speedup);
            queue.push(at, Event::Arrive(root));
        }
        Ok(Self {
            replicas,
            queued_hint_rounds: 0,
            root_of,
            sent: 0,
            pending: HashMap::new(),
            whole_answers: HashSet::new(),
            whole_answered: 0,
            hasher: BlockHasher::new(workload.block_size as usize),
            sessions: (0..workload.sessions.len())
                .map(|_| SessionState::default())
                .collect(),
            kv_samples: vec![Vec::new(); config.workers],
            workload,
            config,
            workers,
            pool,
            queue,
            children,
            parent_of,
            roots_in_flight: 0,
            roots_waiting: VecDeque::new(),
            records: Vec::with_capacity(workload.request_count()),
            unadmitted: HashMap::new(),
            computed: U64Map::new(),
            recomputed_tokens: 0,
            next_sample: Duration::ZERO,
            quiet_runs: false,
            ending: None,
        })
    }

    /// Run to completion; `progress` hears of every request that ends (finished or failed).
    pub fn run(mut self, progress: &mut dyn FnMut()) -> Outcome {
        let hints = self.replicas.iter().any(|r| r.hints.is_some());
        let queues = self.replicas.iter().any(|r| r.router_queue.is_some());
        self.quiet_runs = !hints && !queues;
        // The index is read by a routing policy that weighs the cache, by the router queue
        // (its thresholds count the prefill the index says is cached), by KV hints and by the
        // shared pool's prefix runs. Round robin alone reads none of it, so its engines publish
        // no events (Dynamo's replay keeps no index for round robin either): the same results
        // for half the CPU.
        let feeds_index = self.config.index == IndexMode::Events
            && (self.replicas.iter().any(|r| r.router.policy_reads_index())
                || queues
                || hints
                || self.pool.is_some());
        if !feeds_index {
            for worker in &mut self.workers {
                worker.engine.publish_events(false);
            }
        }
        if hints {
            // The hint path names blocks to the engines as their events did.
            for worker in &mut self.workers {
                worker.keep_names();
            }
        }
        while let Some((now, event)) = self.queue.pop() {
            self.ending = match event {
                Event::StepEnd(w, _) => Some(w),
                _ => None,
            };
            self.sample_until(now);
            match event {
                Event::Arrive(session) => self.arrive(session, now),
                Event::Send { session, request } => self.send(session, request, now, progress),
                Event::Wake(w) if !self.workers[w].busy() => self.start_step(w, now),
                Event::Wake(_) => {}
                Event::StepEnd(w, n) if n == self.workers[w].step_ends => {
                    self.end_step(w, now, progress);
                }
                Event::StepEnd(..) => {}
                Event::KvEvents(w, message) => {
                    // Every replica subscribes to every engine: the same ops reach each index,
                    // and a prompt's last stored block ends its prefill in each router's view.
                    let mut prefilled = false;
                    for op in self.workers[w].ingest(message) {
                        for replica in &mut self.replicas {
                            replica.index.apply(&op);
                            prefilled |= replica.router.blocks_stored(op.device_stores(), now);
                        }
                    }
                    if prefilled {
                        // Load dropped: the router queue may let requests go.
                        self.drain(now, progress);
                    }
                }
                Event::AdmissionTick(r) => self.admission_tick(r, now, progress),
                Event::Hints(r) => {
                    self.queued_hint_rounds -= 1;
                    self.hint_round(r, now);
                }
            }
        }
        let end = self
            .records
            .iter()
            .filter_map(|r| r.finished)
            .max()
            .unwrap_or_default();
        let mut admission_metrics = self.replicas[0].admission.metrics(end);
        let mut queue_stats = self.replicas[0]
            .router_queue
            .as_ref()
            .map(RouterQueue::stats);
        for replica in &self.replicas[1..] {
            add_admission_metrics(&mut admission_metrics, &replica.admission.metrics(end));
            if let (Some(sum), Some(queue)) = (&mut queue_stats, &replica.router_queue) {
                add_queue_stats(sum, &queue.stats());
            }
        }
        let kv_hints = self.config.kv_hints.clone().map(|name| {
            hints::ReplicaHints::report(name, self.replicas.iter().filter_map(|r| r.hints.as_ref()))
        });
        Outcome {
            kv_hints,
            admission: self.config.admission.clone(),
            admission_metrics,
            queue_stats,
            replicas: self.config.replicas,
            replica_affinity: self.config.replica_affinity,
            index: self.config.index,
            policy: self.config.policy,
            workers: self.config.workers,
            concurrency: self.config.concurrency,
            speedup: self.config.speedup,
            block_size: self.workload.block_size,
            records: self.records,
            recomputed_tokens: self.recomputed_tokens,
            whole_answers: self.whole_answered,
            sample_interval: self.config.sample_interval,
            kv_samples: self.kv_samples,
            tiers: (self.config.engine.host_tier.is_some() || self.pool.is_some()).then(|| {
                self.workers
                    .iter()
                    .map(|w| w.engine.stats().tiers)
                    .sum::<TierStats>()
            }),
            pool: self.pool.as_ref().map(SharedPool::stats),
        }
    }

    fn arrive(&mut self, session: usize, now: Duration) {
        if self
            .config
            .concurrency
            .is_some_and(|cap| self.roots_in_flight >= cap)
        {
            self.roots_waiting.push_back(session);
            return;
        }
        self.roots_in_flight += 1;
        self.queue.push(
            now,
            Event::Send {
                session,
                request: 0,
            },
        );
    }

    fn send(&mut self, s: usize, k: usize, now: Duration, progress: &mut dyn FnMut()) {
        let workload = self.workload;
        let session = &workload.sessions[s];
        let Some(request) = session.requests.get(k) else {
            self.session_done(s, now);
            return;
        };
        let id = self.records.len() as u64;
        let (prompt, hashes) = self.prompt(s, k, id);
        let max_tokens = request.output_tokens.max(1);
        self.sessions[s].current = k;
        self.sessions[s].in_flight = true;
        let r = self.replica_for(s, id);
        let mut record = RequestRecord::new(s, k, now, &prompt, max_tokens);
        record.replica = r;
        self.records.push(record);
        let offered = AdmissionRequest {
            id: RequestId(id),
            request: PolicyRequest {
                tokens: prompt.len() as u32,
                blocks: (prompt.len() as u32).div_ceil(workload.block_size.max(1)),
                block_size: workload.block_size,
                session_id: Some(&session.id),
                parent_session_id: session.parent.as_deref(),
                osl: Some(max_tokens),
                ..PolicyRequest::default()
            },
            session_final: k + 1 == session.requests.len(),
        };
        self.pending.insert(
            id,
            Pending {
                prompt,
                hashes,
                max_tokens,
            },
        );
        let workers = self.utilization();
        let outcome = self.replicas[r].admission.arrival(&offered, &workers, now);
        for release in outcome.admitted.into_iter().chain(outcome.released) {
            self.dispatch(release, now, progress);
        }
        self.schedule_tick(r, now);
    }

    /// Request `k` of session `s` (request `id` of the run): its prompt and the prompt's sequence
    /// hashes, built on the session's previous prompt. The blocks both share (the same leading
    /// block ids, whole in both) are kept, and only the rest is drawn and hashed, as the
    /// gateway's session cache tokenizes and hashes only a resent conversation's new suffix.
    fn prompt(&mut self, s: usize, k: usize, id: u64) -> (Vec<u32>, Vec<SequenceHash>) {
        let workload = self.workload;
        let session = &workload.sessions[s];
        let request = &session.requests[k];
        let block_size = workload.block_size;
        let whole = tokens::whole_blocks(request.hash_ids.len(), block_size, request.input_tokens);
        let last = self.sessions[s].last.take().unwrap_or_default();
        let shared = session.requests.get(last.request).map_or(0, |before| {
            before.hash_ids[..last.whole_blocks]
                .iter()
                .zip(&request.hash_ids[..whole])
                .take_while(|(a, b)| a == b)
                .count()
        });
        let shared_tokens = shared * block_size as usize;
        // Fresh buffers of the right size: the engine takes the prompt and appends its outputs
        // (`send`'s `max_tokens`), and growing it would copy it.
        let outputs = request.output_tokens.max(1) as usize;
        let mut prompt = Vec::with_capacity(request.input_tokens.max(1) as usize + outputs);
        prompt.extend_from_slice(&last.tokens[..shared_tokens]);
        tokens::complete_prompt(
            &mut prompt,
            &request.hash_ids,
            block_size,
            request.input_tokens,
            id,
        );
        let mut hashes = Vec::with_capacity(prompt.len() / block_size as usize);
        hashes.extend_from_slice(&last.hashes[..shared]);
        let locals = self.hasher.locals(&prompt[shared_tokens..]);
        hashes.extend(self.hasher.sequence_from(hashes.last().copied(), &locals));
        debug_assert_eq!(
            (&prompt, &hashes),
            (
                &tokens::prompt(&request.hash_ids, block_size, request.input_tokens, id),
                &self.hasher.sequence(&prompt)
            ),
            "session {s} request {k}"
        );
        if k + 1 < session.requests.len() {
            // The kept copy takes only what is new.
            let mut last = last;
            last.tokens.truncate(shared_tokens);
            last.tokens.extend_from_slice(&prompt[shared_tokens..]);
            last.hashes.truncate(shared);
            last.hashes.extend_from_slice(&hashes[shared..]);
            last.request = k;
            last.whole_blocks = whole;
            self.sessions[s].last = Some(last);
        }
        (prompt, hashes)
    }

    /// The replica the load balancer sends request `id` of session `s` to.
    fn replica_for(&mut self, s: usize, id: u64) -> usize {
        let n = self.replicas.len() as u64;
        if n == 1 {
            return 0;
        }
        let pick = match self.config.replica_affinity {
            ReplicaAffinity::Session => {
                xxh3_64(self.workload.sessions[self.root_of[s]].id.as_bytes())
            }
            ReplicaAffinity::Random => xxh3_64_with_seed(&id.to_le_bytes(), self.config.seed),
            ReplicaAffinity::RoundRobin => {
                self.sent += 1;
                self.sent - 1
            }
        };
        (pick % n) as usize
    }

    /// Admission let `release` go: route it (through the router queue, if any).
    fn dispatch(&mut self, release: Release, now: Duration, progress: &mut dyn FnMut()) {
        let id = release.id.0;
        self.records[id as usize].released = Some(now);
        let Some(pending) = self.pending.get(&id) else {
            return;
        };
        let record = &self.records[id as usize];
        let session = &self.workload.sessions[record.session];
        let replica = &mut self.replicas[record.replica];
        let route = RouteRequest {
            hashes: &pending.hashes,
            tokens: pending.prompt.len() as u32,
            expected_output_tokens: Some(pending.max_tokens),
            session_id: Some(&session.id),
            parent_session_id: session.parent.as_deref(),
            priority: release.priority,
            pinned_rank: release.rank,
            ..RouteRequest::default()
        };
        let placed = match &mut replica.router_queue {
            Some(queue) => {
                let waiting = QueuedRequest::new(release.id, &route);
                match queue.submit(waiting, &mut replica.router, &replica.index, now) {
                    Ok(Submitted::Routed(decision)) => Some(decision),
                    Ok(Submitted::Queued { .. }) => return self.drain(now, progress),
                    Err(_) => None,
                }
            }
            None => replica
                .router
                .route(release.id, &route, &replica.index, now)
                .ok(),
        };
        match placed {
            Some(decision) => self.start(id, &decision, now, progress),
            None => self.fail(id, now, progress),
        }
    }

    /// Route what the replicas' router queues let go now.
    fn drain(&mut self, now: Duration, progress: &mut dyn FnMut()) {
        for r in 0..self.replicas.len() {
            let replica = &mut self.replicas[r];
            let Some(queue) = &mut replica.router_queue else {
                continue;
            };
            for drained in queue.drain(&mut replica.router, &replica.index, now) {
                let id = drained.request.id.0;
                match drained.result {
                    Ok(decision) => self.start(id, &decision, now, progress),
                    Err(_) => self.fail(id, now, progress),
                }
            }
        }
    }

    /// Request `id` was placed by `decision`: hand it to that worker's engine.
    fn start(&mut self, id: u64, decision: &Decision, now: Duration, progress: &mut dyn FnMut()) {
        let rank = decision.rank;
        let Some(Pending {
            prompt,
            hashes,
            max_tokens,
        }) = self.pending.remove(&id)
        else {
            return;
        };
        let worker = rank.worker.0 as usize;
        self.hints_routed(id, rank, &prompt, &hashes, now);
        // What the shared pool holds of the prompt, in the engine's hashes, as a driver looks it
        // up when the request reaches its engine.
        let pool_prefix_blocks = match &self.pool {
            Some(pool) => {
                let engine = &self.workers[worker].engine;
                pool.prefix(&engine.cache().hash_blocks(&prompt), now)
            }
            None => 0,
        };
        let engine_request = EngineRequest {
            id,
            prompt,
            max_tokens,
            pool_prefix_blocks,
            pool_prefix_start: 0,
            max_offload_tokens: None,
        };
        self.settle(worker, now);
        if self.workers[worker]
            .engine
            .add_request(engine_request)
            .is_err()
        {
            let r = self.records[id as usize].replica;
            self.replicas[r].router.finish(RequestId(id), now);
            return self.fail(id, now, progress);
        }
        self.records[id as usize].worker = Some(worker);
        if !decision.engine_streams {
            self.whole_answers.insert(id);
            self.whole_answered += 1;
        }
        self.unadmitted.insert(id, hashes);
        let r = self.records[id as usize].replica;
        self.replicas[r]
            .admission
            .request_started(RequestId(id), rank, now);
        self.queue.push(now, Event::Wake(worker));
    }

    /// Request `id` could not be placed or run.
    fn fail(&mut self, id: u64, now: Duration, progress: &mut dyn FnMut()) {
        self.pending.remove(&id);
        let r = self.records[id as usize].replica;
        self.replicas[r].admission.cancel(RequestId(id), now);
        self.request_done(id, now, progress);
    }

    /// Replica `r`'s admission controller's periodic work; schedules the next one.
    fn admission_tick(&mut self, r: usize, now: Duration, progress: &mut dyn FnMut()) {
        if self.replicas[r].tick_at != Some(now) {
            return;
        }
        self.replicas[r].tick_at = None;
        let workers = self.utilization();
        for release in self.replicas[r].admission.tick(&workers, now) {
            self.dispatch(release, now, progress);
        }
        self.schedule_tick(r, now);
    }

    /// Make sure an `AdmissionTick` comes when replica `r`'s controller next has work, while it
    /// watches anything at all.
    fn schedule_tick(&mut self, r: usize, now: Duration) {
        let replica = &mut self.replicas[r];
        if replica.admission.is_idle() {
            return;
        }
        let at = replica.admission.next_wakeup().max(now);
        if replica.tick_at.is_some_and(|t| t <= at) {
            return;
        }
        replica.tick_at = Some(at);
        self.queue.push(at, Event::AdmissionTick(r));
    }

    /// Every worker as admission policies see it.
    fn utilization(&self) -> Vec<RankUtilization> {
        let block_size = self.config.engine.block_size as u64;
        self.workers
            .iter()
            .map(|w| {
                let stats = w.engine.stats();
                RankUtilization {
                    rank: w.rank,
                    kv_usage: stats.kv_usage as f32,
                    active_requests: stats.running as u32,
                    queue_depth: stats.waiting as u32,
                    healthy: true,
                    kv_capacity_tokens: w.engine.config().num_blocks as u64 * block_size,
                }
            })
            .collect()
    }

    /// How request `k` of session `s` ended, as the harness would report it: with a tool call
    /// unless it is the session's last (spawning sub-agents is the `Task` tool).
    fn turn_end(&self, s: usize, k: usize) -> TurnEnd {
        let session = &self.workload.sessions[s];
        let request = &session.requests[k];
        let spawns = self.children.contains_key(&(s, k));
        TurnEnd {
            usage: Some(Usage {
                prompt_tokens: request.input_tokens,
                completion_tokens: request.output_tokens.max(1),
            }),
            tool_call: spawns || k + 1 < session.requests.len(),
            tool_name: spawns.then(|| "Task".to_owned()),
            // The traces do not say which output tokens were thinking.
            thinking: Vec::new(),
        }
    }

    fn start_step(&mut self, w: usize, now: Duration) {
        let worker = &mut self.workers[w];
        if !worker.engine.has_work() {
            return;
        }
        let steps = if self.quiet_runs {
            worker.engine.quiet_steps()
        } else {
            0
        };
        if steps >= 2 {
            // Nothing to see until the last one ends, unless a request arrives first.
            let plan = worker.engine.plan_quiet(steps);
            worker.quiet = Some(QuietRun { start: now, plan });
            self.queue_step_end(w, now + plan.duration());
            return;
        }
        let step = worker.engine.step();
        let block_size = self.workload.block_size as usize;
        for admitted in &step.admitted {
            let record = &mut self.records[admitted.id as usize];
            record.admitted = Some(now);
            record.cached_tokens = admitted.cached_tokens as u32;
            let hashes = self.unadmitted.remove(&admitted.id).unwrap_or_default();
            // The cached prefix was computed once already, so it is in `computed`: only the
            // blocks computed now are looked up, and one probe tells a first computation from
            // a recomputation. The set holds every block of the run, far more than the caches
            // do, so the probes miss: each slot is prefetched a few blocks ahead.
            let cached_blocks = admitted.cached_tokens / block_size;
            let fresh = &hashes[cached_blocks.min(hashes.len())..];
            for hash in fresh.iter().take(PROBES_AHEAD) {
                self.computed.prefetch(hash.0);
            }
            for (i, hash) in fresh.iter().enumerate() {
                if let Some(ahead) = fresh.get(i + PROBES_AHEAD) {
                    self.computed.prefetch(ahead.0);
                }
                if !self.computed.insert_if_absent(hash.0, ()) {
                    self.recomputed_tokens += block_size as u64;
                }
            }
        }
        self.queue_step_end(w, now + step.duration);
        self.workers[w].step = Some((now, step));
    }

    fn queue_step_end(&mut self, w: usize, at: Duration) {
        let worker = &mut self.workers[w];
        worker.step_ends += 1;
        let event = Event::StepEnd(w, worker.step_ends);
        self.queue.push_step_end(at, w, event);
    }

    /// Worker `w`'s engine is about to change at `now`: run the quiet steps begun by then, and
    /// let the one under way end as a step of its own (so what arrives now waits for it, as it
    /// would behind any step).
    fn settle(&mut self, w: usize, now: Duration) {
        let Some(run) = self.workers[w].quiet.take() else {
            return;
        };
        // Whether a step end at `now` came before this event (`EventQueue`'s same-instant
        // order: step ends first, by worker).
        let ended_first = self.ending.is_none_or(|v| w < v);
        let engine = &mut self.workers[w].engine;
        let mut durations = engine.quiet_durations(run.plan.steps);
        let (mut begun, mut start) = (1, run.start);
        let mut current = durations.next().expect("a quiet run has steps");
        for next in durations {
            let end = start + current;
            if end > now || (end == now && !ended_first) {
                break;
            }
            (begun, start, current) = (begun + 1, end, next);
        }
        engine.run_quiet(engine.plan_quiet(begun));
        let step = Step {
            duration: current,
            ..Step::default()
        };
        self.queue_step_end(w, start + current);
        self.workers[w].step = Some((start, step));
    }

    fn end_step(&mut self, w: usize, now: Duration, progress: &mut dyn FnMut()) {
        if let Some(run) = self.workers[w].quiet.take() {
            // Quiet steps report nothing, and no router queue waits on them (runs are off
            // with one): on to the next step.
            self.workers[w].engine.run_quiet(run.plan);
            return self.start_step(w, now);
        }
        let Some((_, step)) = self.workers[w].step.take() else {
            return;
        };
        // Write-through to the pool: visible to every worker from the end of the step that
        // computed the blocks.
        if let Some(pool) = &mut self.pool {
            for transfer in &step.transfers {
                if let KvTransfer::Publish {
                    hash,
                    parent,
                    token_ids,
                    ..
                } = transfer
                {
                    pool.publish(*hash, *parent, token_ids, now);
                }
            }
            // The router sees the pool as the gateway does, from its events (here without
            // transport delay); approximate replicas hear no events.
            for op in pool.index_ops() {
                if self.config.index == IndexMode::Events {
                    for replica in &mut self.replicas {
                        replica.index.apply(&op);
                    }
                }
            }
        }
        for TokenOut {
            id,
            first,
            finished,
            ..
        } in step.outputs
        {
            let request = RequestId(id);
            let r = self.records[id as usize].replica;
            if first {
                self.records[id as usize].first_token = Some(now);
                if !self.whole_answers.contains(&id) {
                    self.replicas[r].router.first_token(request, now);
                }
            }
            if finished {
                self.whole_answers.remove(&id);
                self.records[id as usize].finished = Some(now);
                self.replicas[r].router.finish(request, now);
                let (s, k) = {
                    let record = &self.records[id as usize];
                    (record.session, record.request)
                };
                let end = self.turn_end(s, k);
                self.replicas[r]
                    .admission
                    .request_finished(request, &end, now);
                self.hints_turn_ended(r, s, k, &end, now);
                self.request_done(id, now, progress);
            }
        }
        // Load dropped (first tokens, ends): the router queue may let requests go.
        self.drain(now, progress);
        // Approximate replicas subscribe to nothing, nor do indexes nothing reads: then the
        // engines publish nothing.
        if !step.events.is_empty() {
            let message = self.workers[w].publish(step.events, now);
            self.queue
                .push(now + self.config.event_delay, Event::KvEvents(w, message));
        }
        self.start_step(w, now);
    }

    /// Request `id` ended (finished or failed): spawn its sub-agents and continue its session.
    fn request_done(&mut self, id: u64, now: Duration, progress: &mut dyn FnMut()) {
        progress();
        let (s, k) = {
            let record = &self.records[id as usize];
            (record.session, record.request)
        };
        let state = &mut self.sessions[s];
        state.in_flight = false;
        state.ready = now;
        for &child in self.children.get(&(s, k)).into_iter().flatten() {
            let session = &self.workload.sessions[child];
            if session.spawn.is_some_and(|spawn| spawn.join) {
                self.sessions[s].pending_joins += 1;
            }
            let gap = session
                .requests
                .first()
                .map_or(Duration::ZERO, |r| self.clip(r.gap));
            let at = now + (session.start + gap).div_f64(self.config.speedup);
            self.queue.push(
                at,
                Event::Send {
                    session: child,
                    request: 0,
                },
            );
        }
        self.continue_session(s);
    }

    /// Send the session's next request once its last one and every joining child are done.
    fn continue_session(&mut self, s: usize) {
        let state = &self.sessions[s];
        if state.in_flight || state.pending_joins > 0 {
            return;
        }
        let next = state.current + 1;
        let ready = state.ready;
        match self.workload.sessions[s].requests.get(next) {
            Some(request) => {
                let at = ready + self.clip(request.gap).div_f64(self.config.speedup);
                self.sessions[s].in_flight = true;
                self.queue.push(
                    at,
                    Event::Send {
                        session: s,
                        request: next,
                    },
                );
            }
            None => self.session_done(s, ready),
        }
    }

    fn session_done(&mut self, s: usize, now: Duration) {
        self.sessions[s].last = None;
        let joins = self.workload.sessions[s]
            .spawn
            .is_some_and(|spawn| spawn.join);
        match self.parent_of[s] {
            Some(parent) if joins => {
                let state = &mut self.sessions[parent];
                state.pending_joins -= 1;
                state.ready = state.ready.max(now);
                self.continue_session(parent);
            }
            Some(_) => {}
            None => {
                self.roots_in_flight -= 1;
                if let Some(next) = self.roots_waiting.pop_front() {
                    self.roots_in_flight += 1;
                    self.queue.push(
                        now,
                        Event::Send {
                            session: next,
                            request: 0,
                        },
                    );
                }
            }
        }
    }

    /// A gap, cut to [`SimConfig::max_gap`].
    fn clip(&self, gap: Duration) -> Duration {
        self.config.max_gap.map_or(gap, |max| gap.min(max))
    }

    /// Record KV utilization at every sample time up to `now` (it only changes at events).
    fn sample_until(&mut self, now: Duration) {
        while self.next_sample <= now {
            for (samples, worker) in self.kv_samples.iter_mut().zip(&self.workers) {
                samples.push(worker.engine.cache().usage());
            }
            self.next_sample += self.config.sample_interval;
        }
    }
}

/// `add`'s counters added to `sum` (admission summed over replicas).
fn add_admission_metrics(sum: &mut AdmissionMetrics, add: &AdmissionMetrics) {
    let (p, q) = (&mut sum.programs, &add.programs);
    p.total += q.total;
    p.reasoning += q.reasoning;
    p.acting += q.acting;
    p.idle += q.idle;
    p.paused += q.paused;
    sum.arrivals += add.arrivals;
    sum.holds += add.holds;
    sum.released += add.released;
    sum.forced_releases += add.forced_releases;
    sum.forced_resumes += add.forced_resumes;
    sum.pauses += add.pauses;
    sum.resumes += add.resumes;
    sum.priority_adjustments += add.priority_adjustments;
    sum.unknown_session_actions += add.unknown_session_actions;
    sum.ticks += add.ticks;
    sum.hold_time += add.hold_time;
    sum.paused_time += add.paused_time;
    // Summed peaks: an upper bound of the fleet's (the replicas' peaks need not coincide).
    sum.max_paused += add.max_paused;
}

/// `add`'s counters added to `sum` (router queues summed over replicas; peaks summed).
fn add_queue_stats(sum: &mut QueueStats, add: &QueueStats) {
    sum.enqueued += add.enqueued;
    sum.dequeued += add.dequeued;
    sum.rejected_full += add.rejected_full;
    sum.would_queue += add.would_queue;
    sum.max_depth += add.max_depth;
}
