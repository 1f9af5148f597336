//! Batched copies between slabs: every copy of a batch is queued, then the batch is finished
//! once. Between a device slab and a host slab, the copies go on the device slab's stream and
//! the stream is synchronised once per batch, not once per block; with pinned host memory they
//! run as DMA while the next ones are queued. Between two host slabs, the same bookkeeping
//! copies with `copy_from_slice` (which is how it is tested without a GPU).

use std::ops::Range;

use super::{BlockCopy, BlockStore, HostSlab, slot_range};
use crate::error::StorageError;
use crate::types::SequenceHash;

/// A store that is one of the slabs the batched path drives. Returned by
/// [`super::BlockStore::slab`].
#[derive(Debug)]
pub enum SlabAccess<'a> {
    /// A host slab (pageable or pinned).
    Host(&'a mut HostSlab),
    /// A device slab.
    #[cfg(feature = "cuda")]
    Device(&'a mut super::DeviceSlab),
}

impl SlabAccess<'_> {
    /// Copy `copies` from `self` to `dest` as one batch. `None`: this pair has no batched path
    /// (two device slabs), copy block by block.
    pub(super) fn copy_to(
        self,
        dest: SlabAccess<'_>,
        copies: &[BlockCopy],
    ) -> Option<Vec<Result<(), StorageError>>> {
        match (self, dest) {
            (SlabAccess::Host(source), SlabAccess::Host(dest)) => {
                Some(host_to_host(source, dest, copies))
            }
            #[cfg(feature = "cuda")]
            (SlabAccess::Device(source), SlabAccess::Host(dest)) => {
                Some(source.copy_to_host(dest, copies))
            }
            #[cfg(feature = "cuda")]
            (SlabAccess::Host(source), SlabAccess::Device(dest)) => {
                Some(dest.copy_from_host(source, copies))
            }
            #[cfg(feature = "cuda")]
            (SlabAccess::Device(_), SlabAccess::Device(_)) => None,
        }
    }
}

fn host_to_host(
    source: &HostSlab,
    dest: &mut HostSlab,
    copies: &[BlockCopy],
) -> Vec<Result<(), StorageError>> {
    let block_bytes = (source.block_bytes(), dest.block_bytes());
    let (from_bytes, from_holds) = match source.parts() {
        Ok(parts) => parts,
        Err(error) => return all_failed(copies, &error),
    };
    let (to_bytes, to_holds) = match dest.parts_mut() {
        Ok(parts) => parts,
        Err(error) => return all_failed(copies, &error),
    };
    copy_batch(
        from_holds,
        to_holds,
        block_bytes,
        copies,
        |from, to| {
            to_bytes[to].copy_from_slice(&from_bytes[from]);
            Ok(())
        },
        || Ok(()),
    )
}

/// Every copy failed with `error`.
pub(super) fn all_failed(
    copies: &[BlockCopy],
    error: &StorageError,
) -> Vec<Result<(), StorageError>> {
    copies.iter().map(|_| Err(super::repeat(error))).collect()
}

