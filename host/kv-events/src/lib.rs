//! Engine KV cache events: how the gateway learns which blocks each rank holds.
//!
//! vLLM, SGLang and TensorRT-LLM publish every change to their KV cache over ZMQ
//! (engine-protocols.md section 1). This crate is the edge between those streams and the pure
//! [`switchyard_core::index::KvIndex`]:
//!
//! - [`wire`]: the msgpack payload, both of vLLM's encodings (pure), and
//!   [`wire::mooncake`], Mooncake Store master's events (what the shared KV pool publishes);
//! - [`ingest`]: one publisher's events turned into [`IndexOp`](switchyard_core::index::IndexOp)s
//!   in our own hash space, with sequence tracking (pure);
//! - [`subscriber`]: the ZMQ SUB driver that feeds an [`ingest::Ingestor`], replays lost
//!   messages and survives bad input and dropped connections;
//! - [`publisher`]: an engine-side PUB with a replay socket, for the mock engine, the KV pool and
//!   tests.
//!
//! ```
//! use switchyard_core::{hash::BlockHasher, index::{IndexOp, KvIndex}, worker::{Rank, Tier}};
//! use switchyard_kv_events::ingest::Ingestor;
//! use switchyard_kv_events::wire::{encode_batch, EngineHash, Encoding, EventBatch, KvEvent};
//!
//! let tokens: Vec<u32> = (0..32).collect();
//! let batch = EventBatch {
//!     ts: 0.0,
//!     events: vec![KvEvent::BlockStored {
//!         block_hashes: vec![EngineHash(7), EngineHash(8)],
//!         parent_block_hash: None,
//!         token_ids: tokens.clone(),
//!         block_size: 16,
//!         lora_id: None,
//!         lora_name: None,
//!         extra_keys: false,
//!         kv_cache_spec_kind: None,
//!         medium: None,
//!         group_idx: None,
//!     }],
//!     dp_rank: None,
//! };
//! let rank = Rank::new(0, 0);
//! let mut ingestor = Ingestor::new(rank, 16);
//! let mut index = KvIndex::new();
//! for op in ingestor.on_message(0, &encode_batch(&batch, Encoding::Array)).ops {
//!     index.apply(&op);
//! }
//! let ours = BlockHasher::new(16).sequence(&tokens);
//! assert!(index.contains(rank, Tier::Device, ours[1]));
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod ingest;
pub mod publisher;
pub mod subscriber;
pub mod wire;

use std::time::Duration;

/// A socket-level failure of the subscriber's replay request or of the publisher.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ZMQ socket failed (bind, connect, send or receive).
    #[error("zmq socket: {0}")]
    Socket(#[from] zeromq::ZmqError),
    /// The replay socket did not answer in time.
    #[error("replay socket did not answer within {0:?}")]
    ReplayTimeout(Duration),
    /// The replay socket answered something other than `[b"", seq, payload]`.
    #[error("replay answer is not [empty, sequence, payload]")]
    BadReplay,
    /// The publisher's socket task has stopped.
    #[error("publisher task has stopped")]
    PublisherClosed,
}
