//! Switchyard's request trace: one `request_end` JSON line per finished request.

use super::io::{json_lines, parse_error, write_json_lines};
use super::{Session, Spawn, TraceRequest, Workload, WorkloadError, from_ms, open_loop_times};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// The schema name every line carries.
pub const SCHEMA: &str = "switchyard.request.trace.v1";

#[derive(Debug, Deserialize, Serialize)]
struct Line {
    #[serde(default)]
    schema: String,
    event_type: String,
    #[serde(default)]
    event_time_unix_ms: u64,
    #[serde(default)]
    agent_context: AgentContext,
    request: Option<Request>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct AgentContext {
    session_id: Option<String>,
    parent_session_id: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
struct Request {
    #[serde(default)]
    request_id: String,
    input_tokens: u32,
    output_tokens: u32,
    request_received_ms: u64,
    #[serde(default)]
    total_time_ms: f64,
    replay: Replay,
}

#[derive(Debug, Deserialize, Serialize)]
struct Replay {
    trace_block_size: u32,
    #[serde(default)]
    input_length: u32,
    input_sequence_hashes: Vec<u64>,
}

/// A request as recorded: when it arrived and ended, in ms since the Unix epoch.
struct Seen {
    received: f64,
    ended: f64,
    request: TraceRequest,
}

pub(super) fn load(path: &Path) -> Result<Workload, WorkloadError> {
    let mut block_size = None;
    let mut groups: Vec<(String, Option<String>, Vec<Seen>)> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    json_lines(path, |line, record: Line| {
        if record.event_type != "request_end" {
            return Ok(());
        }
        let request = record
            .request
            .ok_or_else(|| parse_error(path, line, "request_end without `request`"))?;
        let size = request.replay.trace_block_size;
        if size == 0 || *block_size.get_or_insert(size) != size {
            return Err(parse_error(path, line, "trace_block_size is 0 or changes"));
        }
        let seen = Seen {
            received: request.request_received_ms as f64,
            ended: request.request_received_ms as f64 + request.total_time_ms.max(0.0),
            request: TraceRequest {
                gap: Duration::ZERO,
                hash_ids: request.replay.input_sequence_hashes,
                input_tokens: request.input_tokens.max(request.replay.input_length),
                output_tokens: request.output_tokens,
            },
        };
        let context = record.agent_context;
        let Some(session) = context.session_id else {
            groups.push((format!("request-{line}"), None, vec![seen]));
            return Ok(());
        };
        let slot = *by_id.entry(session.clone()).or_insert_with(|| {
            groups.push((session, context.parent_session_id, Vec::new()));
            groups.len() - 1
        });
        groups[slot].2.push(seen);
        Ok(())
    })?;
    for (_, _, seen) in &mut groups {
        seen.sort_by(|a, b| a.received.total_cmp(&b.received));
    }
    let origin = groups
        .iter()
        .flat_map(|(_, _, seen)| seen.iter().map(|s| s.received))
        .fold(f64::INFINITY, f64::min);
    let parent_of = |parent: &Option<String>| parent.as_ref().and_then(|p| by_id.get(p)).copied();
    let spawns: Vec<Option<(usize, Spawn)>> = groups
        .iter()
        .map(|(_, parent, seen)| {
            let p = parent_of(parent)?;
            Some((p, spawn(seen, &groups[p].2)?))
        })
        .collect();
    // Per parent request, the latest end of the children that join after it.
    let mut joined: HashMap<(usize, usize), f64> = HashMap::new();
    for ((_, _, seen), spawned) in groups.iter().zip(&spawns) {
        if let Some((p, Spawn { after, join: true })) = spawned {
            let end = seen.iter().map(|s| s.ended).fold(f64::MIN, f64::max);
            let slot = joined.entry((*p, *after)).or_insert(end);
            *slot = slot.max(end);
        }
    }
    let sessions = groups
        .iter()
        .zip(&spawns)
        .enumerate()
        .map(|(i, ((id, parent, seen), spawned))| {
            let first = seen.first().map_or(origin, |s| s.received);
            let (spawn, start) = match spawned {
                Some((p, spawn)) => (
                    Some(*spawn),
                    from_ms(first - groups[*p].2[spawn.after].ended),
                ),
                None => (None, from_ms(first - origin)),
            };
            let mut ready = first;
            let requests = seen
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let request = TraceRequest {
                        gap: from_ms(s.received - ready),
                        ..s.request.clone()
                    };
                    ready = joined.get(&(i, k)).map_or(s.ended, |&end| end.max(s.ended));
                    request
                })
                .collect();
            Session {
                id: id.clone(),
                parent: parent.clone().filter(|_| spawn.is_some()),
                start,
                spawn,
                requests,
            }
        })
        .collect();
    Ok(Workload {
        block_size: block_size.unwrap_or(16),
        sessions,
    })
}

/// How a child hangs off its parent: spawned after the last parent request that ended before the
/// child's first began; joining if the parent's next request arrived only after the child's last
/// one ended. `None` if no parent request ended before the child began.
fn spawn(seen: &[Seen], parent: &[Seen]) -> Option<Spawn> {
    let first = seen.first()?.received;
    let last_end = seen.iter().map(|s| s.ended).fold(first, f64::max);
    let after = parent.iter().rposition(|s| s.ended <= first)?;
    let join = parent
        .get(after + 1)
        .is_some_and(|next| next.received >= last_end);
    Some(Spawn { after, join })
}

/// Requests at their open-loop times, each taking no time (`total_time_ms` 0).
pub(super) fn write(workload: &Workload, path: &Path) -> Result<(), WorkloadError> {
    let times = open_loop_times(workload);
    let mut lines = Vec::with_capacity(workload.request_count());
    for (session, sent) in workload.sessions.iter().zip(&times) {
        for (k, (request, at)) in session.requests.iter().zip(sent).enumerate() {
            let at_ms = at.as_millis() as u64;
            lines.push((
                *at,
                Line {
                    schema: SCHEMA.to_owned(),
                    event_type: "request_end".to_owned(),
                    event_time_unix_ms: at_ms,
                    agent_context: AgentContext {
                        session_id: Some(session.id.clone()),
                        parent_session_id: session.parent.clone(),
                    },
                    request: Some(Request {
                        request_id: format!("{}#{k}", session.id),
                        input_tokens: request.input_tokens,
                        output_tokens: request.output_tokens,
                        request_received_ms: at_ms,
                        total_time_ms: 0.0,
                        replay: Replay {
                            trace_block_size: workload.block_size,
                            input_length: request.input_tokens,
                            input_sequence_hashes: request.hash_ids.clone(),
                        },
                    }),
                },
            ));
        }
    }
    lines.sort_by_key(|(at, _)| *at);
    write_json_lines(path, lines.into_iter().map(|(_, line)| line))
}
