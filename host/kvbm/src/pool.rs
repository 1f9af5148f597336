//! One tier's block pool: slots, the type-state handles that own them, the registry that dedups
//! by sequence hash, and the inactive set that eviction draws from.
//!
//! ```text
//! reset --allocate--> MutableBlock --complete--> CompleteBlock --register--> ImmutableBlock
//!   ^                      | drop                    | drop                    | clone = refcount+1
//!   +----------------------+-------------------------+                         | last drop
//!   +------------------------------ evict ---------- inactive (still matchable) <+
//! ```
//!
//! Every handle returns its slot on drop, so a failed transition or a forgotten block never
//! leaks. A [`WeakBlock`] does not keep a block alive; it upgrades by slot first, then by hash.

use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::error::KvbmError;
use crate::eviction::{Candidates, Position};
use crate::retention::{PinOutcome, Retention};
use crate::types::{BlockId, SequenceHash, Tick, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registered {
    hash: SequenceHash,
    parent: Option<SequenceHash>,
    refcount: u32,
    retention: Retention,
    pinned_until: Option<Tick>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Reset,
    /// Owned by a `MutableBlock` or `CompleteBlock` handle.
    Leased,
    Registered(Registered),
}

/// Counters of one pool since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Blocks registered under a hash not yet present.
    pub registered: u64,
    /// Registrations that found the hash already present (the new slot went back to reset).
    pub deduplicated: u64,
    /// Prefix lookups that found a block.
    pub hits: u64,
    /// Prefix lookups that ended on a missing block.
    pub misses: u64,
    /// Pin requests refused by the budget.
    pub pins_clipped: u64,
    /// Blocks dropped because their bytes were found bad.
    pub invalidated: u64,
}

#[derive(Debug)]
struct PoolState {
    tier: Tier,
    slots: Vec<SlotState>,
    generations: Vec<u64>,
    free: Vec<BlockId>,
    /// Keyed by hashes already, so by a one-multiply hasher rather than SipHash.
    registry: FxHashMap<SequenceHash, BlockId>,
    /// Registered blocks per parent hash: a block with children is not a leaf.
    children: FxHashMap<SequenceHash, u32>,
    candidates: Candidates,
    pins: BTreeSet<(Tick, BlockId)>,
    pin_budget: usize,
    /// The latest time any caller told us; drops (which take no time) use it.
    now: Tick,
    removed: Vec<SequenceHash>,
    counters: PoolCounters,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<PoolState>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic elsewhere must not turn every later drop into a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A tier's pool of fixed-size block slots. Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    shared: Arc<Shared>,
}

/// What `allocate` handed out and what it had to evict for it (the source of removal events).
#[derive(Debug)]
pub struct Allocation {
    /// The blocks, ready to fill.
    pub blocks: Vec<MutableBlock>,
    /// Sequence hashes evicted to make room, in eviction order.
    pub evicted: Vec<SequenceHash>,
}

/// The result of registering a completed block.
#[derive(Debug)]
pub struct Registration {
    /// The registered block (the existing one when the hash was already present).
    pub block: ImmutableBlock,
    /// True when the hash was new to this pool (a store event), false for a dedup.
    pub stored: bool,
}

/// A snapshot of a pool's occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    /// Slots in the pool.
    pub capacity: usize,
    /// Slots in the reset pool.
    pub free: usize,
    /// Slots held by mutable or complete handles.
    pub leased: usize,
    /// Registered blocks (in use or inactive).
    pub registered: usize,
    /// Registered blocks nobody holds.
    pub inactive: usize,
    /// Inactive blocks eviction may take now (unpinned leaves).
    pub evictable: usize,
    /// Pinned blocks.
    pub pinned: usize,
}

// === impl BlockPool ===

