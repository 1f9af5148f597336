//! Switchyard's shared KV pool (G4): a standalone service that engines write their KV blocks
//! through to and read back from, keyed by the engines' own sequence hashes.
//!
//! - [`protocol`]: the versioned wire format (`/v1/...`; JSON hash lists, binary block frames);
//! - [`client`]: [`PoolClient`], the async client engines use (reqwest only);
//! - with the default `server` feature: [`store`] (a memory tier and an optional disk tier,
//!   both kvbm block pools: bounded, retention-ordered and leaf-first, checksummed on disk),
//!   [`server`] (axum: auth, bounds, the one error shape, `/metrics`, `/health`) and [`events`]
//!   (every store and removal as Mooncake Store master events on ZMQ, with replay).
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_kv_pool::PoolError> {
//! use switchyard_kv_pool::{PoolClient, PutBlock};
//! let pool = PoolClient::new("http://127.0.0.1:9400", 4096)?;
//! let block = PutBlock {
//!     hash: 7,
//!     parent: None,
//!     token_ids: Vec::new(),
//!     retention: None,
//!     bytes: vec![0u8; 4096].into(),
//! };
//! pool.put(&[block]).await?;
//! assert_eq!(pool.exists(&[7, 8]).await?, vec![true, false]);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod protocol;

#[cfg(feature = "server")]
pub mod events;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod store;

pub use client::{PoolClient, PoolError};
pub use protocol::{PutBlock, PutResult, PutRetention, PutSummary};
// The client's TLS settings, so that engines need no TLS crate of their own.
pub use switchyard_tls::{ClientIdentity, ClientTls};

#[cfg(feature = "server")]
pub use server::{PoolService, ServeError, ServiceConfig, spawn};
#[cfg(feature = "server")]
pub use store::{DiskConfig, Pool, PoolConfig, PoolTier};
