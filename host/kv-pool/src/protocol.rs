//! The wire protocol, shared by the service and the client (docs/kvbm.md, "kv-pool").
//!
//! Every call is under `/v1/`, and may repeat the version in an `x-kv-pool-version: 1` header
//! (the client does). Hash lists travel as JSON (`u64` numbers); block bytes travel
//! binary (`application/octet-stream`), in a frame whose small header repeats the protocol
//! version and the pool's block size, so a reader never guesses a length:
//!
//! ```text
//! put body     = "SYKP" version:u16 reserved:u16 block_bytes:u32 count:u32, then per block:
//!                hash:u64 parent:u64 duration_ms:u64 n_tokens:u32 flags:u8 priority:u8
//!                reserved:u16, n_tokens x u32 token ids, block_bytes bytes
//!                (flags: 1 parent present, 2 priority present, 4 duration present)
//! get response = "SYKG" version:u16 reserved:u16 block_bytes:u32 count:u32,
//!                count x u8 (1 present, 0 missing), then the present blocks' bytes in order
//! ```
//!
//! All integers are little-endian. Errors are JSON: `{"error": {"type", "message"}}`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The protocol versions this build speaks.
pub const VERSIONS: &[&str] = &["v1"];
/// The header naming the version too (optional; checked when present, the client always sends
/// it), so a proxy that rewrites paths cannot silently change the dialect.
pub const VERSION_HEADER: &str = "x-kv-pool-version";
/// The one version of the frames.
pub const FRAME_VERSION: u16 = 1;
/// Magic of a put body.
pub const PUT_MAGIC: [u8; 4] = *b"SYKP";
/// Magic of a get response.
pub const GET_MAGIC: [u8; 4] = *b"SYKG";
/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 16;
/// Bytes of one put entry's fixed part.
pub const ENTRY_BYTES: usize = 32;
/// Token ids one block may carry: far above any block size in use, low enough to bound a body.
pub const MAX_TOKENS_PER_BLOCK: usize = 4096;
/// The content type of frames.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// `POST /v1/exists` and `POST /v1/get` bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashesRequest {
    /// Sequence hashes, in the caller's order.
    pub hashes: Vec<u64>,
    /// `get` only: the block size the caller expects (checked against the pool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_bytes: Option<u64>,
}

/// `POST /v1/exists` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistsResponse {
    /// One per requested hash.
    pub present: Vec<bool>,
}

/// What each block of a put became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PutResult {
    /// Written to the pool.
    Stored,
    /// Already there: touched, its retention merged.
    Duplicate,
}

/// `POST /v1/put` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutSummary {
    /// Blocks written.
    pub stored: u32,
    /// Blocks already present.
    pub duplicates: u32,
    /// One per block, in order.
    pub results: Vec<PutResult>,
}

/// `GET /v1/info` answer: what a client must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    /// Versions spoken.
    pub versions: Vec<String>,
    /// Bytes of every block.
    pub block_bytes: u64,
    /// Memory tier capacity.
    pub memory_blocks: u64,
    /// Disk tier capacity (0: none).
    pub disk_blocks: u64,
    /// Most blocks in one put or get.
    pub max_batch_blocks: u64,
    /// Most hashes in one exists.
    pub max_exists_hashes: u64,
}

/// The one error shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable machine-readable kind (`wrong_block_size`, `unsupported_version`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// For people.
    pub message: String,
    /// `unsupported_version` only: the versions that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supported: Option<Vec<String>>,
}

/// A block's retention in a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutRetention {
    /// 0..=100, lower is evicted first (35 is an untagged block's).
    pub priority: u8,
    /// How long the priority holds before it decays to the default (`None`: for good).
    pub duration_ms: Option<u64>,
}

/// One block of a put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutBlock {
    /// Its sequence hash.
    pub hash: u64,
    /// The block before it (the pool evicts leaves first).
    pub parent: Option<u64>,
    /// Its tokens, if the writer has them (they go into the store events).
    pub token_ids: Vec<u32>,
    /// Its retention (`None`: untagged).
    pub retention: Option<PutRetention>,
    /// Exactly one block of bytes.
    pub bytes: Bytes,
}

