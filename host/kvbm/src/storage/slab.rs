//! A host-memory slab: one allocation carved into contiguous block regions by offset (safe
//! Rust: a `Vec<u8>`, offset arithmetic and `copy_from_slice`).

use crate::error::StorageError;
use crate::storage::BlockStore;
use crate::types::{BlockId, SequenceHash};

/// Block regions carved from one host allocation.
#[derive(Debug)]
pub struct HostSlab {
    bytes: Vec<u8>,
    block_bytes: usize,
    /// Which block each slot holds, so a stale slot is a miss.
    holds: Vec<Option<SequenceHash>>,
}

impl HostSlab {
    /// `capacity_blocks` regions of `block_bytes`, zeroed.
    pub fn new(capacity_blocks: usize, block_bytes: usize) -> Result<HostSlab, StorageError> {
        let total = capacity_blocks
            .checked_mul(block_bytes)
            .filter(|total| *total > 0)
            .ok_or(StorageError::WrongBlockSize {
                expected: block_bytes,
                got: 0,
            })?;
        Ok(HostSlab {
            bytes: vec![0; total],
            block_bytes,
            holds: vec![None; capacity_blocks],
        })
    }

    fn range(&self, slot: BlockId) -> Result<std::ops::Range<usize>, StorageError> {
        super::slot_range(slot, self.holds.len(), self.block_bytes)
    }
    /// The bytes of `slot`, whatever it holds.
    pub fn block(&self, slot: BlockId) -> Result<&[u8], StorageError> {
        let range = self.range(slot)?;
        Ok(&self.bytes[range])
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
        for &(from, to) in pairs {
            let src = source.range(from)?;
            let dst = self.range(to)?;
            self.bytes[dst].copy_from_slice(&source.bytes[src]);
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
        self.bytes[range].copy_from_slice(data);
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
        out.copy_from_slice(&self.bytes[range]);
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
            use_bytes(&self.bytes[range])
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
            fill(&mut self.bytes[range])?;
            self.holds[slot.index()] = Some(hash);
            Ok(())
        });
        Some(result)
    }
}
