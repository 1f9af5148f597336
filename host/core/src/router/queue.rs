//! The router queue: requests wait in the router only when every worker they may go to is over
//! its load threshold (agentic-serving.md section 3, "Queue").
//!
//! **Threshold.** A rank is *saturated* when its uncached prompt tokens still before their first
//! token exceed [`QueueConfig::max_prefill_tokens`] (set it to `k x max_num_batched_tokens`: `k`
//! engine steps of prefill already waiting there), or its requests in flight reach
//! [`QueueConfig::max_requests`]. Both come from the router's own bookings, so a queued request
//! leaves as soon as a first token or an end releases load. With neither set the queue never
//! holds anything (the default: a too-low threshold collapsed throughput 4x in practice).
//!
//! **Order.** A max-heap keyed by `(strict_priority tier, then the lowest key)`:
//!
//! | [`QueueOrder`] | key (lower first) |
//! |---|---|
//! | `Fcfs` (default) | `arrival_s - priority * priority_unit_s`: first come first served, priority a head start |
//! | `Lcfs` | `-(arrival_s + priority * priority_unit_s)`: newest first |
//! | `Wspt` | `-weight / uncached_prefill_tokens`, `weight = 1 + priority` (`1 / (1 - priority)` below 0) |
//!
//! When the routing policy defines a key ([`Router::queue_key`], the Wasm `queue-key` export) it
//! replaces the table's, unless [`QueueConfig::use_policy_key`] is off; a [`QueueKey`] replaces
//! the built-in order altogether. Ties go first come first served.
//!
//! **Answers.** A request with `do_not_queue` that would have to wait gets
//! [`QueueError::WouldQueue`] with a retry hint (the gateway's 429 + `Retry-After`); a full queue
//! rejects ([`QueueError::Full`]). A request leaving the queue is routed afresh: its overlap is
//! looked up again, since the index moved while it waited.

use super::{Decision, RequestId, RouteError, RouteRequest, Router};
use crate::hash::SequenceHash;
use crate::index::KvIndex;
use crate::router::CostWeights;
use crate::worker::Rank;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The built-in orders of the queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum QueueOrder {
    /// First come first served; priority is a head start.
    #[default]
    Fcfs,
    /// Last come first served; priority makes a request count as newer.
    Lcfs,
    /// Weighted shortest processing time: `(1 + priority) / uncached prefill tokens`, highest first.
    Wspt,
}

/// Queue settings.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Built-in order. Default: [`QueueOrder::Fcfs`].
    pub order: QueueOrder,
    /// A rank is saturated above this many uncached prompt tokens before their first token
    /// (e.g. `4 * max_num_batched_tokens`). Default: none.
    pub max_prefill_tokens: Option<u64>,
    /// A rank is saturated at this many requests in flight. Default: none.
    pub max_requests: Option<u32>,
    /// Most requests waiting; more are rejected. Default: 10,000.
    pub capacity: usize,
    /// Head start one priority point buys in the FCFS and LCFS orders. Default: 1 s.
    pub priority_unit: Duration,
    /// `Retry-After` hint of a [`QueueError::WouldQueue`] answer. Default: 1 s.
    pub retry_after: Duration,
    /// Let the routing policy's `queue_key` order the queue when it defines one. Default: true.
    pub use_policy_key: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            order: QueueOrder::Fcfs,
            max_prefill_tokens: None,
            max_requests: None,
            capacity: 10_000,
            priority_unit: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
            use_policy_key: true,
        }
    }
}

/// A request that may wait: what [`RouteRequest`] borrows, owned, plus the queue's own fields.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedRequest {
    /// Its id.
    pub id: RequestId,
    /// Sequence hashes of the prompt's full blocks.
    pub hashes: Vec<SequenceHash>,
    /// Prompt tokens.
    pub tokens: u32,
    /// Expected output tokens.
    pub expected_output_tokens: Option<u32>,
    /// The client streams the answer.
    pub client_streams: bool,
    /// Per-request cost weights.
    pub weights: Option<CostWeights>,
    /// Per-request temperature.
    pub temperature: Option<f64>,
    /// Ranks not to use.
    pub exclude: Vec<Rank>,
    /// Agent session.
    pub session_id: Option<String>,
    /// Parent session.
    pub parent_session_id: Option<String>,
    /// Priority (higher is more urgent): a head start in FCFS/LCFS, a weight in WSPT.
    pub priority: i32,
    /// Rank an admission policy placed it on.
    pub pinned_rank: Option<Rank>,
    /// Strict tier: a higher tier always leaves first. Default 0.
    pub strict_priority: i32,
    /// Answer [`QueueError::WouldQueue`] instead of waiting.
    pub do_not_queue: bool,
}

