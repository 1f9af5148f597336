//! The KV-hint path: live traffic -> lifecycle events -> the `[policies] kv_hints` policy ->
//! block actions -> the workers that take them, each action's outcome counted.
//!
//! The request path only records, under a short lock and without I/O, what was routed where
//! and how turns ended ([`SessionTracker`], the same code the simulator drives). One task does
//! the rest: it asks the policy when events arrive (and every `[kv_hints] tick` while a session
//! waits on a tool, so a policy can act at a time it predicted), resolves each hint into block
//! actions per rank, and delivers them as each worker's `kv_hints` setting says. llama.cpp
//! workers (`llama-slots`) take them through their slot save / restore API ([`llama_slots`]).

pub(crate) mod llama_slots;

use crate::config::{HintDelivery, KvHintsConfig};
use crate::error::GatewayError;
use crate::metrics::{HintLabels, LifecycleLabels, worker_label};
use crate::proxy::read_body;
use crate::server::Shared;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::kv_hints::actions::{
    ActionType, HintAction, KvHintsEnvelope, KvHintsReply, Outcome, PROTOCOL_VERSION,
};
use switchyard_core::kv_hints::sessions::{RoutedTurn, SessionTracker};
use switchyard_core::kv_hints::{
    HintKind, HintOutcome, HintTier, IndexState, KvHint, LifecycleEvent, NoHints, RankUsage,
    SessionResidency,
};
use switchyard_core::programs::TurnEnd;
use switchyard_core::worker::{Rank, Tier};
use switchyard_frontend::Api;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Actions waiting to ride on requests to one rank; older ones are dropped beyond it.
const MAX_RIDING_ACTIONS: usize = 256;

/// What the request path records and the hint task consumes.
#[derive(Debug)]
pub(crate) struct Hints {
    state: Mutex<Ledger>,
    wake: Notify,
    next_message: AtomicU64,
    /// llama.cpp workers' slots and the sessions' slot files (`kv_hints = "llama-slots"`).
    pub(crate) slots: llama_slots::Slots,
}

#[derive(Debug)]
struct Ledger {
    tracker: SessionTracker,
    /// Events not yet shown to the policy, in order.
    events: Vec<LifecycleEvent>,
    /// Prefetches harnesses announced: when (router clock) -> sessions.
    prefetches: BTreeMap<Duration, Vec<String>>,
    /// Actions waiting for the next request to a rank whose worker takes them in-band.
    riding: HashMap<Rank, Vec<HintAction>>,
    /// Outcomes counted since the policy last heard them (its `on_outcomes`), oldest first;
    /// bounded like the riding actions.
    outcomes: Vec<HintOutcome>,
}

/// Outcomes kept for the policy between rounds; older ones are dropped beyond it.
const MAX_PENDING_OUTCOMES: usize = 4_096;

/// What one round of the hint task works on.
struct Round {
    events: Vec<LifecycleEvent>,
    /// Sessions whose announced prefetch is due.
    due: Vec<String>,
    /// Some session waits on a tool: the policy wants to be asked even without events.
    waiting: bool,
}

