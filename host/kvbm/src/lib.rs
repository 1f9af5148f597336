//! Switchyard's KV block manager (KVBM): keeps agent sessions' KV alive across tiers while
//! their tools run, so the next turn loads it instead of re-prefilling.
//!
//! Layers, pure first:
//!
//! - [`pool`]: one tier's slots and the type-state handles that own them
//!   (`MutableBlock` -> `CompleteBlock` -> `ImmutableBlock`, shared by refcount, `WeakBlock`),
//!   the registry that dedups by sequence hash, and allocation that reports what it evicted.
//! - [`eviction`]: ephemeral first, an O(1) LRU for untagged blocks, (priority, age) with lazy
//!   decay for tagged ones; only leaves are candidates, so a prefix never dies before its suffix.
//! - [`retention`]: priority 0..=100 with a duration (token ranges map to every block they
//!   touch), ephemeral blocks, bounded pins whose overflow is clipped.
//! - [`manager`]: G1 device, G2 host, G3 disk; write-through in batches with per-edge admission
//!   filters, onboarding on a hit, prefetch with a grace, bypass of tiers slower than recompute;
//!   tier events in vLLM's shape. [`config`] enforces the sizing rule.
//! - [`storage`]: the only I/O. Host slab (pinned with the feature `cuda` and a device),
//!   checksummed disk tier, the device slab (feature `cuda`), the G4 trait, and
//!   [`storage::perform`] to execute a batch (copies between slabs in batches).
//!
//! The logic never reads a clock ([`Tick`] is passed in) and never touches bytes: it returns
//! [`TransferBatch`]es that the caller performs off the request path, then commits.
//! This crate does not depend on tokio, axum, wasmtime or reqwest. Without its default feature
//! `storage` it is the logic alone, with no I/O at all: that is how `switchyard-core`'s engine
//! model uses it for its lower tiers.
//!
//! ```
//! use switchyard_kvbm::retention::Retention;
//! use switchyard_kvbm::storage::{HostSlab, TierStores, perform};
//! use switchyard_kvbm::{KvBlockManager, ManagerConfig, OffloadBudget, SequenceHash, Tick, TierConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = ManagerConfig::new(16, 4096, 2); // 16 tokens, 4 KiB per block, 2 in G1
//! config.host = Some(TierConfig::blocks(8));
//! let mut manager = KvBlockManager::new(config)?;
//! let mut stores = TierStores {
//!     device: Some(Box::new(HostSlab::new(2, 4096)?)),
//!     host: Some(Box::new(HostSlab::new(8, 4096)?)),
//!     disk: None,
//! };
//!
//! // The engine computes two blocks: fill, complete, register.
//! let hashes = [SequenceHash(1), SequenceHash(2)];
//! let mut parent = None;
//! let mut budget = OffloadBudget::unlimited();
//! for (block, hash) in manager.allocate(2, Tick(0))?.into_iter().zip(hashes) {
//!     stores.device.as_mut().map(|d| d.write_block(block.id(), hash, &[7; 4096]));
//!     manager.register(block.complete(hash, parent), Retention::DEFAULT, &mut budget, Tick(0))?;
//!     parent = Some(hash);
//! }
//!
//! // Off the request path: write through to G2.
//! while let Some(batch) = manager.plan_offload(Tick(1))? {
//!     let done = perform(&batch, &mut stores);
//!     manager.commit(batch, &done.failed, Tick(1))?;
//! }
//!
//! // Another request takes G1; the first prefix is then found in G2 and onboarded.
//! drop(manager.allocate(2, Tick(2))?);
//! let found = manager.lookup(&hashes, Tick(3));
//! assert_eq!(found.lower.len(), 2);
//! let batch = manager.onboard(found.lower, Tick(3))?;
//! let done = perform(&batch, &mut stores);
//! let prefix = manager.commit(batch, &done.failed, Tick(3))?.blocks;
//! assert_eq!(prefix.len(), 2);
//! assert_eq!(manager.metrics().onboard_blocks_h2d, 2);
//! # Ok(())
//! # }
//! ```

pub mod config;
pub mod error;
pub mod eviction;
pub mod manager;
pub mod metrics;
pub mod pool;
pub mod retention;
pub mod shared_pool;
pub mod sketch;
#[cfg(feature = "storage")]
pub mod storage;
pub mod types;

pub use config::{ManagerConfig, TierConfig};
pub use error::{KvbmError, StorageError};
pub use manager::{
    KvBlockManager, OffloadBudget, PoolFetch, TierEvent, TransferBatch, TransferKind,
};
pub use metrics::KvbmMetrics;
pub use types::{BlockId, SequenceHash, Tick, Tier};
