//! What a live replay measured: the JSON report, its table, and the timeline.

use super::Measured;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use switchyard_gateway::trace::timeline::{Slice, Timeline, TrackKind, phases};
use switchyard_sim::workload::Workload;

/// The report's schema name.
const SCHEMA: &str = "switchyard.replay.report.v1";

/// What the run was.
pub(super) struct Meta<'a> {
    pub(super) target: &'a str,
    pub(super) trace: &'a Path,
    pub(super) model: &'a str,
    pub(super) speedup: f64,
    pub(super) wall: Duration,
}

/// Microsecond histogram; values past an hour are clamped.
fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_max(3_600_000_000, 3)?)
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(d.as_micros().min(u128::from(u64::MAX)) as u64);
}

/// Mean and percentiles in milliseconds.
fn stats(h: &Histogram<u64>) -> Value {
    let ms = |us: u64| us as f64 / 1e3;
    if h.is_empty() {
        return json!({"count": 0});
    }
    json!({
        "count": h.len(),
        "mean": h.mean() / 1e3,
        "p50": ms(h.value_at_quantile(0.5)),
        "p90": ms(h.value_at_quantile(0.9)),
        "p99": ms(h.value_at_quantile(0.99)),
        "max": ms(h.max()),
    })
}

/// The JSON report.
pub(super) fn summary(results: &[Measured], meta: &Meta<'_>) -> anyhow::Result<Value> {
    let (mut ttft, mut itl, mut e2e) = (histogram()?, histogram()?, histogram()?);
    let (mut input, mut cached, mut output) = (0u64, 0u64, 0u64);
    let mut failed = 0usize;
    let mut errors: Vec<&str> = Vec::new();
    for m in results {
        if let Some(error) = &m.error {
            failed += 1;
            if errors.len() < 5 {
                errors.push(error);
            }
            continue;
        }
        if let Some(first) = m.first_token {
            record(&mut ttft, first.saturating_sub(m.sent));
        }
        for gap in &m.itl {
            record(&mut itl, *gap);
        }
        record(&mut e2e, m.ended.saturating_sub(m.sent));
        input += m.input_tokens;
        cached += m.cached_tokens;
        output += m.output_tokens;
    }
    let secs = meta.wall.as_secs_f64().max(1e-9);
    let ok = results.len() - failed;
    Ok(json!({
        "schema": SCHEMA,
        "target": meta.target,
        "trace": meta.trace.display().to_string(),
        "model": meta.model,
        "speedup": meta.speedup,
        "duration_s": meta.wall.as_secs_f64(),
        "requests": {"sent": results.len(), "ok": ok, "failed": failed, "errors": errors},
        "tokens": {
            "input": input,
            "cached": cached,
            "output": output,
            "hit_rate": if input == 0 { 0.0 } else { cached as f64 / input as f64 },
        },
        "throughput": {
            "requests_per_s": ok as f64 / secs,
            "input_tokens_per_s": input as f64 / secs,
            "output_tokens_per_s": output as f64 / secs,
        },
        "ttft_ms": stats(&ttft),
        "itl_ms": stats(&itl),
        "e2e_ms": stats(&e2e),
    }))
}

/// The report as a terminal table.
pub(super) fn table(summary: &Value) -> String {
    let r = &summary["requests"];
    let t = &summary["throughput"];
    let mut out = format!(
        "replay against {}: {} requests ({} failed) in {:.1} s; {:.2} req/s, {:.0} output tok/s, prefix hit rate {:.1}%\n",
        summary["target"].as_str().unwrap_or_default(),
        r["sent"],
        r["failed"],
        summary["duration_s"].as_f64().unwrap_or_default(),
        t["requests_per_s"].as_f64().unwrap_or_default(),
        t["output_tokens_per_s"].as_f64().unwrap_or_default(),
        summary["tokens"]["hit_rate"].as_f64().unwrap_or_default() * 100.0,
    );
    out += &format!(
        "{:<8}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "ms", "mean", "p50", "p90", "p99", "max"
    );
    for (label, key) in [("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")] {
        let s = &summary[key];
        out += &format!("\n{label:<8}");
        for field in ["mean", "p50", "p90", "p99", "max"] {
            match s[field].as_f64() {
                Some(v) => out += &format!("{v:>10.2}"),
                None => out += &format!("{:>10}", "-"),
            }
        }
    }
    for error in r["errors"].as_array().into_iter().flatten() {
        out += &format!("\nerror: {}", error.as_str().unwrap_or_default());
    }
    out
}