impl Hints {
    pub(crate) fn new(config: &KvHintsConfig) -> Self {
        Self {
            state: Mutex::new(Ledger {
                tracker: SessionTracker::new(config.sessions),
                events: Vec::new(),
                prefetches: BTreeMap::new(),
                riding: HashMap::new(),
                outcomes: Vec::new(),
            }),
            wake: Notify::new(),
            next_message: AtomicU64::new(1),
            slots: llama_slots::Slots::new(config.sessions),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // Plain data: a panic elsewhere leaves nothing half-done that matters.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, events: Vec<LifecycleEvent>, state: &mut Ledger) {
        if !events.is_empty() {
            state.events.extend(events);
            self.wake.notify_one();
        }
    }

    /// A request of a session was routed.
    pub(crate) fn routed(&self, turn: RoutedTurn<'_>, now: Duration) {
        let mut state = self.state();
        let events = state.tracker.routed(turn, now);
        self.record(events, &mut state);
    }

    /// A session's turn ended; `last` when the harness said the session is over.
    pub(crate) fn turn_ended(&self, session_id: &str, end: &TurnEnd, last: bool, now: Duration) {
        let mut state = self.state();
        let mut events = state.tracker.turn_ended(session_id, end, now);
        if last {
            events.extend(state.tracker.ended(session_id, now));
        }
        self.record(events, &mut state);
    }

    /// Whether a turn of `session_id` thought (its answers' KV will not be reused).
    pub(crate) fn thinks(&self, session_id: &str) -> bool {
        self.state().tracker.thinks(session_id)
    }

    /// A harness announced that `session_id`'s next request comes at `at`: bring its blocks
    /// back before then. False when no request of that session was routed.
    fn announce_prefetch(&self, session_id: &str, at: Duration) -> bool {
        let mut state = self.state();
        let known = state.tracker.contains(session_id);
        if known {
            state
                .prefetches
                .entry(at)
                .or_default()
                .push(session_id.to_owned());
            self.wake.notify_one();
        }
        known
    }

    /// The envelope to send with the next request to `rank`, if hints wait for it.
    pub(crate) fn riding(&self, rank: Rank) -> Option<KvHintsEnvelope> {
        let actions = self.state().riding.remove(&rank)?;
        Some(self.envelope(actions))
    }

    fn envelope(&self, actions: Vec<HintAction>) -> KvHintsEnvelope {
        KvHintsEnvelope {
            protocol_version: PROTOCOL_VERSION.to_owned(),
            message_id: format!("sy-{}", self.next_message.fetch_add(1, Ordering::Relaxed)),
            actions,
        }
    }

    /// Keep `outcomes` for the policy's next round.
    fn outcomes(&self, outcomes: impl IntoIterator<Item = HintOutcome>) {
        let mut state = self.state();
        state.outcomes.extend(outcomes);
        let excess = state.outcomes.len().saturating_sub(MAX_PENDING_OUTCOMES);
        state.outcomes.drain(..excess);
    }

    fn take_outcomes(&self) -> Vec<HintOutcome> {
        std::mem::take(&mut self.state().outcomes)
    }

    fn take_round(&self, now: Duration) -> Round {
        let mut state = self.state();
        let later = state.prefetches.split_off(&(now + Duration::from_nanos(1)));
        let due = std::mem::replace(&mut state.prefetches, later);
        Round {
            events: std::mem::take(&mut state.events),
            due: due.into_values().flatten().collect(),
            waiting: state.tracker.waiting_on_tools(),
        }
    }
}

/// The hint task: runs until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut policy = crate::policies::kv_hint_policy(shared.policies.as_ref(), Box::new(NoHints));
    loop {
        let tick = shared.live().config.kv_hints.tick;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.hints.wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
        let now = shared.now();
        // What became of earlier hints first, so the policy decides knowing it.
        let outcomes = shared.hints.take_outcomes();
        if !outcomes.is_empty() {
            policy.on_outcomes(&outcomes, now);
        }
        let round = shared.hints.take_round(now);
        for event in &round.events {
            shared
                .metrics
                .kv_lifecycle_events
                .get_or_create(&LifecycleLabels {
                    kind: event.kind.label(),
                })
                .inc();
        }
        let mut hints = Vec::new();
        if !round.events.is_empty() || round.waiting {
            let index = index_state(&shared, &round.events);
            hints = policy.on_events(&round.events, &index, now);
        }
        hints.extend(
            round
                .due
                .into_iter()
                .map(|s| KvHint::new(s, HintKind::Prefetch(HintTier::Device))),
        );
        if !hints.is_empty() {
            deliver(&shared, &hints);
        }
    }
}

/// The index as the policy sees it: where the sessions `events` name (and those waiting on a
/// tool) are, and every rank's use.
fn index_state(shared: &Shared, events: &[LifecycleEvent]) -> IndexState {
    let state = shared.hints.state();
    let sessions = state.tracker.round_sessions(events);
    let block_size = u64::from(shared.live().config.router.block_size);
    let ranks: Vec<(Rank, u64)> = shared
        .fleet
        .members()
        .iter()
        .flat_map(|m| {
            let capacity = m.config.kv_capacity_tokens.unwrap_or(0) / block_size.max(1);
            m.upstream.ranks().map(move |r| (r, capacity))
        })
        .collect();
    let mut index_state = shared.index().read(|index| IndexState {
        residency: state.tracker.residency(sessions.iter().copied(), index),
        usage: ranks
            .into_iter()
            .map(|(rank, capacity)| RankUsage {
                rank,
                device_used_blocks: index.blocks(rank, Tier::Device),
                device_capacity_blocks: capacity,
                host_used_blocks: index.blocks(rank, Tier::Host),
                host_capacity_blocks: 0,
            })
            .collect(),
    });
    index_state
        .residency
        .extend(slot_residency(shared, &state.tracker, &sessions));
    index_state
}

