//! Gateway throughput while the routing policy is hot-swapped, against the same gateway without
//! swaps, in one run.
//!
//! Starts two in-process mock engines (fast simulated compute, real KV events) and the gateway on
//! 127.0.0.1 with `[policies]` watching a temporary directory whose `active.wasm` routes. Each
//! round sends a fixed number of chat requests from concurrent clients twice: once untouched,
//! once while a task rewrites `active.wasm` every `SWAP_BENCH_SWAP_MS`, alternating the built-in
//! `round-robin` and `kv-cost` components (each write is compiled from the engine's cache,
//! checked, canaried and swapped). It prints throughput, latency and the swaps seen in the admin
//! listing, then the ratio.
//!
//! `cargo bench -p switchyard --bench swap_throughput`
//!
//! Environment: `SWAP_BENCH_REQUESTS` per phase (default 10,000), `SWAP_BENCH_CONCURRENCY`
//! (default 16), `SWAP_BENCH_SWAP_MS` (default 100), `SWAP_BENCH_ROUNDS` (default 3).

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard_gateway::config::{Config, RawConfig, WorkerConfig};
use switchyard_gateway::policies::PoliciesConfig;
use switchyard_kv_events::wire::Encoding;
use switchyard_mock_engine::{MockEngineConfig, MockEngineHandle};
use switchyard_tokenizer::ModelTokenizer;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "swap-bench";
/// The gateway's reload debounce: short, so swaps are frequent.
const DEBOUNCE: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
struct Settings {
    requests: u64,
    concurrency: u64,
    swap_every: Duration,
    rounds: u32,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str, default: u64| -> anyhow::Result<u64> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .with_context(|| format!("{name}={v:?} is not a number")),
                Err(_) => Ok(default),
            }
        };
        let settings = Self {
            requests: var("SWAP_BENCH_REQUESTS", 10_000)?,
            concurrency: var("SWAP_BENCH_CONCURRENCY", 16)?,
            swap_every: Duration::from_millis(var("SWAP_BENCH_SWAP_MS", 100)?),
            rounds: u32::try_from(var("SWAP_BENCH_ROUNDS", 3)?)?,
        };
        if settings.requests == 0 || settings.concurrency == 0 || settings.swap_every.is_zero() {
            bail!("SWAP_BENCH_REQUESTS, _CONCURRENCY and _SWAP_MS must be positive");
        }
        Ok(settings)
    }
}

/// A temporary policy directory, removed on drop.
struct PolicyDir(PathBuf);

