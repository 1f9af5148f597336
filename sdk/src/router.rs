//! The routing decision point: which worker serves a request.

use crate::types::{Extensions, Params, PolicyMetadata, Request, no_params};

/// The candidate workers as columns: every `Vec` has one entry per candidate, in the same order,
/// and a [`Decision`] refers to candidates by that index. Use [`Workers::iter`] or
/// [`Workers::get`] for one candidate at a time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Workers {
    /// Engine server of each candidate.
    pub worker_ids: Vec<u32>,
    /// Data-parallel rank within that server (0 without data parallelism).
    pub dp_ranks: Vec<u32>,
    /// Prefix blocks of this request already on the device.
    pub device_blocks: Vec<u32>,
    /// Further prefix blocks in host memory.
    pub host_blocks: Vec<u32>,
    /// Further prefix blocks on local disk.
    pub disk_blocks: Vec<u32>,
    /// Further prefix blocks in storage shared between workers.
    pub shared_blocks: Vec<u32>,
    /// All blocks indexed on the candidate (the host breaks cost ties towards the emptier one).
    pub indexed_blocks: Vec<u64>,
    /// Uncached prompt tokens of in-flight requests that have no first token yet.
    pub active_prefill_tokens: Vec<u64>,
    /// KV blocks held by running requests.
    pub active_decode_blocks: Vec<u64>,
    /// Requests in flight.
    pub active_requests: Vec<u32>,
    /// KV capacity in blocks (0 when unknown).
    pub kv_capacity_blocks: Vec<u64>,
    /// Fraction of KV capacity in use, 0.0 to 1.0 (0.0 when unknown).
    pub kv_usage: Vec<f32>,
    /// Requests waiting in the engine's queue (0 when unknown).
    pub queue_depth: Vec<u32>,
    /// Health as the host sees it.
    pub healthy: Vec<bool>,
    /// Experimental numeric per-worker signals: (name, one value per candidate).
    pub extra_columns: Vec<(String, Vec<f64>)>,
    /// Extra pool-wide signals.
    pub extensions: Extensions,
}

/// One candidate, copied out of the [`Workers`] columns.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Worker {
    /// Engine server.
    pub worker_id: u32,
    /// Data-parallel rank within that server.
    pub dp_rank: u32,
    /// Prefix blocks of this request already on the device.
    pub device_blocks: u32,
    /// Further prefix blocks in host memory.
    pub host_blocks: u32,
    /// Further prefix blocks on local disk.
    pub disk_blocks: u32,
    /// Further prefix blocks in shared storage.
    pub shared_blocks: u32,
    /// All blocks indexed on the candidate.
    pub indexed_blocks: u64,
    /// Uncached prompt tokens of in-flight requests without a first token.
    pub active_prefill_tokens: u64,
    /// KV blocks held by running requests.
    pub active_decode_blocks: u64,
    /// Requests in flight.
    pub active_requests: u32,
    /// KV capacity in blocks (0 when unknown).
    pub kv_capacity_blocks: u64,
    /// Fraction of KV capacity in use.
    pub kv_usage: f32,
    /// Requests waiting in the engine's queue.
    pub queue_depth: u32,
    /// Health as the host sees it.
    pub healthy: bool,
}

