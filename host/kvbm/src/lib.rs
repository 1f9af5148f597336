//! Switchyard's KV block manager (KVBM).
pub mod config;
pub mod error;
pub mod eviction;
pub mod manager;
pub mod metrics;
pub mod pool;
pub mod retention;
pub mod sketch;
pub mod storage;
pub mod types;

pub use config::{ManagerConfig, TierConfig};
pub use error::{KvbmError, StorageError};
pub use manager::{KvBlockManager, OffloadBudget, TierEvent, TransferBatch, TransferKind};
pub use types::{BlockId, SequenceHash, Tick, Tier};
