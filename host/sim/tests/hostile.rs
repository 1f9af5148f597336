//! Hostile traces: whatever a trace file holds, loading it gives either a workload that
//! simulates to its end, every request recorded, or an error naming the file and the session;
//! never a panic, an overflow or a runaway allocation (docs/reliability.md).

use proptest::prelude::*;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;
use switchyard_core::engine::EngineConfig;
use switchyard_sim::workload::{
    Format, MAX_REQUEST_TOKENS, Session, Spawn, TraceRequest, Workload, WorkloadError, load,
};
use switchyard_sim::{SimConfig, SimError, Simulation};

/// A trace file of `lines` in a temporary directory of its own, removed when the returned
/// handle is dropped.
fn trace(name: &str, lines: &[String]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("switchyard-hostile-")
        .tempdir()
        .expect("mkdir");
    let path = dir.path().join(name);
    std::fs::write(&path, lines.join("\n")).expect("write");
    (dir, path)
}

/// Two small workers with Mooncake's 512-token blocks.
fn config() -> SimConfig {
    SimConfig {
        workers: 2,
        engine: EngineConfig {
            block_size: 512,
            num_blocks: 64,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

fn refused(result: Result<Workload, WorkloadError>) -> String {
    match result {
        Err(e @ WorkloadError::Invalid { .. }) => e.to_string(),
        other => panic!("expected the trace refused, got {other:?}"),
    }
}

#[test]
fn values_no_simulation_could_run_are_refused_naming_file_and_session() {
    for (name, row, needle) in [
        (
            "far.jsonl",
            json!({"timestamp": 1e300, "input_length": 100, "output_length": 1, "hash_ids": [1]}),
            "over a year",
        ),
        (
            "prompt.jsonl",
            json!({"timestamp": 0, "input_length": 4_000_000_000u32, "output_length": 1, "hash_ids": [1]}),
            "4000000000 prompt tokens",
        ),
        (
            "output.jsonl",
            json!({"timestamp": 0, "input_length": 10, "output_length": MAX_REQUEST_TOKENS + 1, "hash_ids": [1]}),
            "16777217 output tokens",
        ),
    ] {
        let (_dir, path) = trace(name, &[row.to_string()]);
        let message = refused(load(&path, Some(Format::Mooncake)));
        assert!(message.contains(name), "{message}");
        assert!(message.contains("session `"), "{message}");
        assert!(message.contains(needle), "{message}");
    }
    // Turns that add up past a u32 are refused, not wrapped round to a small prompt.
    let turn = |input: u32| {
        json!({"session_id": 7, "delay": 1, "input_length": input, "output_length": 1,
            "hash_ids": [1]})
        .to_string()
    };
    let (_dir, path) = trace("delta.jsonl", &[turn(10), turn(u32::MAX)]);
    let message = refused(load(&path, Some(Format::MooncakeDelta)));
    assert!(
        message.contains("request 1 has 4294967295 prompt tokens"),
        "{message}"
    );
}

#[test]
fn spawns_that_could_never_happen_are_refused() {
    let request = TraceRequest {
        gap: Duration::ZERO,
        hash_ids: vec![1],
        input_tokens: 512,
        output_tokens: 1,
    };
    let session = |id: &str, parent: Option<&str>, after| Session {
        id: id.into(),
        parent: parent.map(Into::into),
        start: Duration::ZERO,
        spawn: parent.map(|_| Spawn { after, join: false }),
        requests: vec![request.clone()],
    };
    for (sessions, needle) in [
        (
            vec![session("root", None, 0), session("child", Some("root"), 1)],
            "spawned after request 1 of `root`, which has 1",
        ),
        (
            vec![session("a", Some("b"), 0), session("b", Some("a"), 0)],
            "cycle",
        ),
    ] {
        let workload = Workload {
            block_size: 512,
            sessions,
        };
        match Simulation::new(&workload, config()) {
            Err(SimError::Workload(e)) => assert!(e.to_string().contains(needle), "{e}"),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("{needle}: not refused"),
        }
    }
    let mut stretched = config();
    stretched.speedup = 1e-300;
    let one = Workload {
        block_size: 512,
        sessions: vec![session("root", None, 0)],
    };
    assert!(matches!(
        Simulation::new(&one, stretched),
        Err(SimError::Invalid(_))
    ));
}

/// A `request_end` line of Switchyard's own request trace, with values from every range, and
/// session ids from a small set so that sessions share ids, name each other as parents, and
/// name themselves.
fn request_end() -> impl Strategy<Value = serde_json::Value> {
    let millis = prop_oneof![
        16 => 1_700_000_000_000u64..1_700_000_100_000,
        1 => Just(0u64),
        1 => Just(u64::MAX),
    ];
    let took = prop_oneof![16 => 0.0..5_000.0f64, 1 => Just(-1.0), 1 => 1e15..1e300f64];
    let tokens = prop_oneof![16 => 0u32..3_000, 1 => (1u32 << 31)..=u32::MAX];
    let session = proptest::option::of(0u8..3);
    (
        (session.clone(), session, millis, took),
        (tokens.clone(), tokens),
        proptest::collection::vec(0u64..40, 0..8),
    )
        .prop_map(
            |((session, parent, received, took), (input, output), hashes)| {
                json!({"schema": "switchyard.request.trace.v1", "event_type": "request_end",
                "agent_context": {"session_id": session.map(|s| format!("s{s}")),
                    "parent_session_id": parent.map(|s| format!("s{s}"))},
                "request": {"input_tokens": input, "output_tokens": output,
                    "request_received_ms": received, "total_time_ms": took,
                    "replay": {"trace_block_size": 64, "input_sequence_hashes": hashes}}})
            },
        )
}

/// Load `path` as `format`; what loads must simulate with a record for every request, what
/// does not must be refused naming the file.
fn loads_and_runs_or_is_refused(
    path: &std::path::Path,
    format: Format,
) -> Result<(), TestCaseError> {
    match load(path, Some(format)) {
        Ok(workload) => {
            let mut config = config();
            config.engine.block_size = workload.block_size as usize;
            let outcome = Simulation::new(&workload, config)
                .expect("a loaded workload simulates")
                .run(&mut || {});
            prop_assert_eq!(outcome.records.len(), workload.request_count());
        }
        Err(WorkloadError::Invalid { subject, reason }) => {
            prop_assert!(subject.contains("fuzz-"), "{subject}: {reason}");
        }
        Err(e) => prop_assert!(false, "refused for another reason: {e}"),
    }
    Ok(())
}

/// A Mooncake row with values from every range: sane, at the bounds, past them, negative,
/// and larger than the types' arithmetic allows.
fn row() -> impl Strategy<Value = serde_json::Value> {
    // Mostly sane, so that most traces run; each kind of bad value in a few rows.
    let time = prop_oneof![
        16 => 0.0..1e7f64,
        1 => Just(-5.0),
        1 => 1e9..1e12f64,
        1 => 1e15..1e300f64,
    ];
    let tokens = prop_oneof![
        16 => 0u32..3_000,
        1 => Just(MAX_REQUEST_TOKENS + 1),
        1 => (1u32 << 31)..=u32::MAX,
    ];
    (
        0u8..3,
        time.clone(),
        time,
        tokens.clone(),
        tokens,
        proptest::collection::vec(0u64..40, 0..8),
    )
        .prop_map(|(session, timestamp, delay, input, output, hash_ids)| {
            json!({"session_id": session, "timestamp": timestamp, "delay": delay,
                "input_length": input, "output_length": output, "hash_ids": hash_ids})
        })
}

proptest! {
    // Each case writes a file and most simulate it: 128 by default (PROPTEST_CASES, when set,
    // wins).
    #![proptest_config(ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            ProptestConfig::default().cases
        } else {
            128
        },
        ..ProptestConfig::default()
    })]

    /// Mooncake rows, lone or as session deltas: a load refused with a named session, or a
    /// simulation that records every request.
    #[test]
    fn any_mooncake_trace_loads_and_runs_or_is_refused(
        rows in proptest::collection::vec(row(), 1..5),
        delta in any::<bool>(),
    ) {
        let lines: Vec<String> = rows.iter().map(ToString::to_string).collect();
        let (_dir, path) = trace(&format!("fuzz-{delta}.jsonl"), &lines);
        let format = if delta { Format::MooncakeDelta } else { Format::Mooncake };
        loads_and_runs_or_is_refused(&path, format)?;
    }

    /// Request-trace lines: the same.
    #[test]
    fn any_request_trace_loads_and_runs_or_is_refused(
        lines in proptest::collection::vec(request_end(), 1..6),
    ) {
        let lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
        let (_dir, path) = trace("fuzz-rt.jsonl", &lines);
        loads_and_runs_or_is_refused(&path, Format::RequestTrace)?;
    }
}
