//! The router core: candidates, cost, temperature sampling and load bookings.
//!
//! Pure and synchronous. The caller passes the current time (`now`, a `Duration` since any fixed
//! epoch of its choosing) and an index to read; the gateway drives it with tokio and real engines,
//! the simulator with a virtual clock.

mod pace;
mod policy;
pub mod queue;

pub use policy::{
    Candidate, CostWeights, KvCost, Outcome, PolicyRequest, RoundRobin, RoutingPolicy, Selection,
    native_policy,
};

use crate::hash::SequenceHash;
use crate::index::{KvIndex, Matches, Overlap, SHARED_POOL};
use crate::predicted::PredictedBlocks;
use crate::worker::{Rank, Tier};
use pace::PrefillPace;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

/// Router settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// Tokens per KV block of the hashes passed in.
    pub block_size: u32,
    /// Default cost weights.
    pub weights: CostWeights,
    /// Sampling temperature over costs; 0 picks the cheapest.
    pub temperature: f64,
    /// How long a decision's predicted blocks stand in for the engine's events.
    pub booking_ttl: Duration,
    /// How long blocks are assumed cached on ranks that publish no KV events.
    pub approx_ttl: Duration,
    /// Most predicted blocks kept per rank (approximate mode's memory bound).
    pub approx_max_blocks: usize,
    /// Seed of the sampling RNG, so simulations repeat.
    pub seed: u64,
    /// Whether engines stream answers their clients did not ask to stream (the gateway's
    /// `[server] engine_stream`).
    pub engine_stream: EngineStream,
}

impl RouterConfig {
    /// These settings with `new`'s tunables (weights, temperature, lifetimes): what a running
    /// router can take. The block size, the prediction bound and the seed stay.
    pub fn retuned(&self, new: &RouterConfig) -> RouterConfig {
        RouterConfig {
            block_size: self.block_size,
            approx_max_blocks: self.approx_max_blocks,
            seed: self.seed,
            ..new.clone()
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            weights: CostWeights::default(),
            temperature: 0.0,
            booking_ttl: Duration::from_secs(2),
            approx_ttl: Duration::from_secs(120),
            approx_max_blocks: 1 << 20,
            seed: 0x5717_c4ad,
            engine_stream: EngineStream::default(),
        }
    }
}

/// Identifies a request from routing to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A request to place.
#[derive(Debug, Clone, Default)]
pub struct RouteRequest<'a> {
    /// Sequence hashes of the prompt's full blocks.
    pub hashes: &'a [SequenceHash],
    /// Prompt tokens.
    pub tokens: u32,
    /// Expected output tokens, if the caller hinted them.
    pub expected_output_tokens: Option<u32>,
    /// The client asked for a stream: the engine streams, and its first token ends the prefill.
    pub client_streams: bool,
    /// Per-request cost weights.
    pub weights: Option<CostWeights>,
    /// Per-request temperature.
    pub temperature: Option<f64>,
    /// Ranks not to use (they failed this request already).
    pub exclude: &'a [Rank],
    /// Agent session the request belongs to, if known.
    pub session_id: Option<&'a str>,
    /// Session that spawned this one (a subagent's parent), if known.
    pub parent_session_id: Option<&'a str>,
    /// Scheduling priority; higher is more urgent, 0 is normal.
    pub priority: i32,
    /// Send it to this rank if it is a candidate (healthy, not excluded), bypassing the policy:
    /// an admission policy placed the request's program (`generate(tokens, worker_id)` of
    /// agentic-serving.md section 3). Otherwise the policy chooses as usual.
    pub pinned_rank: Option<Rank>,
}

/// Where a request goes, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Chosen rank.
    pub rank: Rank,
    /// Its prefix overlap, events and bookings combined.
    pub overlap: Overlap,
    /// The part of the overlap the engine's own KV events showed.
    pub indexed: Overlap,
    /// Further prefix blocks the shared pool held beyond `overlap` (credited at
    /// [`CostWeights::shared_credit`]).
    pub shared_blocks: u32,
    /// The chosen rank's cost, when the policy answered with costs.
    pub cost: Option<f64>,
    /// How many ranks were considered.
    pub candidates: usize,
    /// Index of the chosen rank among them (what [`Outcome::candidate_index`] reports back).
    pub candidate_index: usize,
    /// Whether the engine is to stream the answer: the client asked for a stream, or the
    /// router needs its first token to hear that the prefill ended
    /// ([`RouterConfig::engine_stream`]).
    pub engine_streams: bool,
    /// When the router will take the prefill as ended, where nothing else will tell it: the
    /// time the rank's learnt prefill pace predicts ([`Router::end_due_prefills`]).
    pub prefill_due: Option<Duration>,
}

