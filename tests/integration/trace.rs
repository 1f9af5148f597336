//! The request trace end to end: a gateway writing gzip segments for agent sessions and tool
//! events, and `switchyard replay` reproducing a trace's prefix structure through it.

use crate::support::{Gateway, MockEngine, TempFile, client};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_gateway::trace::{TraceLine, read_trace, record::EventType};

const MODEL: &str = "smollm2-135m-instruct";

/// A gateway in front of one mock engine, tracing into `dir`.
fn traced_gateway(engine: &MockEngine, dir: &Path) -> Gateway {
    let config = format!(
        "{}[trace]\npath = \"{}/\"\n",
        Gateway::config_for(&[engine], "kv-cost"),
        dir.display()
    );
    Gateway::start(&config)
}

/// The trace once it holds `count` lines of `event_type` (segments are flushed per batch, so a
/// running gateway's unfinished segment is readable).
async fn wait_for_lines(dir: &Path, event_type: EventType, count: usize) -> Vec<TraceLine> {
    for _ in 0..200 {
        let lines = read_trace(dir).unwrap_or_default();
        if lines.iter().filter(|l| l.event_type == event_type).count() >= count {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the trace in {} never held {count} {event_type:?} lines",
        dir.display()
    );
}

fn trace_dir(holder: &TempFile) -> PathBuf {
    holder.path.parent().unwrap().join("trace")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_traces_sessions_tokens_and_tool_events() {
    let engine = MockEngine::start(20.0, 4096);
    let holder = TempFile::new("keep", "");
    let dir = trace_dir(&holder);
    let gateway = traced_gateway(&engine, &dir);
    let http = client();
    let system = "You are a coding agent. Follow the repository's conventions. ".repeat(20);
    let mut messages = vec![json!({"role": "system", "content": system})];
    for turn in 0..3 {
        messages.push(json!({"role": "user", "content": format!("Step {turn}: run the tests.")}));
        let response = http
            .post(format!("{}/v1/chat/completions", gateway.url))
            .header("X-Claude-Code-Session-Id", "cc-root")
            .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 8, "stream": turn != 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let _ = response.text().await.unwrap();
        messages.push(json!({"role": "assistant", "content": format!("Ran step {turn}.")}));
    }
    // A subagent of the same root.
    let response = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .header("x-claude-code-session-id", "cc-root")
        .header("x-claude-code-agent-id", "explore-1")
        .json(&json!({"model": MODEL, "messages": messages[..2], "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let tool_events = format!("{}/v1/agent/tool_events", gateway.url);
    let accepted = http
        .post(&tool_events)
        .header("x-claude-code-session-id", "cc-root")
        .json(&json!([
            {"event_type": "tool_start", "call_id": "call_1", "name": "bash"},
            {"event_type": "tool_end", "call_id": "call_1", "name": "bash", "duration_ms": 120.5},
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 200);
    assert_eq!(accepted.json::<Value>().await.unwrap()["recorded"], 2);
    let refused = http
        .post(&tool_events)
        .json(&json!({"event_type": "tool_end", "call_id": "call_2", "name": "bash"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let error = refused.json::<Value>().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");

    wait_for_lines(&dir, EventType::RequestEnd, 4).await;
    let lines = wait_for_lines(&dir, EventType::ToolEnd, 1).await;
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("trace-") && n.ends_with(".jsonl.gz")),
        "{names:?}"
    );
    let requests: Vec<&TraceLine> = lines
        .iter()
        .filter(|l| l.event_type == EventType::RequestEnd)
        .collect();
    assert_eq!(requests.len(), 4);
    let mut previous_hashes: Vec<u64> = Vec::new();
    for (turn, line) in requests[..3].iter().enumerate() {
        assert_eq!(line.agent_context.session_id.as_deref(), Some("cc-root"));
        assert_eq!(line.agent_context.parent_session_id, None);
        let r = line.request.as_deref().unwrap();
        assert_eq!(r.model, MODEL);
        assert_eq!(r.output_tokens, 8);
        assert_eq!(r.worker.id, "0.0");
        assert_eq!(r.worker.url, engine.url);
        assert!(r.ttft_ms > 0.0 && r.total_time_ms >= r.ttft_ms, "{r:?}");
        assert_eq!(r.input_tokens, r.replay.input_length);
        assert_eq!(r.replay.trace_block_size, 16);
        let hashes = &r.replay.input_sequence_hashes;
        assert_eq!(hashes.len() as u64, r.input_tokens / 16);
        if turn > 0 {
            // The conversation grew: the earlier prompt's blocks lead this one, mostly cached.
            assert!(r.cached_tokens > 0, "turn {turn}: {r:?}");
            assert!(r.kv_hit_rate > 0.5, "turn {turn}: {r:?}");
            let shared = previous_hashes.len().saturating_sub(1); // the last block may differ
            assert_eq!(hashes[..shared], previous_hashes[..shared]);
        }
        assert!(
            ["length", "stop"].contains(&r.finish_reason_metadata.finish_reason.as_str()),
            "{r:?}"
        );
        previous_hashes.clone_from(hashes);
    }
    let sub = requests[3];
    assert_eq!(sub.agent_context.session_id.as_deref(), Some("explore-1"));
    assert_eq!(
        sub.agent_context.parent_session_id.as_deref(),
        Some("cc-root")
    );

    let tools: Vec<&TraceLine> = lines.iter().filter(|l| l.tool.is_some()).collect();
    assert_eq!(tools.len(), 2);
    for line in &tools {
        assert_eq!(line.agent_context.session_id.as_deref(), Some("cc-root"));
        assert_eq!(line.tool.as_ref().unwrap().call_id, "call_1");
    }
    assert_eq!(tools[1].tool.as_ref().unwrap().duration_ms, Some(120.5));
    assert!(lines.iter().all(|l| l.content.is_none()));

    let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
    assert!(
        metrics.contains("switchyard_trace_dropped_total 0"),
        "{metrics}"
    );
}

/// A request-trace line for the replay's input.
fn trace_row(session: &str, at_ms: u64, hash_ids: &[u64]) -> String {
    json!({
        "schema": "switchyard.request.trace.v1", "event_type": "request_end",
        "event_time_unix_ms": at_ms,
        "agent_context": {"session_id": session, "parent_session_id": null},
        "request": {
            "request_id": format!("{session}@{at_ms}"), "input_tokens": hash_ids.len() * 16,
            "output_tokens": 4, "request_received_ms": at_ms, "total_time_ms": 0.0,
            "replay": {"trace_block_size": 16, "input_length": hash_ids.len() * 16,
                       "input_sequence_hashes": hash_ids},
        },
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reproduces_the_prefix_structure_through_the_gateway() {
    let rows: [(&str, u64, &[u64]); 4] = [
        ("a", 1_000, &[1, 2, 3]),
        ("b", 1_050, &[1, 2, 9]),
        ("a", 1_100, &[1, 2, 3, 4, 5]),
        ("a", 1_200, &[1, 2, 3, 4, 5, 6, 7]),
    ];
    let text: Vec<String> = rows.iter().map(|(s, t, h)| trace_row(s, *t, h)).collect();
    let input = TempFile::new("input.jsonl", &(text.join("\n") + "\n"));
    let engine = MockEngine::start(20.0, 4096);
    let holder = TempFile::new("keep", "");
    let dir = trace_dir(&holder);
    let gateway = traced_gateway(&engine, &dir);
    let report = dir.with_file_name("report.json");
    let timeline = dir.with_file_name("timeline.json");
    let args: Vec<String> = [
        "replay",
        "--target",
        &gateway.url,
        "--trace",
        &input.path.to_string_lossy(),
        "--speedup",
        "10",
        "--report",
        &report.to_string_lossy(),
        "--timeline",
        &timeline.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::support::switchyard_bin())
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("TTFT"), "{stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["requests"]["sent"], 4, "{report}");
    assert_eq!(report["requests"]["failed"], 0, "{report}");
    assert_eq!(report["tokens"]["output"], 16, "{report}");
    let timeline: Value = serde_json::from_slice(&std::fs::read(&timeline).unwrap()).unwrap();
    let tracks: Vec<&str> = timeline["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tracks, ["worker 0.0", "session a", "session b"]);

    // The gateway saw the trace's structure: equal leading hash ids, equal leading hashes.
    let lines = wait_for_lines(&dir, EventType::RequestEnd, 4).await;
    let seen: Vec<(String, Vec<u64>)> = lines
        .iter()
        .map(|l| {
            let r = l.request.as_deref().unwrap();
            let session = l.agent_context.session_id.clone().unwrap();
            (session, r.replay.input_sequence_hashes.clone())
        })
        .collect();
    let find = |session: &str, blocks: usize| {
        let (_, hashes) = seen
            .iter()
            .find(|(s, h)| s == session && h.len() == blocks)
            .unwrap_or_else(|| panic!("no {session} request of {blocks} blocks in {seen:?}"));
        hashes.clone()
    };
    let common = |a: &[u64], b: &[u64]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for (i, (session_i, _, ids_i)) in rows.iter().enumerate() {
        for (session_j, _, ids_j) in &rows[i + 1..] {
            let (hi, hj) = (find(session_i, ids_i.len()), find(session_j, ids_j.len()));
            assert_eq!(
                common(&hi, &hj),
                common(ids_i, ids_j),
                "{ids_i:?} vs {ids_j:?}"
            );
        }
    }
}

/// A gateway killed with SIGKILL mid-traffic leaves a trace that reads: every request answered
/// well before the kill is in it, whole, and the torn end of the unfinished gzip segment is
/// skipped rather than failing the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_survives_a_kill_up_to_its_last_flush() {
    let engine = MockEngine::start(20.0, 4096);
    let holder = TempFile::new("keep", "");
    let dir = trace_dir(&holder);
    let gateway = traced_gateway(&engine, &dir);
    let ask = |i: usize| {
        let url = gateway.url.clone();
        async move {
            let body = json!({"model": MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": format!("request {i}")}]});
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("x-dynamo-session-id", format!("kill-{i}"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    for i in 0..20 {
        ask(i).await;
    }
    // Flushed by now (the writer flushes every batch); then more traffic, killed mid-way.
    wait_for_lines(&dir, EventType::RequestEnd, 20).await;
    let more: Vec<_> = (20..40).map(|i| tokio::spawn(ask(i))).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(gateway); // SIGKILL: no drain, no gzip trailer
    for request in more {
        let _ = request.await; // cut off by the kill, or answered before it
    }
    let lines = read_trace(&dir).expect("a killed gateway's trace reads");
    let sessions: Vec<String> = lines
        .iter()
        .filter_map(|l| l.agent_context.session_id.clone())
        .collect();
    for i in 0..20 {
        assert!(
            sessions.contains(&format!("kill-{i}")),
            "request {i} lost: {sessions:?}"
        );
    }
    assert!(lines.len() <= 40, "{} lines", lines.len());
}
