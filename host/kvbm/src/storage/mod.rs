//! Real bytes behind the tiers. The logic ([`crate::KvBlockManager`]) names slots; a
//! [`BlockStore`] holds the bytes of each slot; [`perform`] executes a [`TransferBatch`]
//! between stores, off the request path. This is the only module that does I/O.

mod batch;
mod disk;
mod shared;
mod slab;

#[cfg(feature = "cuda")]
mod cuda;

use std::fmt::Debug;

pub use batch::SlabAccess;
pub use disk::{AdoptedRecord, DiskCounters, DiskReader, DiskStore};
pub use shared::{MemoryPool, PutOutcome, Spilled, StorePool, fetch_from_pool, publish_to_pool};
pub use slab::HostSlab;

/// The G4 trait lives with the pure logic; it is re-exported here, next to its implementation.
pub use crate::shared_pool::SharedPool;

#[cfg(feature = "cuda")]
pub use cuda::DeviceSlab;

use crate::config::ManagerConfig;
use crate::error::{KvbmError, StorageError};
use crate::manager::TransferBatch;
use crate::retention::Retention;
use crate::types::{BlockId, SequenceHash, Tier};

/// What a block is besides its bytes: the block before it, how long to keep it and its
/// tokens. A store that outlives its process keeps it with the bytes (the disk's records), so
/// that a reopened pool gets its chains, retention and tokens back ([`DiskStore::reopen`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockMeta {
    /// The block before it in its sequence.
    pub parent: Option<SequenceHash>,
    /// Its retention.
    pub retention: Retention,
    /// Its tokens, when the writer gave them (empty otherwise).
    pub tokens: Vec<u32>,
}

/// `got` bytes are exactly one block of `expected` bytes.
fn check_block_len(expected: usize, got: usize) -> Result<(), StorageError> {
    if got == expected {
        Ok(())
    } else {
        Err(StorageError::WrongBlockSize { expected, got })
    }
}

/// `slot` is one of `capacity` slots.
fn check_slot(slot: BlockId, capacity: usize) -> Result<(), StorageError> {
    if slot.index() < capacity {
        Ok(())
    } else {
        Err(StorageError::SlotOutOfRange {
            slot: slot.0,
            capacity,
        })
    }
}

/// The bytes of `slot` in a slab of `capacity` blocks of `block_bytes`.
fn slot_range(
    slot: BlockId,
    capacity: usize,
    block_bytes: usize,
) -> Result<std::ops::Range<usize>, StorageError> {
    check_slot(slot, capacity)?;
    let start = slot.index() * block_bytes;
    Ok(start..start + block_bytes)
}

/// Fixed-size block slots holding real bytes.
pub trait BlockStore: Debug + Send {
    /// Bytes of one block.
    fn block_bytes(&self) -> usize;

    /// Slots this store holds.
    fn capacity_blocks(&self) -> usize;

    /// Write `data` (exactly one block) into `slot`, as block `hash`.
    fn write_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        data: &[u8],
    ) -> Result<(), StorageError>;

    /// [`write_block`](Self::write_block), with what the block is, for a store that keeps it.
    /// Default: the bytes alone.
    fn write_block_with(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        _meta: &BlockMeta,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.write_block(slot, hash, data)
    }

    /// Read block `hash` from `slot` into `out`. A slot that holds another block, or bytes that
    /// fail their check, is a miss: never served.
    fn read_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        out: &mut [u8],
    ) -> Result<(), StorageError>;

    /// Finish outstanding writes (a device store synchronizes its stream). Default: nothing.
    fn flush(&mut self) -> Result<(), StorageError> {
        Ok(())
    }

    /// Hand block `hash` of `slot` to `use_bytes` without copying it out, for stores whose
    /// bytes are addressable (a host slab). `None`: not supported, use `read_block`.
    fn read_in_place(
        &mut self,
        _slot: BlockId,
        _hash: SequenceHash,
        _use_bytes: &mut dyn FnMut(&[u8]) -> Result<(), StorageError>,
    ) -> Option<Result<(), StorageError>> {
        None
    }

    /// Let `fill` write `slot`'s bytes directly; the slot holds `hash` only if `fill`
    /// succeeds. `None`: not supported, use `write_block`.
    fn write_in_place(
        &mut self,
        _slot: BlockId,
        _hash: SequenceHash,
        _fill: &mut dyn FnMut(&mut [u8]) -> Result<(), StorageError>,
    ) -> Option<Result<(), StorageError>> {
        None
    }

    /// This store as one of the slabs that [`copy_between`] copies in batches (a host slab,
    /// a device slab). `None`: copy block by block.
    fn slab(&mut self) -> Option<SlabAccess<'_>> {
        None
    }
}

