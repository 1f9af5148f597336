//! KV hints executed: the `switchyard.kv.*` actions of a [`KvHintsEnvelope`] applied to the
//! engine's tiers in model time (kv-cache.md sections 3 and 6).
//!
//! Every action names blocks by the engine's sequence hashes ([`KvCache::hash_blocks`]) and
//! ends as one [`ActionOutcome`]. A hint only ever changes where bytes live, never what a
//! request computes: a block a running or queued request needs is never freed, and whatever a
//! hint drops is recomputed or reloaded like any evicted block.
//!
//! | action | what the engine does |
//! |---|---|
//! | `demote` (tier host or disk) | drops the device copy of each unreferenced block, keeping one in the target tier (the host has it by write-through; otherwise it is written there); to disk, the host copy moves down too |
//! | `prefetch` (tier device) | loads the root-aligned run from host or disk into the device in the background (queued on the tier's link), stopping at the first block in no tier; may evict cold unreferenced device blocks (LRU), never referenced ones, never more than the device's free blocks not promised to running requests |
//! | `evict` | drops the blocks from the device (unreferenced ones; referenced ones are evicted first once released), the host and the disk |
//! | `pin` (ttl_ms) | holds the device blocks until model time + ttl, at most a quarter of the device at once; expiry is lazy, and pins give way when a request could otherwise never be admitted |
//! | `retain` | evicted last among unpinned device blocks; a high priority in the host and disk tiers |
//! | `ephemeral` | evicted first on the device, and dropped from the host and disk tiers (as if never written through) |
//!
//! The movement is data, as for every step: a hint's events and [`KvTransfer`]s come out at the
//! start of the next [`EngineModel::step`] (so [`EngineModel::has_work`] says so), in the order
//! they happened. A prefetch loads in the background: its copies queue on the host's (or the
//! disk's) link into the device behind the loads already there, its time goes to
//! [`TierStats::prefetch_time`](super::TierStats::prefetch_time) and to no step's duration, and
//! a request that hits a prefetched block before the copy completes waits for it (as for an
//! admission's own load; see the engine's module docs).
//!
//! Known limits of the model: the device slot of a prefetched block is taken when the hint is
//! applied, not when its copy lands; the shared pool (G4) is the driver's, so `evict` and
//! `ephemeral` leave its copies alone; an outcome is never `deferred`.

use super::cache::{BlockTable, CacheEvent, KvCache, Residency};
use super::tiers::{HostTier, KvTransfer};
use super::{EngineModel, Waiting};
use crate::kv_hints::HintTier;
use crate::kv_hints::actions::{
    ACTION_VERSION, ActionOutcome, ActionType, HintAction, KvHintsEnvelope, KvHintsReply, Outcome,
    PROTOCOL_VERSION,
};
use crate::worker::Tier;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;
use switchyard_kvbm::Tick;
use switchyard_kvbm::retention::Retention;

/// Pinned device blocks are at most the device's blocks divided by this (SGLang's bounded pin
/// budget): pins can never take the whole cache.
pub const PIN_BUDGET_DIVISOR: usize = 4;

/// Priority of retained blocks in the host and disk tiers (kvbm's scale: 0..=100, untagged 35).
const RETAIN_PRIORITY: u8 = 90;

/// Why an envelope was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintsError {
    /// The envelope speaks another version of the protocol.
    #[error(
        "kv_hints protocol_version {0:?} is not supported; this engine speaks {PROTOCOL_VERSION:?}"
    )]
    ProtocolVersion(String),
}

/// Hint state between steps: pins, and what hints did that the next step reports.
#[derive(Debug, Default)]
pub(super) struct HintState {
    /// Pinned device blocks by hash (ordered, so that expiry is deterministic).
    pins: BTreeMap<u64, Lease>,
    /// Cache events of hints, in order, for the next step.
    pub(super) events: Vec<CacheEvent>,
    /// Byte movements of hints, in order, for the next step.
    pub(super) transfers: Vec<KvTransfer>,
}

/// A pin: a reference on one device block until model time `until`.
#[derive(Debug)]
struct Lease {
    until: Duration,
    table: BlockTable,
}

impl HintState {
    /// Whether the next step has hint events or transfers to report.
    pub(super) fn has_pending(&self) -> bool {
        !self.events.is_empty() || !self.transfers.is_empty()
    }

