//! The workload schema: what every trace format loads into and is written from.
//!
//! A workload is a set of sessions (agents, conversations, or lone requests). A session's requests
//! run closed loop: each starts its `gap` after the previous one *finished*, so a faster server
//! lets an agent take its next step sooner. A sub-agent is a child session spawned when one of its
//! parent's requests finishes; a joining child holds the parent's next request back until it ends.
//! Prompts are cumulative chains of block ids: equal ids at equal positions mean equal prefixes.

mod claude_code;
mod io;
mod mooncake;
mod request_trace;
mod schedule;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use request_trace::SCHEMA as REQUEST_TRACE_SCHEMA;
pub use schedule::{SpawnTree, open_loop_times};

/// Sessions of requests over prompts named by block ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Tokens per hash id.
    pub block_size: u32,
    /// Every session, roots and children.
    pub sessions: Vec<Session>,
}

/// One agent, conversation or lone request.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// Unique within the workload.
    pub id: String,
    /// The session that spawned this one (a sub-agent's agent).
    pub parent: Option<String>,
    /// A root session: offset of its arrival from the workload's start. A spawned session: delay
    /// after the parent's request `spawn.after` finished.
    pub start: Duration,
    /// When a child session starts, relative to its parent; `None` for roots (and for children
    /// whose spawning request is unknown, which then start at the absolute `start`).
    pub spawn: Option<Spawn>,
    /// Requests in order.
    pub requests: Vec<TraceRequest>,
}

/// How a child session hangs off its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawn {
    /// Index of the parent's request whose finish starts this session.
    pub after: usize,
    /// The parent's request `after + 1` waits until this session's last request finished (a
    /// blocking sub-agent call); its `gap` counts from the later of the two finishes.
    pub join: bool,
}

/// One LLM call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Delay after the previous request of the session finished (closed loop; see [`Spawn::join`]);
    /// for the first request, after the session's start.
    pub gap: Duration,
    /// The cumulative prompt, one id per block of `block_size` tokens (the last may be partial).
    pub hash_ids: Vec<u64>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
}

/// Trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Mooncake FAST'25 JSONL: `timestamp` (ms), cumulative `hash_ids`; every row a lone request.
    Mooncake,
    /// Mooncake rows with `session_id`; later turns carry `delay` (ms after the previous turn
    /// finished) and only the blocks they append.
    MooncakeDelta,
    /// Claude Code traces (kv-cache-tester): one JSON file per session, or a directory of them.
    ClaudeCode,
    /// Switchyard's own request trace (`switchyard.request.trace.v1` JSON lines, optionally gzip).
    RequestTrace,
}

impl Format {
    /// Every format, for help texts.
    pub const ALL: [Format; 4] = [
        Format::Mooncake,
        Format::MooncakeDelta,
        Format::ClaudeCode,
        Format::RequestTrace,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Mooncake => "mooncake",
            Format::MooncakeDelta => "mooncake-delta",
            Format::ClaudeCode => "claude-code",
            Format::RequestTrace => "request-trace",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| WorkloadError::UnknownFormat(s.to_owned()))
    }
}

/// Why a workload could not be loaded, converted or written.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Reading or writing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A record is not what its format says.
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line (1 for whole-file JSON).
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// No format given and none recognised.
    #[error("{}: cannot tell the trace format; pass one of {names}", .0.display(), names = format_names())]
    Undetected(PathBuf),
    /// Not a format name.
    #[error("unknown trace format `{0}`; expected one of {names}", names = format_names())]
    UnknownFormat(String),
    /// The block sizes do not divide one another.
    #[error("cannot convert {from}-token blocks to {to}-token blocks: one must divide the other")]
    BlockSize {
        /// Current block size.
        from: u32,
        /// Requested block size.
        to: u32,
    },
    /// A trace no simulation could run: where, the value and the bound it breaks.
    #[error("{subject}: {reason}")]
    Invalid {
        /// The file when loaded from one, then the session, or the whole trace.
        subject: String,
        /// What is wrong.
        reason: String,
    },
    /// The target format cannot express this workload.
    #[error("{format} cannot express session `{session}`: {reason}")]
    Inexpressible {
        /// Target format.
        format: Format,
        /// The session.
        session: String,
        /// What it lacks.
        reason: &'static str,
    },
}

fn format_names() -> String {
    Format::ALL.map(Format::name).join(", ")
}

