//! G3: blocks in one slot file under a directory. Each slot is a record at a fixed,
//! page-aligned stride: the payload first (so a block of whole pages is written as whole pages),
//! then a 64-byte trailer (magic, version, sequence hash, payload length, XXH3 checksum, and
//! what the block is: its parent and retention, so that a reopened store gives its chains back),
//! then the block's tokens where the stride's padding has room for them.
//! A torn, corrupt or truncated record is a miss and is counted; it is never served. Space is
//! accounted per written slot; when the disk (or the configured byte budget) is full, writes
//! are skipped until a probe write succeeds.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::error::StorageError;
use crate::retention::Retention;
use crate::storage::{BlockMeta, BlockStore};
use crate::types::{BlockId, SequenceHash};

const MAGIC: [u8; 4] = *b"SYKV";
/// Version 2 records keep the block's parent and retention; version 1 records (the hash
/// alone) are still read, and reopen as leaves with the default retention.
const VERSION: u16 = 2;
const VERSION_1: u16 = 1;
/// A version 1 trailer: magic, version, hash, length, checksum of hash and payload.
const TRAILER_V1_BYTES: usize = 32;
/// Version 2 adds the parent and the retention's flags and priority, under the checksum too,
/// and the count and checksum of the tokens that follow the trailer.
const TRAILER_BYTES: usize = 64;
const HAS_PARENT: u8 = 1;
const EPHEMERAL: u8 = 2;
const ALIGN: usize = 4096;
/// While full, one write in this many is attempted to see whether space came back.
const FULL_PROBE_EVERY: u64 = 64;
const FILE_NAME: &str = "blocks.kvb";

/// A record [`DiskStore::reopen`] found: the block, its slot and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedRecord {
    /// Its slot.
    pub slot: BlockId,
    /// The block.
    pub hash: SequenceHash,
    /// Its parent, retention and tokens as written (a version 1 record: none, the default and
    /// none; tokens that did not fit the record, or fail their checksum: none).
    pub meta: BlockMeta,
}

/// A record's trailer, decoded (its `meta` without the tokens, which follow it).
struct Trailer {
    version: u16,
    hash: SequenceHash,
    len: u64,
    checksum: u64,
    meta: BlockMeta,
    /// Tokens after the trailer, and their checksum.
    tokens: (u32, u64),
}

impl Trailer {
    /// The trailer of block `hash` holding `data`, and the tokens after it if `room` bytes
    /// hold both. A retention with an end is written as the default: its lease counts from a
    /// process that will be gone when the record is read.
    fn encode(hash: SequenceHash, meta: &BlockMeta, data: &[u8], room: usize) -> Vec<u8> {
        let retention = if meta.retention.until().is_some() {
            Retention::DEFAULT
        } else {
            meta.retention
        };
        let kept = BlockMeta {
            parent: meta.parent,
            retention,
            tokens: Vec::new(),
        };
        let tokens: &[u32] = if TRAILER_BYTES + 4 * meta.tokens.len() <= room {
            &meta.tokens
        } else {
            &[]
        };
        let (flags, priority) = Self::meta_bytes(&kept);
        let mut out = Vec::with_capacity(TRAILER_BYTES + 4 * tokens.len());
        out.resize(TRAILER_BYTES, 0);
        out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = flags;
        out[7] = priority;
        out[8..16].copy_from_slice(&hash.0.to_le_bytes());
        out[16..24].copy_from_slice(&(data.len() as u64).to_le_bytes());
        out[24..32].copy_from_slice(&Self::checksum_v2(hash, &kept, data).to_le_bytes());
        out[32..40].copy_from_slice(&kept.parent.map_or(0, |p| p.0).to_le_bytes());
        out[40..44].copy_from_slice(&(tokens.len() as u32).to_le_bytes());
        let tokens_checksum = xxh3_64(&out[TRAILER_BYTES..]);
        out[44..52].copy_from_slice(&tokens_checksum.to_le_bytes());
        out
    }

