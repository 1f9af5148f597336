//! `switchyard`: the gateway (`serve`), a standalone mock engine (`mock-engine`), the shared
//! KV pool (`kv-pool`), the simulator (`simulate`) and the policy author's tools (`policy`).

mod discover;
mod embedded;
mod kv_pool;
mod mock_engine;
mod policy;
mod replay;
mod serve;
mod simulate;
mod trace;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc's malloc: the gateway allocates per request on every worker
/// thread, and glibc's arena locks and trims showed in its profile (docs/benchmarks.md (k)).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

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
    /// Run the gateway. Without a config (or with neither workers nor discovery in it), start the
    /// embedded default: in-process mock engines on loopback.
    Serve(serve::ServeArgs),
    /// Run as an endpoint picker for Envoy (the Gateway API Inference Extension's ext_proc): the
    /// gateway's decision over gRPC, Envoy forwarding the requests. The gateway's HTTP listener
    /// stays up for /health, /metrics and the admin API.
    Epp {
        #[command(flatten)]
        serve: serve::ServeArgs,
        /// The ext_proc gRPC listener.
        #[arg(long, default_value = "0.0.0.0:9002")]
        grpc: std::net::SocketAddr,
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
    /// Write a policy: scaffold a crate on the SDK (`new`), run the gateway's load checks on a
    /// component (`check`), compare it with a baseline in the simulator (`test`).
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Trace files: convert between formats and block sizes.
    #[command(subcommand)]
    Trace(trace::TraceCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The policy tools report a load's outcome themselves: the registry's own lines would say
    // it twice. The zeromq crate logs every peer's connect and disconnect at info, with its
    // binary identity; our subscribers report their connections themselves.
    let default_filter = match cli.command {
        Command::Policy(_) => "warn,switchyard_policy_host::slot=error",
        _ => "info,zeromq=warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .init();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve::stop_on_signals(shutdown.clone()));
    match cli.command {
        Command::Simulate(args) => simulate::run(*args),
        Command::Trace(command) => trace::run(command),
        Command::Policy(command) => policy::run(command),
        Command::Replay(args) => replay::run(*args, shutdown).await,
        Command::KvPool(args) => kv_pool::run(*args, shutdown).await,
        Command::Serve(args) => serve::run(args, None, shutdown).await,
        Command::Epp { serve, grpc } => serve::run(serve, Some(grpc), shutdown).await,
        Command::MockEngine(args) => mock_engine::run(*args, shutdown).await,
    }
}