/// Load a trace; `None` detects the format from the path and the first record. A trace whose
/// values no simulation could run ([`Workload::check`]) is refused, naming the session.
pub fn load(path: &Path, format: Option<Format>) -> Result<Workload, WorkloadError> {
    let format = match format {
        Some(format) => format,
        None => io::detect(path)?,
    };
    let workload = match format {
        Format::Mooncake => mooncake::load(path, false),
        Format::MooncakeDelta => mooncake::load(path, true),
        Format::ClaudeCode => claude_code::load(path),
        Format::RequestTrace => request_trace::load(path),
    }?;
    workload.check().map_err(|error| match error {
        WorkloadError::Invalid { subject, reason } => WorkloadError::Invalid {
            subject: format!("{}: {subject}", path.display()),
            reason,
        },
        other => other,
    })?;
    Ok(workload)
}

/// Most tokens a request's prompt, or its output, may have: beyond any model's context window.
pub const MAX_REQUEST_TOKENS: u32 = 1 << 24;

/// Longest a trace may span, from its start to a session's last request (gaps summed): a year.
/// The simulator's clock holds 584 years of nanoseconds, and `--speedup` can stretch the trace.
pub const MAX_TRACE_SPAN: Duration = Duration::from_secs(365 * 24 * 3600);

/// Write `workload` to `path` in `format` (gzip when the path ends in `.gz`).
///
/// Mooncake rows are open loop: requests are written at the times they would be sent if every
/// request took no time ([`open_loop_times`]). Claude Code traces are read-only.
pub fn write(workload: &Workload, path: &Path, format: Format) -> Result<(), WorkloadError> {
    match format {
        Format::Mooncake => mooncake::write(workload, path, false),
        Format::MooncakeDelta => mooncake::write(workload, path, true),
        Format::RequestTrace => request_trace::write(workload, path),
        Format::ClaudeCode => Err(WorkloadError::Inexpressible {
            format,
            session: String::new(),
            reason: "the Claude Code format is an input format only",
        }),
    }
}

// === impl Workload ===

impl Workload {
    /// Requests in all sessions.
    pub fn request_count(&self) -> usize {
        self.sessions.iter().map(|s| s.requests.len()).sum()
    }

    /// The same workload over `block_size`-token blocks.
    ///
    /// Refining (512 -> 64) repeats each id `512 / 64` times: a trace block becomes one block's
    /// tokens repeated, as Dynamo's replay fills a trace block with one token. The prefix
    /// structure is the trace's, since sequence hashes chain, and the block is drawn and hashed
    /// once ([`BlockHasher::locals`] reuses the local hash of a block equal to the one before).
    /// Ids past the prompt's last token are dropped. Coarsening (16 -> 64) names each group of
    /// ids by a hash of the group, and needs the old size to divide the new one.
    ///
    /// [`BlockHasher::locals`]: switchyard_core::hash::BlockHasher::locals
    pub fn with_block_size(&self, block_size: u32) -> Result<Workload, WorkloadError> {
        let from = self.block_size;
        let error = WorkloadError::BlockSize {
            from,
            to: block_size,
        };
        if block_size == 0 || from == 0 {
            return Err(error);
        }
        let convert: BlockConversion = if from == block_size {
            Box::new(|r| r.hash_ids.clone())
        } else if from.is_multiple_of(block_size) {
            let factor = (from / block_size) as usize;
            Box::new(move |r| {
                let keep = r.input_tokens.div_ceil(block_size) as usize;
                r.hash_ids
                    .iter()
                    .flat_map(|&id| std::iter::repeat_n(id, factor))
                    .take(keep.max(1))
                    .collect()
            })
        } else if block_size.is_multiple_of(from) {
            let factor = (block_size / from) as usize;
            Box::new(move |r| {
                r.hash_ids
                    .chunks(factor)
                    .map(|group| {
                        let bytes: Vec<u8> = group.iter().flat_map(|id| id.to_le_bytes()).collect();
                        xxh3_64_with_seed(&bytes, COARSEN_SEED)
                    })
                    .collect()
            })
        } else {
            return Err(error);
        };
        let sessions = self
            .sessions
            .iter()
            .map(|session| Session {
                requests: session
                    .requests
                    .iter()
                    .map(|r| TraceRequest {
                        hash_ids: convert(r),
                        ..r.clone()
                    })
                    .collect(),
                ..session.clone()
            })
            .collect();
        Ok(Workload {
            block_size,
            sessions,
        })
    }
}