    /// `bytes`: a whole trailer, or only a version 1 trailer's worth (the last record of a
    /// version 1 file ends there). `None`: not one of ours.
    fn decode(bytes: &[u8]) -> Option<Trailer> {
        let field = |range: std::ops::Range<usize>| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[range]);
            u64::from_le_bytes(word)
        };
        if bytes.len() < TRAILER_V1_BYTES || bytes[0..4] != MAGIC {
            return None;
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let (meta, tokens) = match version {
            VERSION_1 => (BlockMeta::default(), (0, 0)),
            VERSION if bytes.len() >= TRAILER_BYTES => {
                let (flags, priority) = (bytes[6], bytes[7]);
                let retention = if flags & EPHEMERAL != 0 {
                    Retention::ephemeral()
                } else {
                    Retention::new(priority, None).ok()?
                };
                let meta = BlockMeta {
                    parent: (flags & HAS_PARENT != 0).then(|| SequenceHash(field(32..40))),
                    retention,
                    tokens: Vec::new(),
                };
                let count = u32::from_le_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]);
                (meta, (count, field(44..52)))
            }
            _ => return None,
        };
        Some(Trailer {
            version,
            hash: SequenceHash(field(8..16)),
            len: field(16..24),
            checksum: field(24..32),
            meta,
            tokens,
        })
    }

    /// Whether `payload` is what this trailer was written over.
    fn verifies(&self, payload: &[u8]) -> bool {
        self.len == payload.len() as u64
            && self.checksum
                == match self.version {
                    VERSION_1 => Self::checksum_v1(self.hash, payload),
                    _ => Self::checksum_v2(self.hash, &self.meta, payload),
                }
    }

    fn meta_bytes(meta: &BlockMeta) -> (u8, u8) {
        let mut flags = 0;
        if meta.parent.is_some() {
            flags |= HAS_PARENT;
        }
        if meta.retention.is_ephemeral() {
            flags |= EPHEMERAL;
        }
        (flags, meta.retention.priority())
    }

    fn checksum_v1(hash: SequenceHash, payload: &[u8]) -> u64 {
        let mut hasher = Xxh3::new();
        hasher.update(&hash.0.to_le_bytes());
        hasher.update(payload);
        hasher.digest()
    }

    fn checksum_v2(hash: SequenceHash, meta: &BlockMeta, payload: &[u8]) -> u64 {
        let (flags, priority) = Self::meta_bytes(meta);
        let mut hasher = Xxh3::new();
        hasher.update(&hash.0.to_le_bytes());
        hasher.update(&meta.parent.map_or(0, |p| p.0).to_le_bytes());
        hasher.update(&[flags, priority]);
        hasher.update(payload);
        hasher.digest()
    }
}

/// Read the trailer at `at`: a whole one, or a version 1 one where the file ends sooner.
fn read_trailer(file: &File, at: u64) -> std::io::Result<([u8; TRAILER_BYTES], usize)> {
    let mut bytes = [0u8; TRAILER_BYTES];
    match read_at(file, &mut bytes, at) {
        Ok(()) => Ok((bytes, TRAILER_BYTES)),
        Err(error) if error.kind() == ErrorKind::UnexpectedEof => {
            read_at(file, &mut bytes[..TRAILER_V1_BYTES], at)?;
            Ok((bytes, TRAILER_V1_BYTES))
        }
        Err(error) => Err(error),
    }
}

/// The disk tier's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Blocks written.
    pub writes: u64,
    /// Blocks read and verified.
    pub reads: u64,
    /// Reads whose record failed its checksum or was truncated.
    pub checksum_failures: u64,
    /// Writes skipped because the disk was full.
    pub writes_skipped_full: u64,
}

/// The G3 store.
#[derive(Debug)]
pub struct DiskStore {
    path: PathBuf,
    block_bytes: usize,
    capacity_blocks: usize,
    max_bytes: Option<u64>,
    written: Vec<bool>,
    used_bytes: u64,
    full: bool,
    skipped_since_full: u64,
    /// `reads` and `checksum_failures` are the reader's.
    counters: DiskCounters,
    reader: DiskReader,
}

/// Reads and verifies a [`DiskStore`]'s records without the store: any number at once, from
/// any thread (positional reads of a shared file), so that a caller that keeps the store under
/// a lock can read outside it. The caller makes sure the slot is not rewritten meanwhile (a
/// pool keeps the block in use); a record rewritten anyway fails its check, never reads as
/// another block.
#[derive(Debug, Clone)]
pub struct DiskReader {
    file: Arc<File>,
    block_bytes: usize,
    stride: u64,
    counts: Arc<ReadCounts>,
}

/// What the readers of one store counted.
#[derive(Debug, Default)]
struct ReadCounts {
    reads: AtomicU64,
    checksum_failures: AtomicU64,
}

impl DiskStore {
    /// A store of `capacity_blocks` blocks of `block_bytes` in `dir` (created if missing; an
    /// old slot file is discarded, since the logic starts empty). `max_bytes` caps the space
    /// used below what the disk has.
    pub fn open(
        dir: &Path,
        capacity_blocks: usize,
        block_bytes: usize,
        max_bytes: Option<u64>,
    ) -> Result<DiskStore, StorageError> {
        let file = Self::slot_file(dir, capacity_blocks, block_bytes, true)?;
        Ok(Self::over(
            dir,
            file,
            capacity_blocks,
            block_bytes,
            max_bytes,
        ))
    }