/// Whether an engine is asked to stream an answer its client did not ask to stream (the
/// gateway's `[server] engine_stream`). The router needs to hear when each request's prefill
/// ends: from its first token, which only a stream brings before the end, from its rank's KV
/// events ([`Router::blocks_stored`]), or, where neither comes, at the time the rank's learnt
/// prefill pace predicts ([`Decision::prefill_due`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineStream {
    /// Only where the router would not hear otherwise when a prefill of a block or more ends:
    /// no stored event will come for the prompt's last full block (the worker publishes no KV
    /// events, or the rank holds the block already) and the rank's prefill pace is not learnt
    /// yet, or it is the one request in 16 that keeps it learning. Elsewhere the engine answers
    /// whole, which costs the gateway about half the CPU of reading its stream
    /// (docs/benchmarks.md (k)); such a request records no TTFT (its trace line's TTFT is the
    /// whole answer's time).
    #[default]
    Auto,
    /// Every answer is streamed, with usage, whatever the client asked: the router hears of
    /// each first token, and the TTFT metric and learning policies see it; a client that did not
    /// ask for a stream gets one body assembled from the chunks.
    Always,
    /// An engine streams only when the client does; a client that did not ask for a stream gets
    /// the engine's whole answer, re-encoded for its API. Where the rank publishes no KV events
    /// the router ends the request's prefill load at the time the rank's pace predicts, learnt
    /// from streaming clients, or at the end of the whole answer while it knows none (up to 30 %
    /// more TTFT under load, docs/benchmarks.md (k)). An engine that stalls before answering
    /// whole is cut by `request_timeout`, not `stream_idle_timeout` (nothing arrives until the
    /// end).
    AsClient,
}

impl EngineStream {
    /// Whether the engine is asked to stream the answer to a request whose client asked for a
    /// stream or not, when the router needs its first token or not.
    fn streams(self, client_streams: bool, needs_first_token: bool) -> bool {
        client_streams
            || match self {
                EngineStream::Auto => needs_first_token,
                EngineStream::Always => true,
                EngineStream::AsClient => false,
            }
    }
}

/// Why a request could not be placed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RouteError {
    /// Every rank is unhealthy or excluded.
    #[error("no healthy worker")]
    NoHealthyWorker,
    /// The policy refused the request.
    #[error("rejected by policy: {reason}")]
    Rejected {
        /// The policy's reason.
        reason: String,
    },
    /// The policy answered something impossible (wrong number of costs, index out of range).
    #[error("policy {policy} answered an invalid selection: {detail}")]
    BadSelection {
        /// Policy name.
        policy: String,
        /// What was wrong.
        detail: String,
    },
}

/// Load a rank carries from the router's point of view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankLoad {
    /// Uncached prompt tokens whose prefill has not ended in the router's view (a first token,
    /// a stored event or a predicted end).
    pub prefill_tokens: u64,
    /// KV blocks of running requests.
    pub decode_blocks: u64,
    /// Requests in flight.
    pub requests: u32,
}

/// A change to this router's own bookings, for other gateway replicas to add to their view
/// (see [`Router::record_deltas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookingDelta {
    /// A request was booked on `rank` (again, if it was retried: the new booking replaces the
    /// old one).
    Booked {
        /// The request.
        id: RequestId,
        /// Where it went.
        rank: Rank,
        /// Uncached prompt tokens it loads the rank with until its first token.
        prefill_tokens: u64,
        /// KV blocks it holds while it runs.
        decode_blocks: u64,
    },
    /// The request produced its first token.
    PrefillDone {
        /// The request.
        id: RequestId,
    },
    /// The request ended.
    Finished {
        /// The request.
        id: RequestId,
    },
}

/// Identifies another gateway replica whose bookings this router holds as peer load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u64);

#[derive(Debug, Clone)]
struct PeerBooking {
    slot: usize,
    prefill_tokens: u64,
    decode_blocks: u64,
    prefill_done: bool,
    expires: Duration,
}

