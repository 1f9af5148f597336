//! The pool's blocks: a memory tier (kvbm [`MemoryPool`]: a block pool over a host slab) and,
//! optionally, a disk tier behind it (a block pool over a checksummed [`DiskStore`]). A block
//! lives in one tier at a time: a put lands in memory, a block evicted from memory is written
//! to disk (with its retention), a block evicted from disk is gone. A get that misses memory
//! reads disk, verified, and moves the block back to memory (a hot block read from disk once
//! is served from memory after); a corrupt record is a counted miss and leaves the pool.
//!
//! Each tier is bounded by its capacity in blocks and evicts by retention, leaves first. A
//! full disk (its byte budget, or the OS) only skips writes. The disk tier outlives the
//! process: a pool opened on a directory keeps the blocks an earlier one left there. Every
//! store and removal becomes a Mooncake event, in the order the pool changed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use switchyard_kv_events::wire::EngineHash;
use switchyard_kv_events::wire::mooncake::{MooncakeEvent, MooncakeEventType};
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::storage::{
    AdoptedRecord, BlockMeta, DiskReader, DiskStore, MemoryPool, PutOutcome, Spilled, StorePool,
};
use switchyard_kvbm::{KvbmError, SequenceHash, StorageError, Tick};
use tokio::sync::mpsc;

use crate::protocol::{PutBlock, PutResult, PutSummary};

/// Blocks per message when a pool announces the disk blocks it found at start.
const ANNOUNCED_PER_MESSAGE: usize = 1024;

/// The pool's tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolTier {
    /// Host memory (`CPU` in events).
    Memory,
    /// The disk tier (`DISK` in events).
    Disk,
}

impl PoolTier {
    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            PoolTier::Memory => "memory",
            PoolTier::Disk => "disk",
        }
    }

    /// The events' `medium`.
    pub fn medium(self) -> &'static str {
        match self {
            PoolTier::Memory => "CPU",
            PoolTier::Disk => "DISK",
        }
    }
}

/// The disk tier's place and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// Directory of the slot file (created; an old slot file is discarded).
    pub dir: PathBuf,
    /// Capacity in blocks.
    pub blocks: usize,
    /// Bytes the slot file may use, below what the disk has (`None`: the disk's own limit).
    pub max_bytes: Option<u64>,
}

/// What the pool holds and how much one call may carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes of every block (one per pool).
    pub block_bytes: usize,
    /// Memory tier capacity in blocks.
    pub memory_blocks: usize,
    /// The disk tier, if any.
    pub disk: Option<DiskConfig>,
    /// Most blocks in one put or get.
    pub max_batch_blocks: usize,
    /// Most hashes in one exists.
    pub max_exists_hashes: usize,
    /// The events' `backend_id`.
    pub backend_id: String,
}

impl PoolConfig {
    /// A memory-only pool with the default bounds.
    pub fn memory(block_bytes: usize, memory_blocks: usize) -> PoolConfig {
        PoolConfig {
            block_bytes,
            memory_blocks,
            disk: None,
            max_batch_blocks: 64,
            max_exists_hashes: 16_384,
            backend_id: "switchyard-kv-pool".into(),
        }
    }
}

/// Counters since start (the disk's own come from its store).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounters {
    /// Blocks written by puts.
    pub puts: u64,
    /// Put blocks already present.
    pub duplicate_puts: u64,
    /// Block bytes received by puts.
    pub bytes_in: u64,
    /// Block bytes sent by gets.
    pub bytes_out: u64,
    /// Gets served from memory.
    pub memory_hits: u64,
    /// Gets not found in memory.
    pub memory_misses: u64,
    /// Gets served from disk.
    pub disk_hits: u64,
    /// Gets that missed memory and disk (with a disk tier).
    pub disk_misses: u64,
    /// Blocks evicted from memory written to disk.
    pub spilled: u64,
    /// Blocks evicted from memory that the disk could not take (full, or an I/O error).
    pub spill_failures: u64,
    /// Disk hits moved back to memory.
    pub promoted: u64,
    /// Blocks found on disk at start, left by an earlier pool (`DiskStore::reopen`).
    pub adopted: u64,
}

