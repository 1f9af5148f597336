//! `kv_hints = "llama-slots"`: KV hints to llama.cpp's `llama-server` through its slot API.
//!
//! Every server runs with `--slot-save-path DIR`, the same `DIR` for every server on the host,
//! so a slot saved by one can be restored by any other. The gateway pins each session to a slot
//! of the server it is routed to (`id_slot` on the request), and keeps what it knows of the
//! slots here:
//!
//! - **Demote**: `POST /slots/{id}?action=save {"filename"}` writes the session's slot to a file
//!   named after the session ([`slot_file`]), then `?action=erase` frees the slot for others
//!   while the session waits on its tool.
//! - **Prefetch**: `?action=restore` loads the file into a slot of the rank the session was last
//!   routed to, before its next request.
//! - **On the request path**: a request pinned to a slot that does not hold its session's KV (the
//!   session was demoted, or is routed to another server than before: its first one is busy,
//!   drained or unhealthy) has the session's KV restored there first, so its prompt is read from
//!   the cache instead of prefilled again. Where an idle slot of another server that passes its
//!   health probe still holds KV newer than the session's file (it moved without a demote),
//!   that slot is saved to the file first, keeping its KV there too (counted as a `demote`,
//!   `clipped`: saved, not erased). The restore is counted as a `prefetch`.
//! - **Drain** (`/admin/workers/drain`): the drained server's idle slots are saved the same way
//!   at once, and each busy one when its request ends, so the server can be stopped without
//!   losing a session's KV.
//! - **Evict**: `?action=erase` of the session's slot; the gateway forgets its file (llama.cpp
//!   has no action that deletes one).
//! - Pin, retain and ephemeral have no llama.cpp counterpart: rejected.
//!
//! Each action ends in an [`Outcome`] counted in `switchyard_kv_hint_actions_total`. A failed
//! save or restore never fails a request: it is counted, and the prompt is prefilled as usual.

use crate::fleet::Member;
use crate::hints::settle;
use crate::metrics::worker_label;
use crate::server::Shared;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use switchyard_core::kv_hints::actions::{ActionType, HintAction, Outcome};
use switchyard_core::worker::{Rank, WorkerId};

/// What the gateway knows of the llama.cpp workers' slots and the sessions' slot files.
#[derive(Debug)]
pub(crate) struct Slots {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    workers: HashMap<WorkerId, WorkerSlots>,
    /// Sessions whose slot was saved to the slot directory, and what the save wrote.
    saved: HashMap<String, (u64, Saved)>,
    /// The same sessions by when they were saved: the oldest is forgotten past `capacity`.
    saved_order: BTreeMap<u64, String>,
    capacity: usize,
    next_stamp: u64,
}

/// One llama-server's slots.
#[derive(Debug, Default)]
struct WorkerSlots {
    /// Its `total_slots` (`-np`), asked once from `/props`.
    total: Option<u32>,
    slots: Vec<Slot>,
}

#[derive(Debug, Default, Clone)]
struct Slot {
    /// The session whose KV the slot holds, as far as the gateway knows.
    session: Option<String>,
    /// A request, save or restore runs on it now.
    busy: bool,
    /// When it was last released (a stamp): the least recent is reused first.
    last_used: u64,
    /// The session's file holds what the slot holds (saved or restored since a request last
    /// ran on it): a move needs no save first.
    saved: bool,
}

/// A saved slot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Saved {
    /// Tokens the file holds (`n_saved`).
    pub tokens: u64,
    /// Bytes it has (`n_written`).
    pub bytes: u64,
}

/// A slot taken for one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Taken {
    slot: u32,
    /// It already holds the session's KV.
    holds: bool,
}