impl BlockPool {
    /// A pool of `capacity` slots for `tier`, of which at most `pin_budget` may be pinned.
    pub fn new(tier: Tier, capacity: usize, pin_budget: usize) -> Result<BlockPool, KvbmError> {
        if capacity == 0 || capacity >= u32::MAX as usize {
            return Err(KvbmError::InvalidConfig {
                field: "capacity_blocks",
                reason: format!("{capacity} is not in 1..{}", u32::MAX),
            });
        }
        let free = (0..capacity as u32).rev().map(BlockId).collect();
        let state = PoolState {
            tier,
            slots: vec![SlotState::Reset; capacity],
            generations: vec![0; capacity],
            free,
            registry: FxHashMap::with_capacity_and_hasher(capacity, Default::default()),
            children: FxHashMap::default(),
            candidates: Candidates::new(capacity),
            pins: BTreeSet::new(),
            pin_budget,
            now: Tick(0),
            removed: Vec::new(),
            counters: PoolCounters::default(),
        };
        Ok(BlockPool {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
            }),
        })
    }

    /// The tier this pool serves.
    pub fn tier(&self) -> Tier {
        self.shared.lock().tier
    }

    /// Whether two handles name the same pool.
    pub fn same_pool(&self, other: &BlockPool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// `count` blocks, from the reset pool first, then by evicting inactive leaves in retention
    /// order. All or nothing: on `OutOfBlocks` nothing is leased, but blocks already evicted
    /// stay evicted and are reported by [`BlockPool::drain_removed`].
    pub fn allocate(&self, count: usize, now: Tick) -> Result<Allocation, KvbmError> {
        let mut state = self.shared.lock();
        state.advance(now);
        let mut evicted = Vec::new();
        while state.free.len() < count {
            match state.evict_one() {
                Some(hash) => evicted.push(hash),
                None => {
                    return Err(KvbmError::OutOfBlocks {
                        tier: state.tier,
                        requested: count,
                        available: state.free.len(),
                    });
                }
            }
        }
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            if let Some(id) = state.free.pop() {
                state.slots[id.index()] = SlotState::Leased;
                ids.push(id);
            }
        }
        drop(state);
        let blocks = ids
            .into_iter()
            .map(|id| MutableBlock {
                lease: Lease {
                    pool: Some(self.shared.clone()),
                    id,
                },
            })
            .collect();
        Ok(Allocation { blocks, evicted })
    }

    /// Register a completed block with `retention`. If the hash is already registered the
    /// existing block is returned (its retention merged) and the new slot goes back to reset.
    pub fn register(
        &self,
        block: CompleteBlock,
        retention: Retention,
        now: Tick,
    ) -> Result<Registration, KvbmError> {
        let CompleteBlock {
            lease,
            hash,
            parent,
        } = block;
        if !lease.belongs_to(&self.shared) {
            // Not ours: the lease drops back into its own pool.
            return Err(KvbmError::ForeignBatch);
        }
        let id = lease.disarm();
        let mut state = self.shared.lock();
        state.advance(now);
        if let Some(&existing) = state.registry.get(&hash) {
            state.release_leased(id);
            state.counters.deduplicated += 1;
            state.acquire(existing);
            state.merge_retention(existing, retention);
            drop(state);
            return Ok(Registration {
                block: self.handle(existing, hash),
                stored: false,
            });
        }
        state.slots[id.index()] = SlotState::Registered(Registered {
            hash,
            parent,
            refcount: 1,
            retention,
            pinned_until: None,
        });
        state.registry.insert(hash, id);
        state.counters.registered += 1;
        if let Some(parent) = parent {
            *state.children.entry(parent).or_insert(0) += 1;
            if let Some(&parent_id) = state.registry.get(&parent) {
                state.refresh(parent_id);
            }
        }
        drop(state);
        Ok(Registration {
            block: self.handle(id, hash),
            stored: true,
        })
    }

    fn handle(&self, id: BlockId, hash: SequenceHash) -> ImmutableBlock {
        ImmutableBlock {
            pool: self.shared.clone(),
            id,
            hash,
        }
    }

    /// The block registered under `hash`, taking a reference (a hit touches it).
    pub fn get(&self, hash: SequenceHash, now: Tick) -> Option<ImmutableBlock> {
        let mut state = self.shared.lock();
        state.advance(now);
        let id = *state.registry.get(&hash)?;
        state.acquire(id);
        drop(state);
        Some(self.handle(id, hash))
    }

    /// The longest prefix of `hashes` registered here, stopping at the first miss.
    pub fn match_prefix(&self, hashes: &[SequenceHash], now: Tick) -> Vec<ImmutableBlock> {
        let mut state = self.shared.lock();
        state.advance(now);
        let mut ids = Vec::new();
        for &hash in hashes {
            match state.registry.get(&hash) {
                Some(&id) => {
                    state.acquire(id);
                    state.counters.hits += 1;
                    ids.push((id, hash));
                }
                None => {
                    state.counters.misses += 1;
                    break;
                }
            }
        }
        drop(state);
        ids.into_iter()
            .map(|(id, hash)| self.handle(id, hash))
            .collect()
    }

    /// Whether `hash` is registered (no touch, no reference).
    pub fn contains(&self, hash: SequenceHash) -> bool {
        self.shared.lock().registry.contains_key(&hash)
    }

    /// Store one block (`hash`, after `parent`) unless the pool holds it, which then only
    /// counts as a use: allocate a slot, evicting as needed (the victims go to the removal log,
    /// [`drain_removed`](Self::drain_removed)), and register it. The slot it took, or `None`
    /// when it was present or nothing could be evicted.
    pub fn store(
        &self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        retention: Retention,
        now: Tick,
    ) -> Option<BlockId> {
        if self.touch(hash, now) {
            return None;
        }
        let block = self.allocate(1, now).ok()?.blocks.pop()?;
        let slot = block.id();
        let registration = self
            .register(block.complete(hash, parent), retention, now)
            .ok()?;
        registration.stored.then_some(slot)
    }

    /// Mark `hash` as just used (LRU), if present.
    pub fn touch(&self, hash: SequenceHash, now: Tick) -> bool {
        let mut state = self.shared.lock();
        state.advance(now);
        let Some(&id) = state.registry.get(&hash) else {
            return false;
        };
        // Re-entering the order at the back is what makes it the most recent.
        state.candidates.remove(id);
        state.refresh(id);
        true
    }

    /// Replace the retention of `hash` (explicit: may lower it, e.g. to ephemeral).
    pub fn set_retention(&self, hash: SequenceHash, retention: Retention, now: Tick) -> bool {
        let mut state = self.shared.lock();
        state.advance(now);
        let Some(&id) = state.registry.get(&hash) else {
            return false;
        };
        if let SlotState::Registered(r) = &mut state.slots[id.index()] {
            r.retention = retention;
        }
        // Re-keyed at the back: a retention change counts as a use.
        state.candidates.remove(id);
        state.refresh(id);
        true
    }

    /// The retention of `hash`, as declared.
    pub fn retention(&self, hash: SequenceHash) -> Option<Retention> {
        let state = self.shared.lock();
        let id = *state.registry.get(&hash)?;
        match state.slots[id.index()] {
            SlotState::Registered(r) => Some(r.retention),
            _ => None,
        }
    }

    /// Pin `hashes` until `until`: never evicted before then. At most the pool's pin budget is
    /// pinned at once; the rest is clipped and reported.
    pub fn pin(&self, hashes: &[SequenceHash], until: Tick, now: Tick) -> PinOutcome {
        let mut state = self.shared.lock();
        state.advance(now);
        let mut outcome = PinOutcome::default();
        for &hash in hashes {
            let Some(&id) = state.registry.get(&hash) else {
                outcome.missing += 1;
                continue;
            };
            let SlotState::Registered(r) = state.slots[id.index()] else {
                outcome.missing += 1;
                continue;
            };
            match r.pinned_until {
                Some(old) => {
                    // Already pinned: extending costs no budget.
                    state.pins.remove(&(old, id));
                }
                None if state.pins.len() >= state.pin_budget => {
                    outcome.clipped += 1;
                    state.counters.pins_clipped += 1;
                    continue;
                }
                None => {}
            }
            let until = r.pinned_until.map_or(until, |old| old.max(until));
            if until <= state.now {
                continue;
            }
            if let SlotState::Registered(r) = &mut state.slots[id.index()] {
                r.pinned_until = Some(until);
            }
            state.pins.insert((until, id));
            state.refresh(id);
            outcome.accepted += 1;
        }
        outcome
    }

    /// Evict one inactive leaf in retention order, if any.
    pub fn evict_one(&self, now: Tick) -> Option<SequenceHash> {
        let mut state = self.shared.lock();
        state.advance(now);
        state.evict_one()
    }

    /// Drop `hash` whatever its place in the lineage (its bytes were found bad). Only an
    /// inactive block can go; returns whether it did.
    pub fn invalidate(&self, hash: SequenceHash) -> bool {
        let removed = self.remove(hash);
        if removed {
            self.shared.lock().counters.invalidated += 1;
        }
        removed
    }

    /// Drop `hash` whatever its place in the lineage (it moves to another tier); like
    /// [`invalidate`](Self::invalidate), but not counted as bad bytes.
    pub fn remove(&self, hash: SequenceHash) -> bool {
        let mut state = self.shared.lock();
        let Some(&id) = state.registry.get(&hash) else {
            return false;
        };
        match state.slots[id.index()] {
            SlotState::Registered(r) if r.refcount == 0 => {
                state.remove_registered(id);
                true
            }
            _ => false,
        }
    }

    /// Process expired pins and retention up to `now`.
    pub fn advance(&self, now: Tick) {
        self.shared.lock().advance(now);
    }

    /// The hashes evicted or invalidated since the last call.
    pub fn drain_removed(&self) -> Vec<SequenceHash> {
        std::mem::take(&mut self.shared.lock().removed)
    }

    /// The strong references held on `hash`, if registered.
    pub fn refcount(&self, hash: SequenceHash) -> Option<u32> {
        let state = self.shared.lock();
        let id = *state.registry.get(&hash)?;
        match state.slots[id.index()] {
            SlotState::Registered(r) => Some(r.refcount),
            _ => None,
        }
    }

    /// Whether `hash` is pinned at the pool's latest time.
    pub fn is_pinned(&self, hash: SequenceHash) -> bool {
        let state = self.shared.lock();
        let Some(&id) = state.registry.get(&hash) else {
            return false;
        };
        matches!(state.slots[id.index()], SlotState::Registered(r) if r.pinned_until.is_some_and(|t| t > state.now))
    }

    /// The next block eviction would take at `now`, without taking it.
    pub fn next_victim(&self, now: Tick) -> Option<SequenceHash> {
        let mut state = self.shared.lock();
        state.advance(now);
        let now = state.now;
        let id = state.candidates.peek(now)?;
        match state.slots[id.index()] {
            SlotState::Registered(r) => Some(r.hash),
            _ => None,
        }
    }

    /// Blocks registered under a hash: [`PoolUsage::registered`] without the walk over every
    /// slot that [`BlockPool::usage`] makes (engines read it at each admission decision).
    pub fn registered(&self) -> usize {
        self.shared.lock().registry.len()
    }

    /// Occupancy now (walks every slot).
    pub fn usage(&self) -> PoolUsage {
        let state = self.shared.lock();
        let mut usage = PoolUsage {
            capacity: state.slots.len(),
            free: state.free.len(),
            leased: 0,
            registered: state.registry.len(),
            inactive: 0,
            evictable: state.candidates.len(),
            pinned: state.pins.len(),
        };
        for slot in &state.slots {
            match slot {
                SlotState::Leased => usage.leased += 1,
                SlotState::Registered(r) if r.refcount == 0 => usage.inactive += 1,
                _ => {}
            }
        }
        usage
    }

    /// Counters since creation.
    pub fn counters(&self) -> PoolCounters {
        self.shared.lock().counters
    }
}

