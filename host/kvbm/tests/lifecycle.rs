//! Random sequences of allocate / register / drop / clone / touch / evict / retain / pin /
//! advance / weak upgrade / move, checked against a simple model after every step: no block
//! leaked, none double-freed, refcounts exact, the eviction order exactly the model's
//! (ephemeral, then effective priority after decay, then order of release; leaves only; a
//! prefix right after its suffix), pins within the budget.

use std::collections::HashMap;

use proptest::prelude::*;
use switchyard_kvbm::pool::{BlockPool, ImmutableBlock, MutableBlock, WeakBlock};
use switchyard_kvbm::retention::{PinOutcome, Retention};
use switchyard_kvbm::{KvbmError, SequenceHash, Tick, Tier};

const CHAINS: u64 = 4;
const DEPTH: u64 = 4;
const CAPACITY: usize = 8;
const PIN_BUDGET: usize = 2;

fn hash_of(chain: u64, depth: u64) -> u64 {
    100 * chain + depth
}

fn parent_of(hash: u64) -> Option<u64> {
    (!hash.is_multiple_of(100)).then(|| hash - 1)
}

#[derive(Debug, Clone)]
enum RetentionKind {
    Default,
    Tagged { priority: u8, duration: Option<u64> },
    Ephemeral,
}

impl RetentionKind {
    fn at(&self, now: Tick) -> Retention {
        match self {
            RetentionKind::Default => Retention::DEFAULT,
            RetentionKind::Tagged { priority, duration } => {
                Retention::new(*priority, duration.map(|d| Tick(now.0 + d)))
                    .unwrap_or(Retention::DEFAULT)
            }
            RetentionKind::Ephemeral => Retention::ephemeral(),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(usize),
    Register {
        index: usize,
        chain: u64,
        depth: u64,
        retention: RetentionKind,
    },
    DropMutable(usize),
    DropHandle(usize),
    CloneHandle(usize),
    Get(u64, u64),
    Touch(u64, u64),
    Evict,
    Retain(u64, u64, RetentionKind),
    Pin(u64, u64, u64),
    Advance(u64),
    Downgrade(usize),
    Upgrade(usize),
    Move(u64, u64),
    Remove(u64, u64),
}

fn retention_kind() -> impl Strategy<Value = RetentionKind> {
    prop_oneof![
        3 => Just(RetentionKind::Default),
        3 => (0u8..=100, proptest::option::of(1u64..50))
            .prop_map(|(priority, duration)| RetentionKind::Tagged { priority, duration }),
        1 => Just(RetentionKind::Ephemeral),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let chain = 0..CHAINS;
    let depth = 0..DEPTH;
    prop_oneof![
        4 => (1usize..4).prop_map(Op::Allocate),
        6 => (0usize..8, chain.clone(), depth.clone(), retention_kind()).prop_map(
            |(index, chain, depth, retention)| Op::Register { index, chain, depth, retention }
        ),
        1 => (0usize..8).prop_map(Op::DropMutable),
        4 => (0usize..8).prop_map(Op::DropHandle),
        1 => (0usize..8).prop_map(Op::CloneHandle),
        2 => (chain.clone(), depth.clone()).prop_map(|(c, d)| Op::Get(c, d)),
        1 => (chain.clone(), depth.clone()).prop_map(|(c, d)| Op::Touch(c, d)),
        2 => Just(Op::Evict),
        2 => (chain.clone(), depth.clone(), retention_kind()).prop_map(|(c, d, r)| Op::Retain(c, d, r)),
        2 => (chain.clone(), depth.clone(), 1u64..40).prop_map(|(c, d, t)| Op::Pin(c, d, t)),
        2 => (1u64..30).prop_map(Op::Advance),
        1 => (0usize..8).prop_map(Op::Downgrade),
        1 => (0usize..8).prop_map(Op::Upgrade),
        1 => (chain.clone(), depth.clone()).prop_map(|(c, d)| Op::Move(c, d)),
        1 => (chain, depth).prop_map(|(c, d)| Op::Remove(c, d)),
    ]
}

#[derive(Debug, Clone, Copy)]
struct ModelBlock {
    slot: u32,
    refcount: u32,
    retention: Retention,
    pinned_until: Option<Tick>,
    /// Place in the eviction order while evictable (the pool's rule: a block that becomes
    /// evictable takes a growing back stamp; a prefix whose last child was evicted takes a
    /// shrinking front stamp).
    stamp: Option<u64>,
}

#[derive(Debug)]
struct Model {
    now: Tick,
    blocks: HashMap<u64, ModelBlock>,
    back: u64,
    front: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            now: Tick(0),
            blocks: HashMap::new(),
            back: 1 << 63,
            front: (1 << 63) - 1,
        }
    }

    fn next_back(&mut self) -> u64 {
        self.back += 1;
        self.back
    }

    /// Time moves on: expired pins lapse, in (expiry, slot) order.
    fn advance(&mut self, now: Tick) {
        self.now = self.now.max(now);
        let mut expired: Vec<(Tick, u32, u64)> = self
            .blocks
            .iter()
            .filter_map(|(h, b)| {
                b.pinned_until
                    .filter(|t| *t <= self.now)
                    .map(|t| (t, b.slot, *h))
            })
            .collect();
        expired.sort();
        for (_, _, hash) in expired {
            if let Some(block) = self.blocks.get_mut(&hash) {
                block.pinned_until = None;
            }
            if self.evictable(hash) {
                let stamp = self.next_back();
                if let Some(block) = self.blocks.get_mut(&hash) {
                    block.stamp = Some(stamp);
                }
            }
        }
    }

    fn pinned(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| b.pinned_until.is_some())
            .count()
    }

