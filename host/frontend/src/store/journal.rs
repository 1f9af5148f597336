//! The Responses store's journal: every stored response appended as one JSON line to a segment
//! file in a directory, read back at start.
//!
//! Each line is written with one `write` call on a file opened for appending, so a process that
//! is killed (SIGKILL, OOM) loses nothing it had stored; a power cut loses what the kernel had not
//! yet written back (segments are not fsynced per line). A line cut off by a crash (no newline)
//! is skipped, said in [`RecoveredResponses`], and cut from the file so that later appends start clean.
//!
//! Segments rotate at a size; one whose responses were all evicted is deleted, and when the
//! segments hold more than their budget the oldest one's live responses are written again into
//! the newest and the oldest deleted. The disk therefore holds about the in-memory budget, twice
//! at most.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ir::Message;

/// The line format's version; a line of another version is counted as unreadable.
const VERSION: u32 = 1;

/// Held (with an exclusive lock) while a gateway uses the directory.
const LOCK_FILE: &str = "LOCK";

/// What reading the journal found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveredResponses {
    /// Responses read back (before the store's bounds evicted any).
    pub responses: usize,
    /// Segment files read.
    pub segments: usize,
    /// Lines cut off by a crash (at most one per segment), skipped and truncated away.
    pub torn_lines: usize,
    /// Their bytes.
    pub torn_bytes: u64,
    /// Whole lines that did not parse (another version, or damaged), skipped.
    pub unreadable_lines: usize,
}

/// One segment id per journaled response, as the store keeps it.
pub(super) type SegmentId = u64;

#[derive(Debug)]
pub(super) struct Journal {
    dir: PathBuf,
    /// The newest segment, open for appending.
    current: File,
    current_id: SegmentId,
    /// Every segment on disk (the current one too): its size and how many stored responses
    /// still live in it.
    segments: BTreeMap<SegmentId, Segment>,
    segment_bytes: u64,
    max_disk_bytes: u64,
    _lock: File,
}

#[derive(Debug, Default)]
struct Segment {
    bytes: u64,
    live: usize,
}

#[derive(Serialize)]
struct LineRef<'a> {
    v: u32,
    id: &'a str,
    messages: &'a [Message],
}

#[derive(Deserialize)]
struct Line {
    v: u32,
    id: String,
    messages: Vec<Message>,
}

/// A journaled response read back, in the order it was written.
pub(super) struct Replayed {
    pub(super) id: String,
    pub(super) messages: Vec<Message>,
    pub(super) segment: SegmentId,
}

// === impl Journal ===