/// What a key is computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyInput {
    /// When the request reached the queue, since the driver's epoch.
    pub arrival: Duration,
    /// Its priority.
    pub priority: i32,
    /// Prompt tokens.
    pub tokens: u32,
    /// Prompt tokens no rank holds (per the index when it arrived).
    pub uncached_tokens: u32,
}

/// A queue order: lower keys leave first (within a strict tier).
pub trait QueueKey: Send + fmt::Debug {
    /// The key of a request.
    fn key(&mut self, input: &KeyInput) -> f64;
}

/// A built-in order with its head-start unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuiltinKey {
    /// The order.
    pub order: QueueOrder,
    /// Head start per priority point.
    pub priority_unit: Duration,
}

/// Placed now, or waiting.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    /// Routed at once.
    Routed(Decision),
    /// Waiting; [`RouterQueue::drain`] routes it later. `depth`: requests waiting now.
    Queued {
        /// Requests waiting, this one included.
        depth: usize,
    },
}

/// Why a request was neither routed nor queued.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueError {
    /// It asked not to wait, and would have to.
    #[error("every worker is saturated; retry in {retry_after:?}")]
    WouldQueue {
        /// When to try again.
        retry_after: Duration,
    },
    /// The queue is full.
    #[error("router queue full ({capacity} requests waiting)")]
    Full {
        /// The bound.
        capacity: usize,
    },
    /// Routing failed.
    #[error(transparent)]
    Route(#[from] RouteError),
}

/// A request that left the queue, and where it went.
#[derive(Debug, Clone, PartialEq)]
pub struct Drained {
    /// The request.
    pub request: QueuedRequest,
    /// Its routing, against the index as it is now.
    pub result: Result<Decision, RouteError>,
    /// How long it waited.
    pub waited: Duration,
}

/// Counters of a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests that waited.
    pub enqueued: u64,
    /// Requests that left by [`RouterQueue::drain`].
    pub dequeued: u64,
    /// Rejected: the queue was full.
    pub rejected_full: u64,
    /// `do_not_queue` requests answered [`QueueError::WouldQueue`].
    pub would_queue: u64,
    /// Most requests waiting at once.
    pub max_depth: usize,
}

#[derive(Debug)]
struct Entry {
    tier: i32,
    key: f64,
    seq: u64,
    arrival: Duration,
    request: QueuedRequest,
}

/// Requests waiting for a worker under its threshold.
#[derive(Debug)]
pub struct RouterQueue {
    config: QueueConfig,
    key: Box<dyn QueueKey>,
    heap: BinaryHeap<Entry>,
    next_seq: u64,
    stats: QueueStats,
}

// === impl QueueOrder ===

impl QueueOrder {
    /// Every order, for help texts.
    pub const ALL: [QueueOrder; 3] = [QueueOrder::Fcfs, QueueOrder::Lcfs, QueueOrder::Wspt];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            QueueOrder::Fcfs => "fcfs",
            QueueOrder::Lcfs => "lcfs",
            QueueOrder::Wspt => "wspt",
        }
    }
}

impl fmt::Display for QueueOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Not a queue order name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown queue order `{0}`; expected fcfs, lcfs or wspt")]
pub struct UnknownOrder(pub String);

impl FromStr for QueueOrder {
    type Err = UnknownOrder;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QueueOrder::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| UnknownOrder(s.to_owned()))
    }
}

// === impl QueueConfig ===

impl QueueConfig {
    /// Whether any threshold is set (else the queue never holds a request).
    pub fn is_enabled(&self) -> bool {
        self.max_prefill_tokens.is_some() || self.max_requests.is_some()
    }
}