    fn is_leaf(&self, hash: u64) -> bool {
        !self.blocks.keys().any(|&h| parent_of(h) == Some(hash))
    }

    fn evictable(&self, hash: u64) -> bool {
        self.blocks
            .get(&hash)
            .is_some_and(|b| b.refcount == 0 && b.pinned_until.is_none() && self.is_leaf(hash))
    }

    fn candidates(&self) -> Vec<u64> {
        self.blocks
            .keys()
            .filter(|h| self.evictable(**h))
            .copied()
            .collect()
    }

    /// After an operation: blocks that stopped being evictable leave the order; the (at most
    /// one) block that became evictable enters at the back.
    fn sync(&mut self) -> Result<(), TestCaseError> {
        let hashes: Vec<u64> = self.blocks.keys().copied().collect();
        let mut entering = Vec::new();
        for hash in hashes {
            let evictable = self.evictable(hash);
            let Some(block) = self.blocks.get_mut(&hash) else {
                continue;
            };
            match (evictable, block.stamp) {
                (false, Some(_)) => block.stamp = None,
                (true, None) => entering.push(hash),
                _ => {}
            }
        }
        prop_assert!(
            entering.len() <= 1,
            "one operation freed several blocks: {:?}",
            entering
        );
        for hash in entering {
            let stamp = self.next_back();
            if let Some(block) = self.blocks.get_mut(&hash) {
                block.stamp = Some(stamp);
            }
        }
        Ok(())
    }

    /// A touch, a retention change or a hold-and-release: the block re-enters at the back.
    fn restamp(&mut self, hash: u64) {
        if let Some(block) = self.blocks.get_mut(&hash) {
            block.stamp = None;
        }
    }

    /// Ephemeral first, then lowest priority as it stands now (decay included).
    fn class(&self, hash: u64) -> (u8, u8) {
        let retention = self.blocks[&hash].retention.at(self.now);
        if retention.is_ephemeral() {
            (0, 0)
        } else {
            (1, retention.effective_priority(self.now))
        }
    }

    /// The block eviction must take next: lowest class, then earliest in the order.
    fn next_victim(&self) -> Option<u64> {
        self.candidates()
            .into_iter()
            .min_by_key(|h| (self.class(*h), self.blocks[h].stamp))
    }

    /// Check that `victim` is exactly the block the model would evict, then forget it.
    fn evicted(&mut self, victim: u64) -> Result<(), TestCaseError> {
        let candidates = self.candidates();
        prop_assert!(
            candidates.contains(&victim),
            "{victim} evicted but not evictable (in use, pinned or not a leaf)"
        );
        let best = candidates.iter().map(|h| self.class(*h)).min();
        prop_assert_eq!(
            Some(self.class(victim)),
            best,
            "victim {} out of retention order",
            victim
        );
        prop_assert_eq!(Some(victim), self.next_victim(), "victim out of LRU order");
        self.forget(victim);
        Ok(())
    }

    /// `hash` left the pool: a parent left a leaf by it goes next.
    fn forget(&mut self, hash: u64) {
        self.blocks.remove(&hash);
        if let Some(parent) = parent_of(hash)
            && self.evictable(parent)
            && self.blocks.get(&parent).is_some_and(|b| b.stamp.is_none())
        {
            self.front -= 1;
            let stamp = self.front;
            if let Some(block) = self.blocks.get_mut(&parent) {
                block.stamp = Some(stamp);
            }
        }
    }
}

struct Harness {
    pool: BlockPool,
    other: BlockPool,
    model: Model,
    mutables: Vec<MutableBlock>,
    handles: Vec<ImmutableBlock>,
    weaks: Vec<WeakBlock>,
}