impl Workload {
    /// Refuse what no simulation could run, naming the session: a block size of 0 or over
    /// [`MAX_REQUEST_TOKENS`], a prompt or
    /// output over [`MAX_REQUEST_TOKENS`], a session whose requests end past
    /// [`MAX_TRACE_SPAN`] (its start and gaps summed), a sub-agent spawned after a request its
    /// parent does not have, or parents in a cycle (neither would ever start).
    pub fn check(&self) -> Result<(), WorkloadError> {
        let invalid = |session: &Session, reason: String| WorkloadError::Invalid {
            subject: format!("session `{}`", session.id),
            reason,
        };
        if self.block_size == 0 || self.block_size > MAX_REQUEST_TOKENS {
            return Err(WorkloadError::Invalid {
                subject: "the trace".into(),
                reason: format!(
                    "the block size is {} tokens, not between 1 and {MAX_REQUEST_TOKENS}",
                    self.block_size
                ),
            });
        }
        let tree = self.spawn_tree();
        for (s, session) in self.sessions.iter().enumerate() {
            let mut span = session.start;
            for (i, request) in session.requests.iter().enumerate() {
                for (what, tokens) in [
                    ("prompt", request.input_tokens),
                    ("output", request.output_tokens),
                ] {
                    if tokens > MAX_REQUEST_TOKENS {
                        return Err(invalid(
                            session,
                            format!(
                                "request {i} has {tokens} {what} tokens, over \
                                 {MAX_REQUEST_TOKENS}"
                            ),
                        ));
                    }
                }
                span = span.saturating_add(request.gap);
                if span > MAX_TRACE_SPAN {
                    return Err(invalid(
                        session,
                        format!(
                            "request {i} starts {span:?} after the trace's start (its start \
                             and gaps summed), over a year"
                        ),
                    ));
                }
            }
            // A spawned session's parent and spawning request, as the simulator walks them.
            if let (Some(parent), Some(spawn)) = (tree.parent_of[s], session.spawn) {
                let requests = self.sessions[parent].requests.len();
                if spawn.after >= requests {
                    return Err(invalid(
                        session,
                        format!(
                            "spawned after request {} of `{}`, which has {requests}",
                            spawn.after, self.sessions[parent].id
                        ),
                    ));
                }
            }
            // Each step up a chain of parents; more steps than sessions go round a cycle.
            let mut at = s;
            for _ in 0..=self.sessions.len() {
                match tree.parent_of[at] {
                    Some(parent) => at = parent,
                    None => break,
                }
            }
            if tree.parent_of[at].is_some() {
                return Err(invalid(
                    session,
                    "its parents spawn one another in a cycle".into(),
                ));
            }
        }
        Ok(())
    }

    /// `copies` copies of every session (at least one), as distinct users: copy `i > 0` of
    /// session `s` is `s#i`, its parent `parent#i`, and its block ids are re-keyed so that copies
    /// share no prefix. More sessions than a trace holds, with its shape.
    pub fn replicate(&self, copies: usize) -> Workload {
        let mut sessions = self.sessions.clone();
        for copy in 1..copies.max(1) {
            let scope = format!("copy{copy}");
            let rename = |id: &str| format!("{id}#{copy}");
            sessions.extend(self.sessions.iter().map(|session| {
                Session {
                    id: rename(&session.id),
                    parent: session.parent.as_deref().map(rename),
                    requests: session
                        .requests
                        .iter()
                        .map(|r| TraceRequest {
                            hash_ids: r.hash_ids.iter().map(|&h| scoped_id(&scope, h)).collect(),
                            ..r.clone()
                        })
                        .collect(),
                    ..session.clone()
                }
            }));
        }
        Workload {
            block_size: self.block_size,
            sessions,
        }
    }
}

/// The new hash ids of one request.
type BlockConversion = Box<dyn Fn(&TraceRequest) -> Vec<u64>>;

const COARSEN_SEED: u64 = 0x636f_6172_7365;
const SCOPE_SEED: u64 = 0x7363_6f70_655f_6964;

/// A trace-local id made unique across traces (ids of two Claude Code files never mean the same
/// block).
fn scoped_id(scope: &str, id: u64) -> u64 {
    xxh3_64_with_seed(
        &id.to_le_bytes(),
        xxh3_64_with_seed(scope.as_bytes(), SCOPE_SEED),
    )
}

/// Milliseconds (fractional) as a duration; negative or non-finite values become zero, and one
/// too large for a duration the largest (which [`Workload::check`] then refuses).
fn from_ms(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests;
