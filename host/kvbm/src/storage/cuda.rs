//! G1 as one device slab through cudarc (feature `cuda`, driver loaded at run time), and the
//! pinned host memory of G2. Blocks are regions of one `CudaSlice<u8>` addressed by offset:
//! every `CudaSlice` carries two tracking events, so one slab per tier, never one allocation per
//! block.
//!
//! Detection follows the traps of cudarc 0.19: with no driver, `device_count()` and
//! `CudaContext::new` panic instead of returning `Err`, and a missing symbol in an old driver
//! panics too. So: look for the library first, then count devices, then create the context, the
//! last two inside `catch_unwind`. A machine without a driver gets an error, never a panic, and
//! the caller falls back to the host slab (pageable, for G2).
//!
//! Copies between the device slab and a host slab go through the batch (`batch.rs`): all of a
//! batch's copies are queued on the slab's stream, and the stream is synchronised once. The
//! batch borrows both slabs until that synchronisation, so no queued copy outlives the
//! borrow of the bytes it reads or writes, which is what makes the asynchronous copies from and
//! to pinned memory sound.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PinnedHostSlice};

use crate::error::StorageError;
use crate::storage::{BlockCopy, BlockStore, HostSlab, SlabAccess, batch};
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

/// The (primary) context of device `ordinal`, or why not; never panics.
fn context(ordinal: usize) -> Result<Arc<CudaContext>, StorageError> {
    if !driver_present() {
        return Err(unavailable("no CUDA driver library"));
    }
    let count = catch_unwind(CudaContext::device_count)
        .map_err(|_| unavailable("the driver panicked counting devices"))?
        .map_err(|e| unavailable(format!("counting devices: {e:?}")))?;
    if usize::try_from(count).unwrap_or(0) <= ordinal {
        return Err(unavailable(format!("{count} devices, none at {ordinal}")));
    }
    catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| unavailable("the driver panicked creating a context"))?
        .map_err(|e| unavailable(format!("creating a context: {e:?}")))
}

/// Page-locked host memory from the driver: the bytes of a pinned [`HostSlab`].
#[derive(Debug)]
pub(super) struct PinnedMemory(PinnedHostSlice<u8>);

impl PinnedMemory {
    /// `len` zeroed bytes pinned for device `ordinal`, or why not.
    pub(super) fn alloc(ordinal: usize, len: usize) -> Result<PinnedMemory, StorageError> {
        let context = context(ordinal)?;
        let memory = catch_unwind(AssertUnwindSafe(|| alloc_pinned_zeroed(&context, len)))
            .map_err(|_| unavailable("the driver panicked allocating pinned memory"))?
            .map_err(|e| unavailable(format!("pinning {len} host bytes: {e:?}")))?;
        Ok(PinnedMemory(memory))
    }

    // cudarc waits for the copies it tracked on this allocation before handing out the bytes.
    // It tracks none here (the batch passes sub-slices and synchronises itself), so this waits
    // for nothing and fails only with a broken context.
    pub(super) fn bytes(&self) -> Result<&[u8], StorageError> {
        self.0
            .as_slice()
            .map_err(|e| unavailable(format!("pinned memory: {e:?}")))
    }

    pub(super) fn bytes_mut(&mut self) -> Result<&mut [u8], StorageError> {
        self.0
            .as_mut_slice()
            .map_err(|e| unavailable(format!("pinned memory: {e:?}")))
    }
}

