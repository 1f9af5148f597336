//! `switchyard simulate`: replay a trace against simulated workers, one run per policy,
//! concurrency and speed-up, and report them side by side.

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use switchyard_core::admission::AdmissionPolicy;
use switchyard_core::engine::{
    DEFAULT_BLOCK_BYTES, DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH, DEFAULT_POOL_BANDWIDTH,
    DiskTierConfig, ENGINE_SEED, EngineConfig, HostTierConfig, PoolTierConfig,
};
use switchyard_core::hash::HASH_SEED;
use switchyard_core::kv_hints::KvHintPolicy;
use switchyard_core::router::queue::{QueueConfig, QueueOrder};
use switchyard_core::router::{EngineStream, RouterConfig, RoutingPolicy};
use switchyard_policy_host::{
    EngineConfig as PolicyEngineConfig, PolicyEngine, PolicyStats, WasmAdmission, WasmKvHints,
    WasmRouter,
};
use switchyard_sim::workload::{self, Format, Workload};
use switchyard_sim::{
    IndexMode, Outcome, REPORT_SCHEMA, ReplicaAffinity, Report, SimConfig, Simulation, plot,
    timeline,
};

#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Trace file (or directory of Claude Code traces).
    #[arg(long)]
    trace: PathBuf,
    /// Trace format; detected when absent.
    #[arg(long)]
    format: Option<Format>,
    /// Convert the trace to this many tokens per block (and run the engines with it).
    #[arg(long)]
    block_size: Option<u32>,
    /// Run this many copies of every session, as distinct users (no shared prefixes).
    #[arg(long, default_value_t = 1)]
    replicate: usize,
    /// Simulated workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Routing policies to compare: native (`kv-cost`, `round-robin`), a built-in Wasm component
    /// (`wasm:kv-cost`, `wasm:bandit`, ...) or a `.wasm` file, run through the gateway's policy host
    /// (a Wasm policy takes parameters as `wasm:<name>:key=value:...`, given to its `configure`).
    #[arg(long, value_delimiter = ',', default_value = "kv-cost,round-robin")]
    policies: Vec<String>,
    /// Admission policies to compare: native (`none`, `thunder-agent`, `continuum`,
    /// `autellix`, with parameters as `name:key=value:...`, e.g.
    /// `thunder-agent:decay_half_life=1h`), a built-in Wasm component (`wasm:<name>`) or an
    /// admission `.wasm` file.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    admission: Vec<String>,
    /// KV-hint policies to compare, one run per value: native strategies
    /// (`demote-on-tool-call`, `subagent-reclaim`, `share-to-subagent`, `compaction-evict`,
    /// `no-hints`; parameters as `name:key=value:...`, several joined by `+`, e.g.
    /// `demote-on-tool-call:demote_threshold=500ms+subagent-reclaim`), a built-in Wasm
    /// component (`wasm:<name>`) or a kv-hints `.wasm` file. Each gateway replica runs the
    /// gateway's hint path with its own instance; without the flag there is none.
    #[arg(long, value_delimiter = ',')]
    kv_hints: Vec<String>,
    /// How often the hint path asks its policy while a session waits on a tool (the gateway's
    /// `[kv_hints] tick`), besides whenever lifecycle events arrive.
    #[arg(long, default_value = "100ms", value_parser = parse_gap)]
    kv_hints_tick: Duration,
    /// The gateway's `[server] engine_stream` for clients that do not stream: `auto`, engines
    /// answer whole where the router hears of each prefill's end from KV events (the stored
    /// event of the prompt's last full block) or can predict it from the rank's learnt prefill
    /// pace, else they stream; `always`, the router hears of each request's first token when it
    /// comes (as with streaming clients); `as-client`, engines answer whole, so without KV
    /// events (and with no streaming client to teach the pace) a request's prefill loads its
    /// worker in the router's view until the request ends.
    #[arg(long, default_value = "auto", value_parser = parse_engine_stream)]
    engine_stream: EngineStream,
    /// Router queue: a worker is saturated above this many engine steps of uncached prefill
    /// (x --max-batched-tokens); requests wait in the router while every worker is. 0: no queue.
    #[arg(long, default_value_t = 0.0)]
    queue_threshold: f64,
    /// Order of the router queue.
    #[arg(long, default_value = "fcfs")]
    queue_order: QueueOrder,
    /// Cut longer gaps between a session's requests (a user away) to this (`60s`, `2m`),
    /// before the speed-up divides them.
    #[arg(long, value_parser = parse_gap)]
    max_gap: Option<Duration>,
    /// Root sessions in flight at most, one run per value; `unlimited` for none.
    #[arg(long, value_delimiter = ',', default_value = "unlimited", value_parser = parse_concurrency)]
    concurrency: Vec<Option<usize>>,
    /// Divide arrival times and gaps by these, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    speedup: Vec<f64>,
    /// KV blocks per worker.
    #[arg(long, default_value_t = 16_384)]
    num_blocks: usize,
    /// Host KV tier (G2) per worker, in blocks (at least --num-blocks); none without it.
    #[arg(long)]
    host_tier_blocks: Option<usize>,
    /// Bytes of one KV block across layers, for the host tier's and the pool's load times
    /// (default: 128 KiB per token, a Llama-3-8B-class model in bf16, times the block size).
    #[arg(long)]
    kv_block_bytes: Option<u64>,
    /// Host-to-device bandwidth of loads from the host tier, in GB/s.
    #[arg(long, default_value_t = DEFAULT_HOST_BANDWIDTH / 1e9)]
    host_gb_per_s: f64,
    /// Disk KV tier (G3) per worker behind the host tier, in blocks: host evictions are written
    /// to it; none without it.
    #[arg(long)]
    disk_tier_blocks: Option<usize>,
    /// Disk-to-device bandwidth of loads from the disk tier, in GB/s.
    #[arg(long, default_value_t = DEFAULT_DISK_BANDWIDTH / 1e9)]
    disk_gb_per_s: f64,
    /// Shared KV pool (G4) of all workers, in blocks: engines publish the blocks they compute
    /// and fetch a prefix they lack from it; none without it.
    #[arg(long)]
    pool_blocks: Option<usize>,
    /// Pool-to-device bandwidth of fetches from the shared pool, in GB/s.
    #[arg(long, default_value_t = DEFAULT_POOL_BANDWIDTH / 1e9)]
    pool_gb_per_s: f64,
    /// KV tiers to compare, one run per value: `g1` (the device alone), `g1+g2` (with the host
    /// tier of --host-tier-blocks), `g1+g2+g3` (and the disk tier of --disk-tier-blocks),
    /// `g1+g4`, `g1+g2+g4`, `g1+g2+g3+g4` (with the pool of --pool-blocks). Default: the tiers
    /// those flags give.
    #[arg(long, value_delimiter = ',', value_parser = parse_tiers)]
    tiers: Vec<Tiers>,
    /// Most running requests per worker.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Most tokens per engine step (longer prefills are chunked).
    #[arg(long, default_value_t = 8_192)]
    max_batched_tokens: usize,
    /// How the engines name their blocks: `router` (by the router's hashes, as Dynamo's mocker
    /// names them by Dynamo's router's, so the index takes their events as they are) or `own`
    /// (a seed of their own, as vLLM's and SGLang's hashes differ from the gateway's, so their
    /// events go through the translation the gateway runs for such engines). The same results
    /// either way; `own` costs more CPU.
    #[arg(long, value_enum, default_value_t = EngineHashes::Router)]
    engine_hashes: EngineHashes,
    /// Delay of KV events from engine to index, in milliseconds of virtual time.
    #[arg(long, default_value_t = 5.0)]
    event_delay_ms: f64,
    /// Router sampling temperature (0: cheapest worker).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Seed of the router's tie-breaking (and of `--replica-affinity random`).
    #[arg(long, default_value_t = 0x5717_c4ad)]
    seed: u64,
    /// Gateway replicas over the workers, one run per value: each has its own router (bookings
    /// of its own decisions only), KV index and admission controller.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    replicas: Vec<usize>,
    /// How the load balancer spreads requests over the replicas, one run per value (with more
    /// than one replica): `session` (a stable hash of the root session id mod the replicas),
    /// `random` (per request, seeded), `round-robin` (per request).
    #[arg(long, value_delimiter = ',', default_value = "session")]
    replica_affinity: Vec<ReplicaAffinity>,
    /// What the replicas' KV indexes learn from, one run per value: `events` (every engine's
    /// KV events reach every replica) or `approximate` (no events: each replica predicts from
    /// its own decisions).
    #[arg(long, value_delimiter = ',', default_value = "events")]
    index: Vec<IndexMode>,
    /// Write the report as JSON (schema in docs/simulate.md).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Draw TTFT distributions and KV utilization (.svg or .png).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write a Chrome trace-event timeline per run (the run's label is added to the name when
    /// there are several).
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Runs at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
}

