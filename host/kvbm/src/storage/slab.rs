//! A host-memory slab: one allocation carved into contiguous block regions by offset. The bytes
//! are pageable (a `Vec<u8>`) or, with the `cuda` feature and a device present, pinned through
//! cudarc so that device copies run as DMA without a staging copy. The slot bookkeeping is the
//! same for both.

use crate::error::StorageError;
use crate::storage::BlockStore;
use crate::types::{BlockId, SequenceHash};

/// The memory a host slab carves its blocks from.
enum Memory {
    Pageable(Vec<u8>),
    #[cfg(feature = "cuda")]
    Pinned(super::cuda::PinnedMemory),
}

impl Memory {
    fn bytes(&self) -> Result<&[u8], StorageError> {
        match self {
            Memory::Pageable(bytes) => Ok(bytes),
            #[cfg(feature = "cuda")]
            Memory::Pinned(pinned) => pinned.bytes(),
        }
    }

    fn bytes_mut(&mut self) -> Result<&mut [u8], StorageError> {
        match self {
            Memory::Pageable(bytes) => Ok(bytes),
            #[cfg(feature = "cuda")]
            Memory::Pinned(pinned) => pinned.bytes_mut(),
        }
    }
}

/// Block regions carved from one host allocation.
pub struct HostSlab {
    memory: Memory,
    block_bytes: usize,
    /// Which block each slot holds, so a stale slot is a miss.
    holds: Vec<Option<SequenceHash>>,
}

impl std::fmt::Debug for HostSlab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlab")
            .field("pinned", &self.is_pinned())
            .field("block_bytes", &self.block_bytes)
            .field("capacity_blocks", &self.holds.len())
            .finish_non_exhaustive()
    }
}

/// Bytes of a slab of `capacity_blocks` blocks of `block_bytes`, which must not be zero.
fn slab_bytes(capacity_blocks: usize, block_bytes: usize) -> Result<usize, StorageError> {
    capacity_blocks
        .checked_mul(block_bytes)
        .filter(|total| *total > 0)
        .ok_or(StorageError::WrongBlockSize {
            expected: block_bytes,
            got: 0,
        })
}

impl HostSlab {
    /// `capacity_blocks` regions of `block_bytes` of pageable memory, zeroed.
    pub fn new(capacity_blocks: usize, block_bytes: usize) -> Result<HostSlab, StorageError> {
        let total = slab_bytes(capacity_blocks, block_bytes)?;
        Ok(HostSlab {
            memory: Memory::Pageable(vec![0; total]),
            block_bytes,
            holds: vec![None; capacity_blocks],
        })
    }

    /// `capacity_blocks` regions of `block_bytes` of memory pinned for device `ordinal`,
    /// zeroed; `DeviceUnavailable` (never a panic) without a driver or device.
    /// [`crate::storage::host_store`] falls back to pageable memory.
    #[cfg(feature = "cuda")]
    pub fn pinned(
        ordinal: usize,
        capacity_blocks: usize,
        block_bytes: usize,
    ) -> Result<HostSlab, StorageError> {
        let total = slab_bytes(capacity_blocks, block_bytes)?;
        Ok(HostSlab {
            memory: Memory::Pinned(super::cuda::PinnedMemory::alloc(ordinal, total)?),
            block_bytes,
            holds: vec![None; capacity_blocks],
        })
    }

    /// Whether the bytes are pinned host memory (device copies from and to it are DMA).
    pub fn is_pinned(&self) -> bool {
        match self.memory {
            Memory::Pageable(_) => false,
            #[cfg(feature = "cuda")]
            Memory::Pinned(_) => true,
        }
    }

    fn range(&self, slot: BlockId) -> Result<std::ops::Range<usize>, StorageError> {
        super::slot_range(slot, self.holds.len(), self.block_bytes)
    }

    /// The bytes of `slot`, whatever it holds.
    pub fn block(&self, slot: BlockId) -> Result<&[u8], StorageError> {
        let range = self.range(slot)?;
        Ok(&self.memory.bytes()?[range])
    }

    /// All the bytes and the slot records at once, for a batch that borrows both for its whole
    /// run (see `storage::batch`).
    pub(super) fn parts_mut(
        &mut self,
    ) -> Result<(&mut [u8], &mut [Option<SequenceHash>]), StorageError> {
        Ok((self.memory.bytes_mut()?, &mut self.holds))
    }

    /// The bytes and the slot records, read-only.
    pub(super) fn parts(&self) -> Result<(&[u8], &[Option<SequenceHash>]), StorageError> {
        Ok((self.memory.bytes()?, &self.holds))
    }

    /// Copy many blocks between two slabs of the same block size, `(from, to)` slot pairs.
    pub fn copy_from(
        &mut self,
        source: &HostSlab,
        pairs: &[(BlockId, BlockId)],
    ) -> Result<(), StorageError> {
        if source.block_bytes != self.block_bytes {
            return Err(StorageError::WrongBlockSize {
                expected: self.block_bytes,
                got: source.block_bytes,
            });
        }
        let source_bytes = source.memory.bytes()?;
        for &(from, to) in pairs {
            let src = source.range(from)?;
            let dst = self.range(to)?;
            self.memory.bytes_mut()?[dst].copy_from_slice(&source_bytes[src]);
            self.holds[to.index()] = source.holds[from.index()];
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<(), StorageError> {
        super::check_block_len(self.block_bytes, len)
    }
}

impl BlockStore for HostSlab {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn capacity_blocks(&self) -> usize {
        self.holds.len()
    }

    fn write_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.check_len(data.len())?;
        let range = self.range(slot)?;
        self.memory.bytes_mut()?[range].copy_from_slice(data);
        self.holds[slot.index()] = Some(hash);
        Ok(())
    }

    fn read_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        out: &mut [u8],
    ) -> Result<(), StorageError> {
        self.check_len(out.len())?;
        let range = self.range(slot)?;
        if self.holds[slot.index()] != Some(hash) {
            return Err(StorageError::Miss { hash });
        }
        out.copy_from_slice(&self.memory.bytes()?[range]);
        Ok(())
    }

    fn read_in_place(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        use_bytes: &mut dyn FnMut(&[u8]) -> Result<(), StorageError>,
    ) -> Option<Result<(), StorageError>> {
        let result = self.range(slot).and_then(|range| {
            if self.holds[slot.index()] != Some(hash) {
                return Err(StorageError::Miss { hash });
            }
            use_bytes(&self.memory.bytes()?[range])
        });
        Some(result)
    }

    fn write_in_place(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<(), StorageError>,
    ) -> Option<Result<(), StorageError>> {
        let result = self.range(slot).and_then(|range| {
            // Half-written bytes must never be read as the old block, nor as the new one.
            self.holds[slot.index()] = None;
            fill(&mut self.memory.bytes_mut()?[range])?;
            self.holds[slot.index()] = Some(hash);
            Ok(())
        });
        Some(result)
    }

    fn slab(&mut self) -> Option<super::SlabAccess<'_>> {
        Some(super::SlabAccess::Host(self))
    }
}