/// The same failure again, for each of several copies it failed (`StorageError` is not `Clone`
/// because of its `io::Error`, which is repeated with its kind and message).
fn repeat(error: &StorageError) -> StorageError {
    match error {
        StorageError::SlotOutOfRange { slot, capacity } => StorageError::SlotOutOfRange {
            slot: *slot,
            capacity: *capacity,
        },
        StorageError::WrongBlockSize { expected, got } => StorageError::WrongBlockSize {
            expected: *expected,
            got: *got,
        },
        StorageError::Miss { hash } => StorageError::Miss { hash: *hash },
        StorageError::Corrupt { hash } => StorageError::Corrupt { hash: *hash },
        StorageError::DiskFull { hash } => StorageError::DiskFull { hash: *hash },
        StorageError::NoRoom { hash } => StorageError::NoRoom { hash: *hash },
        StorageError::DeviceUnavailable { reason } => StorageError::DeviceUnavailable {
            reason: reason.clone(),
        },
        StorageError::Io(io) => StorageError::Io(std::io::Error::new(io.kind(), io.to_string())),
    }
}

/// A batch whose end (a flush, a synchronisation) failed: none of its writes can be trusted.
fn fail_unfinished<'a>(
    results: impl IntoIterator<Item = &'a mut Result<(), StorageError>>,
    error: &StorageError,
) {
    for result in results {
        if result.is_ok() {
            *result = Err(repeat(error));
        }
    }
}

/// One block to copy between two stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The block.
    pub hash: SequenceHash,
    /// Slot in the source store.
    pub from: BlockId,
    /// Slot in the destination store.
    pub to: BlockId,
}

/// Copy `copies` from `source` to `dest`. Between two slabs (host or device), as one batch:
/// all the copies are queued, then the batch is finished once (a device stream is synchronised
/// once, not per block; see `batch.rs`). Otherwise block by block, with one copy of the bytes
/// where either side is addressable (straight from the slab into the file, or from the file into
/// the slab), else through a staging buffer, then `dest` is flushed once. Returns the result of
/// each copy.
pub fn copy_between(
    source: &mut dyn BlockStore,
    dest: &mut dyn BlockStore,
    copies: &[BlockCopy],
) -> Vec<Result<(), StorageError>> {
    if let (Some(from), Some(to)) = (source.slab(), dest.slab())
        && let Some(results) = from.copy_to(to, copies)
    {
        return results;
    }
    let block_bytes = dest.block_bytes();
    let mut staging = Vec::new();
    let mut results: Vec<Result<(), StorageError>> = copies
        .iter()
        .map(|copy| {
            let mut read = |buffer: &mut [u8]| source.read_block(copy.from, copy.hash, buffer);
            if let Some(result) = dest.write_in_place(copy.to, copy.hash, &mut read) {
                return result;
            }
            let mut write = |bytes: &[u8]| dest.write_block(copy.to, copy.hash, bytes);
            if let Some(result) = source.read_in_place(copy.from, copy.hash, &mut write) {
                return result;
            }
            staging.resize(block_bytes, 0);
            source
                .read_block(copy.from, copy.hash, &mut staging)
                .and_then(|()| dest.write_block(copy.to, copy.hash, &staging))
        })
        .collect();
    if let Err(error) = dest.flush() {
        fail_unfinished(&mut results, &error);
    }
    results
}