/// Where llama.cpp slots hold `sessions` (llama-server publishes no KV events, so the index
/// knows nothing of them): a slot holding a session holds its lineage on the device; a session
/// whose slot was saved has it on disk, where any server sharing the directory can restore it.
fn slot_residency(
    shared: &Shared,
    tracker: &SessionTracker,
    sessions: &BTreeSet<&str>,
) -> Vec<SessionResidency> {
    let slots = &shared.hints.slots;
    let mut out = Vec::new();
    for &session in sessions {
        for (rank, blocks) in tracker.lineage(session) {
            let on_slots = shared
                .fleet
                .get(rank.worker)
                .is_some_and(|m| m.config.kv_hints == HintDelivery::LlamaSlots);
            if !on_slots {
                continue;
            }
            let (device_blocks, disk_blocks) = if slots.holds(rank.worker, session) {
                (blocks, 0)
            } else if slots.saved(session).is_some() {
                (0, blocks)
            } else {
                continue;
            };
            out.push(SessionResidency {
                session_id: session.to_owned(),
                rank,
                device_blocks,
                host_blocks: 0,
                disk_blocks,
            });
        }
    }
    out
}

/// Resolve `hints` into block actions per rank and hand them to the workers.
fn deliver(shared: &Arc<Shared>, hints: &[KvHint]) {
    let per_rank = shared.hints.state().tracker.actions(hints);
    for (rank, mut actions) in per_rank {
        let Some(member) = shared.fleet.get(rank.worker) else {
            continue; // it left meanwhile
        };
        let delivery = member.config.kv_hints;
        // llama.cpp's slots are named by session, not by block: no engine names needed.
        if !matches!(delivery, HintDelivery::None | HintDelivery::LlamaSlots) {
            let Some(names) = member.engine_names(rank) else {
                // Without its events there is no knowing how the engine names the blocks.
                count(shared, rank, &actions, |_| Outcome::Rejected);
                continue;
            };
            let unnamed = names.name_actions(&mut actions);
            count(shared, rank, &unnamed, |_| Outcome::Missing);
            if actions.is_empty() {
                continue;
            }
        }
        match delivery {
            HintDelivery::None => {
                count(shared, rank, &actions, |_| Outcome::Rejected);
            }
            HintDelivery::Request => {
                count(shared, rank, &actions, |_| Outcome::Deferred);
                let mut state = shared.hints.state();
                let riding = state.riding.entry(rank).or_default();
                riding.extend(actions);
                let excess = riding.len().saturating_sub(MAX_RIDING_ACTIONS);
                riding.drain(..excess);
            }
            HintDelivery::Endpoint => {
                let envelope = shared.hints.envelope(actions);
                tokio::spawn(send(shared.clone(), rank, envelope));
            }
            HintDelivery::LlamaSlots => {
                tokio::spawn(llama_slots::apply(shared.clone(), rank, actions));
            }
        }
    }
}