impl Slots {
    /// Remembers at most `capacity` sessions' slot files.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                workers: HashMap::new(),
                saved: HashMap::new(),
                saved_order: BTreeMap::new(),
                capacity: capacity.max(1),
                next_stamp: 0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain data: a panic elsewhere leaves nothing half-done that matters.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn total(&self, worker: WorkerId) -> Option<u32> {
        self.state().workers.get(&worker).and_then(|w| w.total)
    }

    fn set_total(&self, worker: WorkerId, total: u32) {
        let mut state = self.state();
        let slots = state.workers.entry(worker).or_default();
        slots.total = Some(total);
        slots.slots.resize(total as usize, Slot::default());
    }

    /// Take a slot of `worker` for `session`: the one holding its KV when that is free, else a
    /// free empty one, else the least recently used free one (whose session loses its place).
    /// None when every slot is busy.
    fn take(&self, worker: WorkerId, session: &str) -> Option<Taken> {
        let mut state = self.state();
        let slots = &mut state.workers.get_mut(&worker)?.slots;
        let holding = slots
            .iter()
            .position(|s| !s.busy && s.session.as_deref() == Some(session));
        let (index, holds) = match holding {
            Some(index) => (index, true),
            None => {
                let index = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.busy)
                    .min_by_key(|(_, s)| (s.session.is_some(), s.last_used))
                    .map(|(i, _)| i)?;
                (index, false)
            }
        };
        let slot = &mut slots[index];
        slot.busy = true;
        slot.session = Some(session.to_owned());
        Some(Taken {
            slot: index as u32,
            holds,
        })
    }

    /// Take the free slot of `worker` that holds `session`'s KV. `Err(())` when it holds it
    /// but is busy; `Ok(None)` when no slot holds it.
    fn take_holding(&self, worker: WorkerId, session: &str) -> Result<Option<u32>, ()> {
        let mut state = self.state();
        let Some(slots) = state.workers.get_mut(&worker) else {
            return Ok(None);
        };
        let Some(index) = slots
            .slots
            .iter()
            .position(|s| s.session.as_deref() == Some(session))
        else {
            return Ok(None);
        };
        let slot = &mut slots.slots[index];
        if slot.busy {
            return Err(());
        }
        slot.busy = true;
        Ok(Some(index as u32))
    }

    /// Take an idle slot of a worker other than `here` that holds `session`'s KV, among
    /// `candidates`: the session moved from there. Of several, the one it ran on last holds
    /// the longest KV; none when its file holds that already.
    fn take_held_elsewhere(
        &self,
        here: WorkerId,
        session: &str,
        candidates: impl Fn(WorkerId) -> bool,
    ) -> Option<(WorkerId, u32)> {
        let mut state = self.state();
        let State { workers, saved, .. } = &mut *state;
        let (worker, index, slot) = workers
            .iter_mut()
            .filter(|(worker, _)| **worker != here && candidates(**worker))
            .flat_map(|(worker, slots)| {
                let worker = *worker;
                (slots.slots.iter_mut().enumerate()).map(move |(index, slot)| (worker, index, slot))
            })
            .filter(|(_, _, s)| !s.busy && s.session.as_deref() == Some(session))
            .max_by_key(|(_, _, s)| s.last_used)
            .filter(|(_, _, s)| !in_file(saved, s))?;
        slot.busy = true;
        Some((worker, index as u32))
    }

    /// Whether some slot of `worker` holds `session`'s KV.
    pub(crate) fn holds(&self, worker: WorkerId, session: &str) -> bool {
        self.state().workers.get(&worker).is_some_and(|w| {
            w.slots
                .iter()
                .any(|s| s.session.as_deref() == Some(session))
        })
    }

    /// Hand back a taken slot; it now holds `session`'s KV (None: nobody's).
    fn release(&self, worker: WorkerId, slot: u32, session: Option<&str>) {
        self.put_back(worker, slot, session, false);
    }

    /// Hand back a taken slot that holds `session`'s KV as its file does (just saved or
    /// restored).
    fn release_saved(&self, worker: WorkerId, slot: u32, session: &str) {
        self.put_back(worker, slot, Some(session), true);
    }

    fn put_back(&self, worker: WorkerId, slot: u32, session: Option<&str>, saved: bool) {
        let mut state = self.state();
        state.next_stamp += 1;
        let stamp = state.next_stamp;
        if let Some(slot) = state
            .workers
            .get_mut(&worker)
            .and_then(|w| w.slots.get_mut(slot as usize))
        {
            slot.busy = false;
            slot.session = session.map(str::to_owned);
            slot.last_used = stamp;
            slot.saved = saved && session.is_some();
        }
    }

    /// The sessions whose KV idle slots of `worker` hold and their files lack.
    fn unsaved_sessions(&self, worker: WorkerId) -> Vec<String> {
        let state = self.state();
        let Some(w) = state.workers.get(&worker) else {
            return Vec::new();
        };
        (w.slots.iter())
            .filter(|s| !s.busy && !in_file(&state.saved, s))
            .filter_map(|s| s.session.clone())
            .collect()
    }

    /// The slot file of `session`, if one was saved.
    pub(crate) fn saved(&self, session: &str) -> Option<Saved> {
        self.state().saved.get(session).map(|(_, saved)| *saved)
    }

    fn record_saved(&self, session: &str, saved: Saved) {
        let mut state = self.state();
        state.next_stamp += 1;
        let stamp = state.next_stamp;
        if let Some((old, _)) = state.saved.insert(session.to_owned(), (stamp, saved)) {
            state.saved_order.remove(&old);
        }
        state.saved_order.insert(stamp, session.to_owned());
        while state.saved.len() > state.capacity {
            let Some((_, oldest)) = state.saved_order.pop_first() else {
                break;
            };
            state.saved.remove(&oldest);
        }
    }

    fn forget_saved(&self, session: &str) {
        let mut state = self.state();
        if let Some((stamp, _)) = state.saved.remove(session) {
            state.saved_order.remove(&stamp);
        }
    }
}