    /// Like [`open`](Self::open), but the records an earlier store left in `dir` are kept:
    /// each slot whose trailer names a block of this size (magic, version, length) is written,
    /// and returned with its hash, parent and retention (the first slot of a hash wins; its
    /// payload is verified when read, as always). Slots past `capacity_blocks` are cut off,
    /// and records past `max_bytes` are not kept.
    pub fn reopen(
        dir: &Path,
        capacity_blocks: usize,
        block_bytes: usize,
        max_bytes: Option<u64>,
    ) -> Result<(DiskStore, Vec<AdoptedRecord>), StorageError> {
        let file = Self::slot_file(dir, capacity_blocks, block_bytes, false)?;
        let mut store = Self::over(dir, file, capacity_blocks, block_bytes, max_bytes);
        let cap = store.capacity_blocks as u64 * store.reader.stride;
        if store.reader.file.metadata()?.len() > cap {
            store.reader.file.set_len(cap)?;
        }
        // The last record ends at its trailer, short of a whole stride.
        let records = store
            .reader
            .file
            .metadata()?
            .len()
            .div_ceil(store.reader.stride);
        let mut seen = std::collections::HashSet::new();
        let mut kept = Vec::new();
        for slot in 0..records as u32 {
            let slot = BlockId(slot);
            let at = store.record_offset(slot) + block_bytes as u64;
            let Ok((bytes, len)) = read_trailer(&store.reader.file, at) else {
                continue;
            };
            let Some(trailer) = Trailer::decode(&bytes[..len]) else {
                continue;
            };
            if trailer.len != block_bytes as u64
                || store.over_budget(slot)
                || !seen.insert(trailer.hash)
            {
                continue;
            }
            store.written[slot.index()] = true;
            store.used_bytes += store.reader.stride;
            let mut meta = trailer.meta;
            meta.tokens = store.read_tokens(at + TRAILER_BYTES as u64, trailer.tokens);
            kept.push(AdoptedRecord {
                slot,
                hash: trailer.hash,
                meta,
            });
        }
        if kept.is_empty() {
            // Nothing of ours (another block size, or garbage): the space goes back.
            store.reader.file.set_len(0)?;
        }
        Ok((store, kept))
    }

    fn slot_file(
        dir: &Path,
        capacity_blocks: usize,
        block_bytes: usize,
        truncate: bool,
    ) -> Result<File, StorageError> {
        if block_bytes == 0 || capacity_blocks == 0 {
            return Err(StorageError::WrongBlockSize {
                expected: block_bytes,
                got: 0,
            });
        }
        std::fs::create_dir_all(dir)?;
        Ok(OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(truncate)
            .open(dir.join(FILE_NAME))?)
    }

    /// The `count` tokens at `at` if they are there and match `checksum`; none otherwise (the
    /// block is kept either way: its payload has a checksum of its own).
    fn read_tokens(&self, at: u64, (count, checksum): (u32, u64)) -> Vec<u32> {
        let room = self.reader.stride as usize - self.block_bytes - TRAILER_BYTES;
        if count == 0 || count as usize * 4 > room {
            return Vec::new();
        }
        let mut bytes = vec![0u8; count as usize * 4];
        if read_at(&self.reader.file, &mut bytes, at).is_err() || xxh3_64(&bytes) != checksum {
            return Vec::new();
        }
        bytes
            .chunks_exact(4)
            .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
            .collect()
    }

    fn over(
        dir: &Path,
        file: File,
        capacity_blocks: usize,
        block_bytes: usize,
        max_bytes: Option<u64>,
    ) -> DiskStore {
        let stride = (TRAILER_BYTES + block_bytes).div_ceil(ALIGN) * ALIGN;
        DiskStore {
            path: dir.join(FILE_NAME),
            block_bytes,
            capacity_blocks,
            max_bytes,
            written: vec![false; capacity_blocks],
            used_bytes: 0,
            full: false,
            skipped_since_full: 0,
            counters: DiskCounters::default(),
            reader: DiskReader {
                file: Arc::new(file),
                block_bytes,
                stride: stride as u64,
                counts: Arc::default(),
            },
        }
    }

    /// The slot file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of written records.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Whether writes are being skipped.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// Counters since open (its readers' reads included).
    pub fn counters(&self) -> DiskCounters {
        let counts = &self.reader.counts;
        DiskCounters {
            reads: counts.reads.load(Ordering::Relaxed),
            checksum_failures: counts.checksum_failures.load(Ordering::Relaxed),
            ..self.counters
        }
    }

    /// A reader of this store's records, for reads outside whatever guards the store.
    pub fn reader(&self) -> DiskReader {
        self.reader.clone()
    }

    /// Where `slot`'s record starts in the file.
    pub fn record_offset(&self, slot: BlockId) -> u64 {
        self.reader.record_offset(slot)
    }

