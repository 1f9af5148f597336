use super::*;
use std::io::Write;

fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(text.as_bytes()).expect("write");
    path
}

/// A directory of its own for one test, removed when the test ends.
fn tempdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("switchyard-sim-{name}-"))
        .tempdir()
        .expect("mkdir")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn mooncake_rows_are_lone_requests_ordered_by_time_then_line() {
    let dir = tempdir("mooncake");
    let path = file(
        dir.path(),
        "t.jsonl",
        r#"{"timestamp": 5, "input_length": 700, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 2]}
{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [3]}
"#,
    );
    let w = load(&path, None).expect("load");
    assert_eq!(w.block_size, 512);
    let starts: Vec<(Duration, u32)> = w
        .sessions
        .iter()
        .map(|s| (s.start, s.requests[0].output_tokens))
        .collect();
    assert_eq!(starts, [(ms(0), 4), (ms(5), 3), (ms(5), 5)]);
    assert!(
        w.sessions
            .iter()
            .all(|s| s.requests.len() == 1 && s.spawn.is_none())
    );
}

#[test]
fn mooncake_delta_rows_accumulate_blocks_and_keep_delays() {
    let dir = tempdir("delta");
    let path = file(
        dir.path(),
        "t.jsonl",
        r#"{"session_id": "a", "timestamp": 100, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}
{"session_id": 7, "timestamp": 50, "input_length": 512, "output_length": 8, "hash_ids": [9]}
{"session_id": "a", "delay": 2500, "input_length": 512, "output_length": 9, "hash_ids": [3]}
"#,
    );
    let w = load(&path, None).expect("load");
    assert_eq!(w.sessions.len(), 2);
    let a = &w.sessions[0];
    assert_eq!((a.id.as_str(), a.start), ("a", ms(100)));
    assert_eq!(a.requests[1].hash_ids, [1, 2, 3]);
    assert_eq!(a.requests[1].input_tokens, 1536);
    assert_eq!(a.requests[1].gap, ms(2500));
    assert_eq!(w.sessions[1].id, "7");

    // Written back as deltas, read back the same.
    let out = dir.path().join("back.jsonl");
    write(&w, &out, Format::MooncakeDelta).expect("write");
    let back = load(&out, Some(Format::MooncakeDelta)).expect("reload");
    let lens: Vec<usize> = back.sessions[0]
        .requests
        .iter()
        .map(|r| r.hash_ids.len())
        .collect();
    assert_eq!(lens, [2, 3]);
    assert_eq!(back.sessions[0].requests[1].gap, ms(2500));
}

const CLAUDE_CODE: &str = r#"{"id": "trace_x", "block_size": 64, "hash_id_scope": "local", "requests": [
 {"t": 0.0, "type": "n", "in": 200, "out": 10, "hash_ids": [1, 2, 3], "api_time": 2.0, "think_time": 0.0},
 {"t": 13.0, "type": "subagent", "agent_id": "agent_001", "duration_ms": 10500, "requests": [
    {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [7, 8], "api_time": 1.0, "think_time": 0.0},
    {"t": 4.0, "type": "s", "in": 140, "out": 5, "hash_ids": [7, 8], "api_time": 1.0, "think_time": 3.0}]},
 {"t": 20.0, "type": "n", "in": 300, "out": 10, "hash_ids": [1, 2, 3, 4], "api_time": 2.0, "think_time": 18.0},
 {"t": 30.0, "type": "n", "in": 320, "out": 10, "hash_ids": [1, 2, 3, 4, 5], "api_time": 2.0, "think_time": 8.0}
]}"#;

#[test]
fn claude_code_subagents_are_spawned_and_joined_children() {
    let dir = tempdir("claude");
    let path = file(dir.path(), "trace_x.json", CLAUDE_CODE);
    let w = load(&path, None).expect("load");
    assert_eq!(w.block_size, 64);
    let ids: Vec<&str> = w.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["trace_x", "trace_x/agent_001"]);
    let (root, child) = (&w.sessions[0], &w.sessions[1]);
    assert_eq!(root.requests.len(), 3);
    assert_eq!(child.parent.as_deref(), Some("trace_x"));
    assert_eq!(
        child.spawn,
        Some(Spawn {
            after: 0,
            join: true
        })
    );
    // The sub-agent began at 13 - 10.5 = 2.5 s, 0.5 s after the parent's call ended at 2 s.
    assert_eq!(child.start, ms(500));
    assert_eq!(child.requests[1].gap, ms(3000));
    // The parent's next call came 7 s after the sub-agent ended (13 s), not its 18 s think time.
    assert_eq!(root.requests[1].gap, ms(7000));
    assert_eq!(root.requests[2].gap, ms(8000));
    // Ids are scoped by file: equal within the file, unlike the raw ids.
    assert_eq!(
        root.requests[0].hash_ids[..],
        root.requests[2].hash_ids[..3]
    );
    assert_ne!(root.requests[0].hash_ids[0], 1);
}

