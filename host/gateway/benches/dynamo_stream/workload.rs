//! Reader of the `DYNWL001` event stream (format documented in
//! the dynamo-anchor harness README, section 1): our own decoder, no dependency on the
//! anchor crate.
//!
//! ```text
//! "DYNWL001" | header_len u32 | header JSON | records until EOF, all little-endian:
//!   tag u8 | timestamp_us u64 | worker u32 | payload
//!   1 Query   n u32, n x local_hash u64
//!   2 Stored  event_id u64, flags u8 (bit0 parent, bit1 start), parent u64, start u32,
//!             n u32, n x (block_hash u64, tokens_hash u64)
//!   3 Removed event_id u64, n u32, n x block_hash u64
//!   4 Cleared event_id u64
//! ```
//!
//! The file is one zstd frame with a 2^27 window; it is decompressed by the `zstd` command
//! (`-dc --long=31`) so the workspace needs no zstd crate. A path not ending in `.zst` is read raw.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use switchyard_core::hash::LocalBlockHash;
use switchyard_kv_events::wire::EngineHash;

/// One replayable operation, decoded before any clock starts.
#[derive(Debug)]
pub(crate) enum Op {
    /// A request's local block hashes, answered over every worker.
    Query(Vec<LocalBlockHash>),
    /// `worker` stored a chain continuing after `parent` (engine hash, local hash per block).
    Stored {
        worker: u32,
        parent: Option<EngineHash>,
        blocks: Vec<(EngineHash, LocalBlockHash)>,
    },
    /// `worker` evicted these engine hashes.
    Removed {
        worker: u32,
        blocks: Vec<EngineHash>,
    },
    /// `worker` dropped everything.
    Cleared { worker: u32 },
}

/// Counts in the anchor's `Totals` shape.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    pub(crate) queries: u64,
    pub(crate) query_blocks: u64,
    pub(crate) stored_events: u64,
    pub(crate) stored_blocks: u64,
    pub(crate) removed_events: u64,
    pub(crate) removed_blocks: u64,
    pub(crate) cleared_events: u64,
}

impl Totals {
    /// Query hashes + stored blocks + removed blocks (Dynamo's completion-correct denominator).
    pub(crate) fn block_ops(&self) -> u64 {
        self.query_blocks + self.stored_blocks + self.removed_blocks
    }

    /// Requests + events.
    pub(crate) fn logical_ops(&self) -> u64 {
        self.queries + self.stored_events + self.removed_events + self.cleared_events
    }

    pub(crate) fn json(&self) -> String {
        format!(
            "{{\"queries\":{},\"query_blocks\":{},\"stored_events\":{},\"stored_blocks\":{},\
             \"removed_events\":{},\"removed_blocks\":{},\"cleared_events\":{}}}",
            self.queries,
            self.query_blocks,
            self.stored_events,
            self.stored_blocks,
            self.removed_events,
            self.removed_blocks,
            self.cleared_events
        )
    }
}

/// Totals of a (truncated) op list.
pub(crate) fn totals(ops: &[Op]) -> Totals {
    let mut t = Totals::default();
    for op in ops {
        match op {
            Op::Query(hashes) => {
                t.queries += 1;
                t.query_blocks += hashes.len() as u64;
            }
            Op::Stored { blocks, .. } => {
                t.stored_events += 1;
                t.stored_blocks += blocks.len() as u64;
            }
            Op::Removed { blocks, .. } => {
                t.removed_events += 1;
                t.removed_blocks += blocks.len() as u64;
            }
            Op::Cleared { .. } => t.cleared_events += 1,
        }
    }
    t
}

/// A decoded stream.
#[derive(Debug)]
pub(crate) struct Workload {
    pub(crate) block_size: u32,
    pub(crate) workers: u32,
    pub(crate) ops: Vec<Op>,
    pub(crate) totals: Totals,
}

/// Decompress and decode `path`.
pub(crate) fn read(path: &Path) -> Result<Workload, String> {
    let raw = if path.extension().is_some_and(|e| e == "zst") {
        let mut child = Command::new("zstd")
            .args(["-dc", "--long=31"])
            .arg(path)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run zstd: {e}"))?;
        let mut raw = Vec::new();
        child
            .stdout
            .take()
            .ok_or("zstd has no stdout")?
            .read_to_end(&mut raw)
            .map_err(|e| format!("read zstd output: {e}"))?;
        let status = child.wait().map_err(|e| format!("wait for zstd: {e}"))?;
        if !status.success() {
            return Err(format!("zstd -dc {} failed: {status}", path.display()));
        }
        raw
    } else {
        std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?
    };
    decode(&raw)
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos + n;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| format!("truncated stream at byte {}", self.pos))?;
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// A top-level unsigned integer field of the JSON header (the header is flat enough for this).
fn header_u32(header: &str, key: &str) -> Option<u32> {
    let at = header.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = header[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

fn decode(raw: &[u8]) -> Result<Workload, String> {
    let mut c = Cursor { buf: raw, pos: 0 };
    if c.take(8)? != b"DYNWL001" {
        return Err("bad magic (expected DYNWL001)".into());
    }
    let len = c.u32()? as usize;
    let header = String::from_utf8_lossy(c.take(len)?).into_owned();
    let block_size = header_u32(&header, "block_size").ok_or("header has no block_size")?;
    let workers = header_u32(&header, "num_workers").ok_or("header has no num_workers")?;
    let mut ops = Vec::new();
    let mut t = Totals::default();
    while c.pos < raw.len() {
        let tag = c.u8()?;
        let _timestamp_us = c.u64()?;
        let worker = c.u32()?;
        let op = match tag {
            1 => {
                let n = c.u32()? as usize;
                let hashes = (0..n)
                    .map(|_| c.u64().map(LocalBlockHash))
                    .collect::<Result<Vec<_>, _>>()?;
                t.queries += 1;
                t.query_blocks += n as u64;
                Op::Query(hashes)
            }
            2 => {
                let _event_id = c.u64()?;
                let flags = c.u8()?;
                let parent = c.u64()?;
                let _start = c.u32()?;
                let n = c.u32()? as usize;
                let mut blocks = Vec::with_capacity(n);
                for _ in 0..n {
                    let engine = EngineHash(c.u64()?);
                    blocks.push((engine, LocalBlockHash(c.u64()?)));
                }
                t.stored_events += 1;
                t.stored_blocks += n as u64;
                Op::Stored {
                    worker,
                    parent: (flags & 1 != 0).then_some(EngineHash(parent)),
                    blocks,
                }
            }
            3 => {
                let _event_id = c.u64()?;
                let n = c.u32()? as usize;
                let blocks = (0..n)
                    .map(|_| c.u64().map(EngineHash))
                    .collect::<Result<Vec<_>, _>>()?;
                t.removed_events += 1;
                t.removed_blocks += n as u64;
                Op::Removed { worker, blocks }
            }
            4 => {
                let _event_id = c.u64()?;
                t.cleared_events += 1;
                Op::Cleared { worker }
            }
            other => return Err(format!("unknown record tag {other} at byte {}", c.pos - 13)),
        };
        ops.push(op);
    }
    Ok(Workload {
        block_size,
        workers,
        ops,
        totals: t,
    })
}
