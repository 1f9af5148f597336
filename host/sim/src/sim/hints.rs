//! The KV-hint path on the virtual clock: what the gateway's hint task does
//! (`host/gateway/src/hints.rs`), for each simulated gateway replica.
//!
//! Each replica keeps a [`SessionTracker`] (the gateway's own), fed where the gateway feeds it:
//! a request placed on a rank, a turn's end, a session's last turn. A round of the hint path
//! asks the replica's `kv_hints` policy about the events it has not seen (and, with none, about
//! the time: every tick while a session waits on a tool), resolves the hints into block actions
//! per rank, and the simulator applies them to those workers' engines and counts each outcome.
//!
//! **What the policy sees.** As in the gateway, the index state of a round covers the sessions
//! its events name and every session waiting on a tool: without those, a round with no events
//! (a tick) would show the policy no session at all, and a prefetch it planned for the tick
//! before a tool returns would find nothing resident and never be hinted.
//!
//! **Hashes.** The tracker names blocks by the router's sequence hashes; the engines by theirs
//! ([`EngineConfig::hash_seed`](switchyard_core::engine::EngineConfig::hash_seed): their own
//! [`switchyard_core::engine::ENGINE_SEED`] unless told the router's). As in the gateway, each worker's ingestor
//! keeps the engine's names of the blocks its rank holds ([`EngineNames`]), learnt from the KV
//! events, and a rank's actions are named with them; an action left with no named block is
//! counted missing, without asking the engine.
//!
//! **Outcomes.** What became of each action reaches the policy at its replica's next round,
//! before its events (`on_outcomes`), as the gateway's hint task delivers them.

use super::{Event, RoutedTurn, SimError, Simulation};
use crate::report::{HintCount, KvHintsReport};
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_core::hash::SequenceHash;
use switchyard_core::index::KvIndex;
use switchyard_core::kv_hints::actions::{ActionOutcome, ActionType, HintAction, Outcome};
use switchyard_core::kv_hints::sessions::SessionTracker;
use switchyard_core::kv_hints::{HintOutcome, IndexState, KvHintPolicy, LifecycleEvent, RankUsage};
use switchyard_core::programs::TurnEnd;
use switchyard_core::worker::{Rank, Tier};

// === impl Simulation ===

