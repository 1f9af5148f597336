//! Switchyard's pure router core.
//!
//! Block hashing, the global KV index, predicted blocks, the router (cost, temperature, bookings,
//! the router queue), agent programs and session-aware admission, and the engine model shared by
//! the mock engine and the simulator. This crate does no I/O and
//! never reads a clock: time is passed in as a `Duration` since the driver's epoch. It must not
//! depend on tokio, axum, wasmtime or ZMQ; the gateway and the simulator drive the same code.
//!
//! ```
//! use switchyard_core::{hash::BlockHasher, index::{IndexOp, KvIndex}, worker::{Rank, Tier}};
//! use switchyard_core::router::{KvCost, RequestId, RouteRequest, Router, RouterConfig};
//! use std::time::Duration;
//!
//! let hasher = BlockHasher::new(16);
//! let prompt: Vec<u32> = (0..64).collect();
//! let hashes = hasher.sequence(&prompt);
//! let mut index = KvIndex::new();
//! let (rank, tier) = (Rank::new(1, 0), Tier::Device);
//! index.apply(&IndexOp::Store { rank, tier, blocks: hashes.clone(), locals: Vec::new() });
//!
//! let mut router = Router::new(RouterConfig::default(), Box::new(KvCost));
//! router.add_rank(Rank::new(0, 0), false);
//! router.add_rank(Rank::new(1, 0), false);
//! let request = RouteRequest { hashes: &hashes, tokens: 64, ..Default::default() };
//! let decision = router.route(RequestId(1), &request, &index, Duration::ZERO).unwrap();
//! assert_eq!(decision.rank, Rank::new(1, 0));
//! ```

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod admission;
pub mod engine;
pub mod hash;
pub mod index;
pub mod kv_hints;
pub mod predicted;
pub mod programs;
pub mod router;
pub mod worker;
