//! Mooncake JSONL: cumulative rows (FAST'25 release) and session rows with deltas.

use super::io::{json_lines, parse_error, write_json_lines};
use super::{Format, Session, TraceRequest, Workload, WorkloadError, from_ms, open_loop_times};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// Mooncake's block size: one hash id per 512 tokens.
pub(super) const MOONCAKE_BLOCK_SIZE: u32 = 512;

#[derive(Debug, Deserialize, Serialize)]
struct Row {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_id: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timestamp: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay: Option<f64>,
    #[serde(alias = "input_tokens")]
    input_length: u32,
    #[serde(alias = "output_tokens")]
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// `delta`: rows with `session_id` whose later turns carry `delay` and only the appended blocks.
pub(super) fn load(path: &Path, delta: bool) -> Result<Workload, WorkloadError> {
    let mut sessions: Vec<Session> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    json_lines(path, |line, row: Row| {
        let at = from_ms(row.timestamp.unwrap_or(0.0));
        if !delta {
            sessions.push(lone_request(line, at, row));
            return Ok(());
        }
        let id = match &row.session_id {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v @ serde_json::Value::Number(_)) => v.to_string(),
            _ => return Err(parse_error(path, line, "session_id is missing")),
        };
        let gap = from_ms(row.delay.unwrap_or(0.0));
        let slot = *by_id.entry(id.clone()).or_insert_with(|| {
            sessions.push(Session {
                id,
                parent: None,
                start: at,
                spawn: None,
                requests: Vec::new(),
            });
            sessions.len() - 1
        });
        let requests = &mut sessions[slot].requests;
        let (mut hash_ids, input) = requests
            .last()
            .map_or((Vec::new(), 0), |r| (r.hash_ids.clone(), r.input_tokens));
        hash_ids.extend(row.hash_ids);
        requests.push(TraceRequest {
            gap,
            hash_ids,
            input_tokens: input.saturating_add(row.input_length),
            output_tokens: row.output_length,
        });
        Ok(())
    })?;
    if !delta {
        // Ties keep line order: the sort is stable.
        sessions.sort_by_key(|s| s.start);
    }
    Ok(Workload {
        block_size: MOONCAKE_BLOCK_SIZE,
        sessions,
    })
}

fn lone_request(line: usize, at: Duration, row: Row) -> Session {
    Session {
        id: format!("row-{line}"),
        parent: None,
        start: at,
        spawn: None,
        requests: vec![TraceRequest {
            gap: Duration::ZERO,
            hash_ids: row.hash_ids,
            input_tokens: row.input_length,
            output_tokens: row.output_length,
        }],
    }
}

/// Cumulative rows sorted by open-loop time, or session rows in session order. Ids are remapped
/// densely in order of first appearance, as Mooncake's own traces number them.
pub(super) fn write(workload: &Workload, path: &Path, delta: bool) -> Result<(), WorkloadError> {
    let mut dense: HashMap<u64, u64> = HashMap::new();
    let mut remap = |ids: &[u64]| -> Vec<u64> {
        ids.iter()
            .map(|id| {
                let next = dense.len() as u64;
                *dense.entry(*id).or_insert(next)
            })
            .collect()
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut rows = Vec::with_capacity(workload.request_count());
    if delta {
        for session in &workload.sessions {
            let inexpressible = |reason| WorkloadError::Inexpressible {
                format: Format::MooncakeDelta,
                session: session.id.clone(),
                reason,
            };
            if session.parent.is_some() {
                return Err(inexpressible("rows have no parent sessions"));
            }
            let mut previous: Option<&TraceRequest> = None;
            for request in &session.requests {
                let kept = previous.map_or(0, |p| p.hash_ids.len());
                if previous.is_some_and(|p| !request.hash_ids.starts_with(&p.hash_ids)) {
                    return Err(inexpressible(
                        "a prompt does not extend the previous one; use mooncake or request-trace",
                    ));
                }
                rows.push(Row {
                    session_id: Some(session.id.clone().into()),
                    timestamp: previous.is_none().then(|| ms(session.start)),
                    delay: Some(ms(request.gap)),
                    input_length: request.input_tokens
                        - previous.map_or(0, |p| p.input_tokens.min(request.input_tokens)),
                    output_length: request.output_tokens,
                    hash_ids: remap(&request.hash_ids[kept..]),
                });
                previous = Some(request);
            }
        }
    } else {
        let times = open_loop_times(workload);
        let mut order: Vec<(Duration, usize, usize)> = times
            .iter()
            .enumerate()
            .flat_map(|(s, sent)| sent.iter().enumerate().map(move |(r, &at)| (at, s, r)))
            .collect();
        order.sort();
        for (at, s, r) in order {
            let request = &workload.sessions[s].requests[r];
            rows.push(Row {
                session_id: None,
                timestamp: Some(ms(at).round()),
                delay: None,
                input_length: request.input_tokens,
                output_length: request.output_tokens,
                hash_ids: remap(&request.hash_ids),
            });
        }
    }
    write_json_lines(path, rows)
}
