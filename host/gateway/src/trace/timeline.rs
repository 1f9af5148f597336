//! Timelines in Chrome's trace-event JSON (opens in Perfetto and `chrome://tracing`): a process
//! per worker and per session, requests split into queue / prefill / decode, tool calls between.

use super::record::{EventType, TraceLine};
use serde_json::{Value, json};
use std::collections::HashMap;

/// One slice, in microseconds from the timeline's start.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Shown on the slice (`prefill`, `tool bash`, ...).
    pub name: String,
    /// Start.
    pub start_us: f64,
    /// Length.
    pub dur_us: f64,
    /// Shown when the slice is selected.
    pub args: Value,
}

/// Which kind of track: workers are listed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrackKind {
    /// An engine rank.
    Worker,
    /// An agent session.
    Session,
}

/// Tracks of slices, written out as trace events.
#[derive(Debug, Default)]
pub struct Timeline {
    tracks: Vec<Track>,
    index: HashMap<(TrackKind, String), usize>,
}

#[derive(Debug)]
struct Track {
    kind: TrackKind,
    name: String,
    units: Vec<Vec<Slice>>,
}

impl Timeline {
    /// Add slices that belong together (one request's phases) to a track. Overlapping units go
    /// to separate lanes of the track, so slices always nest properly.
    pub fn add(&mut self, kind: TrackKind, track: &str, unit: Vec<Slice>) {
        if unit.is_empty() {
            return;
        }
        let next = self.tracks.len();
        let i = *self.index.entry((kind, track.to_string())).or_insert(next);
        if i == next {
            self.tracks.push(Track {
                kind,
                name: track.to_string(),
                units: Vec::new(),
            });
        }
        self.tracks[i].units.push(unit);
    }

    /// The trace-event JSON document.
    pub fn to_json(&self) -> Value {
        let mut order: Vec<&Track> = self.tracks.iter().collect();
        order.sort_by_key(|t| t.kind); // stable: first seen first within a kind
        let mut events = Vec::new();
        for (pid, track) in order.into_iter().enumerate() {
            let pid = pid + 1;
            let label = match track.kind {
                TrackKind::Worker => format!("worker {}", track.name),
                TrackKind::Session => format!("session {}", track.name),
            };
            events.push(
                json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}}),
            );
            events.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}));
            for (lane, units) in lanes(&track.units).into_iter().enumerate() {
                let tid = lane + 1;
                events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": format!("lane {lane}")}}));
                for slice in units.into_iter().flatten() {
                    events.push(json!({
                        "ph": "X", "name": slice.name, "pid": pid, "tid": tid,
                        "ts": slice.start_us, "dur": slice.dur_us, "args": slice.args,
                    }));
                }
            }
        }
        json!({"traceEvents": events, "displayTimeUnit": "ms"})
    }
}

fn span(unit: &[Slice]) -> (f64, f64) {
    let start = unit
        .iter()
        .map(|s| s.start_us)
        .fold(f64::INFINITY, f64::min);
    let end = unit
        .iter()
        .map(|s| s.start_us + s.dur_us)
        .fold(f64::NEG_INFINITY, f64::max);
    (start, end)
}

/// Greedy interval packing: each unit goes to the first lane free at its start.
fn lanes(units: &[Vec<Slice>]) -> Vec<Vec<&Vec<Slice>>> {
    let mut sorted: Vec<&Vec<Slice>> = units.iter().collect();
    sorted.sort_by(|a, b| span(a).0.total_cmp(&span(b).0));
    let mut lanes: Vec<(f64, Vec<&Vec<Slice>>)> = Vec::new();
    for unit in sorted {
        let (start, end) = span(unit);
        match lanes.iter_mut().find(|(free_at, _)| *free_at <= start) {
            Some(lane) => {
                lane.0 = end;
                lane.1.push(unit);
            }
            None => lanes.push((end, vec![unit])),
        }
    }
    lanes.into_iter().map(|(_, units)| units).collect()
}