/// A frame that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not our magic.
    #[error("frame does not start with {expected:?}")]
    BadMagic {
        /// The magic expected.
        expected: &'static str,
    },
    /// Another frame version.
    #[error("frame version {got} is not supported (supported: {FRAME_VERSION})")]
    UnsupportedVersion {
        /// The version sent.
        got: u16,
    },
    /// Blocks of another size than the pool's.
    #[error("blocks of {got} bytes sent to a pool of {expected}-byte blocks")]
    WrongBlockSize {
        /// The pool's.
        expected: u64,
        /// The frame's.
        got: u64,
    },
    /// The frame ends early or has bytes after its last block.
    #[error("frame is {got} bytes, its header says {expected}")]
    BadLength {
        /// What the header implies (so far).
        expected: u64,
        /// What arrived.
        got: u64,
    },
    /// A block carries more tokens than any block could hold.
    #[error("block {index} carries {tokens} token ids, more than {MAX_TOKENS_PER_BLOCK}")]
    TooManyTokens {
        /// Its position in the frame.
        index: usize,
        /// How many.
        tokens: usize,
    },
    /// A priority above 100.
    #[error("block {index} has priority {priority}, above 100")]
    BadPriority {
        /// Its position in the frame.
        index: usize,
        /// The priority sent.
        priority: u8,
    },
    /// A block's bytes are not one block.
    #[error("block {index} has {got} bytes, the frame's blocks are {expected}")]
    BlockLength {
        /// Its position.
        index: usize,
        /// The frame's block size.
        expected: u64,
        /// Its length.
        got: u64,
    },
    /// More blocks than one frame may carry.
    #[error("{got} blocks in one batch, at most {max}")]
    TooManyBlocks {
        /// The bound.
        max: usize,
        /// The count sent.
        got: usize,
    },
}

const HAS_PARENT: u8 = 1;
const HAS_PRIORITY: u8 = 2;
const HAS_DURATION: u8 = 4;

fn header(magic: [u8; 4], block_bytes: u32, count: u32, out: &mut BytesMut) {
    out.put_slice(&magic);
    out.put_u16_le(FRAME_VERSION);
    out.put_u16_le(0);
    out.put_u32_le(block_bytes);
    out.put_u32_le(count);
}

/// Read a header: `(block_bytes, count)`.
fn read_header(
    frame: &mut Bytes,
    magic: [u8; 4],
    expected_block_bytes: Option<u64>,
) -> Result<(u64, usize), FrameError> {
    if frame.len() < HEADER_BYTES {
        return Err(FrameError::BadLength {
            expected: HEADER_BYTES as u64,
            got: frame.len() as u64,
        });
    }
    if frame[..4] != magic {
        return Err(FrameError::BadMagic {
            expected: if magic == PUT_MAGIC { "SYKP" } else { "SYKG" },
        });
    }
    frame.advance(4);
    let version = frame.get_u16_le();
    if version != FRAME_VERSION {
        return Err(FrameError::UnsupportedVersion { got: version });
    }
    frame.advance(2);
    let block_bytes = u64::from(frame.get_u32_le());
    let count = frame.get_u32_le() as usize;
    if let Some(expected) = expected_block_bytes
        && expected != block_bytes
    {
        return Err(FrameError::WrongBlockSize {
            expected,
            got: block_bytes,
        });
    }
    Ok((block_bytes, count))
}