/// `len` bytes of pinned host memory, zeroed. The flags: not write-combined (cudarc's
/// `alloc_pinned` default), because the CPU reads these bytes (to disk, to the pool) and
/// write-combined memory is slow to read; portable, so that every context counts it as pinned,
/// not only the one that allocated it.
#[allow(
    unsafe_code,
    reason = "cudarc's pinned allocation is an unsafe fn (the memory is uninitialised), and it \
              is initialised through a raw pointer before any reference to it exists"
)]
fn alloc_pinned_zeroed(
    context: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<u8>, cudarc::driver::DriverError> {
    let flags = cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: the only hazard is that the bytes are uninitialised; nothing reads them before
    // they are zeroed just below.
    let mut memory = unsafe { context.alloc_pinned_with_flags::<u8>(len, flags) }?;
    let start = memory.as_mut_ptr()?;
    // SAFETY: `start` is the start of the `len` bytes just allocated, valid for writes, owned
    // by `memory` alone, and no copy uses them yet.
    unsafe { std::ptr::write_bytes(start, 0, len) };
    Ok(memory)
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
        let context = context(ordinal)?;
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

    /// The name of the device, as the driver gives it.
    pub fn device_name(&self) -> Result<String, StorageError> {
        self.stream
            .context()
            .name()
            .map_err(|e| unavailable(format!("device name: {e:?}")))
    }

    /// Copy blocks from this slab into `host`: one batch on the stream, one synchronisation.
    pub(super) fn copy_to_host(
        &mut self,
        host: &mut HostSlab,
        copies: &[BlockCopy],
    ) -> Vec<Result<(), StorageError>> {
        let block_bytes = (self.block_bytes, host.block_bytes());
        let (bytes, host_holds) = match host.parts_mut() {
            Ok(parts) => parts,
            Err(error) => return batch::all_failed(copies, &error),
        };
        let DeviceSlab {
            stream,
            slab,
            holds,
            ..
        } = self;
        let _guard = SyncOnUnwind(stream);
        batch::copy_batch(
            holds,
            host_holds,
            block_bytes,
            copies,
            |from: Range<usize>, to: Range<usize>| {
                stream
                    .memcpy_dtoh(&slab.slice(from), &mut bytes[to])
                    .map_err(|e| unavailable(format!("device to host copy: {e:?}")))
            },
            || synchronize(stream),
        )
    }

    /// Copy blocks from `host` into this slab: one batch on the stream, one synchronisation.
    pub(super) fn copy_from_host(
        &mut self,
        host: &HostSlab,
        copies: &[BlockCopy],
    ) -> Vec<Result<(), StorageError>> {
        let block_bytes = (host.block_bytes(), self.block_bytes);
        let (bytes, host_holds) = match host.parts() {
            Ok(parts) => parts,
            Err(error) => return batch::all_failed(copies, &error),
        };
        let DeviceSlab {
            stream,
            slab,
            holds,
            ..
        } = self;
        let _guard = SyncOnUnwind(stream);
        batch::copy_batch(
            host_holds,
            holds,
            block_bytes,
            copies,
            |from: Range<usize>, to: Range<usize>| {
                stream
                    .memcpy_htod(&bytes[from], &mut slab.slice_mut(to))
                    .map_err(|e| unavailable(format!("host to device copy: {e:?}")))
            },
            || synchronize(stream),
        )
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
        self.holds[slot.index()] = None;
        let mut view = self.slab.slice_mut(range);
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(|e| unavailable(format!("host to device copy: {e:?}")))?;
        // `data` may be pinned (lent by a pinned slab's `read_in_place`): then the copy is
        // asynchronous and must be done before the borrow ends. Batches do not come here.
        synchronize(&self.stream)?;
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
        synchronize(&self.stream)
    }

    fn flush(&mut self) -> Result<(), StorageError> {
        synchronize(&self.stream)
    }

    fn slab(&mut self) -> Option<SlabAccess<'_>> {
        Some(SlabAccess::Device(self))
    }
}

fn synchronize(stream: &CudaStream) -> Result<(), StorageError> {
    stream
        .synchronize()
        .map_err(|e| unavailable(format!("synchronize: {e:?}")))
}

/// Synchronises the stream if a batch unwinds, so that no queued copy outlives the borrow of
/// its host bytes even then.
struct SyncOnUnwind<'a>(&'a CudaStream);