impl Journal {
    /// Opens (creating it if needed) the journal in `dir` and reads it back. The caller then
    /// [`Journal::hold`]s each response it keeps and [`Journal::settle`]s.
    pub(super) fn open(
        dir: &Path,
        segment_bytes: u64,
        max_disk_bytes: u64,
    ) -> io::Result<(Self, Vec<Replayed>, RecoveredResponses)> {
        std::fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))?;
        if lock.try_lock().is_err() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} is in use by another process (its {LOCK_FILE} file is locked)",
                    dir.display()
                ),
            ));
        }
        let mut found = RecoveredResponses::default();
        let mut replayed = Vec::new();
        let mut segments = BTreeMap::new();
        for (id, path) in segment_files(dir)? {
            let bytes = read_segment(&path, id, &mut replayed, &mut found)?;
            segments.insert(id, Segment { bytes, live: 0 });
            found.segments += 1;
        }
        found.responses = replayed.len();
        // A fresh segment for this run: appends never follow a truncated tail of a file that a
        // crash may have left in the page cache half written.
        let current_id = segments.keys().next_back().map_or(0, |id| id + 1);
        let current = create_segment(dir, current_id)?;
        segments.insert(current_id, Segment::default());
        let journal = Self {
            dir: dir.to_owned(),
            current,
            current_id,
            segments,
            segment_bytes,
            max_disk_bytes,
            _lock: lock,
        };
        Ok((journal, replayed, found))
    }

    /// Appends one response; returns the segment it went to.
    pub(super) fn append(&mut self, id: &str, messages: &[Message]) -> io::Result<SegmentId> {
        if self.segment(self.current_id).bytes >= self.segment_bytes {
            self.rotate()?;
        }
        let mut line = serde_json::to_vec(&LineRef {
            v: VERSION,
            id,
            messages,
        })
        .map_err(io::Error::other)?;
        line.push(b'\n');
        self.current.write_all(&line)?;
        let current = self.segment(self.current_id);
        current.bytes += line.len() as u64;
        current.live += 1;
        Ok(self.current_id)
    }

    /// A response read back at open is kept by the store.
    pub(super) fn hold(&mut self, segment: SegmentId) {
        self.segment(segment).live += 1;
    }

    /// A stored response left the store; its segment goes when nothing in it lives.
    pub(super) fn release(&mut self, segment: SegmentId) -> io::Result<()> {
        let entry = self.segment(segment);
        entry.live = entry.live.saturating_sub(1);
        if entry.live == 0 && segment != self.current_id {
            self.drop_segment(segment)?;
        }
        Ok(())
    }

    /// Deletes every segment (but the current one) that holds no live response.
    pub(super) fn settle(&mut self) -> io::Result<()> {
        let dead: Vec<SegmentId> = self
            .segments
            .iter()
            .filter(|(id, s)| s.live == 0 && **id != self.current_id)
            .map(|(id, _)| *id)
            .collect();
        dead.into_iter().try_for_each(|id| self.drop_segment(id))
    }

    /// The oldest segment, when the journal is over its disk budget and that segment is not the
    /// one being written: the store writes its live responses again, then [`Journal::drop_segment`]s it.
    pub(super) fn over_budget(&self) -> Option<SegmentId> {
        let (&oldest, _) = self.segments.first_key_value()?;
        (self.disk_bytes() > self.max_disk_bytes && oldest != self.current_id).then_some(oldest)
    }

    /// Bytes on disk, all segments together.
    pub(super) fn disk_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.bytes).sum()
    }

    /// Segment files on disk, the current one too.
    pub(super) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn rotate(&mut self) -> io::Result<()> {
        let next = self.current_id + 1;
        let file = create_segment(&self.dir, next)?;
        self.current = file;
        let previous = std::mem::replace(&mut self.current_id, next);
        self.segments.insert(next, Segment::default());
        if self.segment(previous).live == 0 {
            self.drop_segment(previous)?;
        }
        Ok(())
    }

    /// Deletes a segment: nothing in it lives, or its live responses were written again.
    pub(super) fn drop_segment(&mut self, segment: SegmentId) -> io::Result<()> {
        self.segments.remove(&segment);
        match std::fs::remove_file(segment_path(&self.dir, segment)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn segment(&mut self, id: SegmentId) -> &mut Segment {
        self.segments.entry(id).or_default()
    }
}

fn segment_path(dir: &Path, id: SegmentId) -> PathBuf {
    dir.join(format!("responses-{id:016}.jsonl"))
}

fn create_segment(dir: &Path, id: SegmentId) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(segment_path(dir, id))
}

/// The segment files in `dir`, oldest first.
fn segment_files(dir: &Path) -> io::Result<Vec<(SegmentId, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("responses-")?.strip_suffix(".jsonl"))
            .and_then(|n| n.parse().ok());
        if let Some(id) = id {
            files.push((id, path));
        }
    }
    files.sort_unstable();
    Ok(files)
}

/// Reads one segment's lines into `replayed`; cuts a torn last line off the file. Returns the
/// segment's size after that.
fn read_segment(
    path: &Path,
    segment: SegmentId,
    replayed: &mut Vec<Replayed>,
    found: &mut RecoveredResponses,
) -> io::Result<u64> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    for line in bytes[..whole].split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Line>(line) {
            Ok(line) if line.v == VERSION => replayed.push(Replayed {
                id: line.id,
                messages: line.messages,
                segment,
            }),
            _ => found.unreadable_lines += 1,
        }
    }
    if whole < bytes.len() {
        found.torn_lines += 1;
        found.torn_bytes += (bytes.len() - whole) as u64;
        OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(whole as u64)?;
    }
    Ok(whole as u64)
}
