//! The Mooncake conversation trace turned into the index's workload: one lookup per request and
//! the KV events that request makes 16 simulated workers publish.
//!
//! Everything here runs before the clock starts; the modes in `main.rs` only replay it.

use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::BufRead;
use std::path::Path;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::worker::{Rank, Tier};

/// Tokens per block of our index (the engines' block size).
const BLOCK_TOKENS: usize = 16;
/// Tokens per Mooncake hash id.
const TRACE_BLOCK_TOKENS: usize = 512;
/// Our blocks per Mooncake hash id.
const BLOCKS_PER_ID: usize = TRACE_BLOCK_TOKENS / BLOCK_TOKENS;
/// Simulated workers.
pub(crate) const WORKERS: usize = 16;
/// Device cache of each worker, in blocks (256K tokens).
pub(crate) const CACHE_BLOCKS: usize = 16_384;

/// One trace row; other fields are ignored.
#[derive(Deserialize)]
struct Row {
    input_length: usize,
    hash_ids: Vec<u64>,
}

/// Requests in trace order: `lookups[i]` is request i's prompt, `events[i]` what placing it caused.
pub(crate) struct Workload {
    pub(crate) lookups: Vec<Vec<SequenceHash>>,
    pub(crate) events: Vec<Vec<IndexOp>>,
    /// Nodes in the index once every event is applied, for checking each mode's final state.
    pub(crate) final_nodes: usize,
    /// Share of prompt blocks that were already cached on the chosen worker.
    pub(crate) hit_ratio: f64,
}

impl Workload {
    /// Read up to `max_rows` rows of the trace at `path` and simulate the workers.
    pub(crate) fn from_trace(path: &Path, max_rows: usize) -> std::io::Result<Self> {
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        let hasher = BlockHasher::new(BLOCK_TOKENS);
        let mut workers: Vec<LruCache> = (0..WORKERS).map(|_| LruCache::default()).collect();
        // The index as the events so far leave it: placement reads it like the router would.
        let mut index = KvIndex::new();
        let mut placement = Placement::default();
        let (mut lookups, mut events) = (Vec::new(), Vec::new());
        let (mut prompt_blocks, mut hits) = (0usize, 0usize);
        for (n, line) in file.lines().take(max_rows).enumerate() {
            let row: Row = serde_json::from_str(&line?)?;
            let hashes = expand(&hasher, &row);
            let worker = placement.place(&index, &hashes, n);
            let rank = Rank::new(worker as u32, 0);
            let missing = workers[worker].use_blocks(&hashes);
            let evicted = workers[worker].evict_overflow();
            prompt_blocks += hashes.len();
            hits += hashes.len() - missing.len();
            let mut ops = Vec::new();
            if !missing.is_empty() {
                ops.push(IndexOp::Store {
                    rank,
                    tier: Tier::Device,
                    blocks: missing,
                    locals: Vec::new(),
                });
            }
            if !evicted.is_empty() {
                ops.push(IndexOp::Remove {
                    rank,
                    tier: Tier::Device,
                    blocks: evicted,
                });
            }
            for op in &ops {
                index.apply(op);
            }
            lookups.push(hashes);
            events.push(ops);
        }
        Ok(Self {
            lookups,
            events,
            final_nodes: index.node_count(),
            hit_ratio: hits as f64 / prompt_blocks.max(1) as f64,
        })
    }

    /// Hashes looked up, summed over all lookups.
    pub(crate) fn lookup_blocks(&self) -> usize {
        self.lookups.iter().map(Vec::len).sum()
    }

    /// Blocks touched by events (`IndexOp::block_count`), summed.
    pub(crate) fn event_blocks(&self) -> usize {
        self.events.iter().flatten().map(IndexOp::block_count).sum()
    }

    /// Events in stream order.
    pub(crate) fn ops(&self) -> impl Iterator<Item = &IndexOp> {
        self.events.iter().flatten()
    }
}