/// Whether `slot`'s session has a file holding what the slot holds (a file forgotten past the
/// `saved` bound holds nothing).
fn in_file(saved: &HashMap<String, (u64, Saved)>, slot: &Slot) -> bool {
    slot.saved && slot.session.as_ref().is_some_and(|s| saved.contains_key(s))
}

/// The slot file of `session` for `model`: a name llama.cpp accepts (no separators), the same
/// on every gateway replica, so any server sharing the directory finds it.
pub(crate) fn slot_file(model: &str, session: &str) -> String {
    let key = format!("{model}\0{session}");
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    format!("switchyard-{hash:016x}.bin")
}

/// A request's slot, handed back when the request is over (dropped).
pub(crate) struct SlotLease {
    shared: Arc<Shared>,
    worker: WorkerId,
    slot: u32,
    session: String,
}

impl SlotLease {
    /// The slot to pin the request to (`id_slot`).
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }
}

impl std::fmt::Debug for SlotLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotLease")
            .field("worker", &self.worker)
            .field("slot", &self.slot)
            .field("session", &self.session)
            .finish()
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        // The request ran on the slot: it now holds the session's prompt.
        self.shared
            .hints
            .slots
            .release(self.worker, self.slot, Some(&self.session));
        // On a drained server, the session's next turn goes elsewhere: save its KV now, while
        // the server is surely up (unless the runtime itself is going away).
        let drained = (self.shared.fleet.get(self.worker)).is_some_and(|m| m.draining());
        if drained && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(save_in_place(
                self.shared.clone(),
                self.worker,
                self.session.clone(),
            ));
        }
    }
}

/// A `llama-slots` worker was drained: save every session its idle slots hold to the session's
/// file, so that each can be restored wherever its next turn goes, even once the server is
/// stopped. Sessions running a request are saved when it ends ([`SlotLease`]).
pub(crate) async fn save_drained(shared: Arc<Shared>, worker: WorkerId) {
    for session in shared.hints.slots.unsaved_sessions(worker) {
        save_in_place(shared.clone(), worker, session).await;
    }
}

