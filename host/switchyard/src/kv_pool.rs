//! `switchyard kv-pool`: the shared KV pool service (G4) on its own.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use switchyard_kv_pool::{DiskConfig, PoolConfig, ServiceConfig};
use tokio_util::sync::CancellationToken;

/// The flags of `switchyard kv-pool`.
#[derive(Debug, clap::Args)]
pub(crate) struct KvPoolArgs {
    /// Listen address (port 0: the OS picks; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
    /// Bytes of every block (one size per pool; puts and gets of another size are refused).
    #[arg(long)]
    block_bytes: usize,
    /// Memory tier capacity in blocks.
    #[arg(long)]
    memory_blocks: usize,
    /// Disk tier directory (its slot file is recreated at start); none without it.
    #[arg(long, requires = "disk_blocks")]
    disk_dir: Option<PathBuf>,
    /// Disk tier capacity in blocks.
    #[arg(long, requires = "disk_dir")]
    disk_blocks: Option<usize>,
    /// Most bytes the disk tier's file may take (below what the disk has).
    #[arg(long, requires = "disk_dir")]
    disk_max_bytes: Option<u64>,
    /// Most blocks in one put or get.
    #[arg(long, default_value_t = 64)]
    max_batch_blocks: usize,
    /// Mooncake-format KV events PUB endpoint, e.g. tcp://127.0.0.1:5600; none without it.
    #[arg(long)]
    events_endpoint: Option<String>,
    /// The events' replay ROUTER endpoint, e.g. tcp://127.0.0.1:5601.
    #[arg(long, requires = "events_endpoint")]
    events_replay_endpoint: Option<String>,
    /// The events' `backend_id`.
    #[arg(long, default_value = "switchyard-kv-pool")]
    backend_id: String,
    /// Bearer token every /v1 call must carry.
    #[arg(long, env = "SWITCHYARD_KV_POOL_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (read again when it changes on disk).
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Require client certificates signed by the CAs in this PEM file (mutual TLS).
    #[arg(long, requires = "tls_cert_file")]
    tls_client_ca_file: Option<PathBuf>,
}

/// Serve until a signal cancels `shutdown`.
pub(crate) async fn run(args: KvPoolArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let pool = PoolConfig {
        disk: args.disk_dir.map(|dir| DiskConfig {
            dir,
            blocks: args.disk_blocks.unwrap_or(0),
            max_bytes: args.disk_max_bytes,
        }),
        max_batch_blocks: args.max_batch_blocks,
        backend_id: args.backend_id,
        ..PoolConfig::memory(args.block_bytes, args.memory_blocks)
    };
    let config = ServiceConfig {
        listen: args.listen,
        pool,
        auth_token: args.auth_token,
        events_endpoint: args.events_endpoint,
        replay_endpoint: args.events_replay_endpoint,
        tls: args
            .tls_cert_file
            .zip(args.tls_key_file)
            .map(|(cert_file, key_file)| switchyard_tls::ServerTls {
                cert_file,
                key_file,
                client_ca_file: args.tls_client_ca_file,
            }),
    };
    let service = switchyard_kv_pool::spawn(config, shutdown)
        .await
        .context("starting the kv pool")?;
    println!("kv pool listening on {}", service.base_url());
    if let Some(events) = service.events() {
        println!("kv pool events on {}", events.publish);
        if let Some(replay) = &events.replay {
            println!("kv pool replay on {replay}");
        }
    }
    service.stopped().await.context("kv pool server")?;
    println!("kv pool stopped");
    Ok(())
}
