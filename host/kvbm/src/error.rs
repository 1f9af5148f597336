//! The crate's one error type. Bad input and exhausted resources are values, never panics.

use crate::types::{SequenceHash, Tier};

/// Everything the block manager and its storage can refuse.
#[derive(Debug, thiserror::Error)]
pub enum KvbmError {
    /// A tier is smaller than the one above it: it would only churn.
    #[error(
        "tier {tier} has {blocks} blocks, fewer than the {above_blocks} of tier {above} above it \
         (each tier must hold at least as many blocks as the one above)"
    )]
    TierSmallerThanAbove {
        tier: Tier,
        blocks: usize,
        above: Tier,
        above_blocks: usize,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// Not enough reset or evictable blocks for an allocation.
    #[error("tier {tier}: {requested} blocks requested, only {available} could be freed")]
    OutOfBlocks {
        tier: Tier,
        requested: usize,
        available: usize,
    },
    /// A tier that is not configured was named.
    #[error("tier {tier} is not configured")]
    TierNotConfigured { tier: Tier },
    /// A retention priority above 100.
    #[error("retention priority {priority} is out of range 0..=100")]
    PriorityOutOfRange { priority: u8 },
    /// A token range whose end is before its start.
    #[error("token range {start}..{end} is empty or reversed")]
    BadTokenRange { start: u64, end: u64 },
    /// A tier's byte store does not fit its pool.
    #[error("tier {tier}: store does not fit the configuration: {reason}")]
    StoreMismatch { tier: Tier, reason: String },
    /// A transfer batch was committed to a manager it did not come from.
    #[error("transfer batch belongs to another block manager")]
    ForeignBatch,
    /// Storage I/O failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Failures of the byte storage behind a tier.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The slot is beyond the storage's capacity.
    #[error("slot {slot} is beyond the capacity of {capacity} blocks")]
    SlotOutOfRange { slot: u32, capacity: usize },
    /// A buffer of the wrong size was passed.
    #[error("buffer of {got} bytes for blocks of {expected} bytes")]
    WrongBlockSize { expected: usize, got: usize },
    /// The block is not there, or is not the block asked for.
    #[error("block {hash} is not stored")]
    Miss { hash: SequenceHash },
    /// The block was there but failed its checksum, or was truncated: treated as a miss.
    #[error("block {hash} failed its checksum or was truncated")]
    Corrupt { hash: SequenceHash },
    /// The disk is full (or over its configured budget): the write was skipped.
    #[error("disk tier is full: write of block {hash} skipped")]
    DiskFull { hash: SequenceHash },
    /// Every slot is in use: nothing could be evicted for the write.
    #[error("no room for block {hash}: every slot is in use")]
    NoRoom { hash: SequenceHash },
    /// The device could not be used.
    #[error("device unavailable: {reason}")]
    DeviceUnavailable { reason: String },
    /// Any other I/O failure.
    #[error("storage I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl StorageError {
    /// Whether this failure means "not served from this tier" (recompute or look lower), as
    /// opposed to a bug in the caller.
    pub fn is_miss(&self) -> bool {
        matches!(
            self,
            StorageError::Miss { .. } | StorageError::Corrupt { .. }
        )
    }
}