/// The stores of the local tiers, by tier.
#[derive(Debug, Default)]
pub struct TierStores {
    /// G1.
    pub device: Option<Box<dyn BlockStore>>,
    /// G2.
    pub host: Option<Box<dyn BlockStore>>,
    /// G3.
    pub disk: Option<Box<dyn BlockStore>>,
}

impl TierStores {
    /// The store of `tier`.
    pub fn get_mut(&mut self, tier: Tier) -> Option<&mut (dyn BlockStore + 'static)> {
        match tier {
            Tier::Device => self.device.as_deref_mut(),
            Tier::Host => self.host.as_deref_mut(),
            Tier::Disk => self.disk.as_deref_mut(),
            Tier::Pool => None,
        }
    }

    /// Checks that every configured tier has a store with the configured block size and at
    /// least as many slots as its pool (a slot beyond the store would fail every copy).
    pub fn check(&self, config: &ManagerConfig) -> Result<(), KvbmError> {
        for (tier, store) in [
            (Tier::Device, &self.device),
            (Tier::Host, &self.host),
            (Tier::Disk, &self.disk),
        ] {
            let Some(tier_config) = config.tier(tier) else {
                continue;
            };
            let mismatch = |reason: String| KvbmError::StoreMismatch { tier, reason };
            let Some(store) = store else {
                return Err(mismatch("no store".into()));
            };
            if store.block_bytes() as u64 != config.block_bytes {
                return Err(mismatch(format!(
                    "blocks of {} bytes, configured {}",
                    store.block_bytes(),
                    config.block_bytes
                )));
            }
            if store.capacity_blocks() < tier_config.capacity_blocks {
                return Err(mismatch(format!(
                    "{} slots for a pool of {}",
                    store.capacity_blocks(),
                    tier_config.capacity_blocks
                )));
            }
        }
        Ok(())
    }

    /// The stores of two different tiers at once.
    #[allow(
        clippy::type_complexity,
        reason = "a pair of the trait objects this module is about"
    )]
    pub fn pair_mut(
        &mut self,
        source: Tier,
        dest: Tier,
    ) -> Option<(
        &mut (dyn BlockStore + 'static),
        &mut (dyn BlockStore + 'static),
    )> {
        let TierStores { device, host, disk } = self;
        let (a, b) = match (source, dest) {
            (Tier::Device, Tier::Host) => (device, host),
            (Tier::Device, Tier::Disk) => (device, disk),
            (Tier::Host, Tier::Device) => (host, device),
            (Tier::Host, Tier::Disk) => (host, disk),
            (Tier::Disk, Tier::Device) => (disk, device),
            (Tier::Disk, Tier::Host) => (disk, host),
            _ => return None,
        };
        Some((a.as_deref_mut()?, b.as_deref_mut()?))
    }
}

/// What [`perform`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Performed {
    /// Hashes whose copy failed (pass them to `commit`).
    pub failed: Vec<SequenceHash>,
    /// Of those, the ones whose source bytes were bad (report them with `report_corrupt`).
    pub corrupt: Vec<(Tier, SequenceHash)>,
    /// Of those, the ones skipped because the disk is full.
    pub disk_full: usize,
    /// Bytes copied successfully.
    pub bytes: u64,
}

