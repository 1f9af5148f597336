//! `switchyard mock-engine`: one mock engine process (OpenAI HTTP, vLLM-format KV events over ZMQ,
//! optional host and disk tiers and a shared pool).

use anyhow::Context;
use switchyard_kv_events::wire::Encoding;
use switchyard_kv_pool::{ClientIdentity, ClientTls};
use switchyard_mock_engine::{
    AnswerLength, DiskTierConfig, HostTierConfig, MockEngineConfig, PoolSettings,
};
use switchyard_tokenizer::ModelTokenizer;
use tokio_util::sync::CancellationToken;

/// Flags of `switchyard mock-engine`.
#[derive(Debug, clap::Args)]
pub(crate) struct MockEngineArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Listen port.
    #[arg(long, default_value_t = 8100)]
    port: u16,
    /// KV-event PUB endpoint, e.g. tcp://127.0.0.1:5557; absent: publish no events.
    #[arg(long)]
    kv_events: Option<String>,
    /// Replay ROUTER endpoint, e.g. tcp://127.0.0.1:5558.
    #[arg(long)]
    replay: Option<String>,
    /// Event encoding: map (vLLM 0.34, SGLang 0.5.23: events as maps) or array (older vLLM).
    #[arg(long, default_value = "map", value_parser = ["array", "map"])]
    encoding: String,
    /// KV block size in tokens.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV cache capacity in blocks.
    #[arg(long, default_value_t = 16_384)]
    num_blocks: usize,
    /// Simulated time runs this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Model name served.
    #[arg(long)]
    model: Option<String>,
    /// Median length of unscripted answers, in tokens (log-normal around it).
    #[arg(long, default_value_t = AnswerLength::default().median_tokens)]
    answer_median_tokens: u32,
    /// Host KV tier (G2) in blocks, at least --num-blocks; none without it.
    #[arg(long)]
    host_tier_blocks: Option<usize>,
    /// Bytes of one KV block, moved between the tiers' memory (with --host-tier-blocks or
    /// --kv-pool; the pool's --block-bytes must be the same).
    #[arg(long, default_value_t = 4096)]
    kv_block_bytes: u64,
    /// Host-to-device bandwidth charged for loading host blocks, in GB/s.
    #[arg(long, default_value_t = 25.0)]
    host_gb_per_s: f64,
    /// Disk KV tier (G3) in blocks, behind --host-tier-blocks; none without it.
    #[arg(long, requires = "disk_tier_dir")]
    disk_tier_blocks: Option<usize>,
    /// Directory of the disk tier's slot file (discarded and rewritten at start).
    #[arg(long)]
    disk_tier_dir: Option<std::path::PathBuf>,
    /// Disk-to-device bandwidth charged for loading disk blocks, in GB/s.
    #[arg(long, default_value_t = 5.0)]
    disk_gb_per_s: f64,
    /// A shared KV pool (`switchyard kv-pool`, its base URL) to write computed blocks
    /// through to and to load prompt prefixes from.
    #[arg(long)]
    kv_pool: Option<String>,
    /// The pool's bearer token.
    #[arg(long, env = "SWITCHYARD_KV_POOL_TOKEN", hide_env_values = true)]
    kv_pool_token: Option<String>,
    /// PEM CA certificates an `https://` pool is also verified against (a private CA).
    #[arg(long, requires = "kv_pool")]
    kv_pool_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate presented to a pool that asks for one (mutual TLS).
    #[arg(long, requires_all = ["kv_pool", "kv_pool_key_file"])]
    kv_pool_cert_file: Option<std::path::PathBuf>,
    /// The private key of `--kv-pool-cert-file` (PEM).
    #[arg(long, requires = "kv_pool_cert_file")]
    kv_pool_key_file: Option<std::path::PathBuf>,
    /// Pool-to-device bandwidth charged for loading pool blocks, in GB/s.
    #[arg(long, default_value_t = 12.5)]
    pool_gb_per_s: f64,
    /// Longest wait for one pool call before the engine recomputes instead.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    kv_pool_timeout: std::time::Duration,
    /// Serve `POST /debug/kv_events` (`{"lose_batches": N, "replay": "silent"|"answering"}`):
    /// KV-event faults for tests. Off by default.
    #[arg(long, requires = "kv_events")]
    fault_switches: bool,
}

/// Run the engine until `shutdown`.
pub(crate) async fn run(args: MockEngineArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let MockEngineArgs {
        host,
        port,
        kv_events,
        replay,
        encoding,
        block_size,
        num_blocks,
        speedup,
        model,
        answer_median_tokens,
        host_tier_blocks,
        kv_block_bytes,
        host_gb_per_s,
        disk_tier_blocks,
        disk_tier_dir,
        disk_gb_per_s,
        kv_pool,
        kv_pool_token,
        kv_pool_ca_file,
        kv_pool_cert_file,
        kv_pool_key_file,
        pool_gb_per_s,
        kv_pool_timeout,
        fault_switches,
    } = args;
    let tokenizer = ModelTokenizer::embedded_agent_model()?;
    let config = MockEngineConfig {
        host: host.parse().context("--host must be an IP address")?,
        port,
        served_model_name: model,
        block_size,
        num_blocks,
        speedup,
        kv_events,
        replay_endpoint: replay,
        encoding: if encoding == "map" {
            Encoding::Map
        } else {
            Encoding::Array
        },
        answer_length: AnswerLength {
            median_tokens: answer_median_tokens,
            ..AnswerLength::default()
        },
        host_tier: host_tier_blocks.map(|num_blocks| HostTierConfig {
            num_blocks,
            block_bytes: kv_block_bytes,
            bandwidth_bytes_per_s: host_gb_per_s * 1e9,
        }),
        disk_tier: disk_tier_blocks
            .zip(disk_tier_dir)
            .map(|(num_blocks, dir)| {
                let disk = DiskTierConfig {
                    num_blocks,
                    block_bytes: kv_block_bytes,
                    bandwidth_bytes_per_s: disk_gb_per_s * 1e9,
                };
                (disk, dir)
            }),
        pool: kv_pool.map(|url| {
            let settings = PoolSettings {
                url,
                token: kv_pool_token,
                tls: ClientTls {
                    ca_file: kv_pool_ca_file,
                    identity: kv_pool_cert_file.zip(kv_pool_key_file).map(
                        |(cert_file, key_file)| ClientIdentity {
                            cert_file,
                            key_file,
                        },
                    ),
                },
                bandwidth_bytes_per_s: pool_gb_per_s * 1e9,
                timeout: kv_pool_timeout,
            };
            (settings, kv_block_bytes)
        }),
        fault_switches,
        ..MockEngineConfig::default()
    };
    let engine = switchyard_mock_engine::spawn(config, tokenizer, shutdown.clone()).await?;
    println!("mock engine listening on {}", engine.base_url());
    if let Some(events) = engine.kv_events_endpoint() {
        println!("kv events on {events}");
    }
    if let Some(replay) = engine.replay_endpoint() {
        println!("replay on {replay}");
    }
    engine.stopped().await?;
    Ok(())
}
