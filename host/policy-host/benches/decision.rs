//! One whole routing decision with the Wasm `kv-cost` policy against the same decision with the
//! native `KvCost`: the index lookup over 16 workers, the predicted-block lookup and booking, the
//! candidates and the policy call, on `switchyard-core`'s router-bench fixture (a 32K-token
//! prompt, ~248K index nodes). Issue 13's goal for a decision is a p99 of at most 50 us
//! *including the Wasm policy*, so decisions are timed one by one.
//!
//! `cargo bench -p switchyard-policy-host --bench decision`
//!
//! The machine is shared and noisy: every round times hashing the prompt (the compute-only
//! baseline of the router bench), then a run of native decisions, then a run of Wasm ones, and the
//! medians over rounds are printed with the p99 against that baseline.

#[path = "../../core/benches/decision_fixture.rs"]
mod decision_fixture;

use decision_fixture::{Fixture, RouteLoop, WORKERS, median, tail, time_per_call};
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::router::KvCost;
use switchyard_policy_host::{EngineConfig, PolicyEngine, PolicyStats, WasmRouter};

const ROUNDS: usize = 7;
const CALLS: usize = 2_000;
const BASELINE_SLICE: Duration = Duration::from_millis(40);

fn main() {
    let fixture = Fixture::new();
    // The gateway's limits but a deadline no noisy machine reaches: a fallback would time the
    // native policy under the Wasm label (checked below).
    let engine = PolicyEngine::new(EngineConfig {
        deadline: Duration::from_secs(1),
        ..EngineConfig::default()
    })
    .unwrap_or_else(|e| panic!("engine: {e}"));
    let component = engine
        .load_router(switchyard_policy_artifacts::KV_COST)
        .unwrap_or_else(|e| panic!("kv-cost component: {e}"));
    let stats = Arc::new(PolicyStats::default());
    let mut native = RouteLoop::new(Box::new(KvCost));
    let mut wasm = RouteLoop::new(Box::new(WasmRouter::new(component, stats.clone())));
    // Both must choose the deepest holder, or they measure different decisions.
    assert_eq!(
        native.route_once(&fixture.index, &fixture.long),
        WORKERS - 1
    );
    assert_eq!(wasm.route_once(&fixture.index, &fixture.long), WORKERS - 1);
    // `cargo bench` passes `--bench`; `cargo test --benches` does not and only smoke-tests.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }

    let mut baseline = || fixture.hasher.sequence(&fixture.long.tokens).len() as u64;
    let mut native_call = || u64::from(native.route_once(&fixture.index, &fixture.long));
    let mut wasm_call = || u64::from(wasm.route_once(&fixture.index, &fixture.long));
    let (mut base, mut rows) = (
        Vec::new(),
        [
            [Vec::new(), Vec::new(), Vec::new()],
            [Vec::new(), Vec::new(), Vec::new()],
        ],
    );
    for _ in 0..ROUNDS {
        let b = time_per_call(&mut baseline, BASELINE_SLICE);
        base.push(b);
        for (row, f) in rows
            .iter_mut()
            .zip([&mut native_call as &mut dyn FnMut() -> u64, &mut wasm_call])
        {
            let (p50, p99) = tail(f, CALLS);
            row[0].push(p50);
            row[1].push(p99);
            row[2].push(p99 / b);
        }
    }
    let calls = stats.snapshot();
    assert_eq!(
        calls.fallbacks_total(),
        0,
        "the Wasm policy fell back: {:?}",
        calls.last_error
    );
    println!(
        "router/route/32k-16w, {ROUNDS} rounds of {CALLS} decisions timed one by one (median of \
         rounds); baseline hash/sequence/32k {:.1} us",
        median(&mut base) / 1e3
    );
    println!(
        "{:<14} {:>9} {:>9} {:>14}",
        "policy", "p50 us", "p99 us", "p99 x baseline"
    );
    for (name, row) in ["native kv-cost", "wasm kv-cost"].iter().zip(&mut rows) {
        println!(
            "{name:<14} {:>9.1} {:>9.1} {:>14.3}",
            median(&mut row[0]) / 1e3,
            median(&mut row[1]) / 1e3,
            median(&mut row[2])
        );
    }
}
