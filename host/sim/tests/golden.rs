//! Golden runs: small simulations whose whole outcome (every request's times to the nanosecond,
//! its worker and cached tokens, every KV utilization sample, the tier and hint counters) is
//! pinned by a digest. An optimisation of the simulator or of the router core must leave these
//! unchanged; a change of behaviour updates them on purpose, with the reason in its commit.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;
use switchyard_core::engine::{ENGINE_SEED, EngineConfig, HostTierConfig, PoolTierConfig};
use switchyard_core::hash::HASH_SEED;
use switchyard_sim::workload::{self, Workload};
use switchyard_sim::{IndexMode, Outcome, SimConfig, Simulation};
use xxhash_rust::xxh3::xxh3_64;

fn trace(relative: &str) -> Workload {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/traces")
        .join(relative);
    workload::load(&path, None).expect("the example trace loads")
}

fn run(workload: &Workload, config: SimConfig) -> Outcome {
    Simulation::new(workload, config)
        .expect("valid config")
        .run(&mut || {})
}

/// Everything the run recorded, written out exactly (`Duration` and `f64` debug forms are exact).
fn digest(outcome: &Outcome) -> String {
    let mut text = String::new();
    for r in &outcome.records {
        writeln!(
            text,
            "{} {} {:?} {} {:?} {:?} {:?} {:?} {:?} {} {} {}",
            r.session,
            r.request,
            r.worker,
            r.replica,
            r.sent,
            r.released,
            r.admitted,
            r.first_token,
            r.finished,
            r.input_tokens,
            r.output_tokens,
            r.cached_tokens
        )
        .expect("a String takes any write");
    }
    writeln!(text, "{:?}", outcome.kv_samples).expect("a String takes any write");
    writeln!(text, "{} {:?}", outcome.recomputed_tokens, outcome.tiers)
        .expect("a String takes any write");
    writeln!(text, "{:?}", outcome.pool).expect("a String takes any write");
    writeln!(text, "{:?}", outcome.kv_hints).expect("a String takes any write");
    format!("{:016x}", xxh3_64(text.as_bytes()))
}

/// Run `simulate` with engines that name blocks by their own hashes and with engines that name
/// them by the router's (`EngineConfig::hash_seed`): the index then takes their events as they
/// are instead of translating them, which must change nothing.
fn assert_digest(expected: &str, simulate: impl Fn(u64) -> Outcome) {
    for (engines, seed) in [("own", ENGINE_SEED), ("the router's", HASH_SEED)] {
        let outcome = simulate(seed);
        let report = outcome.report();
        let got = digest(&outcome);
        assert_eq!(
            got, expected,
            "the run's outcome changed, engines hashing with {engines} seed: TTFT mean {:.3} ms, \
             prefix hit {:.6}, recomputed {}",
            report.ttft_ms.mean, report.prefix_hit_ratio, outcome.recomputed_tokens
        );
    }
}

/// 500 Mooncake conversations on 8 workers of `num_blocks` blocks, KV routing, engines hashing
/// with `hash_seed`.
fn mooncake(num_blocks: usize, speedup: f64, hash_seed: u64) -> Outcome {
    mooncake_with(num_blocks, speedup, "kv-cost", IndexMode::Events, hash_seed)
}

/// [`mooncake`] under routing `policy`, the routers' index fed by `index`.
fn mooncake_with(
    num_blocks: usize,
    speedup: f64,
    policy: &str,
    index: IndexMode,
    hash_seed: u64,
) -> Outcome {
    let workload = trace("mooncake/conversation_500.jsonl")
        .with_block_size(64)
        .expect("64 divides the trace's blocks");
    let outcome = run(
        &workload,
        SimConfig {
            workers: 8,
            engine: EngineConfig {
                block_size: 64,
                num_blocks,
                hash_seed,
                ..EngineConfig::default()
            },
            speedup,
            policy: policy.to_owned(),
            index,
            ..SimConfig::default()
        },
    );
    assert_eq!(outcome.records.len(), 500);
    outcome
}

/// Three Claude Code sessions (up to 2,175 blocks a prompt) overflowing two devices of 2,560
/// blocks, with a host tier and a shared pool, under ThunderAgent admission (its releases place
/// requests while other engines' steps end).
fn claude_code(kv_hints: Option<&str>, hash_seed: u64) -> Outcome {
    let workload = trace("claude-code");
    let outcome = run(
        &workload,
        SimConfig {
            workers: 2,
            engine: EngineConfig {
                block_size: workload.block_size as usize,
                num_blocks: 2_560,
                host_tier: Some(HostTierConfig::blocks(8_192)),
                pool: Some(PoolTierConfig::default()),
                hash_seed,
                ..EngineConfig::default()
            },
            pool_blocks: Some(16_384),
            admission: "thunder-agent".to_owned(),
            kv_hints: kv_hints.map(str::to_owned),
            max_gap: Some(Duration::from_secs(30)),
            ..SimConfig::default()
        },
    );
    assert!(outcome.records.iter().all(|r| r.finished.is_some()));
    outcome
}

/// The regime of the dynamo-mocker comparison (docs/benchmarks.md (n)): 16,384 blocks a worker.
#[test]
fn mooncake_kv_routing() {
    assert_digest("ddab1c933238acf2", |seed| mooncake(16_384, 1.0, seed));
}

/// At 4x on devices of 2,048 blocks: queues, evictions and recomputation. Since
/// `engine_stream = "auto"` the engines answer whole, and the stored event of each prompt's last
/// block ends its prefill load in the router's view one event delay (5 ms) after the first token
/// would have: TTFT mean 29,538.7 -> 29,562.4 ms, 2.7 % more recomputed tokens.
#[test]
fn mooncake_kv_routing_overloaded() {
    assert_digest("4e4be1ce247cf5bd", |seed| mooncake(2_048, 4.0, seed));
}

/// Round robin, overloaded: its engines' KV events reach no index (nothing reads one), which
/// must change nothing. Pinned from the build that still fed the index (4fb9fde).
#[test]
fn mooncake_round_robin_overloaded() {
    assert_digest("5b4ca96d2790324e", |seed| {
        mooncake_with(2_048, 4.0, "round-robin", IndexMode::Events, seed)
    });
}

/// Overloaded again, with no KV events: the router predicts its bookings' blocks, and the
/// engines answer whole once each rank's prefill pace is learnt (one in 16 streams to keep it),
/// their prefill loads ending when the pace says (TTFT mean 31,393.2 ms).
#[test]
fn mooncake_approximate_kv_routing_overloaded() {
    assert_digest("5ab58b0bdf6e88be", |seed| {
        mooncake_with(2_048, 4.0, "kv-cost", IndexMode::Approximate, seed)
    });
}

#[test]
fn claude_code_admission_and_tiers() {
    assert_digest("d6a1dcb50d911a5b", |seed| claude_code(None, seed));
}

/// With three KV-hint strategies (the hint path runs every step: no quiet runs).
#[test]
fn claude_code_admission_tiers_and_hints() {
    let hints = "demote-on-tool-call:demote_above_usage=0+subagent-reclaim+share-to-subagent";
    assert_digest("809f1c65f16d1bcb", |seed| claude_code(Some(hints), seed));
}