#[test]
fn request_traces_group_sessions_and_measure_gaps_from_the_end() {
    let dir = tempdir("reqtrace");
    let line = |session: &str, parent: &str, received: u64, total: f64, hashes: &str| {
        format!(
            r#"{{"schema":"switchyard.request.trace.v1","event_type":"request_end","event_time_unix_ms":{received},"agent_context":{{"session_id":{session},"parent_session_id":{parent}}},"request":{{"request_id":"r","model":"m","input_tokens":40,"output_tokens":3,"cached_tokens":0,"request_received_ms":{received},"prefill_wait_time_ms":0.0,"prefill_time_ms":1.0,"ttft_ms":1.0,"total_time_ms":{total},"avg_itl_ms":1.0,"kv_hit_rate":0.0,"queue_depth":0,"worker":{{"id":"w","url":"u"}},"finish_reason_metadata":{{"finish_reason":"stop","tool_calls":[]}},"replay":{{"trace_block_size":16,"input_length":40,"input_sequence_hashes":{hashes}}}}}}}"#
        )
    };
    let text = [
        line("\"s\"", "null", 1_000, 500.0, "[1,2]"),
        r#"{"schema":"switchyard.request.trace.v1","event_type":"tool_start","event_time_unix_ms":1600}"#.to_owned(),
        line("\"c\"", "\"s\"", 1_700, 100.0, "[5]"),
        line("\"s\"", "null", 4_000, 500.0, "[1,2,3]"),
        line("null", "null", 1_200, 50.0, "[9]"),
    ]
    .join("\n");
    let w = load(&file(dir.path(), "t.jsonl", &text), None).expect("load");
    assert_eq!(w.block_size, 16);
    let s = &w.sessions[0];
    assert_eq!(s.requests.len(), 2);
    // Counted from the later of the previous end (1500) and the joining child's end (1800).
    assert_eq!(s.requests[1].gap, ms(4_000 - 1_800));
    let c = w.sessions.iter().find(|x| x.id == "c").expect("child");
    assert_eq!(
        c.spawn,
        Some(Spawn {
            after: 0,
            join: true
        })
    );
    assert_eq!(c.start, ms(200));
    let lone = w
        .sessions
        .iter()
        .find(|x| x.parent.is_none() && x.id != "s")
        .expect("lone");
    assert_eq!(lone.start, ms(200));

    // Gzip round trip through our own writer keeps sessions, spawns and gaps.
    let out = dir.path().join("back.jsonl.gz");
    write(&w, &out, Format::RequestTrace).expect("write");
    let back = load(&out, None).expect("reload");
    let child = back.sessions.iter().find(|x| x.id == "c").expect("child");
    assert_eq!(
        child.spawn,
        Some(Spawn {
            after: 0,
            join: true
        })
    );
    assert_eq!(child.start, ms(200));
    let root = back.sessions.iter().find(|x| x.id == "s").expect("root");
    assert_eq!(root.requests[1].gap, s.requests[1].gap);
    assert_eq!(root.requests[1].hash_ids, [1, 2, 3]);
}