/// Consecutive phases from `start_us`, skipping empty ones.
pub fn phases(start_us: f64, parts: &[(&str, f64)], args: &Value) -> Vec<Slice> {
    let mut at = start_us;
    let mut out = Vec::new();
    for (name, dur_us) in parts {
        if *dur_us > 0.0 {
            out.push(Slice {
                name: (*name).to_string(),
                start_us: at,
                dur_us: *dur_us,
                args: args.clone(),
            });
        }
        at += dur_us.max(0.0);
    }
    out
}

/// The timeline of a gateway's request trace: per worker its requests' prefill and decode, per
/// session its requests' queue / prefill / decode and the tool calls its harness reported.
pub fn live_timeline(lines: &[TraceLine]) -> Value {
    let t0 = lines
        .iter()
        .map(|l| match &l.request {
            Some(r) => r.request_received_ms,
            None => l.event_time_unix_ms,
        })
        .min()
        .unwrap_or(0);
    let us = |unix_ms: u64| unix_ms.saturating_sub(t0) as f64 * 1e3;
    let mut timeline = Timeline::default();
    let mut tools: HashMap<(String, String), ToolCall> = HashMap::new();
    for line in lines {
        let session = line.agent_context.session_id.as_deref();
        if let Some(r) = &line.request {
            let args = json!({
                "request_id": r.request_id, "session": session, "worker": r.worker.id,
                "input_tokens": r.input_tokens, "cached_tokens": r.cached_tokens,
                "output_tokens": r.output_tokens, "queue_depth": r.queue_depth,
                "finish_reason": r.finish_reason_metadata.finish_reason,
            });
            let start = us(r.request_received_ms);
            let (wait, prefill) = (r.prefill_wait_time_ms * 1e3, r.prefill_time_ms * 1e3);
            let decode = (r.total_time_ms - r.ttft_ms) * 1e3;
            let engine = [("prefill", prefill), ("decode", decode)];
            timeline.add(
                TrackKind::Worker,
                &r.worker.id,
                phases(start + wait, &engine, &args),
            );
            if let Some(session) = session {
                let all = [("queue", wait), ("prefill", prefill), ("decode", decode)];
                timeline.add(TrackKind::Session, session, phases(start, &all, &args));
            }
        }
        if let (Some(tool), Some(session)) = (&line.tool, session) {
            let call = tools
                .entry((session.to_string(), tool.call_id.clone()))
                .or_default();
            call.name.clone_from(&tool.name);
            match line.event_type {
                EventType::ToolStart => call.start_ms = Some(line.event_time_unix_ms),
                EventType::ToolEnd | EventType::ToolError => {
                    call.end_ms = Some(line.event_time_unix_ms);
                    call.duration_ms = tool.duration_ms;
                    call.error.clone_from(&tool.error);
                    call.failed = line.event_type == EventType::ToolError;
                }
                EventType::RequestEnd => {}
            }
        }
    }
    let mut calls: Vec<_> = tools.into_iter().collect();
    calls.sort_by(|a, b| a.0.cmp(&b.0));
    for ((session, call_id), call) in calls {
        let Some((start_ms, end_ms)) = call.span_ms() else {
            continue; // still running, or only an end without a duration
        };
        let name = if call.failed {
            format!("tool {} (error)", call.name)
        } else {
            format!("tool {}", call.name)
        };
        let args = json!({"call_id": call_id, "error": call.error});
        let slice = Slice {
            name,
            start_us: (start_ms - t0 as f64).max(0.0) * 1e3,
            dur_us: (end_ms - start_ms).max(0.0) * 1e3,
            args,
        };
        timeline.add(TrackKind::Session, &session, vec![slice]);
    }
    timeline.to_json()
}

/// A tool call assembled from its start and end events.
#[derive(Debug, Default)]
struct ToolCall {
    name: String,
    start_ms: Option<u64>,
    end_ms: Option<u64>,
    duration_ms: Option<f64>,
    error: Option<String>,
    failed: bool,
}