impl Workers {
    /// Number of candidates: the shortest column, so a malformed input can never index out of
    /// bounds (a panic in a guest is a trap, which costs the host a fallback).
    pub fn len(&self) -> usize {
        [
            self.worker_ids.len(),
            self.dp_ranks.len(),
            self.device_blocks.len(),
            self.host_blocks.len(),
            self.disk_blocks.len(),
            self.shared_blocks.len(),
            self.indexed_blocks.len(),
            self.active_prefill_tokens.len(),
            self.active_decode_blocks.len(),
            self.active_requests.len(),
            self.kv_capacity_blocks.len(),
            self.kv_usage.len(),
            self.queue_depth.len(),
            self.healthy.len(),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Whether there are no candidates (never true for inputs from the host).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Candidate `index`, if it exists.
    pub fn get(&self, index: usize) -> Option<Worker> {
        if index >= self.len() {
            return None;
        }
        Some(Worker {
            worker_id: self.worker_ids[index],
            dp_rank: self.dp_ranks[index],
            device_blocks: self.device_blocks[index],
            host_blocks: self.host_blocks[index],
            disk_blocks: self.disk_blocks[index],
            shared_blocks: self.shared_blocks[index],
            indexed_blocks: self.indexed_blocks[index],
            active_prefill_tokens: self.active_prefill_tokens[index],
            active_decode_blocks: self.active_decode_blocks[index],
            active_requests: self.active_requests[index],
            kv_capacity_blocks: self.kv_capacity_blocks[index],
            kv_usage: self.kv_usage[index],
            queue_depth: self.queue_depth[index],
            healthy: self.healthy[index],
        })
    }

    /// Every candidate with its index, in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Worker)> + '_ {
        (0..self.len()).filter_map(|i| self.get(i).map(|w| (i, w)))
    }

    /// The index of the candidate `(worker_id, dp_rank)`, if present.
    pub fn position(&self, worker_id: u32, dp_rank: u32) -> Option<usize> {
        self.worker_ids
            .iter()
            .zip(&self.dp_ranks)
            .position(|(&w, &r)| w == worker_id && r == dp_rank)
    }

    /// The experimental column `name`, if the host sent it.
    pub fn extra_column(&self, name: &str) -> Option<&[f64]> {
        self.extra_columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, values)| values.as_slice())
    }

    /// Since WIT 1.2: refill these columns from `route-packed`'s lists (the `packed-workers`
    /// record): `counts` holds eight columns of `count` entries each and `sizes` four, in that
    /// record's order; every candidate is healthy. A short list leaves its columns short, so
    /// [`Workers::len`] counts only whole candidates. The columns keep their buffers, so a
    /// policy's instance stops allocating for them after its first calls.
    pub fn unpack(&mut self, count: usize, counts: &[u32], sizes: &[u64], kv_usage: &[f32]) {
        fn column<T: Copy>(column: &mut Vec<T>, list: &[T], c: usize, count: usize) {
            column.clear();
            let start = c.saturating_mul(count).min(list.len());
            let end = start.saturating_add(count).min(list.len());
            column.extend_from_slice(&list[start..end]);
        }
        let u32_columns = [
            &mut self.worker_ids,
            &mut self.dp_ranks,
            &mut self.device_blocks,
            &mut self.host_blocks,
            &mut self.disk_blocks,
            &mut self.shared_blocks,
            &mut self.active_requests,
            &mut self.queue_depth,
        ];
        for (c, values) in u32_columns.into_iter().enumerate() {
            column(values, counts, c, count);
        }
        let u64_columns = [
            &mut self.indexed_blocks,
            &mut self.active_prefill_tokens,
            &mut self.active_decode_blocks,
            &mut self.kv_capacity_blocks,
        ];
        for (c, values) in u64_columns.into_iter().enumerate() {
            column(values, sizes, c, count);
        }
        column(&mut self.kv_usage, kv_usage, 0, count);
        self.healthy.clear();
        // No more than the lists could hold: `count` comes from the other side.
        self.healthy.resize(count.min(counts.len()), true);
    }

    /// Appends a candidate (for building inputs in tests).
    pub fn push(&mut self, worker: Worker) {
        self.worker_ids.push(worker.worker_id);
        self.dp_ranks.push(worker.dp_rank);
        self.device_blocks.push(worker.device_blocks);
        self.host_blocks.push(worker.host_blocks);
        self.disk_blocks.push(worker.disk_blocks);
        self.shared_blocks.push(worker.shared_blocks);
        self.indexed_blocks.push(worker.indexed_blocks);
        self.active_prefill_tokens
            .push(worker.active_prefill_tokens);
        self.active_decode_blocks.push(worker.active_decode_blocks);
        self.active_requests.push(worker.active_requests);
        self.kv_capacity_blocks.push(worker.kv_capacity_blocks);
        self.kv_usage.push(worker.kv_usage);
        self.queue_depth.push(worker.queue_depth);
        self.healthy.push(worker.healthy);
    }
}

impl FromIterator<Worker> for Workers {
    fn from_iter<I: IntoIterator<Item = Worker>>(rows: I) -> Self {
        let mut workers = Self::default();
        for row in rows {
            workers.push(row);
        }
        workers
    }
}

/// A routing policy's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send to the candidate at this index.
    Chosen(usize),
    /// One finite cost per candidate, lower is better; the host picks with its temperature
    /// (0: the cheapest, ties to the emptier worker).
    Costs(Vec<f64>),
    /// Hold the request in the gateway queue; the string says why.
    Queue(String),
    /// Refuse the request; the string says why and reaches the client.
    Reject(String),
}

/// What happened to a request this policy placed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// Index of the chosen candidate in the `Workers` of the `select` call that placed it.
    pub worker_index: usize,
    /// Engine server it ran on.
    pub worker_id: u32,
    /// Data-parallel rank it ran on.
    pub dp_rank: u32,
    /// Session of the request, if known.
    pub session_id: Option<String>,
    /// Time to first token in milliseconds, if a token came.
    pub ttft_ms: Option<f64>,
    /// Mean inter-token latency in milliseconds, if two tokens or more came.
    pub itl_ms: Option<f64>,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens produced.
    pub output_tokens: u32,
    /// Why the request failed, if it did.
    pub error: Option<String>,
}

/// A routing policy. Export it with [`crate::export_router!`]; one instance sees every call in
/// order, so `&mut self` state (counters, posteriors, session maps) persists between calls.
pub trait RouterPolicy {
    /// Who the policy is; called once at load.
    fn metadata(&self) -> PolicyMetadata;

    /// Place `request` on one of `workers` (never empty). Runs on the request path under a
    /// deadline of a few milliseconds.
    fn select(&mut self, request: &Request, workers: &Workers) -> Decision;

    /// Feedback on a request this policy placed, once it ended. Default: ignore it.
    fn observe(&mut self, _outcome: &Outcome) {}

    /// Order key of a request waiting in the gateway queue; lower keys are served first.
    /// Default: higher priority first (the host keeps arrival order among equal keys).
    fn queue_key(&mut self, request: &Request) -> f64 {
        -f64::from(request.priority)
    }