/// Encode a put body. Every block must be `block_bytes` long and carry at most
/// [`MAX_TOKENS_PER_BLOCK`] tokens.
pub fn encode_put(blocks: &[PutBlock], block_bytes: u32) -> Result<Bytes, FrameError> {
    let tokens: usize = blocks.iter().map(|b| b.token_ids.len()).sum();
    let mut out = BytesMut::with_capacity(
        HEADER_BYTES + blocks.len() * (ENTRY_BYTES + block_bytes as usize) + tokens * 4,
    );
    header(PUT_MAGIC, block_bytes, blocks.len() as u32, &mut out);
    for (index, block) in blocks.iter().enumerate() {
        if block.bytes.len() as u64 != u64::from(block_bytes) {
            return Err(FrameError::BlockLength {
                index,
                expected: block_bytes.into(),
                got: block.bytes.len() as u64,
            });
        }
        if block.token_ids.len() > MAX_TOKENS_PER_BLOCK {
            return Err(FrameError::TooManyTokens {
                index,
                tokens: block.token_ids.len(),
            });
        }
        let mut flags = 0;
        if block.parent.is_some() {
            flags |= HAS_PARENT;
        }
        let (priority, duration) = match block.retention {
            Some(r) => {
                flags |= HAS_PRIORITY;
                if r.duration_ms.is_some() {
                    flags |= HAS_DURATION;
                }
                (r.priority, r.duration_ms.unwrap_or(0))
            }
            None => (0, 0),
        };
        out.put_u64_le(block.hash);
        out.put_u64_le(block.parent.unwrap_or(0));
        out.put_u64_le(duration);
        out.put_u32_le(block.token_ids.len() as u32);
        out.put_u8(flags);
        out.put_u8(priority);
        out.put_u16_le(0);
        for &token in &block.token_ids {
            out.put_u32_le(token);
        }
        out.put_slice(&block.bytes);
    }
    Ok(out.freeze())
}

/// Decode a put body for a pool of `block_bytes` blocks taking at most `max_blocks` per batch.
/// The blocks' bytes are slices of `frame` (no copy).
pub fn decode_put(
    mut frame: Bytes,
    block_bytes: u64,
    max_blocks: usize,
) -> Result<Vec<PutBlock>, FrameError> {
    let total = frame.len() as u64;
    let (block_bytes, count) = read_header(&mut frame, PUT_MAGIC, Some(block_bytes))?;
    if count > max_blocks {
        return Err(FrameError::TooManyBlocks {
            max: max_blocks,
            got: count,
        });
    }
    let short = |needed: usize, frame: &Bytes| FrameError::BadLength {
        expected: total - frame.len() as u64 + needed as u64,
        got: total,
    };
    let mut blocks = Vec::with_capacity(count);
    for index in 0..count {
        if frame.len() < ENTRY_BYTES {
            return Err(short(ENTRY_BYTES, &frame));
        }
        let hash = frame.get_u64_le();
        let parent = frame.get_u64_le();
        let duration = frame.get_u64_le();
        let tokens = frame.get_u32_le() as usize;
        let flags = frame.get_u8();
        let priority = frame.get_u8();
        frame.advance(2);
        if tokens > MAX_TOKENS_PER_BLOCK {
            return Err(FrameError::TooManyTokens { index, tokens });
        }
        if flags & HAS_PRIORITY != 0 && priority > 100 {
            return Err(FrameError::BadPriority { index, priority });
        }
        let needed = tokens * 4 + block_bytes as usize;
        if frame.len() < needed {
            return Err(short(needed, &frame));
        }
        let token_ids = (0..tokens).map(|_| frame.get_u32_le()).collect();
        let bytes = frame.split_to(block_bytes as usize);
        blocks.push(PutBlock {
            hash,
            parent: (flags & HAS_PARENT != 0).then_some(parent),
            token_ids,
            retention: (flags & HAS_PRIORITY != 0).then_some(PutRetention {
                priority,
                duration_ms: (flags & HAS_DURATION != 0).then_some(duration),
            }),
            bytes,
        });
    }
    if !frame.is_empty() {
        return Err(FrameError::BadLength {
            expected: total - frame.len() as u64,
            got: total,
        });
    }
    Ok(blocks)
}

/// Encode a get response: `blocks[i]` is the i-th requested block, if present.
pub fn encode_get(blocks: &[Option<Bytes>], block_bytes: u32) -> Bytes {
    let present = blocks.iter().flatten().count();
    let mut out =
        BytesMut::with_capacity(HEADER_BYTES + blocks.len() + present * block_bytes as usize);
    header(GET_MAGIC, block_bytes, blocks.len() as u32, &mut out);
    for block in blocks {
        out.put_u8(u8::from(block.is_some()));
    }
    for block in blocks.iter().flatten() {
        out.put_slice(block);
    }
    out.freeze()
}