/// POST `envelope` to the rank's `/v1/kv_hints` and count what became of each action.
async fn send(shared: Arc<Shared>, rank: Rank, envelope: KvHintsEnvelope) {
    let Some(member) = shared.fleet.get(rank.worker) else {
        return; // it left meanwhile
    };
    let timeout = shared.live().config.kv_hints.delivery_timeout;
    let body = match serde_json::to_value(&envelope) {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode a kv_hints envelope");
            return;
        }
    };
    let answer = member
        .upstream
        .request(&shared.client, "/v1/kv_hints", rank.dp_rank, body)
        .timeout(timeout)
        .send()
        .await;
    let reply = match answer {
        Ok(response) if response.status().is_success() => response
            .json::<KvHintsReply>()
            .await
            .map_err(|e| e.to_string()),
        Ok(response) => Err(format!("status {}", response.status())),
        Err(e) => Err(e.to_string()),
    };
    match reply {
        Ok(reply) => {
            let mut heard = Vec::with_capacity(envelope.actions.len());
            let outcomes: HashMap<&str, Outcome> = reply
                .outcomes
                .iter()
                .map(|o| (o.action_id.as_str(), o.outcome))
                .collect();
            let blocks: HashMap<&str, u32> = reply
                .outcomes
                .iter()
                .map(|o| (o.action_id.as_str(), o.blocks))
                .collect();
            for action in &envelope.actions {
                let id = action.action_id.as_str();
                // An action the answer does not mention was not applied.
                let outcome = outcomes.get(id).copied().unwrap_or(Outcome::Rejected);
                let labels = labels(rank, action, outcome);
                let covered = blocks.get(id).copied().unwrap_or(0);
                shared.metrics.kv_hints.get_or_create(&labels).inc();
                shared
                    .metrics
                    .kv_hint_blocks
                    .get_or_create(&labels)
                    .inc_by(u64::from(covered));
                heard.extend(HintOutcome::of(rank, action, outcome, covered));
            }
            shared.hints.outcomes(heard);
        }
        Err(why) => {
            // Not delivered: the policy hears its actions rejected, as an unanswered action is.
            shared
                .hints
                .outcomes(envelope.actions.iter().filter_map(|action| {
                    let sent = u32::try_from(action.payload.block_hashes.len()).unwrap_or(u32::MAX);
                    HintOutcome::of(rank, action, Outcome::Rejected, sent)
                }));
            tracing::warn!(worker = %rank, error = %why, "kv hints not delivered");
            shared
                .metrics
                .kv_hint_delivery_failures
                .get_or_create(&worker_label(rank))
                .inc();
        }
    }
}

fn labels(rank: Rank, action: &HintAction, outcome: Outcome) -> HintLabels {
    kind_labels(rank, action.kind(), outcome)
}

fn kind_labels(rank: Rank, kind: Option<ActionType>, outcome: Outcome) -> HintLabels {
    HintLabels {
        action: kind.map_or("unknown", ActionType::label),
        worker: rank.to_string(),
        outcome: outcome.label(),
    }
}

/// Count one action of `kind` (None: not one of ours) on `rank`: its outcome, and the blocks
/// it acted on.
pub(crate) fn count_outcome(
    shared: &Shared,
    rank: Rank,
    kind: Option<ActionType>,
    outcome: Outcome,
    blocks: u64,
) {
    let labels = kind_labels(rank, kind, outcome);
    shared.metrics.kv_hints.get_or_create(&labels).inc();
    shared
        .metrics
        .kv_hint_blocks
        .get_or_create(&labels)
        .inc_by(blocks);
}

/// Count one action's `outcome` on `rank` and keep it for the policy's next round (its
/// `on_outcomes`): for the paths that apply actions one at a time (llama.cpp's slots).
/// `session_id` is the hint's session, `None` for the gateway's own action.
pub(crate) fn settle(
    shared: &Shared,
    rank: Rank,
    (kind, session_id): (Option<ActionType>, Option<String>),
    outcome: Outcome,
    blocks: u64,
) {
    count_outcome(shared, rank, kind, outcome, blocks);
    if let Some(action) = kind {
        shared.hints.outcomes([HintOutcome {
            session_id,
            rank,
            action,
            outcome,
            blocks: u32::try_from(blocks).unwrap_or(u32::MAX),
        }]);
    }
}

/// Count `actions` on `rank` with the outcome the gateway already knows, and keep it for the
/// policy.
fn count(
    shared: &Shared,
    rank: Rank,
    actions: &[HintAction],
    outcome: impl Fn(&HintAction) -> Outcome,
) {
    let mut heard = Vec::with_capacity(actions.len());
    for action in actions {
        let outcome = outcome(action);
        let sent = u32::try_from(action.payload.block_hashes.len()).unwrap_or(u32::MAX);
        count_outcome(shared, rank, action.kind(), outcome, u64::from(sent));
        heard.extend(HintOutcome::of(rank, action, outcome, sent));
    }
    shared.hints.outcomes(heard);
}