/// The setting by the name the gateway's config gives it.
fn parse_engine_stream(s: &str) -> Result<EngineStream, String> {
    serde_json::from_value(serde_json::Value::from(s))
        .map_err(|_| format!("`{s}` is not an engine_stream setting: auto, always or as-client"))
}

fn parse_gap(s: &str) -> Result<Duration, String> {
    switchyard_core::admission::parse_duration(s)
        .ok_or_else(|| format!("`{s}` is not a duration such as 100ms, 60s or 2m"))
}

/// Which KV tiers below the device a run has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiers {
    host: bool,
    disk: bool,
    pool: bool,
}

fn parse_tiers(s: &str) -> Result<Tiers, String> {
    let mut parts = s.split('+').map(str::trim).map(str::to_ascii_lowercase);
    if parts.next().as_deref() != Some("g1") {
        return Err(format!(
            "`{s}` does not start with g1 (e.g. g1, g1+g2, g1+g2+g4)"
        ));
    }
    let mut tiers = Tiers {
        host: false,
        disk: false,
        pool: false,
    };
    for part in parts {
        match part.as_str() {
            "g2" if !tiers.host && !tiers.pool => tiers.host = true,
            "g3" if tiers.host && !tiers.disk && !tiers.pool => tiers.disk = true,
            "g4" if !tiers.pool => tiers.pool = true,
            _ => {
                return Err(format!(
                    "`{s}` is not g1 followed by +g2, +g3 (after g2) and +g4, in that order"
                ));
            }
        }
    }
    Ok(tiers)
}

