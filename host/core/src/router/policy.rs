//! The routing decision as a policy: what a policy sees, what it answers, and the native policies.
//!
//! The policy-platform work puts the same trait behind a Wasm component; the router core does not
//! change.

use crate::index::Overlap;
use crate::worker::Rank;
use std::time::Duration;

/// Weights of the KV cost (agentic-serving.md section 3); any request may override them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostWeights {
    /// Credit per prefix block already on the device.
    pub device_credit: f64,
    /// Credit per further prefix block in host memory.
    pub host_credit: f64,
    /// Credit per further prefix block on disk.
    pub disk_credit: f64,
    /// Credit per further prefix block in the shared pool (G4), counted only beyond what the
    /// rank holds itself (Dynamo's `hits_beyond`); 0 ignores the pool.
    pub shared_credit: f64,
    /// Weight of prefill work against decode load.
    pub prefill_load_scale: f64,
}

impl Default for CostWeights {
    fn default() -> Self {
        Self {
            device_credit: 1.0,
            host_credit: 0.75,
            disk_credit: 0.25,
            // Dynamo's multiplier for a shared pool: a fetch over the network, cheaper than
            // recompute, dearer than the rank's own disk.
            shared_credit: 0.5,
            prefill_load_scale: 1.0,
        }
    }
}

/// The request as a policy sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyRequest<'a> {
    /// Prompt tokens.
    pub tokens: u32,
    /// Full prompt blocks (`tokens / block_size`, rounded up: a partial block still needs a slot).
    pub blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Cost weights in force for this request.
    pub weights: CostWeights,
    /// The weights the request itself asked for, if any (`weights` already includes them).
    pub overrides: Option<CostWeights>,
    /// Agent session the request belongs to, if known.
    pub session_id: Option<&'a str>,
    /// Session that spawned this one (a subagent's parent), if known.
    pub parent_session_id: Option<&'a str>,
    /// Scheduling priority; higher is more urgent, 0 is normal.
    pub priority: i32,
    /// Expected output tokens, if the caller hinted them.
    pub osl: Option<u32>,
}

/// One rank the request may go to, with its overlap and load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The rank.
    pub rank: Rank,
    /// Prefix it holds, per tier (events and bookings combined).
    pub overlap: Overlap,
    /// Further prefix blocks the shared pool holds beyond `overlap` (the run the rank could
    /// fetch instead of recompute; 0 without a pool).
    pub shared_blocks: u32,
    /// All blocks indexed on the rank (tie-break: the emptier rank wins).
    pub indexed_blocks: u64,
    /// Uncached prompt tokens of its requests that have not produced a first token.
    pub active_prefill_tokens: u64,
    /// KV blocks of its running requests.
    pub active_decode_blocks: u64,
    /// Requests in flight on it.
    pub active_requests: u32,
}

/// A policy's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// Send to `candidates[i]`.
    Pick(usize),
    /// A cost per candidate (lower is better); the router picks with its temperature.
    Costs(Vec<f64>),
    /// Refuse the request.
    Reject(String),
}

/// What happened to a request a policy placed, as the caller measured it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The rank it ran on.
    pub rank: Rank,
    /// Index of that rank among the candidates of the `select` call that placed the request
    /// ([`Decision::candidate_index`](super::Decision::candidate_index)).
    pub candidate_index: usize,
    /// Session of the request, if known.
    pub session_id: Option<String>,
    /// Time to first token, if a token came.
    pub ttft: Option<Duration>,
    /// Mean inter-token latency, if two tokens or more came.
    pub itl: Option<Duration>,
    /// Prompt tokens the engine served from its prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens produced.
    pub output_tokens: u32,
    /// Why the request failed, if it did.
    pub error: Option<String>,
}

/// A routing decision point. Implementations: the native ones below, and Wasm components.
pub trait RoutingPolicy: Send + std::fmt::Debug {
    /// Name for metrics and logs.
    fn name(&self) -> &str;
    /// Choose among `candidates` (never empty).
    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection;
    /// Feedback on a request this policy placed, once it ended (learning policies use it).
    fn observe(&mut self, _outcome: &Outcome) {}
    /// Order key of `request` while it waits in the router queue, lower first (the Wasm router
    /// world's `queue-key`). `None` (the default): the queue's own order
    /// ([`QueueOrder`](super::queue::QueueOrder)) applies.
    fn queue_key(&mut self, _request: &PolicyRequest<'_>) -> Option<f64> {
        None
    }
    /// Order key of `request` as it joins the router queue at `arrival` (the router's clock),
    /// lower first: the Wasm router world's 1.1 `queue-key-at`, which can express FCFS with a
    /// head start. Default: [`RoutingPolicy::queue_key`].
    fn queue_key_at(&mut self, request: &PolicyRequest<'_>, _arrival: Duration) -> Option<f64> {
        self.queue_key(request)
    }
    /// Whether [`select`](Self::select) reads what the KV index says of the candidates
    /// (`overlap`, `shared_blocks`, `indexed_blocks`). A driver may keep no index for a policy
    /// that does not: the simulator then skips the engines' KV events, as Dynamo's replay does
    /// for round robin. Default: yes.
    fn reads_index(&self) -> bool {
        true
    }
}

/// The KV-aware cost of agentic-serving.md section 3.
#[derive(Debug, Default, Clone, Copy)]
pub struct KvCost;

impl KvCost {
    /// Cost of sending `request` to `c`: weighted prefill still to do plus decode load.
    pub fn cost(request: &PolicyRequest<'_>, c: &Candidate) -> f64 {
        let w = &request.weights;
        let bs = f64::from(request.block_size.max(1));
        let raw_prefill_blocks = c.active_prefill_tokens as f64 / bs + f64::from(request.blocks);
        let credit = w.device_credit * f64::from(c.overlap.device)
            + w.host_credit * f64::from(c.overlap.host)
            + w.disk_credit * f64::from(c.overlap.disk)
            + w.shared_credit * f64::from(c.shared_blocks);
        let adjusted_prefill = (raw_prefill_blocks - credit).max(0.0);
        let new_blocks = request.blocks.saturating_sub(c.overlap.device);
        let decode_blocks = c.active_decode_blocks as f64 + f64::from(new_blocks);
        w.prefill_load_scale * adjusted_prefill + decode_blocks
    }
}

impl RoutingPolicy for KvCost {
    fn name(&self) -> &str {
        "kv-cost"
    }

    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        Selection::Costs(candidates.iter().map(|c| Self::cost(request, c)).collect())
    }
}

/// Rotate over the candidates, ignoring the cache: the baseline KV routing is measured against.
#[derive(Debug, Default, Clone)]
pub struct RoundRobin {
    next: usize,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &str {
        "round-robin"
    }

    fn select(&mut self, _request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        let i = self.next % candidates.len();
        self.next = self.next.wrapping_add(1);
        Selection::Pick(i)
    }

    fn reads_index(&self) -> bool {
        false
    }
}

/// The native policy named `name`, if there is one.
pub fn native_policy(name: &str) -> Option<Box<dyn RoutingPolicy>> {
    match name {
        "kv-cost" | "kv" => Some(Box::new(KvCost)),
        "round-robin" => Some(Box::new(RoundRobin::default())),
        _ => None,
    }
}