/// The pool cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A size is out of range.
    #[error("kv pool configuration: {0}")]
    Config(String),
    /// The block manager refused a tier.
    #[error(transparent)]
    Kvbm(#[from] KvbmError),
    /// The disk tier could not be opened.
    #[error("disk tier: {0}")]
    Storage(#[from] StorageError),
}

/// A put the pool could not apply.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// A block is not one block of the pool's size.
    #[error("block {hash:016x} has {got} bytes, the pool's blocks are {expected}")]
    WrongBlockSize {
        /// The block.
        hash: u64,
        /// The pool's size.
        expected: usize,
        /// The block's.
        got: usize,
    },
    /// A priority above 100.
    #[error("block {hash:016x}: {source}")]
    Retention {
        /// The block.
        hash: u64,
        /// Why.
        source: KvbmError,
    },
    /// The memory tier failed to store bytes (blocks before it in the batch are stored).
    #[error("block {hash:016x}: {source}")]
    Storage {
        /// The block.
        hash: u64,
        /// Why.
        source: StorageError,
    },
}

/// Per-tier occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierUsage {
    /// Blocks held.
    pub blocks: usize,
    /// Capacity.
    pub capacity: usize,
    /// Blocks evicted since start.
    pub evictions: u64,
}

#[derive(Debug)]
struct Inner {
    memory: MemoryPool,
    disk: Option<StorePool<DiskStore>>,
    /// Tokens of blocks in memory whose writer gave them, for self-describing store events.
    tokens: HashMap<SequenceHash, Vec<u32>>,
    counters: PoolCounters,
    events: Option<mpsc::UnboundedSender<Vec<MooncakeEvent>>>,
}

/// The shared pool: its tiers, counters and event outbox. All calls are synchronous (the
/// service runs them off the async threads) and serialized, so events leave in the order the
/// pool changed.
#[derive(Debug)]
pub struct Pool {
    inner: Mutex<Inner>,
    /// Reads the disk tier's records outside `inner`'s lock ([`Pool::get`]).
    disk_reader: Option<DiskReader>,
    config: PoolConfig,
    start: Instant,
}