#[test]
fn replicas_are_distinct_users_with_the_same_shape() {
    let dir = tempdir("replicate");
    let path = file(dir.path(), "trace_x.json", CLAUDE_CODE);
    let w = load(&path, None).expect("load");
    let three = w.replicate(3);
    assert_eq!(three.sessions.len(), 6);
    assert_eq!(
        three.sessions[..2],
        w.sessions[..],
        "copy 0 is the original"
    );
    let copy = &three.sessions[5];
    assert_eq!(copy.id, "trace_x/agent_001#2");
    assert_eq!(copy.parent.as_deref(), Some("trace_x#2"));
    assert_eq!(copy.spawn, w.sessions[1].spawn);
    let (a, b) = (&w.sessions[1].requests[0], &copy.requests[0]);
    assert_eq!((a.gap, a.input_tokens), (b.gap, b.input_tokens));
    assert_eq!(a.hash_ids.len(), b.hash_ids.len());
    assert!(a.hash_ids.iter().all(|h| !b.hash_ids.contains(h)));
    // Within a copy, prefixes are still shared between calls.
    let root = &three.sessions[4].requests;
    assert_eq!(root[0].hash_ids[..], root[2].hash_ids[..3]);
    assert_eq!(three.spawn_tree().roots, [0, 2, 4]);
    assert_eq!(w.replicate(0), w);
}

fn one(hash_ids: Vec<u64>, input_tokens: u32) -> Workload {
    Workload {
        block_size: 512,
        sessions: vec![Session {
            id: "s".into(),
            parent: None,
            start: Duration::ZERO,
            spawn: None,
            requests: vec![TraceRequest {
                gap: Duration::ZERO,
                hash_ids,
                input_tokens,
                output_tokens: 1,
            }],
        }],
    }
}

#[test]
fn block_sizes_refine_deterministically_and_coarsen_only_when_divisible() {
    let a = one(vec![1, 2], 600).with_block_size(64).expect("refine");
    let ids = &a.sessions[0].requests[0].hash_ids;
    // 600 tokens need 10 blocks of 64: 8 from id 1, 2 from id 2, each its trace block repeated.
    assert_eq!(ids[..], [1, 1, 1, 1, 1, 1, 1, 1, 2, 2]);
    let b = one(vec![1, 3], 1024).with_block_size(64).expect("refine");
    assert_eq!(ids[..8], b.sessions[0].requests[0].hash_ids[..8]);
    assert_ne!(ids[8], b.sessions[0].requests[0].hash_ids[8]);

    let coarse = a.with_block_size(256).expect("coarsen");
    assert_eq!(coarse.sessions[0].requests[0].hash_ids.len(), 3);
    assert!(matches!(
        a.with_block_size(96),
        Err(WorkloadError::BlockSize { from: 64, to: 96 })
    ));
}

#[test]
fn mooncake_writes_dense_ids_at_open_loop_times() {
    let dir = tempdir("dense");
    let mut w = one(vec![1 << 40, 77], 1000);
    w.sessions[0].requests.push(TraceRequest {
        gap: ms(3000),
        hash_ids: vec![1 << 40, 77, 5],
        input_tokens: 1400,
        output_tokens: 2,
    });
    let out = dir.path().join("m.jsonl");
    write(&w, &out, Format::Mooncake).expect("write");
    let back = load(&out, None).expect("reload");
    assert_eq!(back.sessions[0].requests[0].hash_ids, [0, 1]);
    assert_eq!(back.sessions[1].requests[0].hash_ids, [0, 1, 2]);
    assert_eq!(back.sessions[1].start, ms(3000));
}

#[test]
fn the_repository_fixtures_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/traces");
    let mooncake = load(&root.join("mooncake/conversation_500.jsonl"), None).expect("mooncake");
    assert_eq!(mooncake.request_count(), 500);
    let claude = load(&root.join("claude-code"), None).expect("claude code");
    let roots = claude
        .sessions
        .iter()
        .filter(|s| s.parent.is_none())
        .count();
    assert_eq!(roots, 3);
    assert_eq!(claude.sessions.len() - roots, 6, "sub-agents");
    assert_eq!(claude.block_size, 64);
}

/// The whole traces, where `SWITCHYARD_TRACES` names a folder holding them.
#[test]
fn the_full_traces_load_when_given() {
    let Some(root) = std::env::var_os("SWITCHYARD_TRACES").map(std::path::PathBuf::from) else {
        return;
    };
    let w = load(&root.join("mooncake/conversation_trace.jsonl"), None).expect("mooncake");
    assert_eq!(w.request_count(), 12_031);
    let w = load(&root.join("weka"), None).expect("claude code");
    let roots = w.sessions.iter().filter(|s| s.parent.is_none()).count();
    assert_eq!(roots, 50);
    assert_eq!(w.sessions.len() - roots, 12);
    assert_eq!(w.block_size, 64);
}