#[derive(Debug, Clone)]
struct RankState {
    rank: Rank,
    healthy: bool,
    /// Its worker left the fleet: never routed to again (the slot stays: bookings point at it).
    retired: bool,
    /// Publishes no KV events: index it from our own decisions.
    approximate: bool,
    load: RankLoad,
    /// What other gateway replicas booked on it (soft state; zero without a cluster).
    peer: RankLoad,
    /// How fast it gets through its prefill backlog, from the prefill ends heard.
    pace: PrefillPace,
}

#[derive(Debug, Clone)]
struct Booking {
    slot: usize,
    prefill_tokens: u64,
    decode_blocks: u64,
    prefill_done: bool,
    /// The prompt's last full block, when its stored event on the rank ends the prefill load
    /// (a key of [`Router::prefill_ends`]).
    prefill_end: Option<SequenceHash>,
    /// When its prefill load ends unless something is heard first (a key of
    /// [`Router::prefill_dues`]).
    prefill_due: Option<Duration>,
    /// When it was booked, behind how many prefill tokens (its own included): a heard end is a
    /// sample of the rank's pace.
    booked_at: Duration,
    backlog: u64,
    /// The prompt, kept only on approximate ranks (which book it again when it finishes).
    hashes: Vec<SequenceHash>,
}

/// Buffers a decision reuses, so that once grown routing allocates nothing of its own (the
/// policy's answer aside).
#[derive(Debug, Default)]
struct Scratch {
    indexed: Matches,
    predicted: Vec<(Rank, u32)>,
    slots: Vec<usize>,
    candidates: Vec<Candidate>,
    from_events: Vec<Overlap>,
}

/// Prompt buffers of finished bookings kept for the next ones (larger ones are freed).
const SPARE_PROMPTS: usize = 64;
const SPARE_PROMPT_MAX: usize = 1 << 16;

/// The router: ranks, their bookings and the routing policy.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    policy: Box<dyn RoutingPolicy>,
    ranks: Vec<RankState>,
    predicted: PredictedBlocks,
    bookings: FxHashMap<RequestId, Booking>,
    /// Bookings on event-fed ranks by the block whose stored event ends their prefill.
    prefill_ends: FxHashMap<(Rank, SequenceHash), RequestId>,
    /// Bookings whose prefill load ends at a predicted time, soonest first (entries of bookings
    /// that ended meanwhile are skipped when they come up).
    prefill_dues: BinaryHeap<Reverse<(Duration, RequestId)>>,
    /// Other replicas' bookings, by replica and their request id.
    peer_bookings: HashMap<(PeerId, RequestId), PeerBooking>,
    /// The earliest expiry among `peer_bookings` (nothing to scan before then).
    next_peer_expiry: Option<Duration>,
    /// Changes to our own bookings not yet taken, when recording is on.
    journal: Option<Vec<BookingDelta>>,
    rng: SmallRng,
    scratch: Scratch,
    spare_prompts: Vec<Vec<SequenceHash>>,
}

// === impl Router ===

impl Router {
    /// A router with no ranks yet.
    pub fn new(config: RouterConfig, policy: Box<dyn RoutingPolicy>) -> Self {
        Self {
            predicted: PredictedBlocks::new(config.approx_max_blocks),
            rng: SmallRng::seed_from_u64(config.seed),
            config,
            policy,
            ranks: Vec::new(),
            bookings: FxHashMap::default(),
            prefill_ends: FxHashMap::default(),
            prefill_dues: BinaryHeap::new(),
            peer_bookings: HashMap::new(),
            next_peer_expiry: None,
            journal: None,
            scratch: Scratch::default(),
            spare_prompts: Vec::new(),
        }
    }

    /// Settings in force.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Name of the routing policy.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// Whether the routing policy reads the KV index's view of the candidates
    /// ([`RoutingPolicy::reads_index`]).
    pub fn policy_reads_index(&self) -> bool {
        self.policy.reads_index()
    }

    /// Take new cost weights, temperature and lifetimes (a configuration reload); bookings, ranks
    /// and predictions are kept. The block size, the prediction bound and the seed shape state
    /// already built and stay as they are.
    pub fn retune(&mut self, config: &RouterConfig) {
        self.config = self.config.retuned(config);
    }

    /// Replace the routing policy (bookings and ranks are kept).
    pub fn set_policy(&mut self, policy: Box<dyn RoutingPolicy>) {
        self.policy = policy;
    }