impl Pool {
    /// Open the tiers of `config`. `events`: where each call's events go, in order.
    pub fn open(
        config: PoolConfig,
        events: Option<mpsc::UnboundedSender<Vec<MooncakeEvent>>>,
    ) -> Result<Pool, OpenError> {
        if config.block_bytes == 0 || config.block_bytes > u32::MAX as usize {
            return Err(OpenError::Config(format!(
                "block bytes {} is not in 1..=4294967295",
                config.block_bytes
            )));
        }
        if config.max_batch_blocks == 0 || config.max_exists_hashes == 0 {
            return Err(OpenError::Config("batch bounds must be at least 1".into()));
        }
        let memory = MemoryPool::new(config.memory_blocks, config.block_bytes)?;
        // The disk tier keeps what an earlier pool left there: a restart loses memory only.
        let (disk, adopted) = match &config.disk {
            Some(disk) => {
                let (store, kept) =
                    DiskStore::reopen(&disk.dir, disk.blocks, config.block_bytes, disk.max_bytes)?;
                (Some(StorePool::adopting(store, &kept)?), kept)
            }
            None => (None, Vec::new()),
        };
        let inner = Inner {
            memory,
            disk,
            tokens: HashMap::new(),
            counters: PoolCounters {
                adopted: adopted.len() as u64,
                ..PoolCounters::default()
            },
            events,
        };
        // Announced as the first events, each block after its parent, with the parents and
        // tokens the records kept (a block whose writer gave no tokens, or whose tokens did not
        // fit its record, goes without: a subscriber that knew it recognises its hash).
        let announced = parents_first(&adopted);
        for chunk in announced.chunks(ANNOUNCED_PER_MESSAGE) {
            let events = chunk.iter().map(|record| {
                let parent = record.meta.parent.filter(|p| *p != record.hash);
                stored_event(
                    record.hash,
                    parent,
                    record.meta.tokens.clone(),
                    PoolTier::Disk,
                    &config.backend_id,
                )
            });
            inner.emit(events.collect());
        }
        let disk_reader = inner.disk.as_ref().map(|d| d.inspect(DiskStore::reader));
        Ok(Pool {
            inner: Mutex::new(inner),
            disk_reader,
            config,
            start: Instant::now(),
        })
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Tick {
        Tick(self.start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64)
    }

    /// Which of `hashes` the pool holds (either tier), in order. Not a use.
    pub fn exists(&self, hashes: &[u64]) -> Vec<bool> {
        let inner = self.lock();
        hashes
            .iter()
            .map(|&h| inner.tier_of(SequenceHash(h)).is_some())
            .collect()
    }

    /// Where `hash` is, if held.
    pub fn tier_of(&self, hash: u64) -> Option<PoolTier> {
        self.lock().tier_of(SequenceHash(hash))
    }

    /// Every hash of `tier`, sorted (audits and tests).
    pub fn hashes(&self, tier: PoolTier) -> Vec<u64> {
        let inner = self.lock();
        let mut hashes: Vec<u64> = match (tier, &inner.disk) {
            (PoolTier::Memory, _) => inner.memory.hashes(),
            (PoolTier::Disk, Some(disk)) => disk.hashes(),
            (PoolTier::Disk, None) => Vec::new(),
        }
        .into_iter()
        .map(|h| h.0)
        .collect();
        hashes.sort_unstable();
        hashes
    }

    /// The bytes of each of `hashes` held, in order (a hit is a use). Disk reads run outside the
    /// pool's lock, so that one caller's reads hold up no other call: the blocks read stay in
    /// use meanwhile (neither evicted nor moved), and go back to memory once read.
    pub fn get(&self, hashes: &[u64]) -> Vec<Option<Bytes>> {
        let now = self.now();
        let mut blocks: Vec<Option<Bytes>> = vec![None; hashes.len()];
        let mut leased = Vec::new();
        {
            let mut inner = self.lock();
            for (i, &hash) in hashes.iter().enumerate() {
                let hash = SequenceHash(hash);
                let mut out = vec![0u8; self.config.block_bytes];
                if inner.get_from_memory(hash, &mut out, now) {
                    blocks[i] = Some(out.into());
                    continue;
                }
                match inner.disk.as_ref().and_then(|disk| disk.lease(hash, now)) {
                    Some(lease) => leased.push((i, lease, out)),
                    None => inner.counters.disk_misses += 1,
                }
            }
        }
        let Some(reader) = self.disk_reader.as_ref().filter(|_| !leased.is_empty()) else {
            return blocks;
        };
        let read: Vec<_> = leased
            .into_iter()
            .map(|(i, lease, mut out)| {
                let result = reader.read(lease.id(), lease.hash(), &mut out);
                (i, lease, result, out)
            })
            .collect();
        let mut inner = self.lock();
        let mut events = Vec::new();
        for (i, lease, result, out) in read {
            let hash = lease.hash();
            if let Some(disk) = &inner.disk {
                // A corrupt record is dropped by the disk pool and counted by its reader: a miss.
                disk.end_lease(lease, &result);
            }
            if result.is_ok() {
                inner.counters.disk_hits += 1;
                inner.counters.bytes_out += out.len() as u64;
                inner.promote(hash, &out, &self.config, now, &mut events);
                blocks[i] = Some(out.into());
            } else {
                inner.counters.disk_misses += 1;
            }
            // Each block's removals right after its stores: a block promoted and then spilled
            // by the next one's promotion leaves memory before it is stored on disk again.
            inner.drain_removals(&self.config.backend_id, &mut events);
        }
        inner.emit(events);
        blocks
    }

    /// Store `blocks`, in order. Blocks already held are touched (retention merged) and
    /// counted as duplicates. On an error, the blocks before the failing one are stored.
    pub fn put(&self, blocks: &[PutBlock]) -> Result<PutSummary, PutError> {
        let now = self.now();
        let mut inner = self.lock();
        let mut events = Vec::new();
        let mut summary = PutSummary {
            stored: 0,
            duplicates: 0,
            results: Vec::with_capacity(blocks.len()),
        };
        let mut result = Ok(());
        for block in blocks {
            let outcome = inner.put_one(block, &self.config, now, &mut events);
            inner.drain_removals(&self.config.backend_id, &mut events);
            match outcome {
                Ok(put) => {
                    match put {
                        PutResult::Stored => summary.stored += 1,
                        PutResult::Duplicate => summary.duplicates += 1,
                    }
                    summary.results.push(put);
                }
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        inner.emit(events);
        result.map(|()| summary)
    }

    /// Stop sending events (the service is stopping: its publisher drains and closes).
    pub fn close_events(&self) {
        self.lock().events = None;
    }

    /// Counters since start.
    pub fn counters(&self) -> PoolCounters {
        self.lock().counters
    }

    /// Occupancy of `tier` (`None`: no such tier).
    pub fn usage(&self, tier: PoolTier) -> Option<TierUsage> {
        let inner = self.lock();
        let usage = |blocks, capacity, evictions| TierUsage {
            blocks,
            capacity,
            evictions,
        };
        match tier {
            PoolTier::Memory => Some(usage(
                inner.memory.len(),
                inner.memory.capacity_blocks(),
                inner.memory.counters().evictions,
            )),
            PoolTier::Disk => inner.disk.as_ref().map(|disk| {
                usage(
                    disk.len(),
                    disk.capacity_blocks(),
                    disk.counters().evictions,
                )
            }),
        }
    }

    /// The disk store's own counters (writes, verified reads, checksum failures, writes skipped
    /// while full), if there is a disk tier.
    pub fn disk_counters(&self) -> Option<switchyard_kvbm::storage::DiskCounters> {
        let inner = self.lock();
        inner.disk.as_ref().map(|d| d.inspect(DiskStore::counters))
    }

    /// Where block `hash`'s record is on disk: `(slot file, offset)` (tests corrupt it).
    pub fn disk_record(&self, hash: u64) -> Option<(PathBuf, u64)> {
        let inner = self.lock();
        let disk = inner.disk.as_ref()?;
        let slot = disk.slot_of(SequenceHash(hash))?;
        Some(disk.inspect(|store| (store.path().to_owned(), store.record_offset(slot))))
    }
}

impl Inner {
    fn tier_of(&self, hash: SequenceHash) -> Option<PoolTier> {
        if self.memory.holds(hash) {
            Some(PoolTier::Memory)
        } else if self.disk.as_ref().is_some_and(|d| d.holds(hash)) {
            Some(PoolTier::Disk)
        } else {
            None
        }
    }

    /// Read `hash` into `out` if memory holds it (a use); whether it did, counted either way.
    fn get_from_memory(&mut self, hash: SequenceHash, out: &mut [u8], now: Tick) -> bool {
        if self.memory.get_at(hash, out, now).is_ok() {
            self.counters.memory_hits += 1;
            self.counters.bytes_out += out.len() as u64;
            return true;
        }
        self.counters.memory_misses += 1;
        false
    }

    fn put_one(
        &mut self,
        block: &PutBlock,
        config: &PoolConfig,
        now: Tick,
        events: &mut Vec<MooncakeEvent>,
    ) -> Result<PutResult, PutError> {
        let hash = SequenceHash(block.hash);
        if block.bytes.len() != config.block_bytes {
            return Err(PutError::WrongBlockSize {
                hash: block.hash,
                expected: config.block_bytes,
                got: block.bytes.len(),
            });
        }
        let retention = match block.retention {
            Some(r) => {
                Retention::for_duration(r.priority, r.duration_ms.map(Duration::from_millis), now)
                    .map_err(|source| PutError::Retention {
                    hash: block.hash,
                    source,
                })?
            }
            None => Retention::DEFAULT,
        };
        self.counters.bytes_in += block.bytes.len() as u64;
        let storage = |source| PutError::Storage {
            hash: block.hash,
            source,
        };
        // Already on disk: a duplicate, touched there.
        if let Some(disk) = self.disk.as_ref().filter(|d| d.holds(hash)) {
            disk.put_at(hash, None, retention, &block.bytes, now, None)
                .map_err(storage)?;
            self.counters.duplicate_puts += 1;
            return Ok(PutResult::Duplicate);
        }
        // The pool never makes a block its own parent; neither do the events.
        let parent = block.parent.filter(|p| *p != block.hash).map(SequenceHash);
        let outcome =
            self.put_in_memory(hash, parent, retention, &block.bytes, config, now, events);
        if !outcome.map_err(storage)?.stored {
            self.counters.duplicate_puts += 1;
            return Ok(PutResult::Duplicate);
        }
        self.counters.puts += 1;
        if !block.token_ids.is_empty() {
            self.tokens.insert(hash, block.token_ids.clone());
        }
        events.push(stored_event(
            hash,
            parent,
            block.token_ids.clone(),
            PoolTier::Memory,
            &config.backend_id,
        ));
        Ok(PutResult::Stored)
    }

    /// Put a block in memory; what memory evicts for it goes to disk, and those disk stores
    /// are published (even if the memory write then fails: they are on disk).
    #[allow(
        clippy::too_many_arguments,
        reason = "one block's fields, as `StorePool::put_at` takes them"
    )]
    fn put_in_memory(
        &mut self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        retention: Retention,
        bytes: &[u8],
        config: &PoolConfig,
        now: Tick,
        events: &mut Vec<MooncakeEvent>,
    ) -> Result<PutOutcome, StorageError> {
        let Inner {
            memory,
            disk,
            tokens,
            counters,
            ..
        } = self;
        let mut spilled = Vec::new();
        let mut spill = |s: Spilled<'_>| {
            let Some(disk) = disk.as_ref() else {
                return;
            };
            // The tokens go into the disk record, so that a restarted pool announces them, and
            // into the disk store event.
            let ids = tokens.get(&s.hash).cloned().unwrap_or_default();
            let meta = BlockMeta {
                parent: s.parent,
                retention: s.retention,
                tokens: ids.clone(),
            };
            match disk.put_block_at(s.hash, meta, s.bytes, now, None) {
                Ok(_) => {
                    counters.spilled += 1;
                    spilled.push((s.hash, s.parent, ids));
                }
                // A full or failing disk only loses the block: the put goes on.
                Err(_) => counters.spill_failures += 1,
            }
        };
        let outcome = memory.put_at(hash, parent, retention, bytes, now, Some(&mut spill));
        for (spilled, parent, ids) in spilled {
            events.push(stored_event(
                spilled,
                parent,
                ids,
                PoolTier::Disk,
                &config.backend_id,
            ));
        }
        outcome
    }