impl PolicyDir {
    fn new() -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("switchyard-swap-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

/// Write `active.wasm` like cargo or an editor: a temporary file renamed into place.
fn install(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(".active.wasm.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, dir.join("active.wasm"))
}

impl Drop for PolicyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One phase's outcome.
struct Phase {
    elapsed: Duration,
    ok: u64,
    failed: u64,
    latency_us: Histogram<u64>,
    swaps: u64,
}

impl Phase {
    fn throughput(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    fn row(&self, label: &str) -> String {
        format!(
            "| {label} | {:.0} req/s | {:.2} ms | {:.2} ms | {} | {} |",
            self.throughput(),
            self.latency_us.value_at_quantile(0.5) as f64 / 1e3,
            self.latency_us.value_at_quantile(0.99) as f64 / 1e3,
            self.swaps,
            self.failed,
        )
    }
}

fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings))
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let tokenizer = ModelTokenizer::embedded_default()?;
    let dir = PolicyDir::new()?;
    install(&dir.0, switchyard_policy_artifacts::KV_COST)?;
    let mut engines = Vec::new();
    for _ in 0..2 {
        engines.push(engine(&tokenizer, &shutdown).await?);
    }
    let raw = RawConfig {
        workers: engines.iter().map(worker).collect::<anyhow::Result<_>>()?,
        policies: Some(PoliciesConfig {
            dir: Some(dir.0.clone()),
            router: Some("active".into()),
            admin_token: Some(TOKEN.into()),
            debounce: DEBOUNCE,
            ..PoliciesConfig::default()
        }),
        ..RawConfig::default()
    };
    let mut config = Config::try_from(raw)?;
    config.listen = (std::net::Ipv4Addr::LOCALHOST, 0).into();
    let gateway = switchyard_gateway::start(config, tokenizer.clone(), shutdown.clone()).await?;
    let url = format!("http://{}", gateway.addr());
    let client = reqwest::Client::new();
    let model = tokenizer.name().to_string();

    // Warm up connections, the tokenizer and the policy's instance.
    load(&client, &url, &model, 200, settings.concurrency, "warm-up").await?;
    println!(
        "{} requests per phase, {} concurrent clients, a swap every {:?} (debounce {DEBOUNCE:?})\n",
        settings.requests, settings.concurrency, settings.swap_every
    );
    println!("| phase | throughput | p50 | p99 | swaps | failed |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut steady_total, mut swapping_total) = (0.0, 0.0);
    for round in 0..settings.rounds {
        let tag = format!("r{round}");
        let mut steady = load(
            &client,
            &url,
            &model,
            settings.requests,
            settings.concurrency,
            &tag,
        )
        .await?;
        steady.swaps = 0;
        println!("{}", steady.row(&format!("round {round}, no swaps")));
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = tokio::spawn(swap_loop(
            client.clone(),
            url.clone(),
            dir.0.clone(),
            settings.swap_every,
            stop.clone(),
        ));
        let mut swapping = load(
            &client,
            &url,
            &model,
            settings.requests,
            settings.concurrency,
            &format!("{tag}-swapping"),
        )
        .await?;
        stop.store(true, Ordering::Relaxed);
        swapping.swaps = swapper.await??;
        println!("{}", swapping.row(&format!("round {round}, swapping")));
        if steady.failed + swapping.failed > 0 {
            bail!("requests failed: a swap must never fail traffic");
        }
        steady_total += steady.throughput();
        swapping_total += swapping.throughput();
    }
    println!(
        "\nthroughput while swapping / without: {:.3} (mean over {} rounds)",
        swapping_total / steady_total,
        settings.rounds
    );
    shutdown.cancel();
    gateway.wait().await;
    Ok(())
}

async fn engine(
    tokenizer: &ModelTokenizer,
    shutdown: &CancellationToken,
) -> anyhow::Result<MockEngineHandle> {
    let config = MockEngineConfig {
        host: std::net::Ipv4Addr::LOCALHOST.into(),
        port: 0,
        kv_events: Some("tcp://127.0.0.1:0".into()),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        encoding: Encoding::Array,
        // Simulated compute 1000x faster than real: the gateway, not the engine, is measured.
        speedup: 1000.0,
        ..MockEngineConfig::default()
    };
    Ok(switchyard_mock_engine::spawn(config, tokenizer.clone(), shutdown.clone()).await?)
}

/// How the gateway reaches `engine`; through serde, so fields added later take their defaults.
fn worker(engine: &MockEngineHandle) -> anyhow::Result<WorkerConfig> {
    Ok(serde_json::from_value(json!({
        "url": engine.base_url(),
        "kind": "mock",
        "kv_events": engine.kv_events_endpoint(),
        "replay": engine.replay_endpoint(),
        "block_size": MockEngineConfig::default().block_size,
    }))?)
}

/// Send `requests` chat requests from `concurrency` clients; each conversation is new.
async fn load(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    requests: u64,
    concurrency: u64,
    tag: &str,
) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let lanes: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, next) = (client.clone(), next.clone());
            let endpoint = format!("{url}/v1/chat/completions");
            let (model, tag) = (model.to_string(), tag.to_string());
            tokio::spawn(async move {
                let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                let (mut ok, mut failed) = (0, 0);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= requests {
                        break;
                    }
                    let body = json!({"model": model, "max_tokens": 2, "messages": [
                        {"role": "system", "content": "You are a coding agent. Be brief."},
                        {"role": "user", "content": format!("{tag} task {n}: list the files")}]});
                    let sent = Instant::now();
                    match client.post(&endpoint).json(&body).send().await {
                        Ok(r) if r.status().is_success() => {
                            r.bytes().await?;
                            latency.saturating_record(sent.elapsed().as_micros() as u64);
                            ok += 1;
                        }
                        Ok(r) => {
                            eprintln!("request {n}: {} {}", r.status(), r.text().await?);
                            failed += 1;
                        }
                        Err(e) => {
                            eprintln!("request {n}: {e}");
                            failed += 1;
                        }
                    }
                }
                anyhow::Ok((ok, failed, latency))
            })
        })
        .collect();
    let mut phase = Phase {
        elapsed: Duration::ZERO,
        ok: 0,
        failed: 0,
        latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        swaps: 0,
    };
    for lane in lanes {
        let (ok, failed, latency) = lane.await??;
        phase.ok += ok;
        phase.failed += failed;
        phase.latency_us.add(latency)?;
    }
    phase.elapsed = started.elapsed();
    Ok(phase)
}

/// Rewrite `active.wasm` every `every`, alternating two built-ins, until `stop`; returns how
/// many swaps the admin listing showed (the active version's hash changed).
async fn swap_loop(
    client: reqwest::Client,
    url: String,
    dir: PathBuf,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<u64> {
    let versions = [
        switchyard_policy_artifacts::ROUND_ROBIN,
        switchyard_policy_artifacts::KV_COST,
    ];
    let mut last = active_hash(&client, &url).await?;
    let mut swaps = 0;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        install(&dir, versions[i % 2])?;
        i += 1;
        tokio::time::sleep(every).await;
        let now = active_hash(&client, &url).await?;
        if now != last {
            swaps += 1;
            last = now;
        }
    }
    Ok(swaps)
}

async fn active_hash(client: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let listing: Value = client
        .get(format!("{url}/admin/policies"))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .json()
        .await?;
    Ok(listing["policies"][0]["content_hash"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}
