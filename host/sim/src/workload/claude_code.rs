//! Claude Code traces (kv-cache-tester): one coding session per JSON file.
//!
//! Calls (`type` "n" or "s") become the file's requests, `think_time` their gap. A `subagent`
//! entry holds the sub-agent's own calls and is recorded when the sub-agent *ended*: its `t` is
//! the end and `t - duration_ms` the start, which in the traces is right after the parent's
//! previous call finished. It becomes a child session spawned after that call and joined by the
//! parent's next call, whose gap then counts from the later of the two ends (the parent waits for
//! the sub-agent's answer). Hash ids are scoped per file, so they are re-keyed by the file's id.

use super::io::{io_error, parse_error, reader};
use super::{Session, Spawn, TraceRequest, Workload, WorkloadError, scoped_id};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEFAULT_BLOCK_SIZE: u32 = 64;

#[derive(Debug, Deserialize)]
struct File {
    id: Option<String>,
    block_size: Option<u32>,
    requests: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct Call {
    t: f64,
    #[serde(rename = "in")]
    input: u32,
    out: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    api_time: f64,
    #[serde(default)]
    think_time: f64,
}

#[derive(Debug, Deserialize)]
struct Subagent {
    t: f64,
    agent_id: String,
    #[serde(default)]
    duration_ms: f64,
    /// The sub-agent's calls; some exports only count them, which leaves nothing to replay.
    #[serde(default)]
    requests: Value,
}

/// A file, or every `.json` file of a directory (in name order).
pub(super) fn load(path: &Path) -> Result<Workload, WorkloadError> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io_error(path))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut block_size = None;
    let mut sessions = Vec::new();
    for file in &files {
        let parsed: File =
            serde_json::from_reader(reader(file)?).map_err(|e| parse_error(file, 1, e))?;
        let size = parsed.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
        if *block_size.get_or_insert(size) != size {
            return Err(parse_error(
                file,
                1,
                "block_size differs from the other files",
            ));
        }
        let id = parsed.id.clone().unwrap_or_else(|| {
            file.file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
        });
        let mut builder = Builder {
            file,
            scope: &id,
            sessions: &mut sessions,
        };
        let root = builder.session(id.clone(), None, &parsed.requests)?;
        // The root goes before its children, which `session` pushed as it met them.
        let at = builder.sessions.len() - count_children(&root, builder.sessions);
        sessions.insert(at, root);
    }
    Ok(Workload {
        block_size: block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
        sessions,
    })
}

/// Children (at any depth) of `root` already pushed: they are the tail of `sessions`.
fn count_children(root: &Session, sessions: &[Session]) -> usize {
    let prefix = format!("{}/", root.id);
    sessions
        .iter()
        .rev()
        .take_while(|s| s.id.starts_with(&prefix))
        .count()
}

struct Builder<'a> {
    file: &'a Path,
    scope: &'a str,
    sessions: &'a mut Vec<Session>,
}

impl Builder<'_> {
    /// The session of `entries`; its sub-agents are pushed to `sessions` as they appear.
    fn session(
        &mut self,
        id: String,
        parent: Option<String>,
        entries: &[Value],
    ) -> Result<Session, WorkloadError> {
        let mut requests: Vec<TraceRequest> = Vec::new();
        // End (seconds on this session's clock) of the last call, and of sub-agents joined since.
        let mut call_end: Option<f64> = None;
        let mut joined_end: Option<f64> = None;
        for entry in entries {
            match entry.get("type").and_then(Value::as_str) {
                Some("n" | "s") => {
                    let call: Call = self.parse(entry)?;
                    let gap = match (call_end, joined_end) {
                        (Some(end), Some(joined)) => call.t - end.max(joined),
                        _ => call.think_time,
                    };
                    requests.push(TraceRequest {
                        gap: seconds(gap),
                        hash_ids: call
                            .hash_ids
                            .iter()
                            .map(|&h| scoped_id(self.scope, h))
                            .collect(),
                        input_tokens: call.input,
                        output_tokens: call.out,
                    });
                    call_end = Some(call.t + call.api_time);
                    joined_end = None;
                }
                Some("subagent") => {
                    let sub: Subagent = self.parse(entry)?;
                    let began = sub.t - sub.duration_ms / 1000.0;
                    let calls = sub.requests.as_array().map_or(&[][..], Vec::as_slice);
                    let child_id = format!("{id}/{}", sub.agent_id);
                    let mut child = self.session(child_id, Some(id.clone()), calls)?;
                    match call_end {
                        Some(end) => {
                            child.spawn = Some(Spawn {
                                after: requests.len() - 1,
                                join: true,
                            });
                            child.start = seconds(began - end);
                            joined_end = Some(joined_end.map_or(sub.t, |j| j.max(sub.t)));
                        }
                        None => child.start = seconds(began),
                    }
                    self.sessions.push(child);
                }
                _ => {}
            }
        }
        Ok(Session {
            id,
            parent,
            start: Duration::ZERO,
            spawn: None,
            requests,
        })
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, entry: &Value) -> Result<T, WorkloadError> {
        T::deserialize(entry).map_err(|e| parse_error(self.file, 1, e))
    }
}

fn seconds(s: f64) -> Duration {
    super::from_ms(s * 1000.0)
}
