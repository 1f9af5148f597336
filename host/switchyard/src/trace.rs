//! `switchyard trace convert` (between trace formats, block sizes converted explicitly) and
//! `switchyard trace timeline` (a gateway recording as a Perfetto timeline).

use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;
use switchyard_sim::workload::{self, Format};

#[derive(Debug, Subcommand)]
pub(crate) enum TraceCommand {
    /// Read a trace in one format and write it in another.
    Convert {
        /// Input trace (a directory for Claude Code traces).
        #[arg(long)]
        from: PathBuf,
        /// Input format; detected when absent.
        #[arg(long)]
        from_format: Option<Format>,
        /// Output file (`.gz` compresses).
        #[arg(long)]
        to: PathBuf,
        /// Output format: mooncake, mooncake-delta or request-trace.
        #[arg(long)]
        to_format: Format,
        /// Tokens per block of the output; one block size must divide the other.
        #[arg(long)]
        block_size: Option<u32>,
    },
    /// Turn a gateway request trace (a segment, a directory or a prefix) into a Chrome
    /// trace-event timeline: a track per worker and per session (queue, prefill, decode, tools).
    Timeline {
        /// The recorded trace.
        #[arg(long)]
        trace: PathBuf,
        /// Where to write the timeline JSON (open it in Perfetto).
        #[arg(long)]
        out: PathBuf,
    },
}

pub(crate) fn run(command: TraceCommand) -> anyhow::Result<()> {
    match command {
        TraceCommand::Convert {
            from,
            from_format,
            to,
            to_format,
            block_size,
        } => {
            let mut loaded = workload::load(&from, from_format)
                .with_context(|| format!("loading {}", from.display()))?;
            if let Some(block_size) = block_size {
                loaded = loaded.with_block_size(block_size)?;
            }
            workload::write(&loaded, &to, to_format)?;
            eprintln!(
                "{} sessions, {} requests, {}-token blocks -> {} ({to_format})",
                loaded.sessions.len(),
                loaded.request_count(),
                loaded.block_size,
                to.display()
            );
            Ok(())
        }
        TraceCommand::Timeline { trace, out } => {
            let lines = switchyard_gateway::trace::read_trace(&trace)
                .with_context(|| format!("reading {}", trace.display()))?;
            let timeline = switchyard_gateway::trace::live_timeline(&lines);
            std::fs::write(&out, serde_json::to_vec(&timeline)?)
                .with_context(|| format!("writing {}", out.display()))?;
            eprintln!("{} trace lines -> {}", lines.len(), out.display());
            Ok(())
        }
    }
}