    /// Move a block read from disk back to memory, with its parent and retention. Its store in
    /// memory is published before its removal from disk (the next `drain_removals`), so a
    /// consumer never sees the pool without it. Its tokens stayed with its disk store event.
    fn promote(
        &mut self,
        hash: SequenceHash,
        bytes: &[u8],
        config: &PoolConfig,
        now: Tick,
        events: &mut Vec<MooncakeEvent>,
    ) {
        let Some((parent, retention)) = self.disk.as_ref().and_then(|disk| disk.remove(hash))
        else {
            return;
        };
        let stored = self
            .put_in_memory(hash, parent, retention, bytes, config, now, events)
            .is_ok_and(|outcome| outcome.stored);
        // Memory refused it: it was served, and it leaves the pool with its disk removal.
        if stored {
            self.counters.promoted += 1;
            events.push(stored_event(
                hash,
                parent,
                Vec::new(),
                PoolTier::Memory,
                &config.backend_id,
            ));
        }
    }

    /// Removal events for what left each tier since the last call; forget the tokens of
    /// blocks that left memory.
    fn drain_removals(&mut self, backend_id: &str, events: &mut Vec<MooncakeEvent>) {
        let memory = self.memory.drain_removed();
        let disk = self
            .disk
            .as_ref()
            .map(StorePool::drain_removed)
            .unwrap_or_default();
        for (tier, removed) in [(PoolTier::Memory, memory), (PoolTier::Disk, disk)] {
            if removed.is_empty() {
                continue;
            }
            if tier == PoolTier::Memory {
                // Tokens are kept while a block is in memory (bounded by its capacity): a
                // block spilled to disk has had its disk store event by now.
                for hash in &removed {
                    self.tokens.remove(hash);
                }
            }
            // After the put's stores: within one medium a put never stores and removes the
            // same hash, so a consumer replaying the events ends where the pool is.
            events.push(MooncakeEvent {
                event_type: MooncakeEventType::Removed,
                object_key: object_key(removed[0]),
                seq_hashes: removed.iter().map(|h| EngineHash(h.0)).collect(),
                backend_id: backend_id.to_owned(),
                medium: tier.medium().to_owned(),
                parent_hash: None,
                token_ids: Vec::new(),
                block_size: None,
            });
        }
    }

