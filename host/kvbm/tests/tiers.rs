//! Random traffic through the tiered manager: compute, write-through, lookup + onboard,
//! retention, pins, corrupt disk blocks, a shared pool filled by another worker. After every step the tier events replay to exactly
//! what each pool holds, every tier stays within its bounds, pins within budget, ephemeral
//! blocks never leave G1, and a request's offload cap holds.

use std::collections::HashSet;
use std::sync::Arc;

use proptest::prelude::*;
use switchyard_kvbm::manager::Lookup;
use switchyard_kvbm::pool::ImmutableBlock;
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::storage::{MemoryPool, SharedPool};
use switchyard_kvbm::{
    KvBlockManager, KvbmError, ManagerConfig, OffloadBudget, SequenceHash, Tick, Tier, TierConfig,
    TierEvent,
};

const CHAINS: u64 = 6;
const DEPTH: u64 = 6;
const BLOCK_TOKENS: u32 = 16;

fn chain_hashes(chain: u64, len: u64) -> Vec<SequenceHash> {
    (0..len).map(|d| SequenceHash(100 * chain + d)).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Compute {
        chain: u64,
        len: u64,
        ephemeral: bool,
        cap_blocks: Option<u64>,
        hold: bool,
    },
    Offload {
        fail_first: bool,
    },
    Release,
    Advance(u64),
    Pin {
        tier: usize,
        chain: u64,
        depth: u64,
        duration: u64,
    },
    Retain {
        chain: u64,
        priority: u8,
        duration: u64,
    },
    Corrupt {
        chain: u64,
        depth: u64,
    },
    /// Another worker puts a chain into the shared pool.
    PoolPut {
        chain: u64,
        len: u64,
    },
    /// Look a chain up and fetch the pool's part into G1.
    PoolFetch {
        chain: u64,
        len: u64,
        fail_at: Option<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..CHAINS, 1..=DEPTH, proptest::bool::weighted(0.2), proptest::option::of(0u64..4), any::<bool>())
            .prop_map(|(chain, len, ephemeral, cap_blocks, hold)| Op::Compute { chain, len, ephemeral, cap_blocks, hold }),
        5 => any::<bool>().prop_map(|fail_first| Op::Offload { fail_first }),
        2 => Just(Op::Release),
        2 => (1u64..50).prop_map(Op::Advance),
        2 => (0usize..3, 0..CHAINS, 0..DEPTH, 1u64..60)
            .prop_map(|(tier, chain, depth, duration)| Op::Pin { tier, chain, depth, duration }),
        2 => (0..CHAINS, 0u8..=100, 1u64..60)
            .prop_map(|(chain, priority, duration)| Op::Retain { chain, priority, duration }),
        1 => (0..CHAINS, 0..DEPTH).prop_map(|(chain, depth)| Op::Corrupt { chain, depth }),
        2 => (0..CHAINS, 1..=DEPTH).prop_map(|(chain, len)| Op::PoolPut { chain, len }),
        3 => (0..CHAINS, 1..=DEPTH, proptest::option::of(0usize..4))
            .prop_map(|(chain, len, fail_at)| Op::PoolFetch { chain, len, fail_at }),
    ]
}

fn fail(error: KvbmError) -> TestCaseError {
    TestCaseError::fail(error.to_string())
}

struct Harness {
    manager: KvBlockManager,
    shared: Arc<MemoryPool>,
    now: Tick,
    held: Vec<ImmutableBlock>,
    /// What the events say each tier holds.
    seen: [HashSet<SequenceHash>; 3],
}

impl Harness {
    fn new() -> Result<Harness, KvbmError> {
        let mut config = ManagerConfig::new(BLOCK_TOKENS, 4096, 6);
        config.device = TierConfig::blocks(6).with_pin_budget(2);
        config.host = Some(TierConfig::blocks(12).with_pin_budget(3));
        config.disk = Some(TierConfig::blocks(24).with_pin_budget(4));
        config.offload_batch_blocks = 4;
        let shared = Arc::new(MemoryPool::new(16, 8)?);
        Ok(Harness {
            manager: KvBlockManager::new(config)?.with_shared_pool(shared.clone()),
            shared,
            now: Tick(0),
            held: Vec::new(),
            seen: Default::default(),
        })
    }