/// Decode a get response of `expected` blocks of `block_bytes` (slices of `frame`, no copy).
pub fn decode_get(
    mut frame: Bytes,
    block_bytes: u64,
    expected: usize,
) -> Result<Vec<Option<Bytes>>, FrameError> {
    let total = frame.len() as u64;
    let (block_bytes, count) = read_header(&mut frame, GET_MAGIC, Some(block_bytes))?;
    if count != expected {
        return Err(FrameError::TooManyBlocks {
            max: expected,
            got: count,
        });
    }
    if frame.len() < count {
        return Err(FrameError::BadLength {
            expected: (HEADER_BYTES + count) as u64,
            got: total,
        });
    }
    let flags = frame.split_to(count);
    let present = flags.iter().filter(|&&f| f != 0).count() as u64;
    let body = present * block_bytes;
    if frame.len() as u64 != body {
        return Err(FrameError::BadLength {
            expected: (HEADER_BYTES + count) as u64 + body,
            got: total,
        });
    }
    Ok(flags
        .iter()
        .map(|&f| (f != 0).then(|| frame.split_to(block_bytes as usize)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(hash: u64, fill: u8, len: usize) -> PutBlock {
        PutBlock {
            hash,
            parent: hash.checked_sub(1),
            token_ids: vec![hash as u32; 4],
            retention: Some(PutRetention {
                priority: 80,
                duration_ms: Some(1_000),
            }),
            bytes: Bytes::from(vec![fill; len]),
        }
    }

    #[test]
    fn put_frames_check_size_length_and_version() -> Result<(), FrameError> {
        let frame = encode_put(&[block(1, 1, 8), block(2, 2, 8)], 8)?;
        assert_eq!(frame.len(), HEADER_BYTES + 2 * (ENTRY_BYTES + 16 + 8));
        assert_eq!(
            decode_put(frame.clone(), 8, 4)?,
            vec![block(1, 1, 8), block(2, 2, 8)]
        );
        assert_eq!(
            decode_put(frame.clone(), 16, 4),
            Err(FrameError::WrongBlockSize {
                expected: 16,
                got: 8
            })
        );
        assert!(matches!(
            decode_put(frame.slice(..frame.len() - 1), 8, 4),
            Err(FrameError::BadLength { .. })
        ));
        assert_eq!(
            decode_put(frame.clone(), 8, 1),
            Err(FrameError::TooManyBlocks { max: 1, got: 2 })
        );
        let mut other = frame.to_vec();
        other[4] = 9;
        assert_eq!(
            decode_put(other.into(), 8, 4),
            Err(FrameError::UnsupportedVersion { got: 9 })
        );
        assert!(matches!(
            encode_put(&[block(1, 1, 7)], 8),
            Err(FrameError::BlockLength { got: 7, .. })
        ));
        Ok(())
    }

    #[test]
    fn get_frames_say_which_are_missing() -> Result<(), FrameError> {
        let blocks = vec![
            Some(Bytes::from_static(&[1; 4])),
            None,
            Some(Bytes::from_static(&[3; 4])),
        ];
        let frame = encode_get(&blocks, 4);
        assert_eq!(decode_get(frame.clone(), 4, 3)?, blocks);
        assert!(decode_get(frame.clone(), 8, 3).is_err());
        assert!(decode_get(frame.slice(..frame.len() - 2), 4, 3).is_err());
        Ok(())
    }

    proptest! {
        #[test]
        fn put_round_trips(
            entries in prop::collection::vec(
                (any::<u64>(), prop::option::of(any::<u64>()), prop::collection::vec(any::<u32>(), 0..8),
                 prop::option::of((0u8..=100, prop::option::of(any::<u64>()))), any::<u8>()),
                0..6),
            block_bytes in 1u32..64,
        ) {
            let blocks: Vec<PutBlock> = entries.into_iter().map(|(hash, parent, token_ids, retention, fill)| PutBlock {
                hash, parent, token_ids,
                retention: retention.map(|(priority, duration_ms)| PutRetention { priority, duration_ms }),
                bytes: Bytes::from(vec![fill; block_bytes as usize]),
            }).collect();
            let frame = encode_put(&blocks, block_bytes).expect("encodes");
            prop_assert_eq!(decode_put(frame, block_bytes.into(), 16).expect("decodes"), blocks);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_put(Bytes::from(bytes.clone()), 8, 4);
            let _ = decode_get(Bytes::from(bytes), 8, 3);
        }
    }
}