fn parse_concurrency(s: &str) -> Result<Option<usize>, String> {
    match s {
        "unlimited" | "none" => Ok(None),
        n => match n.parse::<usize>() {
            Ok(0) | Err(_) => Err(format!("`{n}` is not a positive number or `unlimited`")),
            Ok(n) => Ok(Some(n)),
        },
    }
}

pub(crate) fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let workload = load_workload(&args)?;
    let (outcomes, report) = simulate(&args, &workload)?;
    print!("{}", report.table());
    write_outputs(&args, &workload, &outcomes, &report)
}

/// The trace of `args`, converted and replicated as they say.
pub(crate) fn load_workload(args: &SimulateArgs) -> anyhow::Result<Workload> {
    let loaded = Instant::now();
    let mut workload = workload::load(&args.trace, args.format)
        .with_context(|| format!("loading {}", args.trace.display()))?;
    if let Some(block_size) = args.block_size {
        workload = workload.with_block_size(block_size)?;
    }
    if args.replicate > 1 {
        workload = workload.replicate(args.replicate);
    }
    eprintln!(
        "{}: {} sessions, {} requests, {}-token blocks (loaded in {:.1?})",
        args.trace.display(),
        workload.sessions.len(),
        workload.request_count(),
        workload.block_size,
        loaded.elapsed()
    );
    Ok(workload)
}

