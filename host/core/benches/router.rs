//! One routing decision over a realistically sized index, excluding tokenization, with native
//! policies (the fixture, shared with `switchyard-policy-host`'s `decision` bench, which routes
//! it with the Wasm `kv-cost`, is in `decision_fixture.rs`).
//!
//! Bench IDs:
//! - `hash/sequence/32k`: `BlockHasher::sequence` over 32K tokens, the compute-only baseline.
//! - `index/find_matches/32k-16w`: the index lookup alone, the component a decision is built on.
//! - `router/route/32k-16w`, `router/route/2k-16w`: `Router::route` then `finish`, policy `KvCost`.
//! - `predicted/book-expire/32k`: booking a 2,048-block prompt as predicted and expiring it, the
//!   part of a decision that is neither the index lookup nor the policy.
//!
//! The machine is shared and noisy, so after criterion's absolute numbers a second pass measures
//! each bench right after the baseline, many times over, and prints the median of the ratios. A
//! third times 32K-token decisions one by one for their tail (the goal is stated as a p99).
//!
//! `SWITCHYARD_ROUTER_BENCH=tail cargo bench -p switchyard-core --bench router` runs the tail pass
//! alone (no criterion, no ratios) and also prints it as one JSON line, for
//! `scripts/decision-vs-dynamo.sh`, which runs it beside Dynamo's own decision on this fixture.

mod decision_fixture;

use criterion::Criterion;
use decision_fixture::{
    BLOCKS_PER_WORKER, Fixture, RouteLoop, WORKERS, median, tail_stats, time_per_call,
};
use std::time::Duration;
use switchyard_core::predicted::PredictedBlocks;
use switchyard_core::router::{KvCost, RouterConfig};
use switchyard_core::worker::Rank;

const BASELINE: &str = "hash/sequence/32k";
/// Rounds of the interleaved ratio pass; the median ratio is reported.
const RATIO_ROUNDS: usize = 15;
/// Time per measurement in the ratio pass.
const RATIO_SLICE: Duration = Duration::from_millis(40);
/// Rounds of the tail pass, each a baseline slice then `TAIL_CALLS` decisions timed one by one.
const TAIL_ROUNDS: usize = 5;
const TAIL_CALLS: usize = 2_000;
/// The bench whose tail is measured.
const TAIL_BENCH: &str = "router/route/32k-16w";
/// Set to `tail` to run only the tail pass, and print it as JSON too.
const MODE_VAR: &str = "SWITCHYARD_ROUTER_BENCH";

type Case<'a> = (&'static str, Box<dyn FnMut() -> u64 + 'a>);

/// The benches, baseline first, as closures shared by criterion and the ratio pass.
fn cases<'a>(
    fixture: &'a Fixture,
    long: &'a mut RouteLoop,
    short: &'a mut RouteLoop,
) -> Vec<Case<'a>> {
    vec![
        (
            BASELINE,
            Box::new(|| fixture.hasher.sequence(&fixture.long.tokens).len() as u64),
        ),
        (
            "index/find_matches/32k-16w",
            Box::new(|| fixture.index.find_matches(&fixture.long.hashes).len() as u64),
        ),
        (
            "router/route/32k-16w",
            Box::new(|| u64::from(long.route_once(&fixture.index, &fixture.long))),
        ),
        (
            "router/route/2k-16w",
            Box::new(|| u64::from(short.route_once(&fixture.index, &fixture.short))),
        ),
        ("predicted/book-expire/32k", {
            let mut predicted = PredictedBlocks::new(RouterConfig::default().approx_max_blocks);
            let ttl = RouterConfig::default().booking_ttl;
            Box::new(move || {
                predicted.insert(Rank::new(0, 0), &fixture.long.hashes, ttl, Duration::ZERO);
                predicted.expire(ttl);
                predicted.is_empty() as u64
            })
        }),
    ]
}