    /// Add a rank (healthy). `approximate`: it publishes no KV events.
    pub fn add_rank(&mut self, rank: Rank, approximate: bool) {
        if self.ranks.iter().any(|r| r.rank == rank) {
            return;
        }
        self.ranks.push(RankState {
            rank,
            healthy: true,
            retired: false,
            approximate,
            load: RankLoad::default(),
            peer: RankLoad::default(),
            pace: PrefillPace::default(),
        });
    }

    /// Mark a rank healthy or not; an unhealthy rank gets no requests and loses its predictions.
    pub fn set_healthy(&mut self, rank: Rank, healthy: bool) {
        if let Some(state) = self.ranks.iter_mut().find(|r| r.rank == rank && !r.retired) {
            if state.healthy && !healthy {
                self.predicted.clear(rank);
            }
            state.healthy = healthy;
        }
    }

    /// Take `rank` out for good (its worker left): it gets no requests, loses its predictions
    /// and is no longer listed; requests already on it finish and release their load.
    pub fn retire_rank(&mut self, rank: Rank) {
        self.set_healthy(rank, false);
        if let Some(state) = self.ranks.iter_mut().find(|r| r.rank == rank) {
            state.retired = true;
        }
    }

    /// Forget what was predicted for `rank` (its engine restarted).
    pub fn forget_predictions(&mut self, rank: Rank) {
        self.predicted.clear(rank);
    }