// === impl QueuedRequest ===

impl QueuedRequest {
    /// An owned copy of `request`, to wait as `id`.
    pub fn new(id: RequestId, request: &RouteRequest<'_>) -> Self {
        Self {
            id,
            hashes: request.hashes.to_vec(),
            tokens: request.tokens,
            expected_output_tokens: request.expected_output_tokens,
            client_streams: request.client_streams,
            weights: request.weights,
            temperature: request.temperature,
            exclude: request.exclude.to_vec(),
            session_id: request.session_id.map(str::to_owned),
            parent_session_id: request.parent_session_id.map(str::to_owned),
            priority: request.priority,
            pinned_rank: request.pinned_rank,
            strict_priority: 0,
            do_not_queue: false,
        }
    }

    /// The request, borrowed, as [`Router::route`] takes it.
    pub fn route_request(&self) -> RouteRequest<'_> {
        RouteRequest {
            hashes: &self.hashes,
            tokens: self.tokens,
            expected_output_tokens: self.expected_output_tokens,
            client_streams: self.client_streams,
            weights: self.weights,
            temperature: self.temperature,
            exclude: &self.exclude,
            session_id: self.session_id.as_deref(),
            parent_session_id: self.parent_session_id.as_deref(),
            priority: self.priority,
            pinned_rank: self.pinned_rank,
        }
    }
}

// === impl BuiltinKey ===

impl QueueKey for BuiltinKey {
    fn key(&mut self, input: &KeyInput) -> f64 {
        let arrival = input.arrival.as_secs_f64();
        let jump = f64::from(input.priority) * self.priority_unit.as_secs_f64();
        match self.order {
            QueueOrder::Fcfs => arrival - jump,
            QueueOrder::Lcfs => -(arrival + jump),
            QueueOrder::Wspt => {
                let p = f64::from(input.priority);
                // (1 + p) as the reference writes it; below 0 it would turn negative, so the
                // weight continues as 1 / (1 - p): positive, and still rising with p.
                let weight = if p >= 0.0 { 1.0 + p } else { 1.0 / (1.0 - p) };
                -weight / f64::from(input.uncached_tokens.max(1))
            }
        }
    }
}