/// Copy every transfer of `batch`, grouped by (source tier, destination tier), each group
/// through [`copy_between`] (one flush per group).
pub fn perform(batch: &TransferBatch, stores: &mut TierStores) -> Performed {
    let mut performed = Performed::default();
    let mut groups: Vec<((Tier, Tier), Vec<BlockCopy>)> = Vec::new();
    for transfer in batch.transfers() {
        let (source_tier, from) = transfer.source();
        let (dest_tier, to) = transfer.dest();
        let copy = BlockCopy {
            hash: transfer.hash(),
            from,
            to,
        };
        match groups
            .iter_mut()
            .find(|(key, _)| *key == (source_tier, dest_tier))
        {
            Some((_, copies)) => copies.push(copy),
            None => groups.push(((source_tier, dest_tier), vec![copy])),
        }
    }
    for ((source_tier, dest_tier), copies) in groups {
        let Some((source, dest)) = stores.pair_mut(source_tier, dest_tier) else {
            performed.failed.extend(copies.iter().map(|c| c.hash));
            continue;
        };
        let block_bytes = dest.block_bytes() as u64;
        for (copy, result) in copies.iter().zip(copy_between(source, dest, &copies)) {
            match result {
                Ok(()) => performed.bytes += block_bytes,
                Err(error) => {
                    match error {
                        StorageError::Corrupt { hash } => {
                            performed.corrupt.push((source_tier, hash));
                        }
                        StorageError::DiskFull { .. } => performed.disk_full += 1,
                        _ => {}
                    }
                    performed.failed.push(copy.hash);
                }
            }
        }
    }
    performed
}

/// How G1's bytes are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceBackend {
    /// A device slab through cudarc.
    Cuda { ordinal: usize },
    /// The host slab, and why the device was not used.
    HostFallback { reason: String },
}

impl std::fmt::Display for DeviceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceBackend::Cuda { ordinal } => write!(f, "GPU memory (cuda:{ordinal})"),
            DeviceBackend::HostFallback { reason } => write!(f, "host memory ({reason})"),
        }
    }
}

/// G1's store: a device slab when the `cuda` feature is on and a driver and device are present,
/// otherwise a host slab. Never panics on a machine without a driver.
pub fn device_store(
    capacity_blocks: usize,
    block_bytes: usize,
) -> Result<(Box<dyn BlockStore>, DeviceBackend), StorageError> {
    #[cfg(feature = "cuda")]
    let fallback = match cuda::DeviceSlab::open(0, capacity_blocks, block_bytes) {
        Ok(slab) => return Ok((Box::new(slab), DeviceBackend::Cuda { ordinal: 0 })),
        Err(error) => error.to_string(),
    };
    #[cfg(not(feature = "cuda"))]
    let fallback = String::from(NO_CUDA_FEATURE);
    let slab = HostSlab::new(capacity_blocks, block_bytes)?;
    Ok((
        Box::new(slab),
        DeviceBackend::HostFallback { reason: fallback },
    ))
}

/// How G2's bytes are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostBackend {
    /// Host memory pinned for device `ordinal` through cudarc.
    Pinned { ordinal: usize },
    /// Pageable host memory, and why it is not pinned.
    Pageable { reason: String },
}

impl std::fmt::Display for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostBackend::Pinned { ordinal } => write!(f, "pinned for cuda:{ordinal}"),
            HostBackend::Pageable { reason } => write!(f, "pageable ({reason})"),
        }
    }
}

/// G2's store: a host slab pinned for device 0 when the `cuda` feature is on and a driver and
/// device are present (device copies are then DMA), otherwise pageable. Never panics on a
/// machine without a driver.
pub fn host_store(
    capacity_blocks: usize,
    block_bytes: usize,
) -> Result<(HostSlab, HostBackend), StorageError> {
    #[cfg(feature = "cuda")]
    let fallback = match HostSlab::pinned(0, capacity_blocks, block_bytes) {
        Ok(slab) => return Ok((slab, HostBackend::Pinned { ordinal: 0 })),
        Err(error) => error.to_string(),
    };
    #[cfg(not(feature = "cuda"))]
    let fallback = String::from(NO_CUDA_FEATURE);
    let slab = HostSlab::new(capacity_blocks, block_bytes)?;
    Ok((slab, HostBackend::Pageable { reason: fallback }))
}

#[cfg(not(feature = "cuda"))]
const NO_CUDA_FEATURE: &str = "built without the `cuda` feature";

#[cfg(test)]
mod tests;