    /// Ranks with their health (retired ones are gone).
    pub fn ranks(&self) -> impl Iterator<Item = (Rank, bool)> + '_ {
        self.ranks
            .iter()
            .filter(|r| !r.retired)
            .map(|r| (r.rank, r.healthy))
    }

    /// Current load of `rank`.
    pub fn load(&self, rank: Rank) -> RankLoad {
        self.ranks
            .iter()
            .find(|r| r.rank == rank)
            .map_or_else(RankLoad::default, |r| r.load)
    }

    /// Requests booked and not finished.
    pub fn in_flight(&self) -> usize {
        self.bookings.len()
    }

    /// Record every change to this router's own bookings for [`Router::take_deltas`] (on), or
    /// stop and drop what was recorded (off). Off by default.
    pub fn record_deltas(&mut self, on: bool) {
        self.journal = on.then(Vec::new);
    }

    /// The booking changes recorded since the last call, oldest first.
    pub fn take_deltas(&mut self) -> Vec<BookingDelta> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn journal(&mut self, delta: BookingDelta) {
        if let Some(journal) = &mut self.journal {
            journal.push(delta);
        }
    }

    /// Load other gateway replicas booked on `rank`, as far as they told us.
    pub fn peer_load(&self, rank: Rank) -> RankLoad {
        self.ranks
            .iter()
            .find(|r| r.rank == rank)
            .map_or_else(RankLoad::default, |r| r.peer)
    }

    /// Peer bookings held.
    pub fn peer_bookings(&self) -> usize {
        self.peer_bookings.len()
    }

    /// Replica `peer` booked its request `id` on `rank`; the cost of every later decision sees
    /// it added to the rank's own load until the peer says it finished or `expires` passes. A
    /// second booking of the same request replaces the first. Returns false (nothing held) if
    /// `rank` is unknown here.
    pub fn peer_booked(
        &mut self,
        peer: PeerId,
        id: RequestId,
        rank: Rank,
        (prefill_tokens, decode_blocks): (u64, u64),
        expires: Duration,
    ) -> bool {
        self.peer_finished(peer, id);
        let Some(slot) = self.ranks.iter().position(|r| r.rank == rank) else {
            return false;
        };
        let load = &mut self.ranks[slot].peer;
        load.prefill_tokens += prefill_tokens;
        load.decode_blocks += decode_blocks;
        load.requests += 1;
        self.peer_bookings.insert(
            (peer, id),
            PeerBooking {
                slot,
                prefill_tokens,
                decode_blocks,
                prefill_done: false,
                expires,
            },
        );
        self.next_peer_expiry = Some(self.next_peer_expiry.map_or(expires, |e| e.min(expires)));
        true
    }

    /// Replica `peer`'s request `id` produced its first token.
    pub fn peer_prefill_done(&mut self, peer: PeerId, id: RequestId) {
        let Some(booking) = self.peer_bookings.get_mut(&(peer, id)) else {
            return;
        };
        if !booking.prefill_done {
            booking.prefill_done = true;
            let load = &mut self.ranks[booking.slot].peer;
            load.prefill_tokens = load.prefill_tokens.saturating_sub(booking.prefill_tokens);
        }
    }

    /// Replica `peer`'s request `id` ended: its load goes.
    pub fn peer_finished(&mut self, peer: PeerId, id: RequestId) {
        if let Some(booking) = self.peer_bookings.remove(&(peer, id)) {
            self.release_peer(&booking);
        }
    }

    /// Forget every booking of replica `peer` (it said it restarted).
    pub fn forget_peer(&mut self, peer: PeerId) {
        let gone: Vec<_> = self
            .peer_bookings
            .keys()
            .filter(|(p, _)| *p == peer)
            .copied()
            .collect();
        for key in gone {
            if let Some(booking) = self.peer_bookings.remove(&key) {
                self.release_peer(&booking);
            }
        }
    }

    /// Forget peer bookings whose expiry has passed (no `finished` came for them).
    pub fn expire_peers(&mut self, now: Duration) {
        if self.next_peer_expiry.is_none_or(|e| e > now) {
            return;
        }
        let mut expired = Vec::new();
        self.peer_bookings.retain(|_, b| {
            let keep = b.expires > now;
            if !keep {
                expired.push(b.clone());
            }
            keep
        });
        for booking in &expired {
            self.release_peer(booking);
        }
        self.next_peer_expiry = self.peer_bookings.values().map(|b| b.expires).min();
    }

    fn release_peer(&mut self, booking: &PeerBooking) {
        let load = &mut self.ranks[booking.slot].peer;
        if !booking.prefill_done {
            load.prefill_tokens = load.prefill_tokens.saturating_sub(booking.prefill_tokens);
        }
        load.decode_blocks = load.decode_blocks.saturating_sub(booking.decode_blocks);
        load.requests = load.requests.saturating_sub(1);
    }

    /// Place `request` and book it at once, so that the next decision sees it.
    pub fn route(
        &mut self,
        id: RequestId,
        request: &RouteRequest<'_>,
        index: &KvIndex,
        now: Duration,
    ) -> Result<Decision, RouteError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.route_with(&mut scratch, id, request, index, now);
        self.scratch = scratch;
        result
    }

    fn route_with(
        &mut self,
        scratch: &mut Scratch,
        id: RequestId,
        request: &RouteRequest<'_>,
        index: &KvIndex,
        now: Duration,
    ) -> Result<Decision, RouteError> {
        self.predicted.expire(now);
        self.expire_peers(now);
        self.end_due_prefills(now);
        let Scratch {
            indexed,
            predicted,
            slots,
            candidates,
            from_events,
        } = scratch;
        index.find_matches_into(request.hashes, indexed);
        let shared_run = indexed
            .iter()
            .find(|(r, _)| *r == SHARED_POOL)
            .map_or(0, |(_, o)| o.total());
        self.predicted
            .find_matches_into(request.hashes, now, predicted);
        let lookup = |rank: Rank| {
            let from_events = indexed
                .iter()
                .find(|(r, _)| *r == rank)
                .map_or(Overlap::default(), |(_, o)| *o);
            let booked = predicted
                .iter()
                .find(|(r, _)| *r == rank)
                .map_or(0, |(_, d)| *d);
            let combined = from_events.max(Overlap {
                device: booked,
                ..Overlap::default()
            });
            (from_events, combined)
        };

        slots.clear();
        candidates.clear();
        from_events.clear();
        for (slot, state) in self.ranks.iter().enumerate() {
            if !state.healthy || request.exclude.contains(&state.rank) {
                continue;
            }
            let (events, overlap) = lookup(state.rank);
            slots.push(slot);
            from_events.push(events);
            candidates.push(Candidate {
                rank: state.rank,
                overlap,
                // The pool serves a run from the first block; a rank is credited only for the
                // part of it beyond what it holds itself, so no block counts twice.
                shared_blocks: shared_run.saturating_sub(overlap.total()),
                indexed_blocks: index.total_blocks(state.rank)
                    + self.predicted.len(state.rank) as u64,
                active_prefill_tokens: state.load.prefill_tokens + state.peer.prefill_tokens,
                active_decode_blocks: state.load.decode_blocks + state.peer.decode_blocks,
                active_requests: state.load.requests + state.peer.requests,
            });
        }
        if candidates.is_empty() {
            return Err(RouteError::NoHealthyWorker);
        }

        let policy_request = self.policy_request(request);
        let temperature = request.temperature.unwrap_or(self.config.temperature);
        let pinned = request
            .pinned_rank
            .and_then(|rank| candidates.iter().position(|c| c.rank == rank));
        let selection = match pinned {
            Some(i) => Selection::Pick(i),
            None => self.policy.select(&policy_request, candidates),
        };
        let (chosen, cost) = match selection {
            Selection::Pick(i) if i < candidates.len() => (i, None),
            Selection::Pick(i) => {
                return Err(
                    self.bad_selection(format!("picked {i} of {} candidates", candidates.len()))
                );
            }
            Selection::Costs(costs) if costs.len() == candidates.len() => {
                if costs.iter().any(|c| !c.is_finite()) {
                    return Err(self.bad_selection("a cost is not finite".into()));
                }
                let i = self.sample(&costs, candidates, temperature);
                (i, Some(costs[i]))
            }
            Selection::Costs(costs) => {
                return Err(self.bad_selection(format!(
                    "{} costs for {} candidates",
                    costs.len(),
                    candidates.len()
                )));
            }
            Selection::Reject(reason) => return Err(RouteError::Rejected { reason }),
        };

        let candidate = candidates[chosen];
        let decision = Decision {
            rank: candidate.rank,
            overlap: candidate.overlap,
            indexed: from_events[chosen],
            shared_blocks: candidate.shared_blocks,
            cost,
            candidates: candidates.len(),
            candidate_index: chosen,
            engine_streams: true,
            prefill_due: None,
        };
        let (engine_streams, prefill_due) =
            self.book(id, slots[chosen], request, (&decision, index), now);
        Ok(Decision {
            engine_streams,
            prefill_due,
            ..decision
        })
    }

    /// The request as the routing policy sees it.
    pub fn policy_request<'a>(&self, request: &RouteRequest<'a>) -> PolicyRequest<'a> {
        let block_size = self.config.block_size.max(1);
        PolicyRequest {
            tokens: request.tokens,
            blocks: request.tokens.div_ceil(block_size),
            block_size,
            weights: request.weights.unwrap_or(self.config.weights),
            overrides: request.weights,
            session_id: request.session_id,
            parent_session_id: request.parent_session_id,
            priority: request.priority,
            osl: request.expected_output_tokens,
        }
    }

    /// The routing policy's order key for `request` waiting in the router queue (lower is
    /// served first), if the policy defines one (the Wasm router world's `queue-key`).
    pub fn queue_key(&mut self, request: &RouteRequest<'_>) -> Option<f64> {
        let policy_request = self.policy_request(request);
        self.policy
            .queue_key(&policy_request)
            .filter(|k| k.is_finite())
    }

    /// [`Router::queue_key`] knowing when the request arrived (the policy's
    /// [`RoutingPolicy::queue_key_at`]).
    pub fn queue_key_at(&mut self, request: &RouteRequest<'_>, arrival: Duration) -> Option<f64> {
        let policy_request = self.policy_request(request);
        self.policy
            .queue_key_at(&policy_request, arrival)
            .filter(|k| k.is_finite())
    }

    /// The request produced its first token at `now`: its prefill no longer loads the rank.
    pub fn first_token(&mut self, id: RequestId, now: Duration) {
        self.end_prefill(id, Some(now));
    }

    /// Ranks stored these blocks on their devices at `now` (their KV events, as the index
    /// applies them): a request whose prompt ends in one of them has been prefilled there,
    /// whether or not anyone streams its first token. Whether that ended any request's prefill
    /// load.
    pub fn blocks_stored(
        &mut self,
        stored: impl IntoIterator<Item = (Rank, SequenceHash)>,
        now: Duration,
    ) -> bool {
        if self.prefill_ends.is_empty() {
            return false;
        }
        let mut ended = false;
        for key in stored {
            if let Some(&id) = self.prefill_ends.get(&key) {
                self.end_prefill(id, Some(now));
                ended = true;
            }
        }
        ended
    }

    /// End the prefill loads whose predicted end ([`Decision::prefill_due`]) is past. Routing
    /// does it itself; a driver whose router queue waits for load to drop calls it at those
    /// times. Whether any ended.
    pub fn end_due_prefills(&mut self, now: Duration) -> bool {
        let mut ended = false;
        while let Some(&Reverse((due, id))) = self.prefill_dues.peek() {
            if due > now {
                break;
            }
            self.prefill_dues.pop();
            let pending = self
                .bookings
                .get(&id)
                .is_some_and(|b| !b.prefill_done && b.prefill_due == Some(due));
            if pending {
                self.end_prefill(id, None);
                ended = true;
            }
        }
        ended
    }

    /// The request's prefill no longer loads its rank: `heard` at that time (a first token, a
    /// stored event: a sample of the rank's pace), or taken as ended (predicted, finished).
    fn end_prefill(&mut self, id: RequestId, heard: Option<Duration>) {
        let Some(booking) = self.bookings.get_mut(&id) else {
            return;
        };
        if booking.prefill_done {
            return;
        }
        booking.prefill_done = true;
        let state = &mut self.ranks[booking.slot];
        state.load.prefill_tokens = state
            .load
            .prefill_tokens
            .saturating_sub(booking.prefill_tokens);
        if let Some(now) = heard {
            state
                .pace
                .observe(booking.backlog, now.saturating_sub(booking.booked_at));
        }
        if let Some(block) = booking.prefill_end.take() {
            unwatch(&mut self.prefill_ends, (state.rank, block), id);
        }
        self.journal(BookingDelta::PrefillDone { id });
    }

    /// Tell the policy what happened to a request it placed (call before [`Router::finish`]).
    pub fn observe(&mut self, outcome: &Outcome) {
        self.policy.observe(outcome);
    }

    /// The request ended (finished, failed or cancelled): release what it booked.
    pub fn finish(&mut self, id: RequestId, now: Duration) {
        self.end_prefill(id, None);
        let Some(booking) = self.bookings.remove(&id) else {
            return;
        };
        self.journal(BookingDelta::Finished { id });
        let state = &mut self.ranks[booking.slot];
        state.load.decode_blocks = state
            .load
            .decode_blocks
            .saturating_sub(booking.decode_blocks);
        state.load.requests = state.load.requests.saturating_sub(1);
        if state.approximate {
            // The engine just used these blocks: they are the freshest in its LRU.
            let rank = state.rank;
            self.predicted
                .insert(rank, &booking.hashes, self.config.approx_ttl, now);
        }
        if (1..=SPARE_PROMPT_MAX).contains(&booking.hashes.capacity())
            && self.spare_prompts.len() < SPARE_PROMPTS
        {
            let mut spare = booking.hashes;
            spare.clear();
            self.spare_prompts.push(spare);
        }
    }

    /// Book the request on `slot`: whether its engine is to stream, and when its prefill load
    /// ends by prediction.
    fn book(
        &mut self,
        id: RequestId,
        slot: usize,
        request: &RouteRequest<'_>,
        (decision, index): (&Decision, &KvIndex),
        now: Duration,
    ) -> (bool, Option<Duration>) {
        let bs = u64::from(self.config.block_size.max(1));
        let cached_tokens = u64::from(decision.overlap.device) * bs;
        let prefill_tokens = u64::from(request.tokens).saturating_sub(cached_tokens);
        let total_tokens =
            u64::from(request.tokens) + u64::from(request.expected_output_tokens.unwrap_or(0));
        let decode_blocks = total_tokens.div_ceil(bs);
        let state = &mut self.ranks[slot];
        state.load.prefill_tokens += prefill_tokens;
        state.load.decode_blocks += decode_blocks;
        state.load.requests += 1;
        let ttl = if state.approximate {
            self.config.approx_ttl
        } else {
            self.config.booking_ttl
        };
        self.predicted.insert(state.rank, request.hashes, ttl, now);
        // Only an approximate rank books the prompt again when it finishes: keep it for that.
        let mut hashes = Vec::new();
        if state.approximate {
            hashes = self.spare_prompts.pop().unwrap_or_default();
            hashes.extend_from_slice(request.hashes);
        }
        // A retried request books again: release the earlier booking first.
        if let Some(old) = self.bookings.remove(&id) {
            let old_state = &mut self.ranks[old.slot];
            old_state.load.decode_blocks = old_state
                .load
                .decode_blocks
                .saturating_sub(old.decode_blocks);
            old_state.load.requests = old_state.load.requests.saturating_sub(1);
            if !old.prefill_done {
                old_state.load.prefill_tokens = old_state
                    .load
                    .prefill_tokens
                    .saturating_sub(old.prefill_tokens);
            }
            if let Some(block) = old.prefill_end {
                unwatch(&mut self.prefill_ends, (old_state.rank, block), id);
            }
        }
        let rank = self.ranks[slot].rank;
        // A rank with events stores the prompt's last full block once it has computed it, unless
        // it holds the block already (a block that outlived its evicted parent: the engine
        // computes up to it but stores nothing new), and once only: a booking that already
        // waits for it keeps it. With every full block cached, under one block is left to
        // prefill, not worth waiting for.
        let with_events = !self.ranks[slot].approximate;
        let blocks_to_compute = request.hashes.len() > decision.overlap.device as usize;
        let prefill_end = match request.hashes.last() {
            Some(&last)
                if with_events
                    && blocks_to_compute
                    && !index.contains(rank, Tier::Device, last) =>
            {
                match self.prefill_ends.entry((rank, last)) {
                    Entry::Vacant(waiting) => {
                        waiting.insert(id);
                        Some(last)
                    }
                    Entry::Occupied(_) => None,
                }
            }
            _ => None,
        };
        let needs_first_token = !with_events || (blocks_to_compute && prefill_end.is_none());
        // Where nothing will be heard, predict the end from the rank's pace (when it knows one
        // and it is not time to hear a real end again).
        let mode = self.config.engine_stream;
        let backlog = self.ranks[slot].load.prefill_tokens;
        let prefill_due = if needs_first_token && !mode.streams(request.client_streams, false) {
            self.ranks[slot].pace.predict(backlog, now)
        } else {
            None
        };
        if let Some(due) = prefill_due {
            self.prefill_dues.push(Reverse((due, id)));
        }
        let engine_streams = mode.streams(
            request.client_streams,
            needs_first_token && prefill_due.is_none(),
        );
        self.journal(BookingDelta::Booked {
            id,
            rank,
            prefill_tokens,
            decode_blocks,
        });
        self.bookings.insert(
            id,
            Booking {
                slot,
                prefill_tokens,
                decode_blocks,
                prefill_done: false,
                prefill_end,
                prefill_due,
                booked_at: now,
                backlog,
                hashes,
            },
        );
        (engine_streams, prefill_due)
    }

    /// Pick an index from costs: the cheapest at temperature 0 (ties: fewest indexed blocks, then
    /// random), else softmax over normalised costs.
    fn sample(&mut self, costs: &[f64], candidates: &[Candidate], temperature: f64) -> usize {
        let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
        let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let spread = max - min;
        if temperature > 0.0 && spread > 0.0 {
            // Weights computed twice rather than collected: the same values, no allocation.
            let weight = |c: f64| (-(c - min) / (spread * temperature)).exp();
            let mut x = self.rng.random::<f64>() * costs.iter().map(|&c| weight(c)).sum::<f64>();
            for (i, &c) in costs.iter().enumerate() {
                let w = weight(c);
                if x < w {
                    return i;
                }
                x -= w;
            }
            return costs.len() - 1;
        }
        let tolerance = 1e-9 * min.abs().max(1.0);
        let cheapest = |i: &usize| costs[*i] - min <= tolerance;
        let fewest = (0..costs.len())
            .filter(cheapest)
            .map(|i| candidates[i].indexed_blocks)
            .min()
            .unwrap_or(0);
        let tie = |i: &usize| cheapest(i) && candidates[*i].indexed_blocks == fewest;
        let ties = (0..costs.len()).filter(tie).count();
        let pick = self.rng.random_range(0..ties);
        (0..costs.len())
            .filter(tie)
            .nth(pick)
            .expect("pick is below the number of ties")
    }

    fn bad_selection(&self, detail: String) -> RouteError {
        RouteError::BadSelection {
            policy: self.policy.name().to_string(),
            detail,
        }
    }
}

/// Stop waiting for `key`'s stored event on behalf of `id`, if it is `id` that waits.
fn unwatch(
    prefill_ends: &mut FxHashMap<(Rank, SequenceHash), RequestId>,
    key: (Rank, SequenceHash),
    id: RequestId,
) {
    if prefill_ends.get(&key) == Some(&id) {
        prefill_ends.remove(&key);
    }
}

#[cfg(test)]
mod tests;
