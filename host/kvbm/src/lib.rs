//! Switchyard's KV block manager (KVBM).
pub mod error;
pub mod eviction;
pub mod pool;
pub mod retention;
pub mod sketch;
pub mod types;

pub use error::{KvbmError, StorageError};