impl Harness {
    fn new() -> Result<Harness, KvbmError> {
        Ok(Harness {
            pool: BlockPool::new(Tier::Device, CAPACITY, PIN_BUDGET)?,
            other: BlockPool::new(Tier::Host, 16, 0)?,
            model: Model::new(),
            mutables: Vec::new(),
            handles: Vec::new(),
            weaks: Vec::new(),
        })
    }

    fn absorb_removals(&mut self) -> Result<(), TestCaseError> {
        for hash in self.pool.drain_removed() {
            self.model.evicted(hash.0)?;
        }
        Ok(())
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        let now = self.model.now;
        match op {
            Op::Allocate(count) => {
                let result = self.pool.allocate(count, now);
                // Evictions happen (and are reported) even when the allocation fails.
                let removed = self.pool.drain_removed();
                match result {
                    Ok(allocation) => {
                        prop_assert_eq!(&allocation.evicted, &removed);
                        self.mutables.extend(allocation.blocks);
                    }
                    Err(KvbmError::OutOfBlocks { .. }) => {}
                    Err(other) => return Err(TestCaseError::fail(other.to_string())),
                }
                for hash in removed {
                    self.model.evicted(hash.0)?;
                }
                let usage = self.pool.usage();
                if usage.free < count && self.model.candidates().is_empty() {
                    // A refusal is only right when nothing more could be evicted.
                } else {
                    prop_assert!(self.mutables.len() >= count);
                }
            }
            Op::Register {
                index,
                chain,
                depth,
                retention,
            } => {
                if self.mutables.is_empty() {
                    return Ok(());
                }
                let block = self.mutables.swap_remove(index % self.mutables.len());
                let hash = hash_of(chain, depth);
                let retention = retention.at(now);
                let complete =
                    block.complete(SequenceHash(hash), parent_of(hash).map(SequenceHash));
                let registration = self
                    .pool
                    .register(complete, retention, now)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match self.model.blocks.get_mut(&hash) {
                    Some(existing) => {
                        prop_assert!(!registration.stored);
                        existing.refcount += 1;
                        existing.retention = existing.retention.merge(retention, now);
                    }
                    None => {
                        prop_assert!(registration.stored);
                        self.model.blocks.insert(
                            hash,
                            ModelBlock {
                                slot: registration.block.id().0,
                                refcount: 1,
                                retention,
                                pinned_until: None,
                                stamp: None,
                            },
                        );
                    }
                }
                self.handles.push(registration.block);
            }
            Op::DropMutable(index) => {
                if !self.mutables.is_empty() {
                    self.mutables.swap_remove(index % self.mutables.len());
                }
            }
            Op::DropHandle(index) => {
                if !self.handles.is_empty() {
                    let handle = self.handles.swap_remove(index % self.handles.len());
                    if let Some(block) = self.model.blocks.get_mut(&handle.hash().0) {
                        block.refcount -= 1;
                    }
                }
            }
            Op::CloneHandle(index) => {
                if !self.handles.is_empty() {
                    let handle = self.handles[index % self.handles.len()].clone();
                    if let Some(block) = self.model.blocks.get_mut(&handle.hash().0) {
                        block.refcount += 1;
                    }
                    self.handles.push(handle);
                }
            }
            Op::Get(chain, depth) => {
                let hash = hash_of(chain, depth);
                let got = self.pool.get(SequenceHash(hash), now);
                prop_assert_eq!(got.is_some(), self.model.blocks.contains_key(&hash));
                if let Some(handle) = got {
                    if let Some(block) = self.model.blocks.get_mut(&hash) {
                        block.refcount += 1;
                    }
                    self.handles.push(handle);
                }
            }
            Op::Touch(chain, depth) => {
                let hash = hash_of(chain, depth);
                let touched = self.pool.touch(SequenceHash(hash), now);
                prop_assert_eq!(touched, self.model.blocks.contains_key(&hash));
                self.model.restamp(hash);
            }
            Op::Evict => match self.pool.evict_one(now) {
                Some(hash) => {
                    self.pool.drain_removed();
                    self.model.evicted(hash.0)?;
                }
                None => prop_assert!(self.model.candidates().is_empty()),
            },
            Op::Retain(chain, depth, retention) => {
                let hash = hash_of(chain, depth);
                let retention = retention.at(now);
                let found = self.pool.set_retention(SequenceHash(hash), retention, now);
                prop_assert_eq!(found, self.model.blocks.contains_key(&hash));
                if let Some(block) = self.model.blocks.get_mut(&hash) {
                    block.retention = retention;
                }
                self.model.restamp(hash);
            }
            Op::Pin(chain, depth, duration) => {
                let hash = hash_of(chain, depth);
                let until = Tick(now.0 + duration);
                let outcome = self.pool.pin(&[SequenceHash(hash)], until, now);
                let pinned = self.model.pinned();
                let expected = match self.model.blocks.get_mut(&hash) {
                    None => PinOutcome {
                        missing: 1,
                        ..PinOutcome::default()
                    },
                    Some(block) => match block.pinned_until {
                        Some(old) => {
                            block.pinned_until = Some(old.max(until));
                            PinOutcome {
                                accepted: 1,
                                ..PinOutcome::default()
                            }
                        }
                        None if pinned >= PIN_BUDGET => PinOutcome {
                            clipped: 1,
                            ..PinOutcome::default()
                        },
                        None => {
                            block.pinned_until = Some(until);
                            PinOutcome {
                                accepted: 1,
                                ..PinOutcome::default()
                            }
                        }
                    },
                };
                prop_assert_eq!(outcome, expected);
            }
            Op::Advance(delta) => {
                let later = Tick(now.0 + delta);
                self.pool.advance(later);
                self.model.advance(later);
            }
            Op::Downgrade(index) => {
                if !self.handles.is_empty() {
                    let weak = self.handles[index % self.handles.len()].downgrade();
                    self.weaks.push(weak);
                }
            }
            Op::Upgrade(index) => {
                if !self.weaks.is_empty() {
                    let weak = &self.weaks[index % self.weaks.len()];
                    let hash = weak.hash().0;
                    let upgraded = weak.upgrade();
                    prop_assert_eq!(upgraded.is_some(), self.model.blocks.contains_key(&hash));
                    if let Some(handle) = upgraded {
                        if let Some(block) = self.model.blocks.get_mut(&hash) {
                            block.refcount += 1;
                        }
                        self.handles.push(handle);
                    }
                }
            }
            Op::Remove(chain, depth) => {
                // Moved to another tier, whatever its place in the lineage: only unused blocks.
                let hash = hash_of(chain, depth);
                let removed = self.pool.remove(SequenceHash(hash));
                let unused = self
                    .model
                    .blocks
                    .get(&hash)
                    .is_some_and(|b| b.refcount == 0);
                prop_assert_eq!(removed, unused);
                if removed {
                    prop_assert_eq!(self.pool.drain_removed(), vec![SequenceHash(hash)]);
                    self.model.forget(hash);
                }
            }
            Op::Move(chain, depth) => {
                // Copy a block to another tier's pool: its retention goes with it.
                let hash = SequenceHash(hash_of(chain, depth));
                let Some(source) = self.pool.get(hash, now) else {
                    return Ok(());
                };
                self.model.restamp(hash.0);
                let retention = source.retention();
                let fresh = !self.other.contains(hash);
                let mut allocation = self
                    .other
                    .allocate(1, now)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(dest) = allocation.blocks.pop() {
                    let dest = dest.complete(hash, source.parent());
                    let moved = self
                        .other
                        .register(dest, retention, now)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    if fresh {
                        prop_assert_eq!(moved.block.retention(), retention);
                    }
                }
                drop(source);
                self.other.drain_removed();
            }
        }
        self.absorb_removals()?;
        self.model.sync()?;
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let victim = self.pool.next_victim(self.model.now).map(|h| h.0);
        prop_assert_eq!(victim, self.model.next_victim(), "next victim");
        let usage = self.pool.usage();
        prop_assert_eq!(usage.leased, self.mutables.len(), "leased slots");
        prop_assert_eq!(
            usage.registered,
            self.model.blocks.len(),
            "registered blocks"
        );
        prop_assert_eq!(
            usage.free + usage.leased + usage.registered,
            CAPACITY,
            "a slot leaked or was freed twice"
        );
        for (hash, block) in &self.model.blocks {
            prop_assert_eq!(
                self.pool.refcount(SequenceHash(*hash)),
                Some(block.refcount)
            );
        }
        let held: usize = self.handles.len();
        let counted: u32 = self.model.blocks.values().map(|b| b.refcount).sum();
        prop_assert_eq!(held, counted as usize, "every reference is a live handle");
        prop_assert!(usage.pinned <= PIN_BUDGET, "pins over budget");
        prop_assert_eq!(usage.pinned, self.model.pinned());
        prop_assert_eq!(usage.evictable, self.model.candidates().len());
        let other = self.other.usage();
        prop_assert_eq!(other.free + other.leased + other.registered, 16);
        prop_assert_eq!(other.leased, 0);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut harness = Harness::new().map_err(|e| TestCaseError::fail(e.to_string()))?;
        for op in ops {
            harness.step(op)?;
        }
        // Dropping every handle leaves every slot free or inactive: nothing leaked.
        harness.handles.clear();
        harness.mutables.clear();
        let usage = harness.pool.usage();
        prop_assert_eq!(usage.leased, 0);
        prop_assert_eq!(usage.inactive, usage.registered);
        prop_assert_eq!(usage.free + usage.registered, CAPACITY);
    }
}
