//! The simulated deployment's shared KV pool (G4): one for every worker, fed by the engines'
//! [`KvTransfer::Publish`](switchyard_core::engine::KvTransfer::Publish)es and consulted when a
//! request reaches its engine.
//!
//! Bookkeeping only (the simulator moves no bytes): a `switchyard-kvbm` [`BlockPool`] keyed by
//! the engines' sequence hashes, as the `kv-pool` service's index is, so dedup, capacity and
//! leaf-first LRU eviction are the block manager's.

use std::time::Duration;
use switchyard_kvbm::pool::BlockPool;
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::{KvbmError, SequenceHash, Tick, Tier};

/// What the pool did over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Capacity in blocks.
    pub capacity_blocks: usize,
    /// Blocks held at the end.
    pub blocks: usize,
    /// Publishes that stored a block the pool lacked.
    pub stored_blocks: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
}

#[derive(Debug)]
pub(crate) struct SharedPool {
    index: BlockPool,
    capacity: usize,
    stored: u64,
}

// === impl SharedPool ===

impl SharedPool {
    pub(crate) fn new(capacity_blocks: usize) -> Result<Self, KvbmError> {
        Ok(Self {
            index: BlockPool::new(Tier::Pool, capacity_blocks, 0)?,
            capacity: capacity_blocks,
            stored: 0,
        })
    }

    /// How many leading blocks of `hashes` (engine hashes) the pool holds; each found block
    /// counts as a use for the LRU.
    pub(crate) fn prefix(&self, hashes: &[u64], now: Duration) -> usize {
        let now = tick(now);
        hashes
            .iter()
            .take_while(|&&hash| self.index.touch(SequenceHash(hash), now))
            .count()
    }

    /// Store a published block unless the pool has it (then it only counts as a use).
    pub(crate) fn publish(&mut self, hash: u64, parent: Option<u64>, now: Duration) {
        let (hash, now) = (SequenceHash(hash), tick(now));
        if self.index.touch(hash, now) {
            return;
        }
        // Nobody holds a pool block between calls, so eviction always finds room.
        let Ok(mut allocation) = self.index.allocate(1, now) else {
            return;
        };
        // No one reads the pool's removals here (the router has no pool index yet).
        drop(self.index.drain_removed());
        let Some(block) = allocation.blocks.pop() else {
            return;
        };
        let complete = block.complete(hash, parent.map(SequenceHash));
        if let Ok(registration) = self.index.register(complete, Retention::DEFAULT, now) {
            self.stored += u64::from(registration.stored);
        }
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            capacity_blocks: self.capacity,
            blocks: self.index.usage().registered,
            stored_blocks: self.stored,
            evictions: self.index.counters().evictions,
        }
    }
}

fn tick(now: Duration) -> Tick {
    Tick(now.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_dedups_bounds_and_evicts_leaves_first() -> Result<(), KvbmError> {
        let mut pool = SharedPool::new(3)?;
        let at = Duration::from_millis;
        pool.publish(1, None, at(1));
        pool.publish(1, None, at(2));
        pool.publish(2, Some(1), at(3));
        pool.publish(3, Some(2), at(4));
        assert_eq!(pool.prefix(&[1, 2, 3, 4], at(5)), 3);
        // Full: a new sequence takes the old chain's leaf, never its prefix.
        pool.publish(9, None, at(6));
        assert_eq!(pool.prefix(&[1, 2, 3], at(7)), 2);
        assert_eq!(pool.prefix(&[9], at(7)), 1);
        assert_eq!(pool.prefix(&[5, 1], at(7)), 0, "only a leading run counts");
        let stats = pool.stats();
        assert_eq!(stats.stored_blocks, 4);
        assert_eq!(stats.evictions, 1);
        assert_eq!(stats.blocks, 3);
        assert_eq!(stats.capacity_blocks, 3);
        Ok(())
    }
}