    /// Blocks pinned now.
    pub(super) fn pinned_blocks(&self) -> usize {
        self.pins.len()
    }

    /// Release every pin whose time is up at `now`.
    pub(super) fn expire(&mut self, cache: &mut KvCache, now: Duration) {
        let expired: Vec<u64> = self
            .pins
            .iter()
            .filter(|(_, lease)| lease.until <= now)
            .map(|(&hash, _)| hash)
            .collect();
        for hash in expired {
            self.unpin(cache, hash);
        }
    }

    /// Release the pin that would expire first; `false` if there is none.
    pub(super) fn release_soonest(&mut self, cache: &mut KvCache) -> bool {
        let soonest = self
            .pins
            .iter()
            .min_by_key(|(hash, lease)| (lease.until, **hash))
            .map(|(&hash, _)| hash);
        soonest.is_some_and(|hash| self.unpin(cache, hash))
    }

    /// Release every pin.
    pub(super) fn release_all(&mut self, cache: &mut KvCache) {
        for (_, lease) in std::mem::take(&mut self.pins) {
            cache.release(lease.table);
        }
    }

    fn unpin(&mut self, cache: &mut KvCache, hash: u64) -> bool {
        match self.pins.remove(&hash) {
            Some(lease) => {
                cache.release(lease.table);
                true
            }
            None => false,
        }
    }
}

// === impl EngineModel ===

impl EngineModel {
    /// Apply `actions` in order, now (model time): one outcome per action, in order. See the
    /// module docs for what each action does; anything not ours at [`ACTION_VERSION`] is
    /// rejected. The events and transfers come out of the next [`EngineModel::step`].
    pub fn apply_hints(&mut self, actions: &[HintAction]) -> Vec<ActionOutcome> {
        self.hints.expire(&mut self.cache, self.clock);
        self.hints.events.extend(self.cache.take_events());
        let mut outcomes = Vec::with_capacity(actions.len());
        for action in actions {
            outcomes.push(self.apply_hint(action));
            // Device events join the lower tiers' in the order they happened.
            self.hints.events.extend(self.cache.take_events());
        }
        outcomes
    }

    /// [`EngineModel::apply_hints`] for a whole envelope, checking its protocol version.
    pub fn apply_envelope(
        &mut self,
        envelope: &KvHintsEnvelope,
    ) -> Result<KvHintsReply, HintsError> {
        if envelope.protocol_version != PROTOCOL_VERSION {
            return Err(HintsError::ProtocolVersion(
                envelope.protocol_version.clone(),
            ));
        }
        Ok(KvHintsReply {
            message_id: envelope.message_id.clone(),
            outcomes: self.apply_hints(&envelope.actions),
        })
    }

    /// Device blocks pinned by hints now (within [`EngineModel::pin_budget`]).
    pub fn pinned_blocks(&self) -> usize {
        self.hints.pinned_blocks()
    }

    /// Most device blocks hints may pin at once: a quarter of the device (at least one).
    pub fn pin_budget(&self) -> usize {
        (self.config.num_blocks / PIN_BUDGET_DIVISOR).max(1)
    }

    fn apply_hint(&mut self, action: &HintAction) -> ActionOutcome {
        let payload = &action.payload;
        let mut seen = HashSet::new();
        let hashes: Vec<u64> = payload
            .block_hashes
            .iter()
            .copied()
            .filter(|h| seen.insert(*h))
            .collect();
        let result = match action.kind() {
            None => Err(format!(
                "unsupported action {}@{}: this engine executes switchyard.kv.* at version {}",
                action.action_type, action.action_version, ACTION_VERSION
            )),
            Some(_) if hashes.is_empty() => Err("the action names no blocks".to_owned()),
            Some(ActionType::Demote) => self.demote(&hashes, payload.tier),
            Some(ActionType::Prefetch) => self.prefetch(&hashes, payload.tier),
            Some(ActionType::Evict) => Ok(self.evict(&hashes)),
            Some(ActionType::Pin) => self.pin_hint(&hashes, payload.ttl_ms),
            Some(ActionType::Retain) => self.retain(&hashes),
            Some(ActionType::Ephemeral) => Ok(self.ephemeral(&hashes)),
        };
        let (outcome, blocks, reason) = match result {
            Ok(tally) => tally.finish(),
            Err(reason) => (Outcome::Rejected, 0, Some(reason)),
        };
        ActionOutcome {
            action_id: action.action_id.clone(),
            outcome,
            blocks,
            reason,
        }
    }

