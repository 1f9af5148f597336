//! The simulated deployment's shared KV pool (G4): one for every worker, fed by the engines'
//! [`KvTransfer::Publish`](switchyard_core::engine::KvTransfer::Publish)es and consulted when a
//! request reaches its engine.
//!
//! Bookkeeping only (the simulator moves no bytes): a `switchyard-kvbm` [`BlockPool`] keyed by
//! the engines' sequence hashes, as the `kv-pool` service's index is, so dedup, capacity and
//! leaf-first LRU eviction are the block manager's. Its stores and removals reach the router's
//! index as the service's events do in the gateway: self-describing events (tokens and parent)
//! through the gateway's own [`Ingestor`], under the index's [`SHARED_POOL`] owner.

use std::time::Duration;
use switchyard_core::index::{IndexOp, SHARED_POOL};
use switchyard_kv_events::ingest::Ingestor;
use switchyard_kv_events::wire::{EngineHash, EventBatch, KvEvent};
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
    /// Tokens per block (the events carry them).
    block_size: u32,
    /// Changes not yet handed to the router's index, in order.
    events: Vec<KvEvent>,
    /// The gateway's ingestion of the pool's stream, and the stream's next sequence number.
    ingestor: Ingestor,
    seq: u64,
}

// === impl SharedPool ===

impl SharedPool {
    /// A pool of `capacity_blocks` blocks of `block_size` tokens.
    ///
    /// # Panics
    /// If `block_size` is 0 (the simulator validates it first).
    pub(crate) fn new(capacity_blocks: usize, block_size: u32) -> Result<Self, KvbmError> {
        Ok(Self {
            index: BlockPool::new(Tier::Pool, capacity_blocks, 0)?,
            capacity: capacity_blocks,
            stored: 0,
            block_size,
            events: Vec::new(),
            ingestor: Ingestor::new(SHARED_POOL, block_size),
            seq: 0,
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

    /// Store a published block (its `block_size` tokens) unless the pool has it (then it only
    /// counts as a use).
    pub(crate) fn publish(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        token_ids: &[u32],
        now: Duration,
    ) {
        // Nobody holds a pool block between calls, so eviction always finds room.
        let stored = self.index.store(
            SequenceHash(hash),
            parent.map(SequenceHash),
            Retention::DEFAULT,
            tick(now),
        );
        let removed = self.index.drain_removed();
        if !removed.is_empty() {
            self.events.push(KvEvent::BlockRemoved {
                block_hashes: removed.into_iter().map(|h| EngineHash(h.0)).collect(),
                medium: Some("CPU".into()),
                group_idx: None,
            });
        }
        if stored.is_some() {
            self.stored += 1;
            self.events.push(KvEvent::BlockStored {
                block_hashes: vec![EngineHash(hash)],
                parent_block_hash: parent.map(EngineHash),
                token_ids: token_ids.to_vec(),
                block_size: self.block_size,
                lora_id: None,
                lora_name: None,
                extra_keys: false,
                kv_cache_spec_kind: None,
                medium: Some("CPU".into()),
                group_idx: None,
            });
        }
    }

    /// The router index's changes since the last call: the pool's events as one message on its
    /// stream, through the gateway's ingestion (decoded already: the wire format is the
    /// kv-events crate's to test).
    pub(crate) fn index_ops(&mut self) -> Vec<IndexOp> {
        if self.events.is_empty() {
            return Vec::new();
        }
        let batch = EventBatch {
            ts: 0.0,
            events: std::mem::take(&mut self.events),
            dp_rank: None,
        };
        let ops = self.ingestor.on_batch(self.seq, batch).ops;
        self.seq += 1;
        ops
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            capacity_blocks: self.capacity,
            blocks: self.index.registered(),
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
        let mut pool = SharedPool::new(3, 2)?;
        let at = Duration::from_millis;
        pool.publish(1, None, &[1, 2], at(1));
        pool.publish(1, None, &[1, 2], at(2));
        pool.publish(2, Some(1), &[3, 4], at(3));
        pool.publish(3, Some(2), &[5, 6], at(4));
        assert_eq!(pool.prefix(&[1, 2, 3, 4], at(5)), 3);
        // Full: a new sequence takes the old chain's leaf, never its prefix.
        pool.publish(9, None, &[7, 8], at(6));
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

    #[test]
    fn the_router_index_sees_what_the_pool_holds_in_its_own_hashes() -> Result<(), KvbmError> {
        use switchyard_core::hash::BlockHasher;
        use switchyard_core::index::KvIndex;
        let mut pool = SharedPool::new(2, 2)?;
        let at = Duration::from_millis;
        pool.publish(11, None, &[1, 2], at(1));
        pool.publish(12, Some(11), &[3, 4], at(2));
        let mut index = KvIndex::new();
        for op in pool.index_ops() {
            index.apply(&op);
        }
        let ours = BlockHasher::new(2).sequence(&[1, 2, 3, 4]);
        let matches = index.find_matches(&ours);
        assert_eq!(matches.len(), 1);
        assert_eq!(matches[0].0, SHARED_POOL);
        assert_eq!(matches[0].1.total(), 2);
        // A third block evicts the chain's leaf: the index follows.
        pool.publish(21, None, &[9, 9], at(3));
        for op in pool.index_ops() {
            index.apply(&op);
        }
        assert_eq!(index.find_matches(&ours)[0].1.total(), 1);
        assert!(pool.index_ops().is_empty());
        Ok(())
    }
}