/// Every run `args` asks for on `workload`, and their report (runs in configuration order).
pub(crate) fn simulate(
    args: &SimulateArgs,
    workload: &Workload,
) -> anyhow::Result<(Vec<Outcome>, Report)> {
    let configs = configs(args, workload)?;
    let bar = ProgressBar::new((workload.request_count() * configs.len()) as u64).with_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec}, eta {eta})",
        )?,
    );
    let started = Instant::now();
    let outcomes = run_all(workload, &configs, args.jobs, &bar)?;
    bar.finish_and_clear();
    eprintln!(
        "simulated {} runs in {:.1?}",
        outcomes.len(),
        started.elapsed()
    );
    let report = Report {
        schema: REPORT_SCHEMA.to_owned(),
        trace: args.trace.display().to_string(),
        runs: outcomes.iter().map(Outcome::report).collect(),
    };
    Ok((outcomes, report))
}

/// The report, plot and timelines `args` asks for.
pub(crate) fn write_outputs(
    args: &SimulateArgs,
    workload: &Workload,
    outcomes: &[Outcome],
    report: &Report,
) -> anyhow::Result<()> {
    if let Some(path) = &args.report {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), report)?;
        eprintln!("report: {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::plot(report, path)?;
        eprintln!("plot: {}", path.display());
    }
    if let Some(path) = &args.timeline {
        for (outcome, run) in outcomes.iter().zip(&report.runs) {
            let file = if outcomes.len() == 1 {
                path.clone()
            } else {
                labelled(path, &run.label())
            };
            timeline::write(outcome, workload, &file)
                .with_context(|| format!("writing {}", file.display()))?;
            eprintln!("timeline: {}", file.display());
        }
    }
    Ok(())
}

/// The engine of one tier set: the device, and the host tier and pool it names.
fn engine(args: &SimulateArgs, workload: &Workload, tiers: Tiers) -> anyhow::Result<EngineConfig> {
    let block_bytes = args
        .kv_block_bytes
        .unwrap_or(DEFAULT_BLOCK_BYTES / 16 * u64::from(workload.block_size));
    let host_tier = match (tiers.host, args.host_tier_blocks) {
        (false, _) => None,
        (true, Some(num_blocks)) => Some(HostTierConfig {
            num_blocks,
            block_bytes,
            bandwidth_bytes_per_s: args.host_gb_per_s * 1e9,
        }),
        (true, None) => bail!("--tiers with g2 needs --host-tier-blocks"),
    };
    let disk_tier = match (tiers.disk, args.disk_tier_blocks) {
        (false, _) => None,
        (true, Some(num_blocks)) => Some(DiskTierConfig {
            num_blocks,
            block_bytes,
            bandwidth_bytes_per_s: args.disk_gb_per_s * 1e9,
        }),
        (true, None) => bail!("--tiers with g3 needs --disk-tier-blocks"),
    };
    let pool = match (tiers.pool, args.pool_blocks) {
        (false, _) => None,
        (true, Some(_)) => Some(PoolTierConfig {
            block_bytes,
            bandwidth_bytes_per_s: args.pool_gb_per_s * 1e9,
        }),
        (true, None) => bail!("--tiers with g4 needs --pool-blocks"),
    };
    Ok(EngineConfig {
        block_size: workload.block_size as usize,
        num_blocks: args.num_blocks,
        max_num_seqs: args.max_num_seqs,
        max_batched_tokens: args.max_batched_tokens,
        host_tier,
        disk_tier,
        pool,
        hash_seed: match args.engine_hashes {
            EngineHashes::Router => HASH_SEED,
            EngineHashes::Own => ENGINE_SEED,
        },
        ..EngineConfig::default()
    })
}

