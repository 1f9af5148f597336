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
    DiskTierConfig, EngineConfig, HostTierConfig, PoolTierConfig,
};
use switchyard_core::router::queue::{QueueConfig, QueueOrder};
use switchyard_core::router::{RouterConfig, RoutingPolicy};
use switchyard_policy_host::{
    EngineConfig as PolicyEngineConfig, PolicyEngine, PolicyStats, WasmAdmission, WasmRouter,
};
use switchyard_sim::workload::{self, Format, Workload};
use switchyard_sim::{Outcome, REPORT_SCHEMA, Report, SimConfig, Simulation, plot, timeline};

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
    /// (`wasm:kv-cost`, `wasm:bandit`, ...) or a `.wasm` file, run through the gateway's policy host.
    #[arg(long, value_delimiter = ',', default_value = "kv-cost,round-robin")]
    policies: Vec<String>,
    /// Admission policies to compare: native (`none`, `thunder-agent`, `continuum`,
    /// `autellix`, with parameters as `name:key=value:...`, e.g.
    /// `thunder-agent:decay_half_life=1h`), a built-in Wasm component (`wasm:<name>`) or an
    /// admission `.wasm` file.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    admission: Vec<String>,
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
    /// Delay of KV events from engine to index, in milliseconds of virtual time.
    #[arg(long, default_value_t = 5.0)]
    event_delay_ms: f64,
    /// Router sampling temperature (0: cheapest worker).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Seed of the router's tie-breaking.
    #[arg(long, default_value_t = 0x5717_c4ad)]
    seed: u64,
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

fn parse_gap(s: &str) -> Result<Duration, String> {
    switchyard_core::admission::parse_duration(s)
        .ok_or_else(|| format!("`{s}` is not a duration such as 60s or 2m"))
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
    let configs = configs(&args, &workload)?;
    let bar = ProgressBar::new((workload.request_count() * configs.len()) as u64).with_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec}, eta {eta})",
        )?,
    );
    let started = Instant::now();
    let outcomes = run_all(&workload, &configs, args.jobs, &bar)?;
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
    print!("{}", report.table());
    if let Some(path) = &args.report {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)?;
        eprintln!("report: {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::plot(&report, path)?;
        eprintln!("plot: {}", path.display());
    }
    if let Some(path) = &args.timeline {
        for (outcome, run) in outcomes.iter().zip(&report.runs) {
            let file = if outcomes.len() == 1 {
                path.clone()
            } else {
                labelled(path, &run.label())
            };
            timeline::write(outcome, &workload, &file)
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
        ..EngineConfig::default()
    })
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
    let mut configs = Vec::new();
    for &speedup in &args.speedup {
        for &concurrency in &args.concurrency {
            for policy in &args.policies {
                for admission in &args.admission {
                    for (engine, pool_blocks) in &engines {
                        configs.push(SimConfig {
                            workers: args.workers,
                            engine: engine.clone(),
                            pool_blocks: *pool_blocks,
                            router: RouterConfig {
                                temperature: args.temperature,
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
    fn bytes(name: &str) -> anyhow::Result<Option<Vec<u8>>> {
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
                let engine = PolicyEngine::new(PolicyEngineConfig::default())?;
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
        Ok(Some(Box::new(WasmRouter::new(component, stats))))
    }

    /// A Wasm admission policy (`wasm:<built-in>` or a `.wasm` file), through the gateway's
    /// policy host; `None` for native names.
    fn admission(&self, name: &str) -> anyhow::Result<Option<Box<dyn AdmissionPolicy>>> {
        let Some(bytes) = Self::bytes(name)? else {
            return Ok(None);
        };
        let component = self.engine()?.load_admission(&bytes)?;
        let stats = std::sync::Arc::new(PolicyStats::default());
        Ok(Some(Box::new(WasmAdmission::new(component, stats))))
    }
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
            let routing = wasm.policy(&config.policy)?;
            let admission = wasm.admission(&config.admission)?;
            Ok(match (routing, admission) {
                (None, None) => Simulation::new(workload, config.clone())?,
                (Some(policy), None) => Simulation::with_policy(workload, config.clone(), policy)?,
                (routing, Some(admission)) => {
                    let routing = match routing {
                        Some(policy) => policy,
                        None => switchyard_core::router::native_policy(&config.policy)
                            .with_context(|| {
                                format!("unknown routing policy {:?}", config.policy)
                            })?,
                    };
                    Simulation::with_policies(workload, config.clone(), routing, admission)?
                }
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