/// Save the idle slot of `worker` holding `session` to the session's file, keeping the KV there:
/// the gateway's own demote, counted `clipped` (saved, not erased).
async fn save_in_place(shared: Arc<Shared>, worker: WorkerId, session: String) {
    let slots = &shared.hints.slots;
    let Ok(Some(slot)) = slots.take_holding(worker, &session) else {
        return; // gone, or busy (then saved when its request ends)
    };
    save_held(&shared, worker, slot, &session).await;
}

/// Before a request of `session` goes to `rank` of a llama-slots worker: the slot to pin it to,
/// with the session's saved KV restored there first when the slot does not hold it. None (the
/// request goes unpinned, as to any server) when the server's slots are unknown or all busy.
pub(crate) async fn before_request(
    shared: &Arc<Shared>,
    member: &Member,
    rank: Rank,
    session: &str,
) -> Option<SlotLease> {
    let worker = rank.worker;
    if shared.hints.slots.total(worker).is_none() {
        match total_slots(shared, member).await {
            Ok(total) => shared.hints.slots.set_total(worker, total),
            Err(why) => {
                tracing::warn!(worker = %rank, error = %why, "cannot read llama-server's slots; not pinning");
                return None;
            }
        }
    }
    let taken = shared.hints.slots.take(worker, session)?;
    let lease = SlotLease {
        shared: shared.clone(),
        worker,
        slot: taken.slot,
        session: session.to_owned(),
    };
    if !taken.holds {
        save_where_held(shared, worker, session).await;
    }
    if !taken.holds && shared.hints.slots.saved(session).is_some() {
        let (outcome, tokens) = restore(shared, member, rank, taken.slot, session).await;
        // The gateway's own restore, ahead of the session's request.
        settle(
            shared,
            rank,
            (Some(ActionType::Prefetch), None),
            outcome,
            blocks(shared, tokens),
        );
    }
    Some(lease)
}

/// Apply `actions` to `rank`'s slots one after the other, counting each one's outcome.
pub(crate) async fn apply(shared: Arc<Shared>, rank: Rank, actions: Vec<HintAction>) {
    let Some(member) = shared.fleet.get(rank.worker) else {
        return; // it left meanwhile
    };
    if shared.hints.slots.total(rank.worker).is_none() {
        match total_slots(&shared, &member).await {
            Ok(total) => shared.hints.slots.set_total(rank.worker, total),
            Err(why) => {
                tracing::warn!(worker = %rank, error = %why, "cannot read llama-server's slots")
            }
        }
    }
    for action in actions {
        let kind = action.kind();
        let (outcome, tokens) = match (kind, action.payload.session_id.as_deref()) {
            (Some(ActionType::Demote), Some(session)) => {
                demote(&shared, &member, rank, session).await
            }
            (Some(ActionType::Prefetch), Some(session)) => {
                prefetch(&shared, &member, rank, session).await
            }
            (Some(ActionType::Evict), Some(session)) => {
                evict(&shared, &member, rank, session).await
            }
            // No llama.cpp counterpart, or no session to name the slot by.
            _ => (Outcome::Rejected, 0),
        };
        let session = action.payload.session_id;
        settle(
            &shared,
            rank,
            (kind, session),
            outcome,
            blocks(&shared, tokens),
        );
    }
}

