//! G4 in process: a bounded, shared block store keyed by sequence hash, with the same
//! bookkeeping as a tier (a [`BlockPool`]: dedup, retention-ordered leaf-first eviction, removal
//! log) over any [`BlockStore`]. [`MemoryPool`] is it over a host slab; over a [`DiskStore`]
//! it is a disk tier. The `kv-pool` service stacks the two (memory evictions spill to disk);
//! tests and the simulator share a [`MemoryPool`] between managers directly.
//!
//! [`DiskStore`]: crate::storage::DiskStore

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{KvbmError, StorageError};
use crate::manager::PoolFetch;
use crate::pool::{BlockPool, ImmutableBlock, PoolCounters, PoolUsage};
use crate::retention::Retention;
use crate::storage::{AdoptedRecord, BlockMeta, BlockStore, HostSlab, SharedPool};
use crate::types::{BlockId, SequenceHash, Tick, Tier};

/// Where a registered block's bytes are, and its parent (kept for a spill, which happens
/// after the pool has forgotten the block).
#[derive(Debug, Clone, Copy)]
struct Held {
    slot: BlockId,
    parent: Option<SequenceHash>,
}

#[derive(Debug)]
struct Inner<S> {
    index: BlockPool,
    store: S,
    held: HashMap<SequenceHash, Held>,
}

/// A shared pool of blocks in a [`BlockStore`], keyed by sequence hash.
#[derive(Debug)]
pub struct StorePool<S> {
    inner: Mutex<Inner<S>>,
    block_bytes: usize,
    capacity_blocks: usize,
}

/// A shared pool in host memory.
pub type MemoryPool = StorePool<HostSlab>;

/// What one [`StorePool::put_at`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutcome {
    /// False when the pool already held the hash (it was touched, not written).
    pub stored: bool,
    /// Hashes evicted to make room (also logged for [`StorePool::drain_removed`]).
    pub evicted: Vec<SequenceHash>,
}

/// A block evicted to make room, handed to the spill callback while its bytes are still there.
#[derive(Debug)]
pub struct Spilled<'a> {
    /// The block.
    pub hash: SequenceHash,
    /// The block before it.
    pub parent: Option<SequenceHash>,
    /// Its retention as declared (it travels to the tier below).
    pub retention: Retention,
    /// Its bytes.
    pub bytes: &'a [u8],
}

impl MemoryPool {
    /// A pool of `capacity_blocks` blocks of `block_bytes`.
    pub fn new(capacity_blocks: usize, block_bytes: usize) -> Result<MemoryPool, KvbmError> {
        StorePool::over(HostSlab::new(capacity_blocks, block_bytes)?)
    }
}

impl<S: BlockStore> StorePool<S> {
    /// A pool with one slot per block of `store`.
    pub fn over(store: S) -> Result<StorePool<S>, KvbmError> {
        let (capacity_blocks, block_bytes) = (store.capacity_blocks(), store.block_bytes());
        Ok(StorePool {
            inner: Mutex::new(Inner {
                index: BlockPool::new(Tier::Pool, capacity_blocks, 0)?,
                store,
                held: HashMap::with_capacity(capacity_blocks),
            }),
            block_bytes,
            capacity_blocks,
        })
    }

    /// A pool over `store` that already holds `blocks`: a disk tier reopened after a restart
    /// ([`crate::storage::DiskStore::reopen`]), each block back with its parent and retention
    /// as its record kept them, so a prefix still outlives its suffix (its tokens are the
    /// caller's to use). A hash given twice keeps
    /// its first slot.
    pub fn adopting(store: S, blocks: &[AdoptedRecord]) -> Result<StorePool<S>, KvbmError> {
        let pool = StorePool::over(store)?;
        if blocks.is_empty() {
            return Ok(pool);
        }
        let wanted: HashMap<BlockId, &AdoptedRecord> =
            blocks.iter().map(|record| (record.slot, record)).collect();
        {
            let mut inner = pool.lock();
            // A fresh pool leases every slot at once; those not wanted go back as they drop.
            let allocation = inner.index.allocate(pool.capacity_blocks, Tick(0))?;
            for block in allocation.blocks {
                let slot = block.id();
                let Some(record) = wanted.get(&slot) else {
                    continue;
                };
                let (hash, meta) = (record.hash, &record.meta);
                // A block is never its own parent, as in `put_at`.
                let parent = meta.parent.filter(|p| *p != hash);
                let complete = block.complete(hash, parent);
                let registration = inner.index.register(complete, meta.retention, Tick(0))?;
                if registration.stored {
                    inner.held.insert(hash, Held { slot, parent });
                }
            }
        }
        Ok(pool)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Blocks the pool can hold.
    pub fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }

    /// Blocks held now (O(1), unlike [`StorePool::usage`]).
    pub fn len(&self) -> usize {
        self.lock().held.len()
    }

    /// Whether the pool holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hashes evicted or invalidated since the last call (the pool's removal events).
    pub fn drain_removed(&self) -> Vec<SequenceHash> {
        self.lock().index.drain_removed()
    }

    /// Occupancy now.
    pub fn usage(&self) -> PoolUsage {
        self.lock().index.usage()
    }

    /// The bookkeeping's counters (evictions, registrations, invalidations, ...).
    pub fn counters(&self) -> PoolCounters {
        self.lock().index.counters()
    }

    /// Whether the pool holds `hash` (no touch).
    pub fn holds(&self, hash: SequenceHash) -> bool {
        self.lock().held.contains_key(&hash)
    }

    /// Every hash held, in no particular order (for audits and tests).
    pub fn hashes(&self) -> Vec<SequenceHash> {
        self.lock().held.keys().copied().collect()
    }

    /// The retention of `hash` as declared, if held.
    pub fn retention(&self, hash: SequenceHash) -> Option<Retention> {
        self.lock().index.retention(hash)
    }

    /// A look at the store (its counters, its file).
    pub fn inspect<R>(&self, look: impl FnOnce(&S) -> R) -> R {
        look(&self.lock().store)
    }

    /// The slot holding `hash`, if held.
    pub fn slot_of(&self, hash: SequenceHash) -> Option<BlockId> {
        self.lock().held.get(&hash).map(|held| held.slot)
    }