/// `POST /v1/agent/prefetch`: a harness that knows a tool is about to return.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefetchRequest {
    /// The session; else the request's session header.
    session_id: Option<String>,
    /// When the session's next request is expected, from now.
    expected_in_ms: u64,
}

/// `POST /v1/agent/prefetch {session_id, expected_in_ms}`: bring the session's blocks back to
/// the device on the rank it was last routed to, `[kv_hints] prefetch_lead` before its next
/// request. The harness's word is an instruction, not a lifecycle event: no policy decides it.
/// Answers 202 with when the prefetch goes out; 400 for a bad body or a session never routed.
pub(crate) async fn prefetch_hook(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(err) = shared.live().admits(&headers) {
        return err.into_api_response(Api::ChatCompletions);
    }
    let limit = shared.live().config.server.max_body_bytes;
    let bytes = match read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(err) => return err.into_response(),
    };
    let request: PrefetchRequest = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(e) => {
            return GatewayError::BadRequest(format!("invalid prefetch request: {e}"))
                .into_response();
        }
    };
    let header_session = crate::agent::AgentContext::from_headers(&headers).session_id;
    let Some(session_id) = request.session_id.or(header_session) else {
        return GatewayError::BadRequest(
            "a prefetch needs a session_id (in the body or a session header)".into(),
        )
        .into_response();
    };
    let lead = shared.live().config.kv_hints.prefetch_lead;
    let wait = Duration::from_millis(request.expected_in_ms).saturating_sub(lead);
    if !shared
        .hints
        .announce_prefetch(&session_id, shared.now() + wait)
    {
        return GatewayError::BadRequest(format!(
            "session {session_id:?} has no routed request to prefetch for"
        ))
        .into_response();
    }
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({
            "session_id": session_id,
            "prefetch_in_ms": wait.as_millis() as u64,
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::hash::SequenceHash;
    use switchyard_core::kv_hints::LifecycleKind;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn routed(hints: &Hints, session: &str, at: Duration) {
        let turn = RoutedTurn {
            session_id: session,
            parent_session_id: None,
            rank: Rank::new(0, 0),
            hashes: &[SequenceHash(7), SequenceHash(8)],
            prompt_tokens: 32,
        };
        hints.routed(turn, at);
    }

    #[test]
    fn announced_prefetches_come_due_once_and_only_for_routed_sessions() {
        let hints = Hints::new(&KvHintsConfig::default());
        routed(&hints, "s", ms(0));
        assert!(!hints.announce_prefetch("ghost", ms(5)));
        assert!(hints.announce_prefetch("s", ms(50)));
        assert!(hints.take_round(ms(49)).due.is_empty());
        assert_eq!(hints.take_round(ms(50)).due, ["s"]);
        assert!(hints.take_round(ms(100)).due.is_empty());
    }

    #[test]
    fn a_tool_call_waits_for_its_result_across_rounds() {
        let hints = Hints::new(&KvHintsConfig::default());
        routed(&hints, "s", ms(0));
        let round = hints.take_round(ms(1));
        assert!(round.events.is_empty() && !round.waiting);
        let end = TurnEnd {
            tool_call: true,
            tool_name: Some("bash".into()),
            ..TurnEnd::default()
        };
        hints.turn_ended("s", &end, false, ms(10));
        let round = hints.take_round(ms(11));
        assert_eq!(round.events.len(), 1);
        assert!(round.waiting, "ticks go on while the tool runs");
        assert!(hints.take_round(ms(12)).events.is_empty());
        routed(&hints, "s", ms(900));
        let round = hints.take_round(ms(901));
        assert!(!round.waiting);
        assert_eq!(
            round.events[0].kind,
            LifecycleKind::ToolResult {
                tool_name: Some("bash".into()),
                waited: ms(890),
            }
        );
        // The harness's last turn ends the session.
        hints.turn_ended("s", &TurnEnd::default(), true, ms(950));
        let kinds: Vec<_> = hints
            .take_round(ms(951))
            .events
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, [LifecycleKind::SessionEnd]);
    }
}