impl Simulation<'_> {
    /// Run the KV-hint path with `policies`, one per replica (Wasm components through the
    /// gateway's policy host, or instrumented ones), in place of
    /// [`SimConfig::kv_hints`](crate::SimConfig::kv_hints); the report names the first one's
    /// `name()`.
    pub fn with_kv_hint_policies(
        mut self,
        policies: Vec<Box<dyn KvHintPolicy>>,
    ) -> Result<Self, SimError> {
        if policies.len() != self.replicas.len() {
            return Err(SimError::Invalid("one KV-hint policy per replica"));
        }
        if self.config.kv_hints_tick.is_zero() {
            return Err(SimError::Invalid("kv_hints_tick must be positive"));
        }
        self.config.kv_hints = policies.first().map(|p| p.name().to_owned());
        for (replica, policy) in self.replicas.iter_mut().zip(policies) {
            replica.hints = Some(ReplicaHints::new(policy));
        }
        Ok(self)
    }

    /// Request `id`, whose prompt is `prompt` (`hashes` in the router's names), was placed on
    /// `rank`: its replica's tracker hears of it.
    pub(super) fn hints_routed(
        &mut self,
        id: u64,
        rank: Rank,
        prompt: &[u32],
        hashes: &[SequenceHash],
        now: Duration,
    ) {
        let workload = self.workload;
        let record = &self.records[id as usize];
        let (r, session) = (record.replica, &workload.sessions[record.session]);
        let Some(hints) = &mut self.replicas[r].hints else {
            return;
        };
        let turn = RoutedTurn {
            session_id: &session.id,
            parent_session_id: session.parent.as_deref(),
            rank,
            hashes,
            prompt_tokens: prompt.len() as u64,
        };
        if hints.routed(turn, now) {
            self.schedule_hints(r, now);
        }
    }

    /// Request `k` of session `s` finished on replica `r`, ending as `end`.
    pub(super) fn hints_turn_ended(
        &mut self,
        r: usize,
        s: usize,
        k: usize,
        end: &TurnEnd,
        now: Duration,
    ) {
        let session = &self.workload.sessions[s];
        let Some(hints) = &mut self.replicas[r].hints else {
            return;
        };
        let last = k + 1 == session.requests.len();
        if hints.turn_ended(&session.id, end, last, now) {
            self.schedule_hints(r, now);
        }
    }

    /// Make sure replica `r` has a round at `at` or before.
    fn schedule_hints(&mut self, r: usize, at: Duration) {
        let Some(hints) = &mut self.replicas[r].hints else {
            return;
        };
        if hints.due.is_some_and(|due| due <= at) {
            return;
        }
        hints.due = Some(at);
        self.queued_hint_rounds += 1;
        self.queue.push(at, Event::Hints(r));
    }

    /// Replica `r`'s round at `now` (unless a later schedule superseded it): the policy's hints
    /// applied to the engines, and the next tick while a session waits on a tool.
    pub(super) fn hint_round(&mut self, r: usize, now: Duration) {
        if self.replicas[r].hints.as_ref().and_then(|h| h.due) != Some(now) {
            return;
        }
        let usage = self.rank_usage(r);
        let replica = &mut self.replicas[r];
        let Some(hints) = &mut replica.hints else {
            return;
        };
        hints.due = None;
        let per_rank = hints.round(now, &replica.index, usage);
        for (rank, mut actions) in per_rank {
            let w = rank.worker.0 as usize;
            let Some(worker) = self.workers.get_mut(w) else {
                continue;
            };
            let blocks = |actions: &[HintAction]| -> usize {
                actions.iter().map(|a| a.payload.block_hashes.len()).sum()
            };
            let ours = blocks(&actions);
            // Named as the gateway names them, from the worker's KV events (which no replica
            // hears with an approximate index: every action is then missing).
            let unnamed = match &worker.names {
                Some(names) => names.name_actions(&mut actions),
                None => std::mem::take(&mut actions),
            };
            hints.count_unnamed(ours - blocks(&actions));
            let missing: Vec<ActionOutcome> = unnamed
                .iter()
                .map(|a| ActionOutcome {
                    action_id: a.action_id.clone(),
                    outcome: Outcome::Missing,
                    blocks: 0,
                    reason: None,
                })
                .collect();
            hints.count(rank, &unnamed, &missing);
            if actions.is_empty() {
                continue;
            }
            // Pins and the tiers' recency run on model time; an idle engine's lags the clock.
            worker.engine.advance_clock_to(now);
            let outcomes = worker.engine.apply_hints(&actions);
            hints.count(rank, &actions, &outcomes);
            // What the hints moved comes out of the next step.
            if worker.engine.has_work() {
                self.queue.push(now, Event::Wake(w));
            }
        }
        // Ticks go on while a session waits on a tool, as long as anything else may happen.
        let others_pending = self.queue.len() > self.queued_hint_rounds;
        if hints.waiting_on_tools() && others_pending {
            let next = now + self.config.kv_hints_tick;
            self.schedule_hints(r, next);
        }
    }

    /// Every worker as replica `r`'s index sees it, with the engines' capacities.
    fn rank_usage(&self, r: usize) -> Vec<RankUsage> {
        let index = &self.replicas[r].index;
        self.workers
            .iter()
            .map(|w| {
                let config = w.engine.config();
                RankUsage {
                    rank: w.rank,
                    device_used_blocks: index.blocks(w.rank, Tier::Device),
                    device_capacity_blocks: config.num_blocks as u64,
                    host_used_blocks: index.blocks(w.rank, Tier::Host),
                    host_capacity_blocks: config.host_tier.as_ref().map_or(0, |h| h.num_blocks)
                        as u64,
                }
            })
            .collect()
    }
}

/// One replica's hint path: the tracker, the policy and what the policy has not seen yet.
#[derive(Debug)]
pub(super) struct ReplicaHints {
    tracker: SessionTracker,
    policy: Box<dyn KvHintPolicy>,
    /// Events not yet shown to the policy, in order.
    events: Vec<LifecycleEvent>,
    /// When the replica's next round is due, if one is scheduled.
    pub(super) due: Option<Duration>,
    /// What became of earlier actions, for the policy's next round.
    outcomes: Vec<HintOutcome>,
    counts: HintCounts,
}

impl ReplicaHints {
    pub(super) fn new(policy: Box<dyn KvHintPolicy>) -> Self {
        Self {
            tracker: SessionTracker::default(),
            policy,
            events: Vec::new(),
            due: None,
            outcomes: Vec::new(),
            counts: HintCounts::default(),
        }
    }