impl Drop for SyncOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{HostBackend, copy_between, host_store};

    // These run everywhere. Without a driver they check the fallbacks (an error or a pageable
    // slab, never a panic); on a machine with a GPU (scripts/gpu-check.sh) they move bytes.
    // There the script sets KVBM_REQUIRE_GPU, and a fallback fails the test instead.

    /// No device, and `why`: fine, unless the GPU check requires one.
    fn no_device(why: &dyn std::fmt::Display) {
        assert!(
            std::env::var_os("KVBM_REQUIRE_GPU").is_none(),
            "KVBM_REQUIRE_GPU is set, but: {why}"
        );
    }

    fn is_unavailable(error: &StorageError) -> bool {
        matches!(error, StorageError::DeviceUnavailable { .. })
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
            .collect()
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match DeviceSlab::open(0, 4, 1024) {
            Ok(mut slab) => {
                let data = pattern(7, 1024);
                let mut out = vec![0u8; 1024];
                assert!(slab.write_block(BlockId(1), SequenceHash(3), &data).is_ok());
                assert!(
                    slab.read_block(BlockId(1), SequenceHash(3), &mut out)
                        .is_ok()
                );
                assert_eq!(out, data);
                assert!(matches!(
                    slab.read_block(BlockId(1), SequenceHash(4), &mut out),
                    Err(StorageError::Miss { .. })
                ));
            }
            Err(error) => {
                no_device(&error);
                assert!(is_unavailable(&error));
            }
        }
        assert!(DeviceSlab::open(usize::MAX, 4, 1024).is_err());
    }

    #[test]
    fn pinned_host_memory_or_a_reason() -> Result<(), StorageError> {
        match HostSlab::pinned(0, 4, 1024) {
            Ok(mut slab) => {
                assert!(slab.is_pinned());
                assert_eq!(slab.block(BlockId(3))?, vec![0; 1024].as_slice());
                let data = pattern(2, 1024);
                slab.write_block(BlockId(3), SequenceHash(8), &data)?;
                let mut out = vec![0; 1024];
                slab.read_block(BlockId(3), SequenceHash(8), &mut out)?;
                assert_eq!(out, data);
            }
            Err(error) => {
                no_device(&error);
                assert!(is_unavailable(&error));
            }
        }
        assert!(HostSlab::pinned(usize::MAX, 4, 1024).is_err());
        assert!(HostSlab::pinned(0, 0, 1024).is_err());
        let (slab, backend) = host_store(4, 1024)?;
        match backend {
            HostBackend::Pinned { ordinal } => assert!(ordinal == 0 && slab.is_pinned()),
            HostBackend::Pageable { reason } => {
                no_device(&reason);
                assert!(!slab.is_pinned());
                assert!(reason.contains("device unavailable"), "{reason}");
            }
        }
        assert_eq!(slab.capacity_blocks(), 4);
        Ok(())
    }

    /// Host -> device -> host through `copy_between` (the batch), with pageable and with pinned
    /// host slabs: every byte comes back, a missing block fails alone, slots claim their blocks.
    #[test]
    fn batches_between_device_and_host_round_trip() -> Result<(), StorageError> {
        const BLOCK: usize = 4096;
        let mut device = match DeviceSlab::open(0, 8, BLOCK) {
            Ok(device) => device,
            // No device: nothing to copy to (the fallback is tested above).
            Err(error) if is_unavailable(&error) => {
                no_device(&error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        // Up from `host`, back down into `back`: pageable both ways, then pinned both ways.
        let pairs = [
            (HostSlab::new(8, BLOCK)?, HostSlab::new(8, BLOCK)?),
            (
                HostSlab::pinned(0, 8, BLOCK)?,
                HostSlab::pinned(0, 8, BLOCK)?,
            ),
        ];
        for (round, (mut host, mut back)) in pairs.into_iter().enumerate() {
            let seed = u8::try_from(round).unwrap_or(0) * 50;
            for slot in 0..8u32 {
                let data = pattern(seed + slot as u8, BLOCK);
                host.write_block(BlockId(slot), SequenceHash(slot.into()), &data)?;
            }
            let up: Vec<BlockCopy> = (0..8u32)
                .map(|slot| BlockCopy {
                    hash: SequenceHash(slot.into()),
                    from: BlockId(slot),
                    to: BlockId(7 - slot),
                })
                .collect();
            assert!(
                copy_between(&mut host, &mut device, &up)
                    .iter()
                    .all(Result::is_ok)
            );
            let mut down: Vec<BlockCopy> = up
                .iter()
                .map(|copy| BlockCopy {
                    from: copy.to,
                    to: copy.from,
                    ..*copy
                })
                .collect();
            down.push(BlockCopy {
                hash: SequenceHash(99),
                from: BlockId(0),
                to: BlockId(0),
            });
            let results = copy_between(&mut device, &mut back, &down);
            assert!(results[..8].iter().all(Result::is_ok));
            assert!(matches!(results[8], Err(StorageError::Miss { .. })));
            for slot in 0..8u32 {
                let mut out = vec![0; BLOCK];
                back.read_block(BlockId(slot), SequenceHash(slot.into()), &mut out)?;
                assert_eq!(
                    out,
                    pattern(seed + slot as u8, BLOCK),
                    "host {round}, slot {slot}"
                );
            }
        }
        Ok(())
    }
}