    /// Since WIT 1.1: the order key of a request joining the gateway queue, knowing it arrived
    /// at `arrival_ms` (the host's monotonic clock), lower first; `arrival_ms as f64 -
    /// head_start_ms` is FCFS with a head start. `None` (the default): the queue's own
    /// configured order, as for a 1.0 policy.
    fn queue_key_at(&mut self, _request: &Request, _arrival_ms: u64) -> Option<f64> {
        None
    }

    /// Since WIT 1.1: the parameters the configuration gives the policy
    /// (`name:key=value:...`), before any decision and again for every new instance; `Err`
    /// refuses them and the load fails with that reason. Default: take none.
    fn configure(&mut self, params: &Params) -> Result<(), String> {
        no_params(&self.metadata().name, params)
    }
}

/// The KV cost of sending `request` to `worker` (agentic-serving.md section 3): weighted prefill
/// still to do plus decode load. The same arithmetic, operation for operation, as the gateway's
/// native `KvCost::cost`, so a Wasm policy built on it decides exactly as the native fallback.
/// Shared-pool blocks (already counted beyond the worker's own prefix by the host) earn
/// [`CostWeights::shared_credit`](crate::CostWeights::shared_credit).
pub fn kv_cost(request: &Request, worker: &Worker) -> f64 {
    let w = &request.weights;
    let bs = f64::from(request.block_size.max(1));
    let raw_prefill_blocks = worker.active_prefill_tokens as f64 / bs + f64::from(request.blocks);
    let credit = w.device_credit * f64::from(worker.device_blocks)
        + w.host_credit * f64::from(worker.host_blocks)
        + w.disk_credit * f64::from(worker.disk_blocks)
        + w.shared_credit * f64::from(worker.shared_blocks);
    let adjusted_prefill = (raw_prefill_blocks - credit).max(0.0);
    let new_blocks = request.blocks.saturating_sub(worker.device_blocks);
    let decode_blocks = worker.active_decode_blocks as f64 + f64::from(new_blocks);
    w.prefill_load_scale * adjusted_prefill + decode_blocks
}

/// [`kv_cost`] of every candidate, in order.
pub fn kv_costs(request: &Request, workers: &Workers) -> Vec<f64> {
    workers.iter().map(|(_, w)| kv_cost(request, &w)).collect()
}

/// The candidate the host picks from `costs` at temperature 0: the cheapest, ties to the fewest
/// indexed blocks, then (where the host would draw at random) the lowest index.
pub fn cheapest(costs: &[f64], workers: &Workers) -> Option<usize> {
    workers
        .iter()
        .zip(costs)
        .min_by(|((_, a), ca), ((_, b), cb)| {
            ca.total_cmp(cb)
                .then(a.indexed_blocks.cmp(&b.indexed_blocks))
        })
        .map(|((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: u32) -> Worker {
        Worker {
            worker_id: i,
            dp_rank: i % 2,
            device_blocks: 10 + i,
            host_blocks: 20 + i,
            disk_blocks: 30 + i,
            shared_blocks: 40 + i,
            indexed_blocks: 50 + u64::from(i),
            active_prefill_tokens: 60 + u64::from(i),
            active_decode_blocks: 70 + u64::from(i),
            active_requests: 80 + i,
            kv_capacity_blocks: 90 + u64::from(i),
            kv_usage: 0.25 * i as f32,
            queue_depth: 100 + i,
            healthy: true,
        }
    }

    /// `w`'s columns as the host packs them (`packed-workers`' order).
    fn pack(w: &Workers) -> (Vec<u32>, Vec<u64>) {
        let counts = [
            &w.worker_ids,
            &w.dp_ranks,
            &w.device_blocks,
            &w.host_blocks,
            &w.disk_blocks,
            &w.shared_blocks,
            &w.active_requests,
            &w.queue_depth,
        ];
        let sizes = [
            &w.indexed_blocks,
            &w.active_prefill_tokens,
            &w.active_decode_blocks,
            &w.kv_capacity_blocks,
        ];
        (
            counts.into_iter().flatten().copied().collect(),
            sizes.into_iter().flatten().copied().collect(),
        )
    }

    #[test]
    fn unpack_restores_every_column_over_stale_ones() {
        let workers: Workers = (0..5).map(row).collect();
        let (counts, sizes) = pack(&workers);
        let mut reused: Workers = (7..16).map(row).collect();
        reused.unpack(5, &counts, &sizes, &workers.kv_usage);
        assert_eq!(reused, workers);
    }

    #[test]
    fn short_lists_give_fewer_candidates_not_a_panic() {
        let workers: Workers = (0..4).map(row).collect();
        let (counts, sizes) = pack(&workers);
        let mut unpacked = Workers::default();
        unpacked.unpack(4, &counts[..counts.len() - 1], &sizes, &workers.kv_usage);
        assert_eq!(unpacked.len(), 3, "the last u32 column lost an entry");
        unpacked.unpack(usize::MAX, &counts, &sizes, &[]);
        assert_eq!(unpacked.len(), 0);
    }
}