/// The run as a Chrome trace-event timeline: per session its requests (waiting for the first
/// token, then decoding) and the think / tool gaps between them; per worker its requests.
pub(super) fn timeline(results: &[Measured], workload: &Workload) -> Value {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut timeline = Timeline::default();
    for m in results {
        let session = &workload.sessions[m.session].id;
        let args = json!({
            "session": session, "request": m.request, "worker": m.worker, "error": m.error,
            "input_tokens": m.input_tokens, "cached_tokens": m.cached_tokens,
            "output_tokens": m.output_tokens,
        });
        let first = m.first_token.unwrap_or(m.ended);
        let parts = [
            ("ttft", us(first.saturating_sub(m.sent))),
            ("decode", us(m.ended.saturating_sub(first))),
        ];
        let request = phases(us(m.sent), &parts, &args);
        if let Some(worker) = &m.worker {
            timeline.add(TrackKind::Worker, worker, request.clone());
        }
        let gap = Slice {
            name: if m.request == 0 {
                "start"
            } else {
                "think / tool"
            }
            .into(),
            start_us: us(m.ready),
            dur_us: us(m.sent.saturating_sub(m.ready)),
            args: json!({"session": session, "before_request": m.request}),
        };
        let mut unit = Vec::with_capacity(3);
        if gap.dur_us > 0.0 {
            unit.push(gap);
        }
        unit.extend(request);
        timeline.add(TrackKind::Session, session, unit);
    }
    timeline.to_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_sim::workload::{Session, TraceRequest};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn measured(request: usize, sent: u64, first: u64, ended: u64) -> Measured {
        Measured {
            session: 0,
            request,
            ready: ms(sent.saturating_sub(5)),
            sent: ms(sent),
            first_token: Some(ms(first)),
            ended: ms(ended),
            itl: vec![ms(2), ms(4)],
            worker: Some("0.0".into()),
            error: None,
            input_tokens: 100,
            cached_tokens: 50,
            output_tokens: 3,
        }
    }

    #[test]
    fn summary_counts_tokens_and_latencies() {
        let failed = Measured {
            error: Some("502 Bad Gateway: down".into()),
            ..measured(2, 0, 0, 0)
        };
        let results = [measured(0, 0, 10, 14), measured(1, 20, 40, 44), failed];
        let meta = Meta {
            target: "http://x",
            trace: Path::new("t.jsonl"),
            model: "m",
            speedup: 1.0,
            wall: Duration::from_secs(2),
        };
        let s = summary(&results, &meta).unwrap();
        assert_eq!(s["requests"]["ok"], 2);
        assert_eq!(s["requests"]["failed"], 1);
        assert_eq!(s["tokens"]["hit_rate"], 0.5);
        assert_eq!(s["throughput"]["output_tokens_per_s"], 3.0);
        assert_eq!(s["ttft_ms"]["count"], 2);
        assert!((s["ttft_ms"]["mean"].as_f64().unwrap() - 15.0).abs() < 0.1);
        assert_eq!(s["itl_ms"]["count"], 4);
        let table = table(&s);
        assert!(
            table.contains("TTFT") && table.contains("502 Bad Gateway"),
            "{table}"
        );
    }

    #[test]
    fn timeline_has_session_and_worker_tracks() {
        let workload = Workload {
            block_size: 16,
            sessions: vec![Session {
                id: "s".into(),
                parent: None,
                start: Duration::ZERO,
                spawn: None,
                requests: vec![TraceRequest {
                    gap: Duration::ZERO,
                    hash_ids: vec![1],
                    input_tokens: 16,
                    output_tokens: 1,
                }],
            }],
        };
        let doc = timeline(
            &[measured(0, 10, 20, 30), measured(1, 40, 50, 60)],
            &workload,
        );
        let events = doc["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["worker 0.0", "session s"]);
        let slices: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(slices.contains(&"think / tool") && slices.contains(&"ttft"));
    }
}