/// The bookkeeping of one batch, apart from how bytes move. Each copy is checked (slots in
/// range, the source slot holds the block), its destination slot stops claiming its old block,
/// and `enqueue` queues the bytes (source range, destination range). Then `finish` runs once
/// (a stream synchronisation), and only if it succeeds do the destination slots claim their new
/// blocks: a failed finish fails every copy of the batch. `block_bytes` is (source, dest).
pub(super) fn copy_batch(
    source_holds: &[Option<SequenceHash>],
    dest_holds: &mut [Option<SequenceHash>],
    block_bytes: (usize, usize),
    copies: &[BlockCopy],
    mut enqueue: impl FnMut(Range<usize>, Range<usize>) -> Result<(), StorageError>,
    finish: impl FnOnce() -> Result<(), StorageError>,
) -> Vec<Result<(), StorageError>> {
    let (source_bytes, dest_bytes) = block_bytes;
    if source_bytes != dest_bytes {
        let error = StorageError::WrongBlockSize {
            expected: dest_bytes,
            got: source_bytes,
        };
        return all_failed(copies, &error);
    }
    // Per copy: whether it touched its destination slot, and its result so far.
    let mut outcomes: Vec<(bool, Result<(), StorageError>)> = copies
        .iter()
        .map(|copy| {
            let ranges = slot_range(copy.from, source_holds.len(), source_bytes).and_then(|from| {
                let to = slot_range(copy.to, dest_holds.len(), dest_bytes)?;
                if source_holds[copy.from.index()] == Some(copy.hash) {
                    Ok((from, to))
                } else {
                    Err(StorageError::Miss { hash: copy.hash })
                }
            });
            match ranges {
                Ok((from, to)) => {
                    // The old bytes are being overwritten: never serve them again.
                    dest_holds[copy.to.index()] = None;
                    (true, enqueue(from, to))
                }
                Err(error) => (false, Err(error)),
            }
        })
        .collect();
    if let Err(error) = finish() {
        super::fail_unfinished(outcomes.iter_mut().map(|(_, result)| result), &error);
    }
    // In batch order, so that when two copies write one slot the later one decides.
    for (copy, (touched, result)) in copies.iter().zip(&outcomes) {
        if *touched {
            dest_holds[copy.to.index()] = result.is_ok().then_some(copy.hash);
        }
    }
    outcomes.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::BlockId;

    fn copy(hash: u64, from: u32, to: u32) -> BlockCopy {
        BlockCopy {
            hash: SequenceHash(hash),
            from: BlockId(from),
            to: BlockId(to),
        }
    }

    type Queued = Vec<(Range<usize>, Range<usize>)>;

    /// A batch over two slot records, recording what was queued instead of moving bytes.
    fn run(
        source_holds: &[Option<SequenceHash>],
        dest_holds: &mut [Option<SequenceHash>],
        copies: &[BlockCopy],
        fail_enqueue_at: Option<usize>,
        finish: Result<(), StorageError>,
    ) -> (Queued, Vec<Result<(), StorageError>>) {
        let mut queued = Vec::new();
        let mut finished = 0;
        let results = copy_batch(
            source_holds,
            dest_holds,
            (4, 4),
            copies,
            |from, to| {
                if Some(queued.len()) == fail_enqueue_at {
                    return Err(StorageError::DeviceUnavailable {
                        reason: "enqueue".into(),
                    });
                }
                queued.push((from, to));
                Ok(())
            },
            || {
                finished += 1;
                finish
            },
        );
        assert_eq!(finished, 1, "a batch finishes exactly once");
        (queued, results)
    }

    #[test]
    fn a_batch_checks_each_copy_and_claims_slots_after_finishing() {
        let source = [Some(SequenceHash(1)), Some(SequenceHash(2)), None];
        let mut dest = [Some(SequenceHash(9)); 3];
        let copies = [copy(1, 0, 2), copy(2, 1, 0), copy(3, 2, 1), copy(1, 0, 7)];
        let (queued, results) = run(&source, &mut dest, &copies, None, Ok(()));
        assert_eq!(queued, vec![(0..4, 8..12), (4..8, 0..4)]);
        assert!(results[0].is_ok() && results[1].is_ok());
        assert!(matches!(results[2], Err(StorageError::Miss { .. })));
        assert!(matches!(
            results[3],
            Err(StorageError::SlotOutOfRange { .. })
        ));
        // Slot 1 was not touched (its copy missed): it still holds its block.
        assert_eq!(
            dest,
            [
                Some(SequenceHash(2)),
                Some(SequenceHash(9)),
                Some(SequenceHash(1))
            ]
        );
    }

    #[test]
    fn a_failed_finish_fails_the_batch_and_empties_its_slots() {
        let source = [Some(SequenceHash(1)), Some(SequenceHash(2))];
        let mut dest = [Some(SequenceHash(9)); 2];
        let failed = Err(StorageError::DeviceUnavailable {
            reason: "sync".into(),
        });
        let (_, results) = run(&source, &mut dest, &[copy(1, 0, 0)], None, failed);
        assert!(matches!(
            &results[0],
            Err(StorageError::DeviceUnavailable { reason }) if reason.contains("sync")
        ));
        assert_eq!(dest, [None, Some(SequenceHash(9))]);
    }

    #[test]
    fn a_failed_enqueue_leaves_its_slot_empty_even_after_an_earlier_copy_to_it() {
        let source = [Some(SequenceHash(1)), Some(SequenceHash(2))];
        let mut dest = [None; 2];
        let copies = [copy(1, 0, 1), copy(2, 1, 1)];
        let (_, results) = run(&source, &mut dest, &copies, Some(1), Ok(()));
        assert!(results[0].is_ok() && results[1].is_err());
        // The second copy may have written part of slot 1: it holds neither block.
        assert_eq!(dest, [None, None]);
    }

    #[test]
    fn different_block_sizes_fail_every_copy() {
        let results = copy_batch(
            &[Some(SequenceHash(1))],
            &mut [None],
            (4, 8),
            &[copy(1, 0, 0)],
            |_, _| Ok(()),
            || Ok(()),
        );
        assert!(matches!(
            results[0],
            Err(StorageError::WrongBlockSize {
                expected: 8,
                got: 4
            })
        ));
    }

    #[test]
    fn host_slabs_copy_through_the_batch() -> Result<(), StorageError> {
        let mut source = HostSlab::new(2, 4)?;
        let mut dest = HostSlab::new(2, 4)?;
        source.write_block(BlockId(1), SequenceHash(5), &[1, 2, 3, 4])?;
        let results = super::super::copy_between(&mut source, &mut dest, &[copy(5, 1, 0)]);
        assert!(results.iter().all(Result::is_ok));
        let mut out = [0; 4];
        dest.read_block(BlockId(0), SequenceHash(5), &mut out)?;
        assert_eq!(out, [1, 2, 3, 4]);
        Ok(())
    }
}