    /// Bytes a record occupies on disk.
    pub fn record_bytes(&self) -> u64 {
        self.reader.stride
    }

    fn check_slot(&self, slot: BlockId) -> Result<(), StorageError> {
        super::check_slot(slot, self.capacity_blocks)
    }

    fn over_budget(&self, slot: BlockId) -> bool {
        let extra = if self.written[slot.index()] {
            0
        } else {
            self.reader.stride
        };
        self.max_bytes
            .is_some_and(|max| self.used_bytes + extra > max)
    }

    fn write_record(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        meta: &BlockMeta,
        data: &[u8],
    ) -> std::io::Result<()> {
        // The checksum first: it leaves the payload in the CPU's cache for the kernel's copy
        // (the other order cost a tenth of the write of a 64 KiB block).
        let room = self.reader.stride as usize - data.len();
        let trailer = Trailer::encode(hash, meta, data, room);
        let offset = self.record_offset(slot);
        write_at(&self.reader.file, data, offset)?;
        write_at(&self.reader.file, &trailer, offset + data.len() as u64)
    }
}

impl BlockStore for DiskStore {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }

    fn write_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.write_block_with(slot, hash, &BlockMeta::default(), data)
    }

    fn write_block_with(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        meta: &BlockMeta,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.check_slot(slot)?;
        super::check_block_len(self.block_bytes, data.len())?;
        if self.full {
            self.skipped_since_full += 1;
            if !self.skipped_since_full.is_multiple_of(FULL_PROBE_EVERY) {
                self.counters.writes_skipped_full += 1;
                return Err(StorageError::DiskFull { hash });
            }
        }
        if self.over_budget(slot) {
            self.full = true;
            self.counters.writes_skipped_full += 1;
            return Err(StorageError::DiskFull { hash });
        }
        match self.write_record(slot, hash, meta, data) {
            Ok(()) => {
                if !self.written[slot.index()] {
                    self.written[slot.index()] = true;
                    self.used_bytes += self.reader.stride;
                }
                self.full = false;
                self.skipped_since_full = 0;
                self.counters.writes += 1;
                Ok(())
            }
            Err(error) if error.kind() == ErrorKind::StorageFull => {
                // Whatever part landed fails its checksum: a miss, never served.
                self.full = true;
                self.counters.writes_skipped_full += 1;
                Err(StorageError::DiskFull { hash })
            }
            Err(error) => Err(error.into()),
        }
    }

    fn read_block(
        &mut self,
        slot: BlockId,
        hash: SequenceHash,
        out: &mut [u8],
    ) -> Result<(), StorageError> {
        self.check_slot(slot)?;
        if !self.written[slot.index()] {
            return Err(StorageError::Miss { hash });
        }
        self.reader.read(slot, hash, out)
    }

    fn flush(&mut self) -> Result<(), StorageError> {
        (&*self.reader.file).flush()?;
        Ok(())
    }
}

impl DiskReader {
    fn record_offset(&self, slot: BlockId) -> u64 {
        slot.0 as u64 * self.stride
    }

    /// Read block `hash` from `slot` into `out` and verify it (see [`DiskStore`]: a torn,
    /// corrupt or truncated record is `Corrupt` and counted; a slot holding another block is a
    /// `Miss`).
    pub fn read(
        &self,
        slot: BlockId,
        hash: SequenceHash,
        out: &mut [u8],
    ) -> Result<(), StorageError> {
        super::check_block_len(self.block_bytes, out.len())?;
        let corrupt = || {
            self.counts
                .checksum_failures
                .fetch_add(1, Ordering::Relaxed);
            Err(StorageError::Corrupt { hash })
        };
        let offset = self.record_offset(slot);
        let read = read_at(&self.file, out, offset)
            .and_then(|()| read_trailer(&self.file, offset + out.len() as u64));
        let (bytes, len) = match read {
            Ok(read) => read,
            Err(error) if error.kind() == ErrorKind::UnexpectedEof => return corrupt(),
            Err(error) => return Err(error.into()),
        };
        let Some(trailer) = Trailer::decode(&bytes[..len]) else {
            return corrupt();
        };
        if trailer.hash != hash {
            // The slot was reused for another block: not ours, not corrupt.
            return Err(StorageError::Miss { hash });
        }
        if !trailer.verifies(out) {
            return corrupt();
        }
        self.counts.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

// Positional I/O: no seek per record, and reads need no `&mut File`.
#[cfg(unix)]
fn write_at(file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, data, offset)
}

#[cfg(unix)]
fn read_at(file: &File, out: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, out, offset)
}

#[cfg(not(unix))]
fn write_at(mut file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(data)
}

#[cfg(not(unix))]
fn read_at(mut file: &File, out: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(out)
}
