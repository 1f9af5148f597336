//! G4 in process: a bounded, shared block store keyed by sequence hash, with the same
//! bookkeeping as a tier (a [`BlockPool`]: dedup, leaf-first LRU eviction, removal log) over a
//! host slab. The `kv-pool` service can wrap it; tests and the simulator can share one between
//! managers directly.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{KvbmError, StorageError};
use crate::manager::PoolFetch;
use crate::pool::{BlockPool, ImmutableBlock, PoolUsage};
use crate::retention::Retention;
use crate::storage::{BlockStore, HostSlab, SharedPool};
use crate::types::{SequenceHash, Tick, Tier};

#[derive(Debug)]
struct Inner {
    index: BlockPool,
    slab: HostSlab,
}

/// A shared pool in host memory.
#[derive(Debug)]
pub struct MemoryPool {
    inner: Mutex<Inner>,
    block_bytes: usize,
}

impl MemoryPool {
    /// A pool of `capacity_blocks` blocks of `block_bytes`.
    pub fn new(capacity_blocks: usize, block_bytes: usize) -> Result<MemoryPool, KvbmError> {
        Ok(MemoryPool {
            inner: Mutex::new(Inner {
                index: BlockPool::new(Tier::Pool, capacity_blocks, 0)?,
                slab: HostSlab::new(capacity_blocks, block_bytes)?,
            }),
            block_bytes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hashes evicted since the last call (the pool's removal events).
    pub fn drain_removed(&self) -> Vec<SequenceHash> {
        self.lock().index.drain_removed()
    }

    /// Occupancy now.
    pub fn usage(&self) -> PoolUsage {
        self.lock().index.usage()
    }

    fn check_len(&self, len: usize) -> Result<(), StorageError> {
        super::check_block_len(self.block_bytes, len)
    }
}

impl SharedPool for MemoryPool {
    fn contains(&self, hashes: &[SequenceHash]) -> Vec<bool> {
        let inner = self.lock();
        hashes.iter().map(|h| inner.index.contains(*h)).collect()
    }

    fn put(
        &self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.check_len(data.len())?;
        let mut inner = self.lock();
        if inner.index.touch(hash, Tick(0)) {
            // Idempotent: same hash, same bytes.
            return Ok(());
        }
        let mut allocation = inner
            .index
            .allocate(1, Tick(0))
            .map_err(|_| StorageError::NoRoom { hash })?;
        let Some(block) = allocation.blocks.pop() else {
            return Err(StorageError::NoRoom { hash });
        };
        inner.slab.write_block(block.id(), hash, data)?;
        let complete = block.complete(hash, parent);
        // Registering into its own pool cannot be foreign; any failure returns the slot.
        drop(
            inner
                .index
                .register(complete, Retention::DEFAULT, Tick(0))
                .map_err(|_| StorageError::NoRoom { hash })?,
        );
        Ok(())
    }

    fn get(&self, hash: SequenceHash, out: &mut [u8]) -> Result<(), StorageError> {
        self.check_len(out.len())?;
        let mut inner = self.lock();
        let Some(block) = inner.index.get(hash, Tick(0)) else {
            return Err(StorageError::Miss { hash });
        };
        let result = inner.slab.read_block(block.id(), hash, out);
        drop(block);
        result
    }
}

/// Copy the blocks of `fetch` from the shared pool into G1's store. Returns the hashes that
/// failed (pass them to [`crate::KvBlockManager::commit_pool_fetch`]).
pub fn fetch_from_pool(
    pool: &dyn SharedPool,
    fetch: &PoolFetch,
    device: &mut dyn BlockStore,
) -> Vec<SequenceHash> {
    let mut failed = Vec::new();
    let mut buffer = vec![0u8; device.block_bytes()];
    for (hash, slot) in fetch.slots() {
        let mut read = |bytes: &mut [u8]| pool.get(hash, bytes);
        let result = match device.write_in_place(slot, hash, &mut read) {
            Some(result) => result,
            None => pool
                .get(hash, &mut buffer)
                .and_then(|()| device.write_block(slot, hash, &buffer)),
        };
        if result.is_err() {
            failed.push(hash);
        }
    }
    if device.flush().is_err() {
        failed = fetch.slots().map(|(hash, _)| hash).collect();
    }
    failed
}

/// Write `blocks` (held in `store`, e.g. G1 or G2) to the shared pool so other workers can read
/// them. Returns the hashes that failed. Blocks the pool already has cost nothing.
pub fn publish_to_pool(
    pool: &dyn SharedPool,
    store: &mut dyn BlockStore,
    blocks: &[ImmutableBlock],
) -> Vec<SequenceHash> {
    let mut failed = Vec::new();
    let mut buffer = vec![0u8; store.block_bytes()];
    let present = pool.contains(&blocks.iter().map(ImmutableBlock::hash).collect::<Vec<_>>());
    for (block, present) in blocks.iter().zip(present) {
        if present {
            continue;
        }
        let (hash, parent) = (block.hash(), block.parent());
        let mut put = |bytes: &[u8]| pool.put(hash, parent, bytes);
        let result = match store.read_in_place(block.id(), hash, &mut put) {
            Some(result) => result,
            None => store
                .read_block(block.id(), hash, &mut buffer)
                .and_then(|()| pool.put(hash, parent, &buffer)),
        };
        if result.is_err() {
            failed.push(hash);
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn puts_are_idempotent_bounded_and_leaf_first() -> TestResult {
        let pool = MemoryPool::new(3, 8)?;
        pool.put(SequenceHash(1), None, &[1; 8])?;
        pool.put(SequenceHash(1), None, &[1; 8])?;
        assert_eq!(pool.usage().registered, 1);
        pool.put(SequenceHash(2), Some(SequenceHash(1)), &[2; 8])?;
        pool.put(SequenceHash(3), Some(SequenceHash(2)), &[3; 8])?;
        pool.put(SequenceHash(9), None, &[9; 8])?;
        // Full at 3: the chain's leaf went, never its prefix.
        assert_eq!(pool.drain_removed(), vec![SequenceHash(3)]);
        assert_eq!(
            pool.contains(&[SequenceHash(1), SequenceHash(2), SequenceHash(3)]),
            vec![true, true, false]
        );
        let mut out = [0u8; 8];
        pool.get(SequenceHash(2), &mut out)?;
        assert_eq!(out, [2; 8]);
        assert!(pool.get(SequenceHash(3), &mut out).is_err());
        assert!(matches!(
            pool.put(SequenceHash(4), None, &[0; 7]),
            Err(StorageError::WrongBlockSize { .. })
        ));
        Ok(())
    }
}