// === impl Entry ===

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// The max-heap's top is the entry to serve: highest tier, then lowest key, then oldest.
    fn cmp(&self, other: &Self) -> Ordering {
        self.tier
            .cmp(&other.tier)
            .then_with(|| other.key.total_cmp(&self.key))
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

// === impl RouterQueue ===

impl RouterQueue {
    /// An empty queue with the built-in order of `config`.
    pub fn new(config: QueueConfig) -> Self {
        let key = BuiltinKey {
            order: config.order,
            priority_unit: config.priority_unit,
        };
        Self::with_key(config, Box::new(key))
    }

    /// An empty queue ordered by `key` instead of `config.order`.
    pub fn with_key(config: QueueConfig, key: Box<dyn QueueKey>) -> Self {
        Self {
            config,
            key,
            heap: BinaryHeap::new(),
            next_seq: 0,
            stats: QueueStats::default(),
        }
    }

    /// Settings in force.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// Whether `request` would have to wait now: requests are waiting already, or every rank
    /// it may go to is saturated.
    pub fn would_queue(&self, request: &QueuedRequest, router: &Router) -> bool {
        !self.heap.is_empty() || !self.has_room(request, router)
    }

    /// Route `request` now if nothing waits and a rank it may go to is not saturated; else queue
    /// it (or answer why not). After a [`Submitted::Queued`] answer, and whenever load drops
    /// (first token, end of a request), call [`RouterQueue::drain`].
    pub fn submit(
        &mut self,
        request: QueuedRequest,
        router: &mut Router,
        index: &KvIndex,
        now: Duration,
    ) -> Result<Submitted, QueueError> {
        if !self.would_queue(&request, router) {
            let decision = router.route(request.id, &request.route_request(), index, now)?;
            return Ok(Submitted::Routed(decision));
        }
        if request.do_not_queue {
            self.stats.would_queue += 1;
            return Err(QueueError::WouldQueue {
                retry_after: self.config.retry_after,
            });
        }
        if self.heap.len() >= self.config.capacity {
            self.stats.rejected_full += 1;
            return Err(QueueError::Full {
                capacity: self.config.capacity,
            });
        }
        let key = self.key_of(&request, router, index, now);
        self.heap.push(Entry {
            tier: request.strict_priority,
            key,
            seq: self.next_seq,
            arrival: now,
            request,
        });
        self.next_seq += 1;
        self.stats.enqueued += 1;
        self.stats.max_depth = self.stats.max_depth.max(self.heap.len());
        Ok(Submitted::Queued {
            depth: self.heap.len(),
        })
    }

    /// Route waiting requests, best first, while ranks have room. A request whose only allowed
    /// rank is saturated (a pinned one) stays and lets the next one pass.
    pub fn drain(&mut self, router: &mut Router, index: &KvIndex, now: Duration) -> Vec<Drained> {
        router.end_due_prefills(now);
        let mut out = Vec::new();
        let mut blocked = Vec::new();
        while self.any_room(router) {
            let Some(entry) = self.heap.pop() else {
                break;
            };
            if !self.has_room(&entry.request, router) {
                blocked.push(entry);
                continue;
            }
            let result = router.route(entry.request.id, &entry.request.route_request(), index, now);
            self.stats.dequeued += 1;
            out.push(Drained {
                waited: now.saturating_sub(entry.arrival),
                request: entry.request,
                result,
            });
        }
        self.heap.extend(blocked);
        out
    }

    /// Take request `id` out of the queue (its client went away).
    pub fn remove(&mut self, id: RequestId) -> Option<QueuedRequest> {
        let mut found = None;
        let entries = std::mem::take(&mut self.heap).into_vec();
        for entry in entries {
            if entry.request.id == id && found.is_none() {
                found = Some(entry.request);
            } else {
                self.heap.push(entry);
            }
        }
        found
    }

    fn key_of(
        &mut self,
        request: &QueuedRequest,
        router: &mut Router,
        index: &KvIndex,
        now: Duration,
    ) -> f64 {
        if self.config.use_policy_key
            && let Some(key) = router.queue_key_at(&request.route_request(), now)
        {
            return key;
        }
        let block_size = router.config().block_size.max(1);
        let cached_blocks = index
            .find_matches(&request.hashes)
            .iter()
            .map(|(_, overlap)| overlap.device)
            .max()
            .unwrap_or(0);
        let input = KeyInput {
            arrival: now,
            priority: request.priority,
            tokens: request.tokens,
            uncached_tokens: request
                .tokens
                .saturating_sub(cached_blocks.saturating_mul(block_size)),
        };
        self.key.key(&input)
    }

    /// Whether `rank` takes more work.
    fn rank_has_room(&self, router: &Router, rank: Rank) -> bool {
        let load = router.load(rank);
        self.config
            .max_prefill_tokens
            .is_none_or(|max| load.prefill_tokens <= max)
            && self
                .config
                .max_requests
                .is_none_or(|max| load.requests < max)
    }

    /// Whether some rank `request` may go to takes more work (or none may: routing then fails
    /// at once rather than waiting forever).
    fn has_room(&self, request: &QueuedRequest, router: &Router) -> bool {
        if !self.config.is_enabled() {
            return true;
        }
        let eligible: Vec<Rank> = router
            .ranks()
            .filter(|&(rank, healthy)| healthy && !request.exclude.contains(&rank))
            .map(|(rank, _)| rank)
            .collect();
        let pinned = request.pinned_rank.filter(|r| eligible.contains(r));
        match pinned {
            Some(rank) => self.rank_has_room(router, rank),
            None => eligible.is_empty() || eligible.iter().any(|&r| self.rank_has_room(router, r)),
        }
    }

    /// Whether any rank takes more work (or none is healthy: waiting requests then leave, and
    /// fail, rather than wait forever).
    fn any_room(&self, router: &Router) -> bool {
        let mut healthy = router.ranks().filter(|(_, healthy)| *healthy).peekable();
        !self.config.is_enabled()
            || healthy.peek().is_none()
            || healthy.any(|(rank, _)| self.rank_has_room(router, rank))
    }
}

#[cfg(test)]
mod tests;
