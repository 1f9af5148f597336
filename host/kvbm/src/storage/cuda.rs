//! G1 as one device slab through cudarc (feature `cuda`, driver loaded at run time). Blocks are
//! regions of one `CudaSlice<u8>` addressed by offset: every `CudaSlice` carries two tracking
//! events, so one slab per tier, never one allocation per block.
//!
//! Detection follows the traps of cudarc 0.19: with no driver, `device_count()` and
//! `CudaContext::new` panic instead of returning `Err`, and a missing symbol in an old driver
//! panics too. So: look for the library first, then count devices, then create the context, the
//! last two inside `catch_unwind`. A machine without a driver gets an error, never a panic, and
//! the caller falls back to the host slab.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use crate::error::StorageError;
use crate::storage::BlockStore;
use crate::types::{BlockId, SequenceHash};

/// Whether the CUDA driver library can be loaded.
#[allow(
    unsafe_code,
    reason = "cudarc exposes the driver-library probe only as an unsafe fn"
)]
fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by its usual names
    // and drops the handle; it touches no memory of ours. Loading libcuda runs its initializers,
    // which is what every use of the driver API does anyway.
    let probe = catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
    probe.unwrap_or(false)
}

fn unavailable(reason: impl Into<String>) -> StorageError {
    StorageError::DeviceUnavailable {
        reason: reason.into(),
    }
}

/// Block regions carved from one device allocation.
pub struct DeviceSlab {
    ordinal: usize,
    stream: Arc<CudaStream>,
    slab: CudaSlice<u8>,
    block_bytes: usize,
    holds: Vec<Option<SequenceHash>>,
}

impl std::fmt::Debug for DeviceSlab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSlab")
            .field("ordinal", &self.ordinal)
            .field("block_bytes", &self.block_bytes)
            .field("capacity_blocks", &self.holds.len())
            .finish_non_exhaustive()
    }
}

impl DeviceSlab {
    /// A slab of `capacity_blocks` blocks on device `ordinal`, or why not.
    pub fn open(
        ordinal: usize,
        capacity_blocks: usize,
        block_bytes: usize,
    ) -> Result<DeviceSlab, StorageError> {
        let total = capacity_blocks
            .checked_mul(block_bytes)
            .filter(|total| *total > 0)
            .ok_or_else(|| unavailable("zero-sized or overflowing slab"))?;
        if !driver_present() {
            return Err(unavailable("no CUDA driver library"));
        }
        let count = catch_unwind(CudaContext::device_count)
            .map_err(|_| unavailable("the driver panicked counting devices"))?
            .map_err(|e| unavailable(format!("counting devices: {e:?}")))?;
        if usize::try_from(count).unwrap_or(0) <= ordinal {
            return Err(unavailable(format!("{count} devices, none at {ordinal}")));
        }
        let context = catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| unavailable("the driver panicked creating a context"))?
            .map_err(|e| unavailable(format!("creating a context: {e:?}")))?;
        let stream = context.default_stream();
        let slab = catch_unwind(AssertUnwindSafe(|| stream.alloc_zeros::<u8>(total)))
            .map_err(|_| unavailable("the driver panicked allocating the slab"))?
            .map_err(|e| unavailable(format!("allocating {total} bytes: {e:?}")))?;
        Ok(DeviceSlab {
            ordinal,
            stream,
            slab,
            block_bytes,
            holds: vec![None; capacity_blocks],
        })
    }

    fn range(&self, slot: BlockId, len: usize) -> Result<std::ops::Range<usize>, StorageError> {
        let range = super::slot_range(slot, self.holds.len(), self.block_bytes)?;
        super::check_block_len(self.block_bytes, len)?;
        Ok(range)
    }
}

impl BlockStore for DeviceSlab {
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
        let range = self.range(slot, data.len())?;
        let mut view = self.slab.slice_mut(range);
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(|e| unavailable(format!("host to device copy: {e:?}")))?;
        self.holds[slot.index()] = Some(hash);
        Ok(())
    }

    fn read_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        out: &mut [u8],
    ) -> Result<(), StorageError> {
        let range = self.range(slot, out.len())?;
        if self.holds[slot.index()] != Some(hash) {
            return Err(StorageError::Miss { hash });
        }
        let view = self.slab.slice(range);
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(|e| unavailable(format!("device to host copy: {e:?}")))?;
        // The copy is queued on the stream: `out` is only valid once it has run.
        self.stream
            .synchronize()
            .map_err(|e| unavailable(format!("synchronize: {e:?}")))?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StorageError> {
        self.stream
            .synchronize()
            .map_err(|e| unavailable(format!("synchronize: {e:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // On a machine with a GPU this opens it; either way it must return.
        match DeviceSlab::open(0, 4, 1024) {
            Ok(mut slab) => {
                let data = vec![7u8; 1024];
                let mut out = vec![0u8; 1024];
                assert!(slab.write_block(BlockId(1), SequenceHash(3), &data).is_ok());
                assert!(
                    slab.read_block(BlockId(1), SequenceHash(3), &mut out)
                        .is_ok()
                );
                assert_eq!(out, data);
            }
            Err(error) => assert!(matches!(error, StorageError::DeviceUnavailable { .. })),
        }
        assert!(DeviceSlab::open(usize::MAX, 4, 1024).is_err());
    }
}