/// Save the session's slot to its file, then free the slot.
async fn demote(
    shared: &Arc<Shared>,
    member: &Member,
    rank: Rank,
    session: &str,
) -> (Outcome, u64) {
    let slots = &shared.hints.slots;
    let slot = match slots.take_holding(rank.worker, session) {
        Ok(Some(slot)) => slot,
        // No slot holds it (it was erased, or another session took the slot).
        Ok(None) => return (Outcome::Missing, 0),
        Err(()) => {
            tracing::debug!(worker = %rank, session, "not demoted: a request of the session runs on its slot");
            return (Outcome::Rejected, 0);
        }
    };
    let saved = match save(shared, member, rank, slot, session).await {
        Ok(saved) => saved,
        Err(Outcome::Missing) => {
            slots.release(rank.worker, slot, None);
            return (Outcome::Missing, 0);
        }
        Err(outcome) => {
            slots.release(rank.worker, slot, Some(session));
            return (outcome, 0);
        }
    };
    match slot_action(shared, member, rank, slot, "erase", None).await {
        Ok(_) => {
            slots.release(rank.worker, slot, None);
            (Outcome::Accepted, saved.tokens)
        }
        Err(e) => {
            // Saved, but still on the device.
            let _ = e.outcome(shared, rank, false);
            slots.release_saved(rank.worker, slot, session);
            (Outcome::Clipped, saved.tokens)
        }
    }
}

/// Write `slot` of `rank` (taken by the caller) to `session`'s file and remember it. `Err`: the
/// outcome of a save that wrote nothing (`Missing`: the slot was empty).
async fn save(
    shared: &Arc<Shared>,
    member: &Member,
    rank: Rank,
    slot: u32,
    session: &str,
) -> Result<Saved, Outcome> {
    let file = slot_file(&shared.model_name, session);
    let saved = match slot_action(shared, member, rank, slot, "save", Some(&file)).await {
        Ok(reply) if reply.n_saved.unwrap_or(0) > 0 => Saved {
            tokens: reply.n_saved.unwrap_or(0),
            bytes: reply.n_written.unwrap_or(0),
        },
        Ok(_) => return Err(Outcome::Missing),
        Err(e) => return Err(e.outcome(shared, rank, false)),
    };
    shared.hints.slots.record_saved(session, saved);
    tracing::debug!(worker = %rank, session, slot, file, tokens = saved.tokens, bytes = saved.bytes, "slot saved");
    Ok(saved)
}

/// `session` is about to run on `here` without its KV: if an idle slot of another server holds
/// it (the session moved: that server is drained, or busier), save that slot to the session's
/// file, so that the restore on `here` reads its latest KV. Only servers whose last health probe
/// passed are asked: a hung one would hold the request for the whole slot timeout. The slot
/// keeps the KV: the gateway's own demote, counted `clipped` (saved, not erased).
async fn save_where_held(shared: &Arc<Shared>, here: WorkerId, session: &str) {
    let slots = &shared.hints.slots;
    let answers = |worker| shared.fleet.get(worker).is_some_and(|m| m.probe_passed());
    let Some((worker, slot)) = slots.take_held_elsewhere(here, session, answers) else {
        return;
    };
    save_held(shared, worker, slot, session).await;
}

/// Save `slot` of `worker` (taken by the caller, holding `session`) to the session's file and
/// hand it back still holding the KV; counted as a `clipped` demote.
async fn save_held(shared: &Arc<Shared>, worker: WorkerId, slot: u32, session: &str) {
    let slots = &shared.hints.slots;
    // A llama-slots worker has one rank (the config checks it).
    let Some((rank, member)) = shared.fleet.get(worker).and_then(|m| {
        let rank = m.upstream.ranks().next();
        Some((rank?, m))
    }) else {
        slots.release(worker, slot, Some(session));
        return;
    };
    let (outcome, tokens) = match save(shared, &member, rank, slot, session).await {
        Ok(saved) => {
            slots.release_saved(worker, slot, session);
            (Outcome::Clipped, saved.tokens)
        }
        Err(outcome) => {
            slots.release(worker, slot, Some(session));
            (outcome, 0)
        }
    };
    settle(
        shared,
        rank,
        (Some(ActionType::Demote), None),
        outcome,
        blocks(shared, tokens),
    );
}