    /// `turn` was placed at `now`; true when events arrived (a round is due).
    pub(super) fn routed(&mut self, turn: RoutedTurn<'_>, now: Duration) -> bool {
        let events = self.tracker.routed(turn, now);
        self.record(events)
    }

    /// A turn of `session_id` ended at `now` (`last`: the session's final one); true when events
    /// arrived.
    pub(super) fn turn_ended(
        &mut self,
        session_id: &str,
        end: &TurnEnd,
        last: bool,
        now: Duration,
    ) -> bool {
        let mut events = self.tracker.turn_ended(session_id, end, now);
        if last {
            events.extend(self.tracker.ended(session_id, now));
        }
        self.record(events)
    }

    fn record(&mut self, events: Vec<LifecycleEvent>) -> bool {
        let arrived = !events.is_empty();
        self.events.extend(events);
        arrived
    }

    /// Whether a session waits on a tool: rounds then come every tick.
    pub(super) fn waiting_on_tools(&self) -> bool {
        self.tracker.waiting_on_tools()
    }

    /// One round at `now`: the policy asked (if there are events or a session waits on a tool)
    /// with the index state from `index` and `usage`, and its hints resolved into block actions
    /// per rank, in order. Block hashes are still the router's.
    pub(super) fn round(
        &mut self,
        now: Duration,
        index: &KvIndex,
        usage: Vec<RankUsage>,
    ) -> BTreeMap<Rank, Vec<HintAction>> {
        // What became of earlier hints first, so the policy decides knowing it.
        let outcomes = std::mem::take(&mut self.outcomes);
        if !outcomes.is_empty() {
            self.policy.on_outcomes(&outcomes, now);
        }
        let events = std::mem::take(&mut self.events);
        if events.is_empty() && !self.tracker.waiting_on_tools() {
            return BTreeMap::new();
        }
        for event in &events {
            *self.counts.events.entry(event.kind.label()).or_default() += 1;
        }
        let state = IndexState {
            residency: self
                .tracker
                .residency(self.tracker.round_sessions(&events), index),
            usage,
        };
        let hints = self.policy.on_events(&events, &state, now);
        self.counts.policy_calls += 1;
        self.counts.hints += hints.len() as u64;
        self.tracker.actions(&hints)
    }

    /// Count what became of `actions` on `rank` (outcomes in the same order), and keep it for
    /// the policy's next round.
    pub(super) fn count(&mut self, rank: Rank, actions: &[HintAction], outcomes: &[ActionOutcome]) {
        for (action, outcome) in actions.iter().zip(outcomes) {
            self.outcomes.extend(HintOutcome::of(
                rank,
                action,
                outcome.outcome,
                outcome.blocks,
            ));
            let kind = action.kind().map_or("unknown", ActionType::label);
            let count = self
                .counts
                .actions
                .entry((kind, outcome.outcome.label()))
                .or_default();
            count.actions += 1;
            count.blocks += u64::from(outcome.blocks);
        }
    }

    /// Count router hashes of hints that the rank's engine has no name for (it holds them in no
    /// tier).
    pub(super) fn count_unnamed(&mut self, blocks: usize) {
        self.counts.unnamed_blocks += blocks as u64;
    }

    /// What the replicas' hint paths did, summed, under the first replica's policy name.
    pub(super) fn report<'a>(
        name: String,
        replicas: impl IntoIterator<Item = &'a ReplicaHints>,
    ) -> KvHintsReport {
        let mut report = KvHintsReport {
            policy: name,
            ..KvHintsReport::default()
        };
        for replica in replicas {
            let counts = &replica.counts;
            report.policy_calls += counts.policy_calls;
            report.hints += counts.hints;
            report.unnamed_blocks += counts.unnamed_blocks;
            for (kind, n) in &counts.events {
                *report.events.entry((*kind).to_owned()).or_default() += n;
            }
            for ((action, outcome), count) in &counts.actions {
                let sum = report
                    .actions
                    .entry((*action).to_owned())
                    .or_default()
                    .entry((*outcome).to_owned())
                    .or_default();
                sum.actions += count.actions;
                sum.blocks += count.blocks;
            }
        }
        report
    }
}

/// One replica's counters (labels as the gateway's metrics name them).
#[derive(Debug, Default)]
struct HintCounts {
    policy_calls: u64,
    hints: u64,
    events: BTreeMap<&'static str, u64>,
    /// (action, outcome) -> actions and blocks.
    actions: BTreeMap<(&'static str, &'static str), HintCount>,
    unnamed_blocks: u64,
}