/// Our sequence hashes for a trace row: each 512-token id becomes 32 blocks whose local hashes
/// derive from (id, position in the id), chained, so equal id prefixes give equal chains. Only
/// full 16-token blocks of `input_length` are kept, as an engine would hash them.
fn expand(hasher: &BlockHasher, row: &Row) -> Vec<SequenceHash> {
    let blocks = (row.input_length / BLOCK_TOKENS).min(row.hash_ids.len() * BLOCKS_PER_ID);
    let mut parent = None;
    (0..blocks)
        .map(|position| {
            let id = row.hash_ids[position / BLOCKS_PER_ID];
            let within = (position % BLOCKS_PER_ID) as u32;
            let local = hasher.local(&[id as u32, (id >> 32) as u32, within]);
            let hash = hasher.chain(parent, local);
            parent = Some(hash);
            hash
        })
        .collect()
}

/// Where requests go: the cheapest worker by prefill still to do plus recent load (the shape of
/// the router's `KvCost`). Deepest overlap alone would send everything to one worker: every
/// conversation in the trace starts with the same 512-token id.
#[derive(Default)]
struct Placement {
    /// Workers and prompt blocks of the last `IN_FLIGHT` requests: a stand-in for running work.
    recent: VecDeque<(usize, usize)>,
    load: [usize; WORKERS],
}

/// Requests assumed in flight cluster-wide (~3 requests/s, each running 10-20 s).
const IN_FLIGHT: usize = 48;

impl Placement {
    /// The worker for request `n`; ties go to the first at or after `n % WORKERS`, which spreads
    /// equal candidates round robin.
    fn place(&mut self, index: &KvIndex, hashes: &[SequenceHash], n: usize) -> usize {
        let matches = index.find_matches(hashes);
        let cost = |worker: usize| {
            let overlap = matches
                .iter()
                .find(|(rank, _)| rank.worker.0 as usize == worker)
                .map_or(0, |(_, overlap)| overlap.device as usize);
            hashes.len() - overlap + self.load[worker]
        };
        let chosen = (0..WORKERS)
            .map(|k| (n + k) % WORKERS)
            .min_by_key(|&worker| cost(worker))
            .expect("at least one worker");
        self.load[chosen] += hashes.len();
        self.recent.push_back((chosen, hashes.len()));
        if self.recent.len() > IN_FLIGHT {
            let (worker, blocks) = self.recent.pop_front().expect("not empty");
            self.load[worker] -= blocks;
        }
        chosen
    }
}

/// One worker's device cache: `CACHE_BLOCKS` blocks, least recently used evicted first.
#[derive(Default)]
struct LruCache {
    clock: u64,
    last_use: HashMap<SequenceHash, u64>,
    by_age: BTreeMap<u64, SequenceHash>,
}

impl LruCache {
    /// Use a request's blocks: cached ones become the most recent, the missing ones are stored
    /// and returned (the engine's `BlockStored` events). Cache hits publish no event.
    fn use_blocks(&mut self, blocks: &[SequenceHash]) -> Vec<SequenceHash> {
        let mut missing = Vec::new();
        for &hash in blocks {
            self.clock += 1;
            match self.last_use.insert(hash, self.clock) {
                Some(previous) => {
                    self.by_age.remove(&previous);
                }
                None => missing.push(hash),
            }
            self.by_age.insert(self.clock, hash);
        }
        missing
    }

    /// Evict the oldest blocks beyond capacity and return them (`BlockRemoved` events).
    fn evict_overflow(&mut self) -> Vec<SequenceHash> {
        let overflow = self.last_use.len().saturating_sub(CACHE_BLOCKS);
        let mut evicted = Vec::with_capacity(overflow);
        for _ in 0..overflow {
            let Some((_, hash)) = self.by_age.pop_first() else {
                break;
            };
            self.last_use.remove(&hash);
            evicted.push(hash);
        }
        evicted
    }
}
