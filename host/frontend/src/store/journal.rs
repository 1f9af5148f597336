//! The Responses store's journal: every stored response appended as one JSON line to a segment
//! file in a directory, read back at start.
//!
//! Each line is written with one `write` call on a file opened for appending, so a process that
//! is killed (SIGKILL, OOM) loses nothing it had stored; a power cut loses what the kernel had not
//! yet written back (segments are not fsynced per line). A line cut off by a crash (no newline)
//! is skipped, said in [`RecoveredResponses`], and cut from the file so that later appends start clean.
//!
//! Segments rotate at a size; one whose responses were all evicted is deleted, and when the
//! segments hold more than their budget the oldest one's live lines are copied into the newest
//! and the oldest deleted. The disk therefore holds about the in-memory budget, twice at most.
//!
//! The journal knows which segment holds each live response id, so that all of this is file work
//! alone: [`JournalWriter`] runs it on a thread of its own, and the store (behind the gateway's
//! mutex) only hands it lines and the ids it evicted, over a channel. Each line's
//! [`JournalWrite`] resolves once it is written (before any compaction that follows it), so a
//! request can hold back the end of its response until then without holding anything else.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

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

/// A segment file's number: segments are written in its order.
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
    /// The segment holding each live response's newest line.
    live: HashMap<String, SegmentId>,
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

/// A line's id alone, for compaction (the messages are skipped, not built).
#[derive(Deserialize)]
struct LineId<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
}

/// One stored response as a journal line (with its newline), ready for [`JournalWriter::store`].
pub(super) fn line(id: &str, messages: &[Message]) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(&LineRef {
        v: VERSION,
        id,
        messages,
    })
    .map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
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
            live: HashMap::new(),
            segment_bytes,
            max_disk_bytes,
            _lock: lock,
        };
        Ok((journal, replayed, found))
    }

    /// Appends the line of response `id` (replacing any earlier one of the same id).
    fn append(&mut self, id: &str, line: &[u8]) -> io::Result<()> {
        if self.segment(self.current_id).bytes >= self.segment_bytes {
            self.rotate()?;
        }
        if let Err(e) = self.current.write_all(line) {
            // A line cut short (the disk full) would glue the next one to it: cut it off.
            let whole = self.segment(self.current_id).bytes;
            let _ = self.current.set_len(whole);
            return Err(e);
        }
        let current = self.segment(self.current_id);
        current.bytes += line.len() as u64;
        current.live += 1;
        match self.live.insert(id.to_owned(), self.current_id) {
            Some(older) => self.release(older),
            None => Ok(()),
        }
    }

    /// A response read back at open is kept by the store; its newest line is in `segment`.
    pub(super) fn hold(&mut self, id: String, segment: SegmentId) {
        self.segment(segment).live += 1;
        self.live.insert(id, segment);
    }

    /// Response `id` left the store.
    fn forget(&mut self, id: &str) -> io::Result<()> {
        match self.live.remove(id) {
            Some(segment) => self.release(segment),
            None => Ok(()),
        }
    }

    /// One line of `segment` is no longer live; the segment goes when nothing in it lives.
    fn release(&mut self, segment: SegmentId) -> io::Result<()> {
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

    /// Keeps the journal within its disk budget: the oldest segment's live lines are copied into
    /// the newest, then it is deleted. At most one pass per segment there was, so live lines
    /// larger than the budget are not copied in a loop.
    pub(super) fn compact(&mut self) -> io::Result<()> {
        for _ in 0..self.segments.len() {
            let Some((&oldest, _)) = self.segments.first_key_value() else {
                break;
            };
            if !self.over_budget() {
                break;
            }
            let bytes = match std::fs::read(segment_path(&self.dir, oldest)) {
                Ok(bytes) => bytes,
                // Gone already (removed by hand): nothing to copy, only the count to drop.
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e),
            };
            for line in bytes.split_inclusive(|&b| b == b'\n') {
                // Only whole lines: copied, a cut one would glue the next append to it.
                if line.last() != Some(&b'\n') {
                    continue;
                }
                let Ok(LineId { id }) = serde_json::from_slice::<LineId<'_>>(line) else {
                    continue;
                };
                if self.live.get(id.as_ref()) == Some(&oldest) {
                    self.append(&id, line)?;
                }
            }
            self.drop_segment(oldest)?;
        }
        Ok(())
    }

    /// Whether [`Journal::compact`] has a segment to copy and delete.
    pub(super) fn over_budget(&self) -> bool {
        self.disk_bytes() > self.max_disk_bytes
            && self.segments.first_key_value().map(|(&id, _)| id) != Some(self.current_id)
    }

    /// Bytes on disk, all segments together.
    pub(super) fn disk_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.bytes).sum()
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

    /// Deletes a segment: nothing in it lives, or its live lines were copied.
    fn drop_segment(&mut self, segment: SegmentId) -> io::Result<()> {
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

/// What the store asks of the writer thread, one per stored response.
struct Op {
    /// Responses that left the store (evicted, or a line that was not queued).
    forget: Vec<String>,
    /// The stored response's line, unless the queue was full.
    append: Option<Append>,
}

struct Append {
    id: String,
    line: Vec<u8>,
    written: oneshot::Sender<io::Result<()>>,
}

/// Called by the writer thread after each line, before compacting, with whether it will copy
/// anything (tests hold the writer there).
pub(super) type Hook = Box<dyn FnMut(bool) + Send>;

/// The journal on a thread of its own: appends, rotation, compaction and deletion never run
/// under the store's lock or on a request's task, and queueing never waits. Dropping it writes
/// what is queued and releases the directory.
#[derive(Debug)]
pub(super) struct JournalWriter {
    ops: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
    /// Resolves once the thread has written what was queued and released the directory.
    closed: Option<oneshot::Receiver<io::Result<()>>>,
    /// Line bytes queued and not yet written.
    queued: Arc<AtomicU64>,
    /// Beyond this many queued bytes a line is not queued (the disk is that far behind).
    max_queued: u64,
    disk_bytes: Arc<AtomicU64>,
}

/// A stored response's line on its way to disk: [`JournalWrite::written`] resolves once it is in
/// the kernel (a process kill no longer loses it).
#[derive(Debug)]
pub struct JournalWrite(oneshot::Receiver<io::Result<()>>);

impl JournalWrite {
    /// Waits until the line is written, or why it could not be.
    pub async fn written(self) -> io::Result<()> {
        self.0.await.unwrap_or_else(|_| Err(writer_gone()))
    }

    /// [`JournalWrite::written`] from a thread outside any async runtime.
    pub fn wait(self) -> io::Result<()> {
        self.0
            .blocking_recv()
            .unwrap_or_else(|_| Err(writer_gone()))
    }

    /// The outcome if it has come, without waiting.
    #[cfg(test)]
    pub(super) fn outcome_now(&mut self) -> Option<io::Result<()>> {
        match self.0.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(writer_gone())),
        }
    }

    /// A write that failed before it was queued.
    pub(super) fn failed(error: io::Error) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Err(error));
        JournalWrite(rx)
    }
}

