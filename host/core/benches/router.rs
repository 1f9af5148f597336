//! One routing decision over a realistically sized index, excluding tokenization.
//!
//! Fixture: 16 workers that each hold 16,384 blocks of 16 tokens (~262K index nodes). Worker `i`
//! holds the first `i/16` of a 32K-token prompt on the device (odd workers a further 1/8 in host
//! memory) and the same share of a 2K-token prompt; the rest of its blocks are unrelated chains.
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

use criterion::{Criterion, black_box};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use switchyard_core::hash::{BlockHasher, LocalBlockHash, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::predicted::PredictedBlocks;
use switchyard_core::router::{KvCost, RequestId, RouteRequest, Router, RouterConfig};
use switchyard_core::worker::{Rank, Tier};

const BLOCK_SIZE: usize = 16;
const WORKERS: u32 = 16;
const BLOCKS_PER_WORKER: usize = 16_384;
/// Length of the unrelated chains that fill each worker's cache.
const FILLER_CHAIN: usize = 512;
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

/// A prompt with its tokens and precomputed sequence hashes.
struct Prompt {
    tokens: Vec<u32>,
    hashes: Vec<SequenceHash>,
}

impl Prompt {
    fn random(rng: &mut SmallRng, hasher: &BlockHasher, tokens: usize) -> Self {
        let tokens: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..150_000)).collect();
        let hashes = hasher.sequence(&tokens);
        Self { tokens, hashes }
    }
}

/// Everything the benches read: the hasher, both prompts and the populated index.
struct Fixture {
    hasher: BlockHasher,
    long: Prompt,
    short: Prompt,
    index: KvIndex,
}

impl Fixture {
    fn new() -> Self {
        let mut rng = SmallRng::seed_from_u64(16);
        let hasher = BlockHasher::new(BLOCK_SIZE);
        let long = Prompt::random(&mut rng, &hasher, 32 * 1024);
        let short = Prompt::random(&mut rng, &hasher, 2 * 1024);
        let mut index = KvIndex::new();
        for worker in 0..WORKERS {
            let rank = Rank::new(worker, 0);
            let mut held = 0;
            for prompt in [&long.hashes, &short.hashes] {
                // Worker i holds i/16 of the prefix on the device; odd workers 1/8 more on host,
                // so the deepest match mixes tiers and the walk covers the whole prompt.
                let device = prompt.len() * worker as usize / WORKERS as usize;
                let host_end = (device + prompt.len() / 8).min(prompt.len());
                store(&mut index, rank, Tier::Device, &prompt[..device]);
                if worker % 2 == 1 {
                    store(&mut index, rank, Tier::Host, &prompt[device..host_end]);
                }
                held += device;
            }
            // Unrelated conversations fill the rest of the cache: the index is sized like a busy
            // cluster's, so hash-map lookups miss the CPU caches as they would in production.
            while held < BLOCKS_PER_WORKER {
                let len = FILLER_CHAIN.min(BLOCKS_PER_WORKER - held);
                let locals: Vec<LocalBlockHash> =
                    (0..len).map(|_| LocalBlockHash(rng.random())).collect();
                store(
                    &mut index,
                    rank,
                    Tier::Device,
                    &hasher.sequence_from(None, &locals),
                );
                held += len;
            }
        }
        Self {
            hasher,
            long,
            short,
            index,
        }
    }
}

fn store(index: &mut KvIndex, rank: Rank, tier: Tier, blocks: &[SequenceHash]) {
    index.apply(&IndexOp::Store {
        rank,
        tier,
        blocks: blocks.to_vec(),
    });
}

/// A router over the 16 workers that routes one request at a time.
struct RouteLoop {
    router: Router,
    next_id: u64,
    now: Duration,
}

impl RouteLoop {
    fn new() -> Self {
        let mut router = Router::new(RouterConfig::default(), Box::new(KvCost));
        for worker in 0..WORKERS {
            router.add_rank(Rank::new(worker, 0), false);
        }
        Self {
            router,
            next_id: 0,
            now: Duration::ZERO,
        }
    }

    /// Route and finish one request; returns the chosen worker.
    fn route_once(&mut self, index: &KvIndex, prompt: &Prompt) -> u32 {
        // Step past the booking TTL so each decision finds the previous booking expired: a steady
        // state in which every decision also pays for expiring one booking, as in production.
        self.now += RouterConfig::default().booking_ttl + Duration::from_secs(1);
        self.next_id += 1;
        let id = RequestId(self.next_id);
        let request = RouteRequest {
            hashes: &prompt.hashes,
            tokens: prompt.tokens.len() as u32,
            ..Default::default()
        };
        let decision = self
            .router
            .route(id, &request, index, self.now)
            .expect("16 healthy workers");
        self.router.finish(id, self.now);
        decision.rank.worker.0
    }
}

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

/// Nanoseconds per call of `f`, over about `RATIO_SLICE`.
fn time_per_call(f: &mut dyn FnMut() -> u64) -> f64 {
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < RATIO_SLICE || calls < 3 {
        black_box(f());
        calls += 1;
    }
    start.elapsed().as_nanos() as f64 / f64::from(calls)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
            let base = time_per_call(&mut baseline.1);
            let time = time_per_call(f);
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
/// against the baseline measured just before it.
fn print_tail(cases: &mut [Case<'_>]) {
    let (baseline, others) = cases.split_first_mut().expect("the baseline comes first");
    let (_, f) = others
        .iter_mut()
        .find(|(name, _)| *name == TAIL_BENCH)
        .expect("the tail bench is a case");
    let (mut p50s, mut p99s, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut times = Vec::with_capacity(TAIL_CALLS);
    for _ in 0..TAIL_ROUNDS {
        let base = time_per_call(&mut baseline.1);
        times.clear();
        for _ in 0..TAIL_CALLS {
            let start = Instant::now();
            black_box(f());
            times.push(start.elapsed().as_nanos() as f64);
        }
        times.sort_by(f64::total_cmp);
        let p99 = times[TAIL_CALLS * 99 / 100];
        p50s.push(times[TAIL_CALLS / 2]);
        p99s.push(p99);
        ratios.push(p99 / base);
    }
    println!(
        "\n{TAIL_BENCH}, {TAIL_ROUNDS} rounds of {TAIL_CALLS} calls timed one by one (median of rounds):"
    );
    println!(
        "p50 {:.1} us, p99 {:.1} us, p99 {:.3} x baseline",
        median(&mut p50s) / 1e3,
        median(&mut p99s) / 1e3,
        median(&mut ratios)
    );
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
    let (mut long, mut short) = (RouteLoop::new(), RouteLoop::new());
    // The deepest holder (device and host) must win, or the bench measures a different decision.
    assert_eq!(long.route_once(&fixture.index, &fixture.long), WORKERS - 1);
    assert_eq!(
        short.route_once(&fixture.index, &fixture.short),
        WORKERS - 1
    );

    let mut cases = cases(&fixture, &mut long, &mut short);
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
        print_tail(&mut cases);
    }
}