// === impl PoolState ===

impl PoolState {
    fn advance(&mut self, now: Tick) {
        if now > self.now {
            self.now = now;
        }
        while let Some(&(until, id)) = self.pins.first() {
            if until > self.now {
                break;
            }
            self.pins.pop_first();
            if let SlotState::Registered(r) = &mut self.slots[id.index()] {
                r.pinned_until = None;
            }
            self.refresh(id);
        }
    }

    fn is_leaf(&self, hash: SequenceHash) -> bool {
        self.children.get(&hash).copied().unwrap_or(0) == 0
    }

    /// Put `id` in or out of the eviction candidates to match its state.
    fn refresh(&mut self, id: BlockId) {
        self.refresh_at(id, Position::Back);
    }

    fn refresh_at(&mut self, id: BlockId, position: Position) {
        let evictable = match self.slots[id.index()] {
            SlotState::Registered(r) => {
                r.refcount == 0
                    && self.is_leaf(r.hash)
                    && r.pinned_until.is_none_or(|t| t <= self.now)
            }
            _ => false,
        };
        let present = self.candidates.contains(id);
        if evictable && !present {
            if let SlotState::Registered(r) = self.slots[id.index()] {
                self.candidates.insert(id, r.retention, position, self.now);
            }
        } else if !evictable && present {
            self.candidates.remove(id);
        }
    }