impl ToolCall {
    fn span_ms(&self) -> Option<(f64, f64)> {
        match (self.start_ms, self.end_ms, self.duration_ms) {
            (Some(start), Some(end), _) => Some((start as f64, end as f64)),
            (None, Some(end), Some(d)) => Some((end as f64 - d, end as f64)),
            (Some(start), None, Some(d)) => Some((start as f64, start as f64 + d)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::tool_events::parse_tool_events;
    use crate::trace::{RequestDraft, RequestFacts, WorkerRef};
    use crate::{agent::AgentContext, sse::Finish, trace::Ending};
    use std::time::{Duration, Instant, UNIX_EPOCH};

    fn request(session: &str, worker: &str, at_ms: u64, total_ms: u64) -> TraceLine {
        let t0 = Instant::now();
        let mut draft = RequestDraft::new(RequestFacts {
            request_id: at_ms,
            model: "m".into(),
            agent: AgentContext {
                session_id: Some(session.into()),
                ..AgentContext::default()
            },
            received: t0,
            received_at: UNIX_EPOCH + Duration::from_millis(at_ms),
            routed: t0 + Duration::from_millis(1),
            worker: WorkerRef {
                id: worker.into(),
                url: "http://w".into(),
            },
            queue_depth: 0,
            block_size: 16,
            prompt_tokens: 32,
            hashes: vec![1, 2],
            body: None,
        });
        draft.first_byte(t0 + Duration::from_millis(4));
        let end = t0 + Duration::from_millis(total_ms);
        draft.finish(end, None, Finish::default(), Ending::Complete)
    }

    fn slices<'a>(doc: &'a Value, process: &str) -> Vec<(&'a str, f64, f64, u64)> {
        let events = doc["traceEvents"].as_array().unwrap();
        let pid = events
            .iter()
            .find(|e| e["name"] == "process_name" && e["args"]["name"] == process)
            .unwrap_or_else(|| panic!("no {process}"))["pid"]
            .clone();
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .map(|e| {
                let name = e["name"].as_str().unwrap();
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                (name, ts, dur, e["tid"].as_u64().unwrap())
            })
            .collect()
    }

    #[test]
    fn requests_and_tool_calls_land_on_worker_and_session_tracks() {
        let tools = parse_tool_events(
            br#"[{"event_type":"tool_start","call_id":"c1","name":"bash","session_id":"s","event_time_unix_ms":1010},
                 {"event_type":"tool_end","call_id":"c1","name":"bash","session_id":"s","event_time_unix_ms":1030}]"#,
            &AgentContext::default(),
            UNIX_EPOCH,
        )
        .unwrap();
        let mut lines = vec![request("s", "0.0", 1000, 10), request("s", "0.0", 1030, 10)];
        lines.extend(tools);
        // Another session's request overlapping the first on the same worker.
        lines.push(request("t", "0.0", 1002, 10));
        let doc = live_timeline(&lines);
        let session = slices(&doc, "session s");
        let names: Vec<&str> = session.iter().map(|s| s.0).collect();
        assert_eq!(
            names,
            [
                "queue",
                "prefill",
                "decode",
                "tool bash",
                "queue",
                "prefill",
                "decode"
            ]
        );
        assert_eq!(session[0].1, 0.0);
        assert_eq!(session[3].1, 10_000.0); // the tool started 10 ms in
        assert_eq!(session[3].2, 20_000.0);
        let worker = slices(&doc, "worker 0.0");
        assert_eq!(worker.len(), 6);
        // The overlapping request went to a second lane.
        let lanes: std::collections::BTreeSet<u64> = worker.iter().map(|s| s.3).collect();
        assert_eq!(lanes.len(), 2);
        // Workers are listed before sessions.
        let events = doc["traceEvents"].as_array().unwrap();
        assert_eq!(events[0]["args"]["name"], "worker 0.0");
    }
}
