//! The routing-decision fixture shared by `switchyard-core`'s `router` bench (native policies) and
//! `switchyard-policy-host`'s `decision` bench (the same decision with a Wasm policy), so both
//! measure one index, one prompt and one decision.
//!
//! 16 workers that each hold 16,384 blocks of 16 tokens (~248K index nodes). Worker `i` holds the
//! first `i/16` of a 32K-token prompt on the device (odd workers a further 1/8 in host memory) and
//! the same share of a 2K-token prompt; the rest of its blocks are unrelated chains, so hash-map
//! lookups miss the CPU caches as they would in a busy cluster.
#![allow(
    dead_code,
    reason = "each bench that includes this module uses a different part of it"
)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use switchyard_core::hash::{BlockHasher, LocalBlockHash, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::router::{RequestId, RouteRequest, Router, RouterConfig, RoutingPolicy};
use switchyard_core::worker::{Rank, Tier};

const BLOCK_SIZE: usize = 16;
pub(crate) const WORKERS: u32 = 16;
pub(crate) const BLOCKS_PER_WORKER: usize = 16_384;
/// Length of the unrelated chains that fill each worker's cache.
const FILLER_CHAIN: usize = 512;

/// A prompt with its tokens and precomputed sequence hashes.
pub(crate) struct Prompt {
    pub(crate) tokens: Vec<u32>,
    pub(crate) hashes: Vec<SequenceHash>,
}

impl Prompt {
    fn random(rng: &mut SmallRng, hasher: &BlockHasher, tokens: usize) -> Self {
        let tokens: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..150_000)).collect();
        let hashes = hasher.sequence(&tokens);
        Self { tokens, hashes }
    }
}

/// Everything the benches read: the hasher, both prompts and the populated index.
pub(crate) struct Fixture {
    pub(crate) hasher: BlockHasher,
    pub(crate) long: Prompt,
    pub(crate) short: Prompt,
    pub(crate) index: KvIndex,
}

impl Fixture {
    pub(crate) fn new() -> Self {
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
        locals: Vec::new(),
    });
}

/// A router over the 16 workers that routes one request at a time.
pub(crate) struct RouteLoop {
    router: Router,
    next_id: u64,
    now: Duration,
}

impl RouteLoop {
    pub(crate) fn new(policy: Box<dyn RoutingPolicy>) -> Self {
        let mut router = Router::new(RouterConfig::default(), policy);
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
    pub(crate) fn route_once(&mut self, index: &KvIndex, prompt: &Prompt) -> u32 {
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

/// Nanoseconds per call of `f`, over about `slice` (at least 3 calls).
pub(crate) fn time_per_call(f: &mut dyn FnMut() -> u64, slice: Duration) -> f64 {
    let start = std::time::Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < slice || calls < 3 {
        std::hint::black_box(f());
        calls += 1;
    }
    start.elapsed().as_nanos() as f64 / f64::from(calls)
}

/// `calls` calls of `f` timed one by one: their (p50, p99) in nanoseconds.
pub(crate) fn tail(f: &mut dyn FnMut() -> u64, calls: usize) -> (f64, f64) {
    let stats = tail_stats(f, calls);
    (stats.p50, stats.p99)
}

/// Per-call times of one round of [`tail_stats`], in nanoseconds.
pub(crate) struct TailStats {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) mean: f64,
}

/// `calls` calls of `f` timed one by one: their p50, p99 and mean in nanoseconds.
pub(crate) fn tail_stats(f: &mut dyn FnMut() -> u64, calls: usize) -> TailStats {
    let mut times: Vec<f64> = (0..calls)
        .map(|_| {
            let start = std::time::Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_nanos() as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    TailStats {
        p50: times[calls / 2],
        p99: times[calls * 99 / 100],
        mean: times.iter().sum::<f64>() / calls as f64,
    }
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