    fn acquire(&mut self, id: BlockId) {
        if let SlotState::Registered(r) = &mut self.slots[id.index()] {
            r.refcount += 1;
        }
        self.candidates.remove(id);
    }

    fn release(&mut self, id: BlockId) {
        if let SlotState::Registered(r) = &mut self.slots[id.index()] {
            r.refcount = r.refcount.saturating_sub(1);
        }
        self.refresh(id);
    }

    fn merge_retention(&mut self, id: BlockId, retention: Retention) {
        let now = self.now;
        if let SlotState::Registered(r) = &mut self.slots[id.index()] {
            r.retention = r.retention.merge(retention, now);
        }
        self.candidates.remove(id);
        self.refresh(id);
    }

    fn release_leased(&mut self, id: BlockId) {
        if self.slots[id.index()] == SlotState::Leased {
            self.slots[id.index()] = SlotState::Reset;
            self.generations[id.index()] += 1;
            self.free.push(id);
        }
    }

    /// Evict the next candidate into the reset pool and return its hash.
    fn evict_one(&mut self) -> Option<SequenceHash> {
        let id = self.candidates.pop(self.now)?;
        let hash = self.remove_registered(id)?;
        self.counters.evictions += 1;
        Some(hash)
    }

    fn remove_registered(&mut self, id: BlockId) -> Option<SequenceHash> {
        let SlotState::Registered(r) = self.slots[id.index()] else {
            return None;
        };
        self.candidates.remove(id);
        if let Some(until) = r.pinned_until {
            self.pins.remove(&(until, id));
        }
        self.registry.remove(&r.hash);
        self.slots[id.index()] = SlotState::Reset;
        self.generations[id.index()] += 1;
        self.free.push(id);
        if let Some(parent) = r.parent {
            if let Some(count) = self.children.get_mut(&parent) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.children.remove(&parent);
                }
            }
            if let Some(&parent_id) = self.registry.get(&parent) {
                // The parent may have just become a leaf: it goes next, so a chain dies
                // tail-first in one run.
                self.refresh_at(parent_id, Position::Front);
            }
        }
        self.removed.push(r.hash);
        Some(r.hash)
    }
}