/// Make the session's KV present in a slot of `rank`: there already, or restored from its file.
async fn prefetch(
    shared: &Arc<Shared>,
    member: &Member,
    rank: Rank,
    session: &str,
) -> (Outcome, u64) {
    let slots = &shared.hints.slots;
    if slots.holds(rank.worker, session) {
        return (Outcome::Accepted, 0);
    }
    if slots.saved(session).is_none() {
        return (Outcome::Missing, 0);
    }
    if slots.total(rank.worker).is_none() {
        return (Outcome::Rejected, 0);
    }
    let Some(taken) = slots.take(rank.worker, session) else {
        tracing::debug!(worker = %rank, session, "not prefetched: every slot is busy");
        return (Outcome::Rejected, 0);
    };
    let (outcome, tokens) = restore(shared, member, rank, taken.slot, session).await;
    if matches!(outcome, Outcome::Accepted | Outcome::Clipped) {
        slots.release_saved(rank.worker, taken.slot, session);
    } else {
        slots.release(rank.worker, taken.slot, None);
    }
    (outcome, tokens)
}

/// Free the session's slot and forget its file.
async fn evict(shared: &Arc<Shared>, member: &Member, rank: Rank, session: &str) -> (Outcome, u64) {
    let slots = &shared.hints.slots;
    let had_file = slots.saved(session).is_some();
    slots.forget_saved(session);
    let slot = match slots.take_holding(rank.worker, session) {
        Ok(Some(slot)) => slot,
        Ok(None) if had_file => return (Outcome::Accepted, 0),
        Ok(None) => return (Outcome::Missing, 0),
        Err(()) => return (Outcome::Rejected, 0),
    };
    match slot_action(shared, member, rank, slot, "erase", None).await {
        Ok(reply) => {
            slots.release(rank.worker, slot, None);
            (Outcome::Accepted, reply.n_erased.unwrap_or(0))
        }
        Err(e) => {
            slots.release(rank.worker, slot, Some(session));
            (e.outcome(shared, rank, false), 0)
        }
    }
}

/// Restore `session`'s file into `slot` (taken by the caller): the outcome and tokens restored.
async fn restore(
    shared: &Arc<Shared>,
    member: &Member,
    rank: Rank,
    slot: u32,
    session: &str,
) -> (Outcome, u64) {
    let file = slot_file(&shared.model_name, session);
    match slot_action(shared, member, rank, slot, "restore", Some(&file)).await {
        Ok(reply) => {
            let tokens = reply.n_restored.unwrap_or(0);
            tracing::debug!(
                worker = %rank, session, slot, file, tokens,
                restore_ms = reply.timings.as_ref().and_then(|t| t.restore_ms),
                "slot restored"
            );
            if tokens == 0 {
                (Outcome::Missing, 0)
            } else {
                (Outcome::Accepted, tokens)
            }
        }
        Err(e) => (e.outcome(shared, rank, true), 0),
    }
}

/// Tokens as the router's blocks, for `switchyard_kv_hint_blocks_total`.
fn blocks(shared: &Shared, tokens: u64) -> u64 {
    tokens / u64::from(shared.live().config.router.block_size.max(1))
}

/// What llama-server answers a slot action (save, restore, erase).
#[derive(Debug, Default, Deserialize)]
struct SlotReply {
    n_saved: Option<u64>,
    n_written: Option<u64>,
    n_restored: Option<u64>,
    n_erased: Option<u64>,
    timings: Option<SlotTimings>,
}

#[derive(Debug, Default, Deserialize)]
struct SlotTimings {
    restore_ms: Option<f64>,
}

/// Why a slot action did not happen.
#[derive(Debug)]
enum SlotError {
    /// The server has no `--slot-save-path` (501).
    Unsupported,
    /// It refused (an error status): e.g. no such file to restore.
    Refused(u16, String),
    /// No answer (unreachable, a timeout, an unreadable reply).
    Unreachable(String),
}