/// Measure each case right after the baseline, `RATIO_ROUNDS` times, and print median ratios.
fn print_ratios(cases: &mut [Case<'_>]) {
    let (baseline, others) = cases.split_first_mut().expect("the baseline comes first");
    println!("\nratios against {BASELINE}, measured back to back ({RATIO_ROUNDS} rounds, median):");
    println!("{:<30} {:>12} {:>10}", "bench", "median", "x baseline");
    let mut base_times = Vec::new();
    for (name, f) in others.iter_mut() {
        let (mut times, mut ratios) = (Vec::new(), Vec::new());
        for _ in 0..RATIO_ROUNDS {
            let base = time_per_call(&mut baseline.1, RATIO_SLICE);
            let time = time_per_call(f, RATIO_SLICE);
            base_times.push(base);
            times.push(time);
            ratios.push(time / base);
        }
        let time = median(&mut times) / 1e3;
        println!("{name:<30} {time:>9.1} us {:>10.3}", median(&mut ratios));
    }
    let base = median(&mut base_times) / 1e3;
    println!("{BASELINE:<30} {base:>9.1} us {:>10.3}", 1.0);
}

/// Time `TAIL_BENCH` call by call and print its p50 and p99 (medians over rounds), and the p99
/// against the baseline measured just before it. With `json`, also one JSON line with the
/// medians over rounds of the p50, p99 and mean, the calls timed and `winner`, the worker the
/// decision picks.
fn print_tail(cases: &mut [Case<'_>], json: Option<u32>) {
    let (baseline, others) = cases.split_first_mut().expect("the baseline comes first");
    let (_, f) = others
        .iter_mut()
        .find(|(name, _)| *name == TAIL_BENCH)
        .expect("the tail bench is a case");
    let (mut p50s, mut p99s, mut means, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TAIL_ROUNDS {
        let base = time_per_call(&mut baseline.1, RATIO_SLICE);
        let stats = tail_stats(f, TAIL_CALLS);
        p50s.push(stats.p50);
        p99s.push(stats.p99);
        means.push(stats.mean);
        ratios.push(stats.p99 / base);
    }
    let (p50, p99) = (median(&mut p50s) / 1e3, median(&mut p99s) / 1e3);
    println!(
        "\n{TAIL_BENCH}, {TAIL_ROUNDS} rounds of {TAIL_CALLS} calls timed one by one (median of rounds):"
    );
    println!(
        "p50 {p50:.1} us, p99 {p99:.1} us, p99 {:.3} x baseline",
        median(&mut ratios)
    );
    if let Some(winner) = json {
        println!(
            "{{\"bench\":\"{TAIL_BENCH}\",\"side\":\"switchyard\",\"p50_us\":{p50:.3},\"p99_us\":{p99:.3},\"mean_us\":{:.3},\"calls\":{},\"rounds\":{TAIL_ROUNDS},\"winner\":{winner}}}",
            median(&mut means) / 1e3,
            TAIL_ROUNDS * TAIL_CALLS,
        );
    }
}

fn main() {
    let fixture = Fixture::new();
    println!(
        "fixture: {} index nodes, {} workers x {} blocks, prompts of {} and {} blocks",
        fixture.index.node_count(),
        WORKERS,
        BLOCKS_PER_WORKER,
        fixture.long.hashes.len(),
        fixture.short.hashes.len(),
    );
    let (mut long, mut short) = (
        RouteLoop::new(Box::new(KvCost)),
        RouteLoop::new(Box::new(KvCost)),
    );
    // The deepest holder (device and host) must win, or the bench measures a different decision.
    let winner = long.route_once(&fixture.index, &fixture.long);
    assert_eq!(winner, WORKERS - 1);
    assert_eq!(
        short.route_once(&fixture.index, &fixture.short),
        WORKERS - 1
    );

    let tail_only = match std::env::var(MODE_VAR).as_deref() {
        Ok("tail") => true,
        Ok("") | Err(_) => false,
        Ok(mode) => panic!("{MODE_VAR}={mode:?}: the only mode is `tail`"),
    };

    let mut cases = cases(&fixture, &mut long, &mut short);
    if tail_only {
        print_tail(&mut cases, Some(winner));
        return;
    }
    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    for (name, f) in cases.iter_mut() {
        criterion.bench_function(name, |b| b.iter(&mut *f));
    }
    criterion.final_summary();

    // `cargo bench` passes `--bench`; `cargo test --benches` does not and only smoke-tests.
    if std::env::args().any(|arg| arg == "--bench") {
        print_ratios(&mut cases);
        print_tail(&mut cases, None);
    }
}