    /// Store one block with `retention` at `now`. A hash already held is touched and its
    /// retention merged (the stronger claim wins): idempotent. When the pool is full the next
    /// victim in retention order (a leaf) is evicted, and handed to `spill` first if given.
    pub fn put_at(
        &self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        retention: Retention,
        data: &[u8],
        now: Tick,
        spill: Option<&mut dyn FnMut(Spilled<'_>)>,
    ) -> Result<PutOutcome, StorageError> {
        let meta = BlockMeta {
            parent,
            retention,
            tokens: Vec::new(),
        };
        self.put_block_at(hash, meta, data, now, spill)
    }

    /// [`put_at`](Self::put_at) with the block's tokens too, for a store that keeps them (a
    /// disk tier's records).
    pub fn put_block_at(
        &self,
        hash: SequenceHash,
        meta: BlockMeta,
        data: &[u8],
        now: Tick,
        mut spill: Option<&mut dyn FnMut(Spilled<'_>)>,
    ) -> Result<PutOutcome, StorageError> {
        super::check_block_len(self.block_bytes, data.len())?;
        // A block is never its own parent: it would never be a leaf.
        let parent = meta.parent.filter(|p| *p != hash);
        let retention = meta.retention;
        let mut inner = self.lock();
        if inner.held.contains_key(&hash) {
            let merged = inner
                .index
                .retention(hash)
                .map_or(retention, |old| old.merge(retention, now));
            inner.index.set_retention(hash, merged, now);
            return Ok(PutOutcome {
                stored: false,
                evicted: Vec::new(),
            });
        }
        // Peek at the victim while the pool still knows its retention.
        let victim = if inner.held.len() >= self.capacity_blocks {
            let victim = inner.index.next_victim(now);
            victim.map(|v| (v, inner.index.retention(v).unwrap_or_default()))
        } else {
            None
        };
        let mut allocation = match inner.index.allocate(1, now) {
            Ok(allocation) => allocation,
            Err(_) => {
                // Nothing is a leaf: parents named in a cycle (no real chain of sequence
                // hashes has one). Drop any block rather than refuse writes for good.
                let stuck = inner.held.keys().next().copied();
                if let Some(stuck) = stuck.filter(|s| inner.index.invalidate(*s)) {
                    inner.held.remove(&stuck);
                }
                inner
                    .index
                    .allocate(1, now)
                    .map_err(|_| StorageError::NoRoom { hash })?
            }
        };
        let Some(block) = allocation.blocks.pop() else {
            return Err(StorageError::NoRoom { hash });
        };
        for evicted in &allocation.evicted {
            match spill.as_deref_mut() {
                Some(spill) => {
                    let retention = victim
                        .filter(|(v, _)| v == evicted)
                        .map_or(Retention::DEFAULT, |(_, r)| r);
                    inner.spill(*evicted, retention, spill);
                }
                None => {
                    inner.held.remove(evicted);
                }
            }
        }
        // The bytes go in before the block is registered: a failed write registers nothing.
        let meta = BlockMeta { parent, ..meta };
        inner
            .store
            .write_block_with(block.id(), hash, &meta, data)?;
        let slot = block.id();
        let registration = inner
            .index
            .register(block.complete(hash, parent), retention, now)
            .map_err(|_| StorageError::NoRoom { hash })?;
        drop(registration.block);
        inner.held.insert(hash, Held { slot, parent });
        Ok(PutOutcome {
            stored: true,
            evicted: allocation.evicted,
        })
    }

    /// Take `hash` out of the pool, to move it to another tier: its parent and retention as
    /// declared (it shows in the next removals). `None` if it is not held or is in use.
    pub fn remove(&self, hash: SequenceHash) -> Option<(Option<SequenceHash>, Retention)> {
        let mut inner = self.lock();
        let retention = inner.index.retention(hash)?;
        if !inner.index.remove(hash) {
            return None;
        }
        let held = inner.held.remove(&hash)?;
        Some((held.parent, retention))
    }

    /// Read block `hash` into `out` at `now` (a hit is a use). A block whose bytes fail their
    /// check is dropped from the pool (it shows in the next removals) and returned as `Corrupt`.
    pub fn get_at(
        &self,
        hash: SequenceHash,
        out: &mut [u8],
        now: Tick,
    ) -> Result<(), StorageError> {
        super::check_block_len(self.block_bytes, out.len())?;
        let mut inner = self.lock();
        let Some(block) = inner.index.get(hash, now) else {
            return Err(StorageError::Miss { hash });
        };
        let result = inner.store.read_block(block.id(), hash, out);
        drop(block);
        if matches!(result, Err(StorageError::Corrupt { .. })) && inner.index.invalidate(hash) {
            inner.held.remove(&hash);
        }
        result
    }

    /// Keep block `hash` in use for a read of its slot outside the pool, as a reader of the
    /// store makes (`DiskStore::reader`), so that reads of several callers overlap (a hit is a
    /// use, as in [`get_at`](Self::get_at)). While the returned handle lives, the block is
    /// neither evicted nor moved, so its slot is not rewritten. `None`: not held.
    pub fn lease(&self, hash: SequenceHash, now: Tick) -> Option<ImmutableBlock> {
        self.lock().index.get(hash, now)
    }

    /// The end of a read of `leased`'s slot whose outcome was `result`: a block whose bytes
    /// failed their check is dropped from the pool, as [`get_at`](Self::get_at) drops it.
    pub fn end_lease(&self, leased: ImmutableBlock, result: &Result<(), StorageError>) {
        let hash = leased.hash();
        drop(leased);
        // Another reader's lease keeps it until that read fails its check too.
        if matches!(result, Err(StorageError::Corrupt { .. })) {
            let mut inner = self.lock();
            if inner.index.invalidate(hash) {
                inner.held.remove(&hash);
            }
        }
    }
}

impl<S: BlockStore> Inner<S> {
    /// Hand an evicted block's bytes to `spill`. Its slot was only returned to the reset pool:
    /// nothing has overwritten it yet.
    fn spill(
        &mut self,
        hash: SequenceHash,
        retention: Retention,
        spill: &mut dyn FnMut(Spilled<'_>),
    ) {
        let Some(held) = self.held.remove(&hash) else {
            return;
        };
        let mut hand = |bytes: &[u8]| {
            spill(Spilled {
                hash,
                parent: held.parent,
                retention,
                bytes,
            });
            Ok(())
        };
        let handed = match self.store.read_in_place(held.slot, hash, &mut hand) {
            Some(result) => result,
            None => {
                let mut buffer = vec![0u8; self.store.block_bytes()];
                self.store
                    .read_block(held.slot, hash, &mut buffer)
                    .map(|()| hand(&buffer))
                    .and_then(|r| r)
            }
        };
        // Unreadable bytes are not spilled: the block simply leaves this pool.
        drop(handed);
    }
}

impl<S: BlockStore> SharedPool for StorePool<S> {
    fn contains(&self, hashes: &[SequenceHash]) -> Vec<bool> {
        let inner = self.lock();
        hashes.iter().map(|h| inner.held.contains_key(h)).collect()
    }

    fn put(
        &self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.put_at(hash, parent, Retention::DEFAULT, data, Tick(0), None)
            .map(drop)
    }

    fn get(&self, hash: SequenceHash, out: &mut [u8]) -> Result<(), StorageError> {
        self.get_at(hash, out, Tick(0))
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

    #[test]
    fn evictions_follow_retention_and_spill_with_their_bytes() -> TestResult {
        let pool = MemoryPool::new(2, 8)?;
        let keep = Retention::new(90, None)?;
        pool.put_at(SequenceHash(1), None, keep, &[1; 8], Tick(1), None)?;
        pool.put_at(
            SequenceHash(2),
            None,
            Retention::DEFAULT,
            &[2; 8],
            Tick(2),
            None,
        )?;
        let mut spilled = Vec::new();
        let mut spill =
            |s: Spilled<'_>| spilled.push((s.hash, s.parent, s.retention, s.bytes.to_vec()));
        let outcome = pool.put_at(
            SequenceHash(3),
            None,
            Retention::DEFAULT,
            &[3; 8],
            Tick(3),
            Some(&mut spill),
        )?;
        // The untagged block went, though the kept one is older.
        assert_eq!(outcome.evicted, vec![SequenceHash(2)]);
        assert_eq!(
            spilled,
            vec![(SequenceHash(2), None, Retention::DEFAULT, vec![2; 8])]
        );
        assert!(pool.holds(SequenceHash(1)) && !pool.holds(SequenceHash(2)));
        assert_eq!(pool.len(), 2);
        // A duplicate keeps the stronger claim and writes nothing.
        let again = pool.put_at(
            SequenceHash(1),
            None,
            Retention::DEFAULT,
            &[0; 8],
            Tick(4),
            None,
        )?;
        assert!(!again.stored);
        assert_eq!(pool.retention(SequenceHash(1)), Some(keep));
        let mut out = [0u8; 8];
        pool.get_at(SequenceHash(1), &mut out, Tick(5))?;
        assert_eq!(out, [1; 8]);
        Ok(())
    }

    #[test]
    fn a_corrupt_disk_block_is_dropped_not_served() -> TestResult {
        let dir = tempfile::tempdir()?;
        let pool = StorePool::over(crate::storage::DiskStore::open(dir.path(), 2, 8, None)?)?;
        pool.put_at(
            SequenceHash(7),
            None,
            Retention::DEFAULT,
            &[7; 8],
            Tick(0),
            None,
        )?;
        let (path, offset) =
            pool.inspect(|disk| (disk.path().to_owned(), disk.record_offset(BlockId(0))));
        assert_eq!(pool.slot_of(SequenceHash(7)), Some(BlockId(0)));
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        std::os::unix::fs::FileExt::write_all_at(&file, &[0xff; 4], offset)?;
        let mut out = [0u8; 8];
        assert!(matches!(
            pool.get_at(SequenceHash(7), &mut out, Tick(1)),
            Err(StorageError::Corrupt { .. })
        ));
        assert!(!pool.holds(SequenceHash(7)));
        assert_eq!(pool.drain_removed(), vec![SequenceHash(7)]);
        assert_eq!(pool.inspect(|disk| disk.counters().checksum_failures), 1);
        Ok(())
    }

    #[test]
    fn a_leased_block_is_read_outside_the_pool_and_kept_until_the_read_ends() -> TestResult {
        let dir = tempfile::tempdir()?;
        let pool = StorePool::over(crate::storage::DiskStore::open(dir.path(), 2, 8, None)?)?;
        let put = |hash: u64, tick: u64| {
            let bytes = [hash as u8; 8];
            pool.put_at(
                SequenceHash(hash),
                None,
                Retention::DEFAULT,
                &bytes,
                Tick(tick),
                None,
            )
        };
        put(1, 0)?;
        put(2, 1)?;
        let reader = pool.inspect(crate::storage::DiskStore::reader);
        let leased = pool.lease(SequenceHash(1), Tick(2)).ok_or("1 is held")?;
        let mut out = [0u8; 8];
        pool.get_at(SequenceHash(2), &mut out, Tick(3))?;
        // 1 is now the least recently used, but in use: the next put evicts the other block,
        // and the leased one's slot keeps its bytes while another thread reads them.
        put(3, 4)?;
        assert_eq!(pool.drain_removed(), vec![SequenceHash(2)]);
        let slot = leased.id();
        let read = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut out = [0u8; 8];
                    reader.read(slot, SequenceHash(1), &mut out).map(|()| out)
                })
                .join()
        })
        .map_err(|_| "the reader panicked")?;
        assert_eq!(read.as_ref().ok(), Some(&[1u8; 8]));
        pool.end_lease(leased, &read.map(|_| ()));
        assert!(pool.holds(SequenceHash(1)));
        // The get of 2 and the reader's: the store counts both.
        assert_eq!(pool.inspect(|disk| disk.counters().reads), 2);
        // Another hash in the slot is a miss, not a corrupt block.
        assert!(matches!(
            reader.read(slot, SequenceHash(9), &mut out),
            Err(StorageError::Miss { .. })
        ));
        // Bad bytes found by a leased read drop the block once the lease ends.
        let (path, offset) =
            pool.inspect(|disk| (disk.path().to_owned(), disk.record_offset(slot)));
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        std::os::unix::fs::FileExt::write_all_at(&file, &[0xff; 4], offset)?;
        let leased = pool.lease(SequenceHash(1), Tick(5)).ok_or("1 is held")?;
        let read = reader.read(leased.id(), SequenceHash(1), &mut out);
        assert!(matches!(read, Err(StorageError::Corrupt { .. })));
        pool.end_lease(leased, &read);
        assert!(!pool.holds(SequenceHash(1)));
        assert_eq!(pool.drain_removed(), vec![SequenceHash(1)]);
        assert_eq!(pool.inspect(|disk| disk.counters().checksum_failures), 1);
        Ok(())
    }

    #[test]
    fn parents_in_a_cycle_do_not_wedge_the_pool() -> TestResult {
        let pool = MemoryPool::new(2, 8)?;
        pool.put(SequenceHash(1), Some(SequenceHash(2)), &[1; 8])?;
        pool.put(SequenceHash(2), Some(SequenceHash(1)), &[2; 8])?;
        pool.put(SequenceHash(3), Some(SequenceHash(3)), &[3; 8])?;
        pool.put(SequenceHash(4), None, &[4; 8])?;
        assert_eq!(pool.len(), 2);
        assert!(pool.holds(SequenceHash(4)));
        Ok(())
    }
}