    fn apply_events(&mut self) -> Result<Vec<TierEvent>, TestCaseError> {
        let events = self.manager.drain_events();
        for event in &events {
            match event {
                TierEvent::Stored { tier, hash, .. } => {
                    let set = &mut self.seen[index(*tier)];
                    prop_assert!(set.insert(*hash), "stored twice in {tier}: {hash}");
                }
                TierEvent::Removed { tier, hashes } => {
                    for hash in hashes {
                        let set = &mut self.seen[index(*tier)];
                        prop_assert!(
                            set.remove(hash),
                            "removed from {tier} but never stored: {hash}"
                        );
                    }
                }
            }
        }
        Ok(events)
    }

    fn onboard(&mut self, found: Lookup) -> Result<(), TestCaseError> {
        self.held.extend(found.device);
        if found.lower.is_empty() {
            return Ok(());
        }
        match self.manager.onboard(found.lower, self.now) {
            Ok(batch) => {
                let committed = self.manager.commit(batch, &[], self.now).map_err(fail)?;
                self.held.extend(committed.blocks);
            }
            Err(KvbmError::OutOfBlocks { .. }) => {}
            Err(other) => return Err(fail(other)),
        }
        Ok(())
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Compute {
                chain,
                len,
                ephemeral,
                cap_blocks,
                hold,
            } => {
                let hashes = chain_hashes(chain, len);
                let found = self.manager.lookup(&hashes, self.now);
                let start = found.local_blocks();
                self.onboard(found)?;
                let rest = &hashes[start..];
                let retention = if ephemeral {
                    Retention::ephemeral()
                } else {
                    Retention::DEFAULT
                };
                let mut budget = match cap_blocks {
                    Some(blocks) => OffloadBudget::capped(blocks * u64::from(BLOCK_TOKENS)),
                    None => OffloadBudget::unlimited(),
                };
                let queued_before = self.manager.pending_offloads()[0];
                match self.manager.allocate(rest.len(), self.now) {
                    Ok(blocks) => {
                        for (block, hash) in blocks.into_iter().zip(rest) {
                            let parent =
                                (!hash.0.is_multiple_of(100)).then(|| SequenceHash(hash.0 - 1));
                            let registered = self
                                .manager
                                .register(
                                    block.complete(*hash, parent),
                                    retention,
                                    &mut budget,
                                    self.now,
                                )
                                .map_err(fail)?;
                            self.held.push(registered);
                        }
                    }
                    Err(KvbmError::OutOfBlocks { .. }) => {}
                    Err(other) => return Err(fail(other)),
                }
                let queued = self.manager.pending_offloads()[0] - queued_before;
                if let Some(blocks) = cap_blocks {
                    prop_assert!(queued as u64 <= blocks, "offload cap exceeded");
                }
                if ephemeral {
                    prop_assert_eq!(queued, 0);
                }
                if !hold {
                    self.held.clear();
                }
            }
            Op::Offload { fail_first } => {
                if let Some(batch) = self.manager.plan_offload(self.now).map_err(fail)? {
                    prop_assert!(batch.len() <= 4);
                    let failed: Vec<SequenceHash> = if fail_first {
                        batch.transfers().iter().take(1).map(|t| t.hash()).collect()
                    } else {
                        Vec::new()
                    };
                    self.manager
                        .commit(batch, &failed, self.now)
                        .map_err(fail)?;
                }
            }
            Op::Release => self.held.clear(),
            Op::Advance(delta) => self.now = Tick(self.now.0 + delta),
            Op::Pin {
                tier,
                chain,
                depth,
                duration,
            } => {
                let tier = Tier::LOCAL[tier];
                let hash = SequenceHash(100 * chain + depth);
                let until = Tick(self.now.0 + duration);
                self.manager
                    .pin(tier, &[hash], until, self.now)
                    .map_err(fail)?;
            }
            Op::Retain {
                chain,
                priority,
                duration,
            } => {
                let retention =
                    Retention::new(priority, Some(Tick(self.now.0 + duration))).map_err(fail)?;
                self.manager
                    .set_retention(&chain_hashes(chain, DEPTH), retention, self.now);
            }
            Op::PoolPut { chain, len } => {
                let mut parent = None;
                for hash in chain_hashes(chain, len) {
                    self.shared
                        .put(hash, parent, &[0; 8])
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    parent = Some(hash);
                }
                prop_assert!(self.shared.usage().registered <= 16);
            }
            Op::PoolFetch {
                chain,
                len,
                fail_at,
            } => {
                let hashes = chain_hashes(chain, len);
                let found = self.manager.lookup(&hashes, self.now);
                let start = found.local_blocks();
                let run = &hashes[start..start + found.pool_blocks];
                let parent = start.checked_sub(1).map(|i| hashes[i]);
                self.onboard(found)?;
                match self.manager.plan_pool_fetch(run, parent, self.now) {
                    Ok(fetch) => {
                        let failed: Vec<SequenceHash> = fail_at
                            .and_then(|i| run.get(i).copied())
                            .into_iter()
                            .collect();
                        let committed = self
                            .manager
                            .commit_pool_fetch(fetch, &failed, self.now)
                            .map_err(fail)?;
                        let expected = fail_at.map_or(run.len(), |i| i.min(run.len()));
                        prop_assert_eq!(committed.blocks.len(), expected);
                        self.held.extend(committed.blocks);
                    }
                    Err(KvbmError::OutOfBlocks { .. }) => {}
                    Err(other) => return Err(fail(other)),
                }
                self.held.clear();
            }
            Op::Corrupt { chain, depth } => {
                self.manager
                    .report_corrupt(Tier::Disk, SequenceHash(100 * chain + depth));
            }
        }
        let events = self.apply_events()?;
        self.check(&events)
    }

    fn check(&mut self, events: &[TierEvent]) -> Result<(), TestCaseError> {
        for tier in Tier::LOCAL {
            let pool = self
                .manager
                .pool(tier)
                .ok_or_else(|| TestCaseError::fail("tier"))?;
            let usage = pool.usage();
            prop_assert_eq!(pool.registered(), usage.registered);
            prop_assert!(usage.registered + usage.leased <= usage.capacity);
            prop_assert_eq!(usage.free + usage.leased + usage.registered, usage.capacity);
            prop_assert!(
                usage.pinned
                    <= self
                        .manager
                        .config()
                        .tier(tier)
                        .map_or(0, |t| t.pin_budget_blocks)
            );
            // Nothing is leased between steps: every batch was committed or dropped.
            prop_assert_eq!(usage.leased, 0, "leased slots in {}", tier);
            for chain in 0..CHAINS {
                for hash in chain_hashes(chain, DEPTH) {
                    prop_assert_eq!(
                        pool.contains(hash),
                        self.seen[index(tier)].contains(&hash),
                        "events disagree with {} about {}",
                        tier,
                        hash
                    );
                }
            }
        }
        for event in events {
            if let TierEvent::Stored {
                tier: tier @ (Tier::Host | Tier::Disk),
                hash,
                ..
            } = event
            {
                let retention = self.manager.pool(*tier).and_then(|p| p.retention(*hash));
                prop_assert!(
                    !retention.is_some_and(|r| r.is_ephemeral()),
                    "ephemeral block written through"
                );
            }
        }
        Ok(())
    }
}

fn index(tier: Tier) -> usize {
    match tier {
        Tier::Device => 0,
        Tier::Host => 1,
        _ => 2,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn tier_events_bounds_and_filters_hold(ops in proptest::collection::vec(op(), 1..80)) {
        let mut harness = Harness::new().map_err(fail)?;
        for op in ops {
            harness.step(op)?;
        }
        harness.held.clear();
        for tier in Tier::LOCAL {
            let usage = harness.manager.pool(tier).map(|p| p.usage());
            prop_assert!(usage.is_some_and(|u| u.inactive == u.registered));
        }
    }
}
