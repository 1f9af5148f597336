//! A run as a Chrome trace-event timeline (opens in Perfetto or `chrome://tracing`).
//!
//! One process per worker, where every request is an async slice (requests overlap on a worker)
//! split into queue, prefill and decode; and a "sessions" process with a thread per session, where
//! requests follow one another with the tool wait (the gap) between them.

use crate::metrics::{Outcome, RequestRecord};
use crate::workload::Workload;
use serde_json::{Value, json};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

const SESSIONS_PID: usize = 1;
const FIRST_WORKER_PID: usize = 100;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Write the timeline of `outcome` (a run of `workload`) to `path`.
pub fn write(outcome: &Outcome, workload: &Workload, path: &Path) -> std::io::Result<()> {
    let mut events = Vec::new();
    let name = |pid: usize, tid: Option<usize>, name: &str| {
        let (kind, tid) = tid.map_or(("process_name", 0), |t| ("thread_name", t));
        json!({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}})
    };
    events.push(name(SESSIONS_PID, None, "sessions"));
    for w in 0..outcome.workers {
        events.push(name(FIRST_WORKER_PID + w, None, &format!("worker {w}")));
    }
    for (s, session) in workload.sessions.iter().enumerate() {
        events.push(name(SESSIONS_PID, Some(s + 1), &session.id));
    }
    let mut previous_end: Vec<Option<Duration>> = vec![None; workload.sessions.len()];
    for (id, record) in outcome.records.iter().enumerate() {
        let phases = phases(record);
        let tid = record.session + 1;
        let span = |name: &str, from: Duration, to: Duration| {
            json!({"ph": "X", "name": name, "pid": SESSIONS_PID, "tid": tid,
                   "ts": us(from), "dur": us(to.saturating_sub(from))})
        };
        if let Some(end) = previous_end[record.session] {
            events.push(span("tool wait", end, record.sent));
        }
        let end = record.finished.unwrap_or(record.sent);
        previous_end[record.session] = Some(end);
        events.push(span(
            &format!("request {}", record.request),
            record.sent,
            end,
        ));
        for &(phase, from, to) in &phases {
            events.push(span(phase, from, to));
        }
        let Some(worker) = record.worker else {
            continue;
        };
        let pid = FIRST_WORKER_PID + worker;
        let label = format!(
            "{} #{}",
            workload.sessions[record.session].id, record.request
        );
        // The outer slice opens first and closes last, so the phases nest inside it.
        let base = json!({"cat": "request", "name": label, "pid": pid, "tid": 0, "id": id,
                          "args": {"input_tokens": record.input_tokens,
                                   "cached_tokens": record.cached_tokens,
                                   "output_tokens": record.output_tokens}});
        events.push(with(&base, "b", record.sent));
        for &(phase, from, to) in &phases {
            let inner = json!({"cat": "request", "name": phase, "pid": pid, "tid": 0, "id": id});
            events.push(with(&inner, "b", from));
            events.push(with(&inner, "e", to));
        }
        events.push(with(&base, "e", end));
    }
    let mut out = BufWriter::new(File::create(path)?);
    serde_json::to_writer(
        &mut out,
        &json!({"displayTimeUnit": "ms", "traceEvents": events}),
    )?;
    out.flush()
}

/// Queue, prefill and decode of a request, as far as it got.
fn phases(r: &RequestRecord) -> Vec<(&'static str, Duration, Duration)> {
    let mut out = Vec::new();
    if let Some(admitted) = r.admitted {
        out.push(("queue", r.sent, admitted));
        if let Some(first) = r.first_token {
            out.push(("prefill", admitted, first));
            if let Some(finished) = r.finished {
                out.push(("decode", first, finished));
            }
        }
    }
    out
}

fn with(base: &Value, phase: &str, at: Duration) -> Value {
    let mut event = base.clone();
    event["ph"] = json!(phase);
    event["ts"] = json!(us(at));
    event
}