/// Ownership of one leased slot; returns it to the reset pool on drop unless disarmed.
#[derive(Debug)]
struct Lease {
    pool: Option<Arc<Shared>>,
    id: BlockId,
}

impl Lease {
    fn belongs_to(&self, shared: &Arc<Shared>) -> bool {
        self.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, shared))
    }

    fn disarm(mut self) -> BlockId {
        self.pool = None;
        self.id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.lock().release_leased(self.id);
        }
    }
}

/// A block being filled. Dropping it returns the slot to the reset pool.
#[derive(Debug)]
pub struct MutableBlock {
    lease: Lease,
}

impl MutableBlock {
    /// The slot to write into.
    pub fn id(&self) -> BlockId {
        self.lease.id
    }

    /// The block is full: it now has a sequence hash (and the parent it chains from).
    pub fn complete(self, hash: SequenceHash, parent: Option<SequenceHash>) -> CompleteBlock {
        CompleteBlock {
            lease: self.lease,
            hash,
            parent,
        }
    }
}

/// A full block with a sequence hash, not yet registered. Dropping it returns the slot.
#[derive(Debug)]
pub struct CompleteBlock {
    lease: Lease,
    hash: SequenceHash,
    parent: Option<SequenceHash>,
}

impl CompleteBlock {
    /// The slot holding its bytes.
    pub fn id(&self) -> BlockId {
        self.lease.id
    }