    fn emit(&self, events: Vec<MooncakeEvent>) {
        if events.is_empty() {
            return;
        }
        if let Some(sink) = &self.events {
            // Sent under the lock, so calls' events keep the pool's order. A closed sink (the
            // publisher stopped) loses them; the pool goes on.
            let _ = sink.send(events);
        }
    }
}

fn object_key(hash: SequenceHash) -> String {
    format!("{:016x}", hash.0)
}

fn stored_event(
    hash: SequenceHash,
    parent: Option<SequenceHash>,
    token_ids: Vec<u32>,
    tier: PoolTier,
    backend_id: &str,
) -> MooncakeEvent {
    MooncakeEvent {
        event_type: MooncakeEventType::Stored,
        object_key: object_key(hash),
        seq_hashes: vec![EngineHash(hash.0)],
        backend_id: backend_id.to_owned(),
        medium: tier.medium().to_owned(),
        parent_hash: parent.map(|p| EngineHash(p.0)),
        block_size: (!token_ids.is_empty()).then_some(token_ids.len() as u32),
        token_ids,
    }
}

/// `records` ordered so that a block comes after its parent when both are there (a chain is
/// announced from its root), otherwise in their order.
fn parents_first(records: &[AdoptedRecord]) -> Vec<&AdoptedRecord> {
    let by_hash: HashMap<SequenceHash, &AdoptedRecord> =
        records.iter().map(|record| (record.hash, record)).collect();
    let mut done = std::collections::HashSet::with_capacity(records.len());
    let mut ordered = Vec::with_capacity(records.len());
    let mut chain = Vec::new();
    for record in records {
        // Climb to the first ancestor already announced (or absent), then announce downwards.
        let mut next = Some(record);
        while let Some(at) = next.filter(|at| !done.contains(&at.hash)) {
            done.insert(at.hash);
            chain.push(at);
            next = at
                .meta
                .parent
                .and_then(|parent| by_hash.get(&parent).copied());
        }
        ordered.extend(chain.drain(..).rev());
    }
    ordered
}

#[cfg(test)]
mod tests;
