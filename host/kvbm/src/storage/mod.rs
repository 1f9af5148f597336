//! Real bytes behind the tiers. The logic ([`crate::KvBlockManager`]) names slots; a
//! [`BlockStore`] holds the bytes of each slot; [`perform`] executes a [`TransferBatch`]
//! between stores, off the request path. This is the only module that does I/O.

mod disk;
mod slab;

#[cfg(feature = "cuda")]
mod cuda;

use std::fmt::Debug;

pub use disk::{DiskCounters, DiskStore};
pub use slab::HostSlab;

#[cfg(feature = "cuda")]
pub use cuda::DeviceSlab;

use crate::error::StorageError;
use crate::manager::TransferBatch;
use crate::types::{BlockId, SequenceHash, Tier};

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
}

/// G4: a pool shared by workers, keyed by sequence hash (the `kv-pool` service implements it
/// later; writes are idempotent: same hash, same bytes).
pub trait SharedPool: Debug + Send + Sync {
    /// Which of `hashes` the pool holds, in order.
    fn contains(&self, hashes: &[SequenceHash]) -> Vec<bool>;

    /// Store one block.
    fn put(&self, hash: SequenceHash, data: &[u8]) -> Result<(), StorageError>;

    /// Fetch one block into `out`.
    fn get(&self, hash: SequenceHash, out: &mut [u8]) -> Result<(), StorageError>;
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

/// Copy every transfer of `batch`: all reads into one staging buffer, then all writes, then
/// one flush per destination tier.
pub fn perform(batch: &TransferBatch, stores: &mut TierStores) -> Performed {
    let mut performed = Performed::default();
    let transfers = batch.transfers();
    let Some(first) = transfers.first() else {
        return performed;
    };
    let block_bytes = match stores.get_mut(first.dest().0) {
        Some(store) => store.block_bytes(),
        None => {
            performed.failed = transfers.iter().map(|t| t.hash()).collect();
            return performed;
        }
    };
    let mut staging = vec![0u8; block_bytes * transfers.len()];
    let mut read_ok = vec![false; transfers.len()];
    for (i, (transfer, chunk)) in transfers
        .iter()
        .zip(staging.chunks_exact_mut(block_bytes))
        .enumerate()
    {
        let (tier, slot) = transfer.source();
        let result = match stores.get_mut(tier) {
            Some(store) => store.read_block(slot, transfer.hash(), chunk),
            None => Err(StorageError::Miss {
                hash: transfer.hash(),
            }),
        };
        match result {
            Ok(()) => read_ok[i] = true,
            Err(StorageError::Corrupt { hash }) => performed.corrupt.push((tier, hash)),
            Err(_) => {}
        }
    }
    let mut dest_tiers = Vec::new();
    for (i, (transfer, chunk)) in transfers
        .iter()
        .zip(staging.chunks_exact(block_bytes))
        .enumerate()
    {
        if !read_ok[i] {
            performed.failed.push(transfer.hash());
            continue;
        }
        let (tier, slot) = transfer.dest();
        let result = match stores.get_mut(tier) {
            Some(store) => store.write_block(slot, transfer.hash(), chunk),
            None => Err(StorageError::Miss {
                hash: transfer.hash(),
            }),
        };
        match result {
            Ok(()) => {
                performed.bytes += block_bytes as u64;
                if !dest_tiers.contains(&tier) {
                    dest_tiers.push(tier);
                }
            }
            Err(error) => {
                if matches!(error, StorageError::DiskFull { .. }) {
                    performed.disk_full += 1;
                }
                performed.failed.push(transfer.hash());
            }
        }
    }
    for tier in dest_tiers {
        if let Some(store) = stores.get_mut(tier)
            && store.flush().is_err()
        {
            // A failed flush means none of this tier's writes can be trusted.
            for transfer in transfers.iter().filter(|t| t.dest().0 == tier) {
                if !performed.failed.contains(&transfer.hash()) {
                    performed.failed.push(transfer.hash());
                    performed.bytes = performed.bytes.saturating_sub(block_bytes as u64);
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
    let fallback = String::from("built without the `cuda` feature");
    let slab = HostSlab::new(capacity_blocks, block_bytes)?;
    Ok((
        Box::new(slab),
        DeviceBackend::HostFallback { reason: fallback },
    ))
}

#[cfg(test)]
mod tests;
