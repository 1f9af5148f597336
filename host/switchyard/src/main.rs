//! `switchyard`: the gateway (`serve`), a standalone mock engine (`mock-engine`) and the shared
//! KV pool (`kv-pool`).

mod embedded;
mod kv_pool;
mod mock_engine;
mod replay;
mod serve;
mod simulate;
mod trace;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "KV-aware gateway for agentic LLM traffic"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway. Without a config (or with no workers in it), start the embedded default:
    /// in-process mock engines on loopback.
    Serve {
        /// Configuration file (TOML); see examples/.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Listen address (overrides the file).
        #[arg(long)]
        host: Option<String>,
        /// Listen port (overrides the file).
        #[arg(long)]
        port: Option<u16>,
        /// Mock engines the embedded default starts.
        #[arg(long, default_value_t = 4)]
        mock_engines: u32,
    },
    /// Run one mock engine (OpenAI HTTP + vLLM-format KV events over ZMQ).
    MockEngine(Box<mock_engine::MockEngineArgs>),
    /// Run the shared KV pool (G4): put / get / exists by sequence hash over HTTP, memory and
    /// disk tiers, Mooncake-format events.
    KvPool(Box<kv_pool::KvPoolArgs>),
    /// Replay a trace against simulated workers and compare routing policies.
    Simulate(Box<simulate::SimulateArgs>),
    /// Send a trace to a live OpenAI-compatible endpoint and measure TTFT, ITL and throughput.
    Replay(Box<replay::ReplayArgs>),
    /// Trace files: convert between formats and block sizes.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve::stop_on_signals(shutdown.clone()));
    match Cli::parse().command {
        Command::Simulate(args) => simulate::run(*args),
        Command::Trace(command) => trace::run(command),
        Command::Replay(args) => replay::run(*args, shutdown).await,
        Command::KvPool(args) => kv_pool::run(*args, shutdown).await,
        Command::Serve {
            config,
            host,
            port,
            mock_engines,
        } => serve::run(config, host, port, mock_engines, shutdown).await,
        Command::MockEngine(args) => mock_engine::run(*args, shutdown).await,
    }
}