    fn now(&self) -> Tick {
        Tick(self.clock.as_nanos() as u64)
    }

    fn demote(&mut self, hashes: &[u64], tier: Option<HintTier>) -> Result<Tally, String> {
        let to_disk = match tier {
            Some(HintTier::Host) => false,
            Some(HintTier::Disk) => true,
            Some(other) => {
                return Err(format!(
                    "demote moves blocks to the host or disk tier, not {}",
                    tier_name(other)
                ));
            }
            None => return Err("demote needs a tier: host or disk".to_owned()),
        };
        let now = self.now();
        let waiting = waiting_hashes(&self.waiting);
        let Self {
            cache, host, hints, ..
        } = self;
        let Some(host) = host.as_mut().filter(|h| !to_disk || h.has_disk()) else {
            let missing = if to_disk { "disk" } else { "host" };
            return Err(format!("the engine has no {missing} tier"));
        };
        let mut tally = Tally::default();
        for &hash in hashes {
            // An explicit demote outranks an earlier pin of ours.
            hints.unpin(cache, hash);
            let device = cache.residency(hash);
            if device == Residency::InUse || (device == Residency::Free && waiting.contains(&hash))
            {
                tally.clip("in use by a request");
                continue;
            }
            let demoted = if to_disk {
                demote_to_disk(cache, host, hints, hash, now, &mut tally)
            } else {
                demote_to_host(cache, host, hints, hash, now, &mut tally)
            };
            if demoted {
                host.count_demoted();
                tally.done += 1;
            }
        }
        Ok(tally)
    }

    fn prefetch(&mut self, hashes: &[u64], tier: Option<HintTier>) -> Result<Tally, String> {
        if let Some(other) = tier.filter(|t| *t != HintTier::Device) {
            return Err(format!(
                "prefetch loads blocks into the device tier, not {}",
                tier_name(other)
            ));
        }
        let now = self.now();
        let clock = self.clock;
        let Self {
            cache,
            host,
            hints,
            links,
            loading,
            ..
        } = self;
        let Some(host) = host.as_mut() else {
            return Err("the engine has no host or disk tier to prefetch from".to_owned());
        };
        let (mut host_loaded, mut disk_loaded) = (Vec::new(), Vec::new());
        // The prefix's own blocks are never evicted to make room for the rest of it.
        let keep: HashSet<u64> = hashes.iter().copied().collect();
        let (mut from_host, mut from_disk) = (0, 0);
        let mut tally = Tally::default();
        for (index, &hash) in hashes.iter().enumerate() {
            let left = hashes.len() - index;
            if cache.touch(hash) != Residency::Absent {
                tally.already += 1;
                continue;
            }
            let Some((tier, resident)) = host.find(hash, now) else {
                let why = format!("not loaded: the prefix stops at block {index}, in no tier");
                tally.absent(left, why);
                break;
            };
            let Some(slot) = cache.load(hash, resident.parent, &resident.token_ids, &keep) else {
                tally.clip_many(
                    left,
                    "not loaded: no room (the device's other free blocks are promised to \
                     running requests)",
                );
                break;
            };
            hints.transfers.push(KvTransfer::Copy {
                hash,
                from: (tier, resident.slot),
                to: (Tier::Device, slot),
            });
            match tier {
                Tier::Disk => {
                    from_disk += 1;
                    disk_loaded.push(hash);
                }
                _ => {
                    from_host += 1;
                    host_loaded.push(hash);
                }
            }
            tally.done += 1;
        }
        // Loaded, not computed: the host's copies are refreshed and what came from disk is
        // written through to the host, as an admission's loads are.
        hints.events.extend(cache.take_events());
        host.write_through(
            cache.take_stored(),
            now,
            &mut hints.events,
            &mut hints.transfers,
        );
        // The copies run in the background on the tiers' links, behind the loads queued there;
        // a request that hits a block before it is there waits for it.
        let (host_time, disk_time) = host.charge_prefetch(from_host, from_disk);
        let host_ready = links.host(clock, host_time);
        let disk_ready = links.disk(clock, disk_time);
        for (blocks, ready) in [(host_loaded, host_ready), (disk_loaded, disk_ready)] {
            if ready > clock {
                loading.extend(blocks.into_iter().map(|hash| (hash, ready)));
            }
        }
        Ok(tally)
    }

