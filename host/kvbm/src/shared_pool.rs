//! The G4 contract: a pool shared by workers, keyed by sequence hash. Only the trait lives here,
//! with the pure logic that consults it; [`crate::storage`] (feature `storage`) implements it.

use std::fmt::Debug;

use crate::error::StorageError;
use crate::types::SequenceHash;

/// G4: a pool shared by workers, keyed by sequence hash. Writes are idempotent (same hash, same
/// bytes). `storage::StorePool` (feature `storage`; `MemoryPool` over a host slab) is the
/// in-process implementation; the `switchyard-kv-pool` service serves its tiers over the network.
pub trait SharedPool: Debug + Send + Sync {
    /// Which of `hashes` the pool holds, in order.
    fn contains(&self, hashes: &[SequenceHash]) -> Vec<bool>;

    /// Store one block (`parent`: the block before it, so the pool can evict leaves first).
    fn put(
        &self,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
        data: &[u8],
    ) -> Result<(), StorageError>;

    /// Fetch one block into `out`.
    fn get(&self, hash: SequenceHash, out: &mut [u8]) -> Result<(), StorageError>;
}