fn writer_gone() -> io::Error {
    io::Error::other("the responses journal's writer thread has stopped")
}

/// A deletion or compaction that failed: said with the next line's outcome, since nothing else
/// waits on the writer.
fn upkeep_failed(e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "responses journal: deleting or compacting segments failed (the disk may stay over its budget): {e}"
        ),
    )
}

impl JournalWriter {
    /// Starts the thread that owns `journal`; at most `max_queued` bytes of lines wait for it.
    pub(super) fn spawn(
        mut journal: Journal,
        max_queued: u64,
        mut hook: Option<Hook>,
    ) -> io::Result<Self> {
        let (ops, queue) = mpsc::channel::<Op>();
        let (done, closed) = oneshot::channel();
        let disk_bytes = Arc::new(AtomicU64::new(journal.disk_bytes()));
        let queued = Arc::new(AtomicU64::new(0));
        let (disk, waiting) = (disk_bytes.clone(), queued.clone());
        let thread = std::thread::Builder::new()
            .name("responses-journal".into())
            .spawn(move || {
                let mut pending: Option<io::Error> = None;
                for op in queue {
                    for id in &op.forget {
                        if let Err(e) = journal.forget(id) {
                            pending.get_or_insert(upkeep_failed(e));
                        }
                    }
                    if let Some(append) = op.append {
                        let mut outcome = journal.append(&append.id, &append.line);
                        if let (Ok(()), Some(e)) = (&outcome, pending.take()) {
                            outcome = Err(e);
                        }
                        waiting.fetch_sub(append.line.len() as u64, Ordering::Relaxed);
                        // Before compacting: a request waits for its own line, nothing more.
                        // It may have stopped waiting; the line is written either way.
                        let _ = append.written.send(outcome);
                        if let Some(hook) = &mut hook {
                            hook(journal.over_budget());
                        }
                        if let Err(e) = journal.compact() {
                            pending.get_or_insert(upkeep_failed(e));
                        }
                    }
                    disk.store(journal.disk_bytes(), Ordering::Relaxed);
                }
                // The directory is free once the caller hears of it.
                drop(journal);
                let _ = done.send(pending.map_or(Ok(()), Err));
            })?;
        Ok(Self {
            ops: Some(ops),
            thread: Some(thread),
            closed: Some(closed),
            queued,
            max_queued,
            disk_bytes,
        })
    }

    /// Queues `line` for response `id`, and forgets `forget`. Never waits: when the queue is
    /// full the line is refused (the returned write fails) and the journal forgets `id`.
    pub(super) fn store(&self, id: String, line: Vec<u8>, mut forget: Vec<String>) -> JournalWrite {
        let len = line.len() as u64;
        let before = self.queued.fetch_add(len, Ordering::Relaxed);
        // One line always fits an empty queue, however long.
        if before > 0 && before + len > self.max_queued {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            // An earlier line of `id` on disk is no longer its newest.
            forget.push(id);
            self.send(Op {
                forget,
                append: None,
            });
            return JournalWrite::failed(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("the responses journal is {before} bytes behind; this line was not queued"),
            ));
        }
        let (written, write) = oneshot::channel();
        self.send(Op {
            forget,
            append: Some(Append { id, line, written }),
        });
        JournalWrite(write)
    }

    /// Only fails when the thread is gone: a write waiting on `op` then says so.
    fn send(&self, op: Op) {
        if let Some(ops) = &self.ops {
            let _ = ops.send(op);
        }
    }

    /// Stops queueing; the returned write resolves once what was queued is written and the
    /// directory is released (with the last upkeep error, if any was not yet said).
    pub(super) fn close(mut self) -> JournalWrite {
        drop(self.ops.take());
        // Detached: the thread ends by itself once the queue is drained.
        drop(self.thread.take());
        match self.closed.take() {
            Some(closed) => JournalWrite(closed),
            None => JournalWrite::failed(writer_gone()),
        }
    }

    /// Bytes on disk, as of the last line written.
    pub(super) fn disk_bytes(&self) -> u64 {
        self.disk_bytes.load(Ordering::Relaxed)
    }
}

impl Drop for JournalWriter {
    fn drop(&mut self) {
        drop(self.ops.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