    fn evict(&mut self, hashes: &[u64]) -> Tally {
        let now = self.now();
        let waiting = waiting_hashes(&self.waiting);
        let Self {
            cache, host, hints, ..
        } = self;
        let mut tally = Tally::default();
        for &hash in hashes {
            hints.unpin(cache, hash);
            let mut freed = false;
            match cache.residency(hash) {
                Residency::Free if waiting.contains(&hash) => {
                    tally.clip("in use by a queued request");
                }
                Residency::Free => freed = cache.drop_free(hash),
                Residency::InUse => {
                    cache.evict_first(hash);
                    tally.clip("in use on the device (evicted first once released)");
                }
                Residency::Absent => {}
            }
            if let Some(host) = host.as_mut() {
                hints.events.extend(cache.take_events());
                freed |= host.drop_block(hash, now, &mut hints.events, &mut hints.transfers);
                freed |= host.drop_disk_block(hash, &mut hints.events);
            }
            if freed {
                tally.done += 1;
            } else if cache.residency(hash) == Residency::Absent {
                tally.absent(1, "in no tier".to_owned());
            }
        }
        tally
    }

    fn pin_hint(&mut self, hashes: &[u64], ttl_ms: Option<u64>) -> Result<Tally, String> {
        let Some(ttl) = ttl_ms.filter(|ms| *ms > 0).map(Duration::from_millis) else {
            return Err("pin needs a positive ttl_ms".to_owned());
        };
        let until = self.clock.saturating_add(ttl);
        let budget = self.pin_budget();
        let Self { cache, hints, .. } = self;
        let mut tally = Tally::default();
        for &hash in hashes {
            if let Some(lease) = hints.pins.get_mut(&hash) {
                // Extending a pin costs no budget.
                lease.until = lease.until.max(until);
                tally.done += 1;
                continue;
            }
            if cache.residency(hash) == Residency::Absent {
                tally.absent(1, "not on the device".to_owned());
                continue;
            }
            if hints.pins.len() >= budget {
                tally.clip("over the pin budget");
                continue;
            }
            match cache.hold(hash) {
                Some(table) => {
                    hints.pins.insert(hash, Lease { until, table });
                    tally.done += 1;
                }
                None => {
                    tally.clip("without room (every free device block is promised to a request)")
                }
            }
        }
        Ok(tally)
    }

    fn retain(&mut self, hashes: &[u64]) -> Result<Tally, String> {
        let retention = Retention::new(RETAIN_PRIORITY, None).map_err(|e| e.to_string())?;
        let now = self.now();
        let mut tally = Tally::default();
        for &hash in hashes {
            let on_device = self.cache.retain(hash) != Residency::Absent;
            let below = self
                .host
                .as_ref()
                .is_some_and(|host| host.set_retention(hash, retention, now));
            if on_device || below {
                tally.done += 1;
            } else {
                tally.absent(1, "in no tier".to_owned());
            }
        }
        Ok(tally)
    }

    fn ephemeral(&mut self, hashes: &[u64]) -> Tally {
        let now = self.now();
        let Self {
            cache, host, hints, ..
        } = self;
        let mut tally = Tally::default();
        for &hash in hashes {
            // Not to be reused: a pin of ours no longer makes sense.
            hints.unpin(cache, hash);
            let on_device = cache.evict_first(hash) != Residency::Absent;
            let mut below = false;
            if let Some(host) = host.as_mut() {
                below |= host.drop_block(hash, now, &mut hints.events, &mut hints.transfers);
                below |= host.drop_disk_block(hash, &mut hints.events);
            }
            if on_device || below {
                tally.done += 1;
            } else {
                tally.absent(1, "in no tier".to_owned());
            }
        }
        tally
    }
}