    /// Its sequence hash.
    pub fn hash(&self) -> SequenceHash {
        self.hash
    }

    /// The hash of the block before it.
    pub fn parent(&self) -> Option<SequenceHash> {
        self.parent
    }

    /// Back to mutable (the fill was wrong); the slot stays leased.
    pub fn reset(self) -> MutableBlock {
        MutableBlock { lease: self.lease }
    }
}

/// A registered, immutable block; one strong reference. Clone adds a reference; the last drop
/// moves the block to the inactive set, where it stays matchable until evicted.
#[derive(Debug)]
pub struct ImmutableBlock {
    pool: Arc<Shared>,
    id: BlockId,
    hash: SequenceHash,
}

impl ImmutableBlock {
    /// The slot holding its bytes.
    pub fn id(&self) -> BlockId {
        self.id
    }

    /// Its sequence hash.
    pub fn hash(&self) -> SequenceHash {
        self.hash
    }

    /// Its parent's hash.
    pub fn parent(&self) -> Option<SequenceHash> {
        match self.pool.lock().slots[self.id.index()] {
            SlotState::Registered(r) => r.parent,
            _ => None,
        }
    }

    /// Its retention, as declared.
    pub fn retention(&self) -> Retention {
        match self.pool.lock().slots[self.id.index()] {
            SlotState::Registered(r) => r.retention,
            _ => Retention::DEFAULT,
        }
    }

    /// A handle that does not keep the block alive.
    pub fn downgrade(&self) -> WeakBlock {
        let generation = self.pool.lock().generations[self.id.index()];
        WeakBlock {
            pool: Arc::downgrade(&self.pool),
            id: self.id,
            hash: self.hash,
            generation,
        }
    }
}

impl Clone for ImmutableBlock {
    fn clone(&self) -> Self {
        self.pool.lock().acquire(self.id);
        ImmutableBlock {
            pool: self.pool.clone(),
            id: self.id,
            hash: self.hash,
        }
    }
}

impl Drop for ImmutableBlock {
    fn drop(&mut self) {
        self.pool.lock().release(self.id);
    }
}

/// A reference that does not prevent eviction.
#[derive(Debug, Clone)]
pub struct WeakBlock {
    pool: Weak<Shared>,
    id: BlockId,
    hash: SequenceHash,
    generation: u64,
}

impl WeakBlock {
    /// Its sequence hash.
    pub fn hash(&self) -> SequenceHash {
        self.hash
    }

    /// A strong reference again: the same slot if it still holds the block, else whichever
    /// slot the hash is registered in now; `None` once evicted (or the pool is gone).
    pub fn upgrade(&self) -> Option<ImmutableBlock> {
        let pool = self.pool.upgrade()?;
        let mut state = pool.lock();
        let same_slot = state.generations.get(self.id.index()) == Some(&self.generation)
            && matches!(state.slots[self.id.index()], SlotState::Registered(r) if r.hash == self.hash);
        let id = if same_slot {
            self.id
        } else {
            *state.registry.get(&self.hash)?
        };
        state.acquire(id);
        drop(state);
        Some(ImmutableBlock {
            pool,
            id,
            hash: self.hash,
        })
    }
}

#[cfg(test)]
mod tests;