impl SlotError {
    /// The action's outcome; an unanswered one is also counted as a delivery failure.
    /// `restoring`: a refusal means the file is absent or unusable (missing).
    fn outcome(&self, shared: &Shared, rank: Rank, restoring: bool) -> Outcome {
        let why = match self {
            SlotError::Unsupported => "the server has no --slot-save-path".to_owned(),
            SlotError::Refused(status, text) => format!("status {status}: {text}"),
            SlotError::Unreachable(why) => why.clone(),
        };
        tracing::warn!(worker = %rank, error = %why, "llama.cpp slot action failed");
        match self {
            SlotError::Unsupported => Outcome::Rejected,
            SlotError::Refused(..) if restoring => Outcome::Missing,
            SlotError::Refused(..) => Outcome::Rejected,
            SlotError::Unreachable(_) => {
                shared
                    .metrics
                    .kv_hint_delivery_failures
                    .get_or_create(&worker_label(rank))
                    .inc();
                Outcome::Rejected
            }
        }
    }
}

fn timeout(shared: &Shared) -> Duration {
    shared.live().config.kv_hints.slot_timeout
}

/// `POST /slots/{slot}?action={action}` with `{"filename"}` when given.
async fn slot_action(
    shared: &Shared,
    member: &Member,
    rank: Rank,
    slot: u32,
    action: &str,
    filename: Option<&str>,
) -> Result<SlotReply, SlotError> {
    let url = format!("{}/slots/{slot}?action={action}", member.upstream.base_url);
    let body = match filename {
        Some(filename) => serde_json::json!({ "filename": filename }),
        None => serde_json::json!({}),
    };
    let response = shared
        .client
        .post(url)
        .json(&body)
        .timeout(timeout(shared))
        .send()
        .await
        .map_err(|e| SlotError::Unreachable(e.to_string()))?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_IMPLEMENTED {
        return Err(SlotError::Unsupported);
    }
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        return Err(SlotError::Refused(status.as_u16(), text));
    }
    let reply = response
        .json::<SlotReply>()
        .await
        .map_err(|e| SlotError::Unreachable(format!("bad reply to {action}: {e}")))?;
    tracing::trace!(worker = %rank, slot, action, "slot action done");
    Ok(reply)
}