/// How the simulated engines name their blocks (`--engine-hashes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum EngineHashes {
    /// By the router's hashes.
    Router,
    /// By a seed of their own.
    Own,
}

/// The cross product of policies, concurrency levels, speed-ups and tier sets.
fn configs(args: &SimulateArgs, workload: &Workload) -> anyhow::Result<Vec<SimConfig>> {
    let tiers = if args.tiers.is_empty() {
        vec![Tiers {
            host: args.host_tier_blocks.is_some(),
            disk: args.disk_tier_blocks.is_some(),
            pool: args.pool_blocks.is_some(),
        }]
    } else {
        args.tiers.clone()
    };
    let engines = tiers
        .iter()
        .map(|&t| {
            Ok((
                engine(args, workload, t)?,
                t.pool.then_some(args.pool_blocks).flatten(),
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let queue = (args.queue_threshold > 0.0).then(|| QueueConfig {
        order: args.queue_order,
        max_prefill_tokens: Some((args.queue_threshold * args.max_batched_tokens as f64) as u64),
        ..QueueConfig::default()
    });
    let max_gap = args.max_gap;
    if args.replicas.contains(&0) {
        bail!("--replicas must be positive");
    }
    // One replica has no load balancer: one run, whatever the affinities.
    let mut placements = Vec::new();
    for &index in &args.index {
        for &replicas in &args.replicas {
            let affinities = if replicas == 1 {
                &args.replica_affinity[..1]
            } else {
                &args.replica_affinity[..]
            };
            for &affinity in affinities {
                placements.push((replicas, affinity, index));
            }
        }
    }
    // No flag: one run per setting without a hint path.
    let hint_policies: Vec<Option<String>> = if args.kv_hints.is_empty() {
        vec![None]
    } else {
        args.kv_hints.iter().cloned().map(Some).collect()
    };
    let mut configs = Vec::new();
    for &speedup in &args.speedup {
        for &concurrency in &args.concurrency {
            for policy in &args.policies {
                for (admission, kv_hints) in args
                    .admission
                    .iter()
                    .flat_map(|a| hint_policies.iter().map(move |h| (a, h)))
                {
                    for ((engine, pool_blocks), &(replicas, replica_affinity, index)) in engines
                        .iter()
                        .flat_map(|e| placements.iter().map(move |p| (e, p)))
                    {
                        configs.push(SimConfig {
                            workers: args.workers,
                            engine: engine.clone(),
                            pool_blocks: *pool_blocks,
                            router: RouterConfig {
                                temperature: args.temperature,
                                engine_stream: args.engine_stream,
                                ..RouterConfig::default()
                            },
                            policy: policy.clone(),
                            admission: admission.clone(),
                            queue: queue.clone(),
                            max_gap,
                            concurrency,
                            speedup,
                            event_delay: Duration::from_secs_f64(
                                args.event_delay_ms.max(0.0) / 1000.0,
                            ),
                            seed: args.seed,
                            replicas,
                            replica_affinity,
                            index,
                            kv_hints: kv_hints.clone(),
                            kv_hints_tick: args.kv_hints_tick,
                            ..SimConfig::default()
                        });
                    }
                }
            }
        }
    }
    Ok(configs)
}

/// Wasm routing policies for the simulator: the very components the gateway runs, through the
/// same host. A policy name `wasm:<built-in>` (e.g. `wasm:kv-cost`) or a path ending in `.wasm`
/// selects one; other names are native policies.
#[derive(Default)]
struct WasmPolicies {
    engine: std::sync::OnceLock<PolicyEngine>,
}

impl WasmPolicies {
    /// The component bytes `name` selects, if it names a Wasm policy.
    /// A `wasm:<name>:key=value:...` spec's parameters go to the component's 1.1 `configure`.
    fn bytes(spec: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let (name, _) = switchyard_policy_host::split_params(spec);
        let name = name.as_str();
        Ok(if let Some(builtin) = name.strip_prefix("wasm:") {
            Some(
                switchyard_policy_artifacts::find(builtin)
                    .with_context(|| format!("no built-in Wasm policy {builtin:?}"))?
                    .to_vec(),
            )
        } else if name.ends_with(".wasm") {
            Some(std::fs::read(name).with_context(|| format!("reading {name}"))?)
        } else {
            None
        })
    }

    fn engine(&self) -> anyhow::Result<&PolicyEngine> {
        Ok(match self.engine.get() {
            Some(engine) => engine,
            None => {
                let engine = PolicyEngine::new(PolicyEngineConfig::simulation())?;
                self.engine.get_or_init(|| engine)
            }
        })
    }

    fn policy(&self, name: &str) -> anyhow::Result<Option<Box<dyn RoutingPolicy>>> {
        let Some(bytes) = Self::bytes(name)? else {
            return Ok(None);
        };
        let component = self.engine()?.load_router(&bytes)?;
        let stats = std::sync::Arc::new(PolicyStats::default());
        let mut policy = WasmRouter::new(component, stats);
        policy
            .configure(switchyard_policy_host::split_params(name).1)
            .with_context(|| format!("configuring {name}"))?;
        Ok(Some(Box::new(policy)))
    }

    /// A Wasm KV-hint policy (`wasm:<built-in>` or a `.wasm` file), through the gateway's
    /// policy host; `None` for native specs.
    fn kv_hints(&self, name: &str) -> anyhow::Result<Option<Box<dyn KvHintPolicy>>> {
        let Some(bytes) = Self::bytes(name)? else {
            return Ok(None);
        };
        let component = self.engine()?.load_kv_hints(&bytes)?;
        let stats = std::sync::Arc::new(PolicyStats::default());
        let mut policy = WasmKvHints::new(component, stats);
        policy
            .configure(switchyard_policy_host::split_params(name).1)
            .with_context(|| format!("configuring {name}"))?;
        Ok(Some(Box::new(policy)))
    }

    /// A Wasm admission policy (`wasm:<built-in>` or a `.wasm` file), through the gateway's
    /// policy host; `None` for native names.
    fn admission(&self, name: &str) -> anyhow::Result<Option<Box<dyn AdmissionPolicy>>> {
        let Some(bytes) = Self::bytes(name)? else {
            return Ok(None);
        };
        let component = self.engine()?.load_admission(&bytes)?;
        let stats = std::sync::Arc::new(PolicyStats::default());
        let mut policy = WasmAdmission::new(component, stats);
        policy
            .configure(switchyard_policy_host::split_params(name).1)
            .with_context(|| format!("configuring {name}"))?;
        Ok(Some(Box::new(policy)))
    }
}

/// The simulation of `config`, with its Wasm routing and admission policies, if any.
fn simulation<'w>(
    workload: &'w Workload,
    config: SimConfig,
    wasm: &WasmPolicies,
) -> anyhow::Result<Simulation<'w>> {
    if WasmPolicies::bytes(&config.policy)?.is_none()
        && WasmPolicies::bytes(&config.admission)?.is_none()
    {
        return Ok(Simulation::new(workload, config)?);
    }
    // A policy instance per replica: each replica's router owns its own.
    let mut routing = Vec::with_capacity(config.replicas);
    let mut admission = Vec::with_capacity(config.replicas);
    for _ in 0..config.replicas {
        routing.push(match wasm.policy(&config.policy)? {
            Some(policy) => policy,
            None => switchyard_core::router::native_policy(&config.policy)
                .with_context(|| format!("unknown routing policy {:?}", config.policy))?,
        });
        if let Some(policy) = wasm.admission(&config.admission)? {
            admission.push(policy);
        }
    }
    // Native admission: the spec, parameters included, names it in the report.
    let admission = (!admission.is_empty()).then_some(admission);
    Ok(Simulation::with_replica_policies(
        workload, config, routing, admission,
    )?)
}

/// Run every configuration on `jobs` threads; outcomes come back in configuration order.
fn run_all(
    workload: &Workload,
    configs: &[SimConfig],
    jobs: Option<usize>,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Outcome>> {
    let wasm = WasmPolicies::default();
    let simulations = configs
        .iter()
        .map(|config| {
            // A Wasm KV-hint policy joins the simulation once it is built; a native spec is
            // built in.
            let mut config = config.clone();
            let hint_policies = match config.kv_hints.as_deref() {
                Some(name) if WasmPolicies::bytes(name)?.is_some() => {
                    let policies = (0..config.replicas)
                        .map(|_| wasm.kv_hints(name)?.context("a Wasm kv-hints policy"))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    config.kv_hints = None;
                    Some(policies)
                }
                _ => None,
            };
            let simulation = simulation(workload, config, &wasm)?;
            Ok(match hint_policies {
                Some(policies) => simulation.with_kv_hint_policies(policies)?,
                None => simulation,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let jobs = jobs
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .clamp(1, simulations.len().max(1));
    let pending = Mutex::new(simulations.into_iter().enumerate().collect::<Vec<_>>());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let next = pending.lock().map(|mut p| p.pop()).ok().flatten();
                    let Some((i, simulation)) = next else { break };
                    let outcome = simulation.run(&mut || bar.inc(1));
                    if let Ok(mut done) = done.lock() {
                        done.push((i, outcome));
                    }
                }
            });
        }
    });
    let mut done = done
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a run panicked"))?;
    if done.len() != configs.len() {
        bail!(
            "{} of {} runs did not finish",
            configs.len() - done.len(),
            configs.len()
        );
    }
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, outcome)| outcome).collect())
}