/// Demote one block whose device copy (if any) is unreferenced to the host tier. Whether it
/// moved.
fn demote_to_host(
    cache: &mut KvCache,
    host: &mut HostTier,
    hints: &mut HintState,
    hash: u64,
    now: Tick,
    tally: &mut Tally,
) -> bool {
    if cache.residency(hash) == Residency::Absent {
        if host.holds(hash) {
            tally.already += 1;
        } else {
            tally.absent(1, "not on the device".to_owned());
        }
        return false;
    }
    // A demoted block is the host's most recent: it is there to be reloaded.
    if !host.touch(hash, now) {
        // Not written through (the host evicted it, or it was ephemeral): write it now.
        if let Some(block) = cache.cached_block(hash) {
            hints.events.extend(cache.take_events());
            host.write_through(vec![block], now, &mut hints.events, &mut hints.transfers);
        }
        if !host.holds(hash) {
            tally.clip("without room in the host tier");
            return false;
        }
    }
    cache.drop_free(hash)
}

/// Demote one block whose device copy (if any) is unreferenced to the disk tier, dropping its
/// device and host copies. Whether it moved.
fn demote_to_disk(
    cache: &mut KvCache,
    host: &mut HostTier,
    hints: &mut HintState,
    hash: u64,
    now: Tick,
    tally: &mut Tally,
) -> bool {
    let on_device = cache.residency(hash) != Residency::Absent;
    if !on_device && !host.holds(hash) {
        if host.disk_holds(hash) {
            tally.already += 1;
        } else {
            tally.absent(1, "not on the device or in the host tier".to_owned());
        }
        return false;
    }
    hints.events.extend(cache.take_events());
    let (events, transfers) = (&mut hints.events, &mut hints.transfers);
    if !host.disk_holds(hash) {
        let on_disk = if host.holds(hash) {
            host.move_to_disk(hash, now, events, transfers)
        } else {
            cache
                .cached_block(hash)
                .is_some_and(|block| host.write_to_disk(block, now, events, transfers))
        };
        if !on_disk {
            tally.clip("without room in the disk tier");
            return false;
        }
    }
    host.drop_block(hash, now, events, transfers);
    if on_device {
        cache.drop_free(hash);
    }
    true
}

/// Every block hash a queued request's prompt names: a hint must not free what it will hit.
fn waiting_hashes(waiting: &VecDeque<Waiting>) -> HashSet<u64> {
    waiting
        .iter()
        .flat_map(|w| w.hashes.iter().copied())
        .collect()
}

fn tier_name(tier: HintTier) -> &'static str {
    match tier {
        HintTier::Device => "device",
        HintTier::Host => "host",
        HintTier::Disk => "disk",
        HintTier::Shared => "shared",
    }
}

/// How one action went, block by block.
#[derive(Debug, Default)]
struct Tally {
    /// Blocks acted on.
    done: u32,
    /// Blocks that needed nothing: already where the action wants them.
    already: usize,
    /// Blocks the engine could not act on, by reason (a budget, no room, in use), in the
    /// order first seen.
    clipped: Vec<(usize, &'static str)>,
    /// Blocks not where the action needs them, and why.
    absent: Option<(usize, String)>,
}

impl Tally {
    fn clip(&mut self, why: &'static str) {
        self.clip_many(1, why);
    }

    fn clip_many(&mut self, blocks: usize, why: &'static str) {
        match self.clipped.iter_mut().find(|(_, w)| *w == why) {
            Some((count, _)) => *count += blocks,
            None => self.clipped.push((blocks, why)),
        }
    }

    fn absent(&mut self, blocks: usize, why: String) {
        match &mut self.absent {
            Some((count, _)) => *count += blocks,
            None => self.absent = Some((blocks, why)),
        }
    }

    /// Accepted when nothing fell short; missing when no block was where the action needs it;
    /// clipped otherwise, with every reason.
    fn finish(self) -> (Outcome, u32, Option<String>) {
        let mut reasons: Vec<String> = self
            .clipped
            .iter()
            .map(|(count, why)| format!("{} {why}", blocks(*count)))
            .collect();
        if let Some((count, why)) = &self.absent {
            reasons.push(format!("{} {why}", blocks(*count)));
        }
        let reason = (!reasons.is_empty()).then(|| reasons.join("; "));
        let outcome = if reasons.is_empty() {
            Outcome::Accepted
        } else if self.done == 0 && self.already == 0 && self.clipped.is_empty() {
            Outcome::Missing
        } else {
            Outcome::Clipped
        };
        (outcome, self.done, reason)
    }
}

/// "1 block", "3 blocks".
fn blocks(count: usize) -> String {
    match count {
        1 => "1 block".to_owned(),
        n => format!("{n} blocks"),
    }
}

#[cfg(test)]
mod tests;