/// The server's slot count: `total_slots` of `GET /props`.
async fn total_slots(shared: &Shared, member: &Member) -> Result<u32, String> {
    #[derive(Deserialize)]
    struct Props {
        total_slots: u32,
    }
    let response = shared
        .client
        .get(format!("{}/props", member.upstream.base_url))
        .timeout(timeout(shared))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("/props answered {}", response.status()));
    }
    let props: Props = response.json().await.map_err(|e| format!("/props: {e}"))?;
    if props.total_slots == 0 {
        return Err("/props says total_slots = 0".into());
    }
    Ok(props.total_slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(total: u32) -> Slots {
        let slots = Slots::new(4);
        slots.set_total(WorkerId(0), total);
        slots
    }

    const W: WorkerId = WorkerId(0);

    #[test]
    fn a_session_gets_its_own_slot_back_and_new_ones_take_empty_slots_first() {
        let s = slots(2);
        let a = s.take(W, "a").unwrap();
        assert!(!a.holds);
        s.release(W, a.slot, Some("a"));
        let b = s.take(W, "b").unwrap();
        assert_ne!(b.slot, a.slot, "an empty slot before a session's");
        s.release(W, b.slot, Some("b"));
        assert_eq!(
            s.take(W, "a"),
            Some(Taken {
                slot: a.slot,
                holds: true
            })
        );
        s.release(W, a.slot, Some("a"));
        // A third session reuses the least recently used slot: b's.
        let c = s.take(W, "c").unwrap();
        assert_eq!((c.slot, c.holds), (b.slot, false));
        assert!(!s.holds(W, "b"));
    }

    #[test]
    fn busy_slots_are_not_taken_and_demotes_wait_for_none() {
        let s = slots(1);
        let a = s.take(W, "a").unwrap();
        assert_eq!(s.take(W, "b"), None, "the only slot is busy");
        assert_eq!(s.take_holding(W, "a"), Err(()));
        s.release(W, a.slot, Some("a"));
        assert_eq!(s.take_holding(W, "a"), Ok(Some(0)));
        s.release(W, 0, None);
        assert_eq!(s.take_holding(W, "a"), Ok(None));
        assert_eq!(
            s.take(W, "x"),
            Some(Taken {
                slot: 0,
                holds: false
            })
        );
        assert_eq!(Slots::new(1).take(W, "a"), None, "slots never read");
    }

    #[test]
    fn a_moved_session_is_found_idle_on_another_answering_server() {
        let s = slots(2);
        let other = WorkerId(1);
        s.set_total(other, 1);
        let a = s.take(W, "a").unwrap();
        let anyone = |_| true;
        assert_eq!(
            s.take_held_elsewhere(other, "a", anyone),
            None,
            "a's slot is busy"
        );
        s.release(W, a.slot, Some("a"));
        assert_eq!(s.take_held_elsewhere(W, "a", anyone), None, "not elsewhere");
        assert_eq!(
            s.take_held_elsewhere(other, "a", |w| w != W),
            None,
            "its server does not answer"
        );
        // Held on two servers: the one it ran on last has its longest KV.
        let third = WorkerId(2);
        s.set_total(third, 1);
        let older = s.take(third, "a").unwrap();
        s.release(third, older.slot, Some("a"));
        let newer = s.take(W, "a").unwrap();
        s.release(W, newer.slot, Some("a"));
        assert_eq!(s.take_held_elsewhere(other, "a", anyone), Some((W, a.slot)));
        assert_eq!(
            s.take_holding(W, "a"),
            Err(()),
            "taken for the save until released"
        );
        assert_eq!(s.unsaved_sessions(third), ["a"]);
        s.record_saved(
            "a",
            Saved {
                tokens: 10,
                bytes: 100,
            },
        );
        s.release_saved(W, a.slot, "a");
        assert!(s.holds(W, "a"), "the save leaves the KV in place");
        assert_eq!(
            s.take_held_elsewhere(other, "a", anyone),
            None,
            "the file holds it already"
        );
        assert!(s.unsaved_sessions(W).is_empty());
        // A request runs on the slot again: its KV is newer than the file.
        let again = s.take(W, "a").unwrap();
        s.release(W, again.slot, Some("a"));
        assert_eq!(s.unsaved_sessions(W), ["a"]);
        assert_eq!(s.take_held_elsewhere(other, "a", anyone), Some((W, a.slot)));
    }

    #[test]
    fn saved_files_are_bounded_oldest_first() {
        let s = Slots::new(2);
        let saved = Saved {
            tokens: 10,
            bytes: 100,
        };
        for session in ["a", "b", "c"] {
            s.record_saved(session, saved);
        }
        assert_eq!(s.saved("a"), None);
        assert_eq!(s.saved("c"), Some(saved));
        s.record_saved("b", saved);
        s.record_saved("d", saved);
        assert!(s.saved("b").is_some() && s.saved("c").is_none());
        s.forget_saved("b");
        assert_eq!(s.saved("b"), None);
    }

    #[test]
    fn slot_files_are_plain_names_per_model_and_session() {
        let a = slot_file("m", "session/../1");
        assert!(a.starts_with("switchyard-") && a.ends_with(".bin"));
        assert!(!a.contains('/'));
        assert_eq!(a, slot_file("m", "session/../1"));
        assert_ne!(a, slot_file("other", "session/../1"));
        assert_ne!(a, slot_file("m", "session/../2"));
    }
}