/// `out.json` with `label` -> `out.label.json`.
fn labelled(path: &Path, label: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{label}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{label}"),
    };
    path.with_file_name(name.replace(['@', '/', ' '], "-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use switchyard_sim::workload::Workload;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn configs_of(flags: &[&str]) -> anyhow::Result<Vec<SimConfig>> {
        let cli = Cli::try_parse_from(
            ["simulate", "--trace", "t.jsonl", "--policies", "kv-cost"]
                .iter()
                .chain(flags),
        )?;
        let workload = Workload {
            block_size: 16,
            sessions: Vec::new(),
        };
        configs(&cli.args, &workload)
    }

    #[test]
    fn replica_sweep_runs_one_replica_once() {
        let configs = configs_of(&[
            "--replicas",
            "1,2,4",
            "--replica-affinity",
            "session,random",
            "--index",
            "events,approximate",
        ])
        .unwrap();
        let runs: Vec<(usize, ReplicaAffinity, IndexMode)> = configs
            .iter()
            .map(|c| (c.replicas, c.replica_affinity, c.index))
            .collect();
        use IndexMode::*;
        use ReplicaAffinity::*;
        assert_eq!(
            runs,
            [
                (1, Session, Events),
                (2, Session, Events),
                (2, Random, Events),
                (4, Session, Events),
                (4, Random, Events),
                (1, Session, Approximate),
                (2, Session, Approximate),
                (2, Random, Approximate),
                (4, Session, Approximate),
                (4, Random, Approximate),
            ]
        );
        let default = configs_of(&[]).unwrap();
        assert_eq!(
            (default[0].replicas, default[0].index),
            (1, IndexMode::Events)
        );
        assert!(configs_of(&["--replicas", "0"]).is_err());
        assert!(configs_of(&["--replica-affinity", "sticky"]).is_err());
    }

    #[test]
    fn engine_stream_takes_the_gateways_setting_names() {
        let setting = |flags: &[&str]| configs_of(flags).map(|c| c[0].router.engine_stream);
        assert_eq!(
            setting(&[]).unwrap(),
            EngineStream::default(),
            "the gateway's"
        );
        for (name, value) in [
            ("auto", EngineStream::Auto),
            ("always", EngineStream::Always),
            ("as-client", EngineStream::AsClient),
        ] {
            assert_eq!(setting(&["--engine-stream", name]).unwrap(), value);
        }
        assert!(setting(&["--engine-stream", "as_client"]).is_err());
    }

    #[test]
    fn kv_hint_policies_are_swept_and_absent_by_default() {
        let configs = configs_of(&[
            "--admission",
            "none,thunder-agent",
            "--kv-hints",
            "no-hints,demote-on-tool-call:demote_threshold=500ms",
            "--kv-hints-tick",
            "250ms",
        ])
        .unwrap();
        let runs: Vec<(&str, Option<&str>)> = configs
            .iter()
            .map(|c| (c.admission.as_str(), c.kv_hints.as_deref()))
            .collect();
        let demote = Some("demote-on-tool-call:demote_threshold=500ms");
        assert_eq!(
            runs,
            [
                ("none", Some("no-hints")),
                ("none", demote),
                ("thunder-agent", Some("no-hints")),
                ("thunder-agent", demote),
            ]
        );
        assert!(
            configs
                .iter()
                .all(|c| c.kv_hints_tick == Duration::from_millis(250))
        );
        assert_eq!(configs_of(&[]).unwrap()[0].kv_hints, None);
        assert!(configs_of(&["--kv-hints-tick", "soon"]).is_err());
    }

    /// Two agents whose tools take 3 s, long enough for the component's default threshold.
    fn slow_tools() -> Workload {
        use switchyard_sim::workload::{Session, TraceRequest};
        let sessions = (0..2u64)
            .map(|a| {
                let requests = (1..=4u64)
                    .map(|t| TraceRequest {
                        gap: Duration::from_secs(if t == 1 { 0 } else { 3 }),
                        hash_ids: (0..8 * t).map(|b| a * 1_000 + b).collect(),
                        input_tokens: 8 * t as u32 * 16,
                        output_tokens: 8,
                    })
                    .collect();
                Session {
                    id: format!("agent-{a}"),
                    parent: None,
                    start: Duration::ZERO,
                    spawn: None,
                    requests,
                }
            })
            .collect();
        Workload {
            block_size: 16,
            sessions,
        }
    }

    #[test]
    fn a_wasm_kv_hint_policy_runs_like_its_native_twin() {
        let workload = slow_tools();
        let cli = Cli::try_parse_from([
            "simulate",
            "--trace",
            "t.jsonl",
            "--policies",
            "kv-cost",
            "--workers",
            "1",
            "--num-blocks",
            "64",
            "--host-tier-blocks",
            "256",
            "--kv-hints",
            // Demote whatever the device's usage, so that there are hints to compare.
            "demote-on-tool-call:demote_above_usage=0,wasm:demote-on-tool-call:demote_above_usage=0",
        ])
        .unwrap();
        let configs = configs(&cli.args, &workload).unwrap();
        let outcomes = run_all(&workload, &configs, Some(1), &ProgressBar::hidden()).unwrap();
        let [native, mut wasm] = [&outcomes[0], &outcomes[1]].map(Outcome::report);
        let hints = native.kv_hints.as_ref().expect("a hint report");
        assert!(hints.total("demote").actions > 0, "{hints:?}");
        // The component reports the name its metadata gives, without the parameters.
        let wasm_hints = wasm.kv_hints.as_mut().expect("a hint report");
        assert_eq!(wasm_hints.policy, "demote-on-tool-call");
        wasm_hints.policy.clone_from(&hints.policy);
        assert_eq!(wasm, native);
        assert!(
            configs_of(&["--kv-hints", "wasm:no-such-policy"])
                .and_then(|configs| {
                    run_all(&workload, &configs, Some(1), &ProgressBar::hidden())
                })
                .is_err()
        );
    }
}
