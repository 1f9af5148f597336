//! Stored responses for the Responses API's `previous_response_id`.
//!
//! A bounded in-memory map from response id to the conversation up to and including that
//! response (as IR messages), evicting the least recently used entries beyond a count and a byte
//! budget. Synchronous: the gateway owns one behind a mutex. Memory only by default;
//! [`ResponseStore::open`] adds a journal on disk (see [`journal`]) so that stored responses
//! outlive a restart or a crash. The journal's files belong to a thread of its own: under the
//! gateway's mutex the store only serialises a line and queues it (never waiting), so a slow disk
//! or a compaction holds no request's `get` or `insert`. The request awaits its line instead.

mod journal;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use self::journal::{Journal, JournalWriter};
pub use self::journal::{JournalWrite, RecoveredResponses};
use crate::error::ApiError;
use crate::ir::{Block, Message};

/// Fixed cost counted per message and per block on top of their text, for the bookkeeping the
/// text lengths do not show.
const OVERHEAD_BYTES: u64 = 64;

/// Response id -> conversation, bounded by entry count and approximate bytes (LRU).
#[derive(Debug)]
pub struct ResponseStore {
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    /// Recency stamps, oldest first.
    recency: BTreeMap<u64, String>,
    entries: HashMap<String, Entry>,
    next_stamp: u64,
    journal: Option<JournalWriter>,
}

#[derive(Debug)]
struct Entry {
    messages: Vec<Message>,
    bytes: u64,
    stamp: u64,
}

/// What [`ResponseStore::insert`] did.
#[derive(Debug)]
#[must_use = "a journaled response is only safe from a crash once written"]
pub struct Inserted {
    /// Whether the response is stored (`false`: it alone exceeds the byte budget).
    pub stored: bool,
    /// Its journal line on the way to disk, when the store has a journal.
    pub journal: Option<JournalWrite>,
}

// === impl ResponseStore ===

impl ResponseStore {
    /// A store of at most `max_entries` responses and about `max_bytes` of conversation.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        Self {
            max_entries,
            max_bytes,
            bytes: 0,
            recency: BTreeMap::new(),
            entries: HashMap::new(),
            next_stamp: 0,
            journal: None,
        }
    }

    /// A store that keeps its responses in `dir` too (created if missing), reading back what an
    /// earlier run stored there (within this store's bounds, oldest evicted first). Fails when
    /// the directory cannot be used, or another process holds it.
    pub fn open(
        dir: &Path,
        max_entries: usize,
        max_bytes: u64,
    ) -> io::Result<(Self, RecoveredResponses)> {
        Self::open_with(dir, max_entries, max_bytes, None)
    }

    /// [`ResponseStore::open`], with a hook on the writer thread (tests hold the writer there).
    fn open_with(
        dir: &Path,
        max_entries: usize,
        max_bytes: u64,
        hook: Option<journal::Hook>,
    ) -> io::Result<(Self, RecoveredResponses)> {
        let segment_bytes = (max_bytes / 8).clamp(64 << 10, 64 << 20);
        let max_disk_bytes = max_bytes.saturating_mul(2).saturating_add(segment_bytes);
        let (mut journal, replayed, recovered) = Journal::open(dir, segment_bytes, max_disk_bytes)?;
        let mut store = Self::new(max_entries, max_bytes);
        // In memory first: a segment is only released once every response read from it is
        // known to be kept or evicted. A response stored again is in its last line's segment.
        let mut segment_of = HashMap::new();
        for line in replayed {
            if let Some(bytes) = store.size(&line.id, &line.messages) {
                segment_of.insert(line.id.clone(), line.segment);
                store.keep(line.id, line.messages, bytes);
            }
        }
        for id in store.entries.keys() {
            if let Some(&segment) = segment_of.get(id) {
                journal.hold(id.clone(), segment);
            }
        }
        journal.settle()?;
        journal.compact()?;
        // Lines waiting for the disk hold at most the store's own budget of memory again.
        store.journal = Some(JournalWriter::spawn(journal, max_bytes, hook)?);
        Ok((store, recovered))
    }

    /// Stores the conversation of `response_id`, evicting the least recently used entries to make
    /// room; nothing is stored when it alone exceeds the byte budget. With a journal, the line
    /// is serialised here and written by the journal's thread: await [`Inserted::journal`]
    /// before the client learns the response is complete, so a crash cannot lose what it may
    /// name next. A failed write leaves the response in memory, not on disk; so does a line
    /// refused because the disk is `max_bytes` of lines behind (queueing never waits).
    pub fn insert(&mut self, response_id: String, messages: Vec<Message>) -> Inserted {
        let Some(bytes) = self.size(&response_id, &messages) else {
            return Inserted {
                stored: false,
                journal: None,
            };
        };
        let line = self
            .journal
            .as_ref()
            .map(|_| journal::line(&response_id, &messages));
        let evicted = self.keep(response_id.clone(), messages, bytes);
        let journal = self
            .journal
            .as_ref()
            .zip(line)
            .map(|(writer, line)| match line {
                Ok(line) => writer.store(response_id, line, evicted),
                Err(e) => JournalWrite::failed(e),
            });
        Inserted {
            stored: true,
            journal,
        }
    }

    /// Stops journaling: later stores are kept in memory only. The returned write resolves once
    /// the lines already queued are written and the directory is released; `None` without a
    /// journal.
    pub fn close_journal(&mut self) -> Option<JournalWrite> {
        self.journal.take().map(JournalWriter::close)
    }

    /// The bytes an entry would count, or `None` when it could never be stored.
    fn size(&self, id: &str, messages: &[Message]) -> Option<u64> {
        let bytes = conversation_bytes(messages) + id.len() as u64;
        (self.max_entries > 0 && bytes <= self.max_bytes).then_some(bytes)
    }

    /// The in-memory half of [`ResponseStore::insert`], for an entry of `bytes` (its
    /// [`ResponseStore::size`]); returns the ids it evicted to make room.
    fn keep(&mut self, response_id: String, messages: Vec<Message>, bytes: u64) -> Vec<String> {
        self.forget(&response_id);
        let mut evicted = Vec::new();
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            let Some((_, oldest)) = self.recency.pop_first() else {
                break;
            };
            if let Some(entry) = self.entries.remove(&oldest) {
                self.bytes -= entry.bytes;
                evicted.push(oldest);
            }
        }
        let stamp = self.stamp();
        self.recency.insert(stamp, response_id.clone());
        self.bytes += bytes;
        self.entries.insert(
            response_id,
            Entry {
                messages,
                bytes,
                stamp,
            },
        );
        evicted
    }

    /// The conversation stored under `response_id` (marking it recently used), or a 400
    /// `previous_response_not_found` as OpenAI answers.
    pub fn get(&mut self, response_id: &str) -> Result<Vec<Message>, ApiError> {
        let stamp = self.stamp();
        let Some(entry) = self.entries.get_mut(response_id) else {
            return Err(ApiError::invalid(
                "previous_response_id",
                format_args!("previous response with id '{response_id}' not found"),
            )
            .with_code("previous_response_not_found"));
        };
        self.recency.remove(&entry.stamp);
        self.recency.insert(stamp, response_id.to_owned());
        entry.stamp = stamp;
        Ok(entry.messages.clone())
    }

    /// Forgets `response_id` in memory.
    fn forget(&mut self, response_id: &str) {
        if let Some(entry) = self.entries.remove(response_id) {
            self.recency.remove(&entry.stamp);
            self.bytes -= entry.bytes;
        }
    }

    /// Number of stored responses.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Approximate bytes held (text plus a fixed overhead per message and block).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes the journal holds on disk (0 in memory only).
    pub fn journal_bytes(&self) -> u64 {
        self.journal.as_ref().map_or(0, JournalWriter::disk_bytes)
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

fn conversation_bytes(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| OVERHEAD_BYTES + blocks_bytes(&m.blocks))
        .sum()
}

fn blocks_bytes(blocks: &[Block]) -> u64 {
    blocks
        .iter()
        .map(|b| {
            let text = match b {
                Block::Text { text } => text.len(),
                Block::Thinking { text, signature } => {
                    text.len() + signature.as_ref().map_or(0, String::len)
                }
                Block::RedactedThinking { data } => data.len(),
                Block::ToolCall {
                    id,
                    name,
                    arguments,
                } => id.len() + name.len() + arguments.len(),
                Block::ToolResult {
                    call_id, content, ..
                } => call_id.len() + blocks_bytes(content) as usize,
                Block::Image { url } => url.len(),
            };
            OVERHEAD_BYTES + text as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Role;
    use std::io::Write;

    impl ResponseStore {
        /// Stores and waits for the journal's write, as the gateway does.
        fn insert_ok(&mut self, id: String, messages: Vec<Message>) -> bool {
            let inserted = self.insert(id, messages);
            if let Some(write) = inserted.journal {
                write.wait().unwrap();
            }
            inserted.stored
        }
    }

    fn conversation(text: &str) -> Vec<Message> {
        vec![Message::text(Role::User, text)]
    }

    #[test]
    fn unknown_id_is_previous_response_not_found() {
        let mut store = ResponseStore::new(4, 1 << 20);
        let err = store.get("resp_nope").unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.code.as_deref(), Some("previous_response_not_found"));
        assert_eq!(err.param.as_deref(), Some("previous_response_id"));
    }

    #[test]
    fn evicts_least_recently_used_by_count() {
        let mut store = ResponseStore::new(2, 1 << 20);
        assert!(store.insert_ok("a".into(), conversation("first")));
        assert!(store.insert_ok("b".into(), conversation("second")));
        // Reading `a` makes `b` the least recently used.
        assert_eq!(store.get("a").unwrap(), conversation("first"));
        assert!(store.insert_ok("c".into(), conversation("third")));
        assert_eq!(store.len(), 2);
        assert!(store.get("b").is_err());
        assert!(store.get("a").is_ok() && store.get("c").is_ok());
    }

    #[test]
    fn evicts_by_bytes_and_refuses_oversized() {
        let one = conversation_bytes(&conversation(&"x".repeat(100))) + 1;
        let mut store = ResponseStore::new(100, one * 2);
        for id in ["a", "b", "c"] {
            assert!(store.insert_ok(id.into(), conversation(&"x".repeat(100))));
        }
        assert_eq!(store.len(), 2);
        assert!(store.bytes() <= one * 2);
        assert!(store.get("a").is_err());
        assert!(!store.insert_ok("big".into(), conversation(&"x".repeat(1000))));
        assert_eq!(store.len(), 2, "an oversized entry evicts nothing");
    }

    #[test]
    fn reinsert_replaces_and_remove_frees() {
        let mut store = ResponseStore::new(10, 1 << 20);
        store.insert_ok("a".into(), conversation("one"));
        store.insert_ok("a".into(), conversation("two"));
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap(), conversation("two"));
        store.forget("a");
        assert!(store.is_empty());
        assert_eq!(store.bytes(), 0);
    }

    fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        files
    }

    fn reopen(dir: &Path, entries: usize, bytes: u64) -> (ResponseStore, RecoveredResponses) {
        ResponseStore::open(dir, entries, bytes).unwrap()
    }

    #[test]
    fn a_journaled_store_reads_back_every_block_kind() {
        let dir = tempfile::tempdir().unwrap();
        let rich = vec![
            Message::text(Role::System, "sys"),
            Message {
                role: Role::Assistant,
                blocks: vec![
                    Block::Thinking {
                        text: "hmm \"quoted\"\n".into(),
                        signature: Some("sig".into()),
                    },
                    Block::RedactedThinking { data: "xx".into() },
                    Block::ToolCall {
                        id: "call_1".into(),
                        name: "bash".into(),
                        arguments: r#"{"cmd":"ls"}"#.into(),
                    },
                ],
            },
            Message {
                role: Role::Tool,
                blocks: vec![Block::ToolResult {
                    call_id: "call_1".into(),
                    content: vec![
                        Block::Text {
                            text: "ünïcode ✓".into(),
                        },
                        Block::Image {
                            url: "data:image/png;base64,AA==".into(),
                        },
                    ],
                    is_error: true,
                }],
            },
        ];
        {
            let (mut store, found) = reopen(dir.path(), 8, 1 << 20);
            assert_eq!(found, RecoveredResponses::default());
            assert!(store.insert_ok("resp_a".into(), rich.clone()));
            assert!(store.insert_ok("resp_b".into(), conversation("second")));
            assert!(store.journal_bytes() > 0);
        }
        let (mut store, found) = reopen(dir.path(), 8, 1 << 20);
        assert_eq!((found.responses, found.torn_lines), (2, 0));
        assert_eq!(store.get("resp_a").unwrap(), rich);
        assert_eq!(store.get("resp_b").unwrap(), conversation("second"));
    }

    #[test]
    fn a_torn_last_line_is_skipped_said_and_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut store, _) = reopen(dir.path(), 8, 1 << 20);
            assert!(store.insert_ok("resp_a".into(), conversation("kept")));
        }
        // What a crash in the middle of a write leaves: a line with no end, after whole ones.
        let last = segments(dir.path()).pop().unwrap();
        let whole = std::fs::metadata(&last).unwrap().len();
        let torn = br#"{"v":1,"id":"resp_b","messages":[{"role":"us"#;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&last)
            .unwrap()
            .write_all(torn)
            .unwrap();
        {
            let (mut store, found) = reopen(dir.path(), 8, 1 << 20);
            assert_eq!(found.responses, 1);
            assert_eq!((found.torn_lines, found.torn_bytes), (1, torn.len() as u64));
            assert_eq!(store.get("resp_a").unwrap(), conversation("kept"));
            assert!(store.get("resp_b").is_err());
            assert_eq!(std::fs::metadata(&last).unwrap().len(), whole, "cut off");
            assert!(store.insert_ok("resp_c".into(), conversation("after")));
        }
        let (mut store, found) = reopen(dir.path(), 8, 1 << 20);
        assert_eq!((found.responses, found.torn_lines), (2, 0));
        assert!(store.get("resp_c").is_ok());
    }

    #[test]
    fn a_damaged_line_is_counted_and_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut store, _) = reopen(dir.path(), 8, 1 << 20);
            store.insert_ok("resp_a".into(), conversation("one"));
        }
        let last = segments(dir.path()).pop().unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&last)
            .unwrap();
        file.write_all(b"not json\n{\"v\":99,\"id\":\"x\",\"messages\":[]}\n")
            .unwrap();
        let (mut store, found) = reopen(dir.path(), 8, 1 << 20);
        assert_eq!((found.responses, found.unreadable_lines), (1, 2));
        assert!(store.get("resp_a").is_ok());
    }

    #[test]
    fn the_journal_stays_within_its_budget_and_reads_back_what_memory_kept() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 256 << 10;
        let text = "y".repeat(5_000);
        let kept: Vec<String> = {
            let (mut store, _) = reopen(dir.path(), 1_000, budget);
            for i in 0..2_000 {
                assert!(store.insert_ok(format!("resp_{i}"), conversation(&text)));
                // Reading an old response keeps it alive in an old segment: compaction moves it.
                assert!(store.get("resp_0").is_ok());
                assert!(
                    store.journal_bytes() <= 2 * budget + (64 << 10) + 6_000,
                    "{} bytes on disk after {i}",
                    store.journal_bytes()
                );
            }
            assert!(
                segments(dir.path()).len() <= 12,
                "{:?}",
                segments(dir.path())
            );
            store.entries.keys().cloned().collect()
        };
        // Everything memory kept is on disk, `resp_0` too, though its first segment is long gone
        // (read back into a store large enough to keep all of it).
        let (mut store, found) = reopen(dir.path(), 100_000, 1 << 30);
        assert!(found.responses >= kept.len());
        for id in &kept {
            assert_eq!(store.get(id).unwrap(), conversation(&text), "{id}");
        }
        drop(store);
        // With the original bounds, the last stored are kept (the journal records writes, not
        // reads, so recency after a restart is the order of writing).
        let (mut store, _) = reopen(dir.path(), 1_000, budget);
        assert!(
            store.len() >= kept.len() - 2,
            "{} of {}",
            store.len(),
            kept.len()
        );
        for i in 1_990..2_000 {
            assert!(store.get(&format!("resp_{i}")).is_ok(), "resp_{i}");
        }
    }

    proptest::proptest! {
        // Each case writes files: 64 by default (PROPTEST_CASES, when set, wins).
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: if std::env::var_os("PROPTEST_CASES").is_some() {
                proptest::prelude::ProptestConfig::default().cases
            } else {
                64
            },
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// A journal damaged anywhere (bytes flipped, inserted, cut), or any bytes at all,
        /// reads back what parses and never fails the start.
        #[test]
        fn a_damaged_journal_always_opens(
            flips in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), 1..=255u8), 0..6),
            cut in proptest::option::of(proptest::prelude::any::<proptest::sample::Index>()),
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let dir = tempfile::tempdir().unwrap();
            {
                let (mut store, _) = reopen(dir.path(), 8, 1 << 20);
                for i in 0..4 {
                    store.insert_ok(format!("resp_{i}"), conversation(&format!("turn {i} \u{e9}")));
                }
            }
            let last = segments(dir.path()).pop().unwrap();
            let mut bytes = std::fs::read(&last).unwrap();
            for (at, mask) in flips {
                let at = at.index(bytes.len());
                bytes[at] ^= mask;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            std::fs::write(&last, &bytes).unwrap();
            std::fs::write(dir.path().join("responses-0000000000000007.jsonl"), &noise).unwrap();
            let (store, found) = ResponseStore::open(dir.path(), 8, 1 << 20).unwrap();
            proptest::prop_assert!(store.len() <= 8 && store.len() <= found.responses);
        }
    }

    /// The store hands lines to the writer thread and moves on: nothing it does waits for the
    /// disk. Lines not yet waited for are still written, in order (a re-stored response's
    /// newest line wins), by the time the store is dropped.
    #[test]
    fn lines_not_waited_for_are_written_in_order_before_the_store_goes() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut store, _) = reopen(dir.path(), 100, 1 << 20);
            for i in 0..300 {
                let inserted =
                    store.insert(format!("resp_{}", i % 120), conversation(&format!("v{i}")));
                assert!(inserted.stored && inserted.journal.is_some());
            }
        }
        let (mut store, found) = reopen(dir.path(), 100, 1 << 20);
        assert!(found.responses >= 100, "{found:?}");
        assert_eq!(store.len(), 100);
        // The last 100 stored: ids 80..120 of the second pass and 0..60 of the third.
        for i in 200..300 {
            let id = format!("resp_{}", i % 120);
            assert_eq!(
                store.get(&id).unwrap(),
                conversation(&format!("v{i}")),
                "{id}"
            );
        }
    }

    /// The segment files and their sizes.
    fn disk(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
        segments(dir)
            .into_iter()
            .map(|p| {
                let len = std::fs::metadata(&p).unwrap().len();
                (p, len)
            })
            .collect()
    }

    /// A compaction holds no one: with the writer thread held just before a compaction that
    /// will copy (a hook, not a clock), the store still answers `get` and takes new lines, and
    /// nothing on disk changes under it; released, the writer compacts and writes the rest.
    #[test]
    fn a_compaction_holds_neither_gets_nor_inserts() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 64 << 10;
        let (events_tx, events) = std::sync::mpsc::channel();
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        let hook: journal::Hook = Box::new(move |over| {
            let _ = events_tx.send(over);
            if over {
                // Until the test lets go (drops `go_tx`).
                let _ = go.recv();
            }
        });
        let (mut store, _) =
            ResponseStore::open_with(dir.path(), 1_000, budget, Some(hook)).unwrap();
        // Declared after the store, dropped before it: a failing assertion lets the writer go
        // rather than hang in the store's drop.
        let go_tx = go_tx;
        let text = "y".repeat(5_000);
        let mut i = 0;
        loop {
            let write = store
                .insert(format!("resp_{i}"), conversation(&text))
                .journal
                .unwrap();
            // One response kept recent in each of the first segments (about 12 lines each)
            // keeps every one of them alive: the disk outgrows its budget, compaction must copy.
            for pinned in (0..=i.min(48)).step_by(12) {
                assert!(store.get(&format!("resp_{pinned}")).is_ok());
            }
            i += 1;
            // One event per line, after its outcome.
            let over = events.recv().unwrap();
            write.wait().unwrap();
            if over {
                break;
            }
            assert!(i < 1_000, "the journal never went over its budget");
        }
        let oldest = segments(dir.path()).remove(0);
        let before = disk(dir.path());

        // The writer is held: every stored response is still served, new ones are taken.
        let kept: Vec<String> = store.entries.keys().cloned().collect();
        for id in &kept {
            assert!(store.get(id).is_ok(), "{id}");
        }
        assert_eq!(store.get("resp_0").unwrap(), conversation(&text));
        let mut late = store
            .insert("resp_late".into(), conversation("late"))
            .journal
            .unwrap();
        assert!(
            late.outcome_now().is_none(),
            "written while the writer is held"
        );
        assert!(store.get("resp_late").is_ok());
        assert_eq!(disk(dir.path()), before, "the store touched the files");

        drop(go_tx);
        late.wait().unwrap();
        assert!(!oldest.exists(), "{} not compacted away", oldest.display());
        assert!(store.journal_bytes() <= 2 * budget + (64 << 10) + 6_000);
        drop(store);
        let (mut store, _) = reopen(dir.path(), 100_000, 1 << 30);
        assert_eq!(store.get("resp_0").unwrap(), conversation(&text));
        assert_eq!(store.get("resp_late").unwrap(), conversation("late"));
    }

    /// A disk that falls behind by the store's budget of lines refuses the next line (kept in
    /// memory, said by its write) rather than make the store, and so every request, wait.
    #[test]
    fn a_journal_too_far_behind_refuses_a_line_rather_than_wait() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 64 << 10;
        let (go_tx, go) = std::sync::mpsc::channel::<()>();
        // Holds the writer after its first line until the test lets go.
        let hook: journal::Hook = Box::new(move |_| {
            let _ = go.recv();
        });
        let (mut store, _) =
            ResponseStore::open_with(dir.path(), 1_000, budget, Some(hook)).unwrap();
        // Dropped before the store: a failing assertion lets the writer go rather than hang.
        let go_tx = go_tx;
        assert!(store.insert_ok("resp_0".into(), conversation("first")));
        let text = "y".repeat(5_000);
        let mut queued = Vec::new();
        let refused = loop {
            let id = format!("resp_{}", queued.len() + 1);
            let mut write = store
                .insert(id.clone(), conversation(&text))
                .journal
                .unwrap();
            match write.outcome_now() {
                None => queued.push((id, write)),
                Some(Err(e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
                    break id;
                }
                Some(Ok(())) => panic!("{id} written while the writer is held"),
            }
            assert!(queued.len() < 100, "never refused");
        };
        assert!(!queued.is_empty() && queued.len() as u64 * 5_000 <= budget);
        assert!(store.get(&refused).is_ok(), "kept in memory");

        drop(go_tx);
        let ids: Vec<String> = queued.iter().map(|(id, _)| id.clone()).collect();
        for (id, write) in queued {
            write.wait().unwrap_or_else(|e| panic!("{id}: {e}"));
        }
        assert!(store.insert_ok("resp_after".into(), conversation("after")));
        drop(store);
        let (mut store, _) = reopen(dir.path(), 1_000, 1 << 30);
        for id in ids.iter().chain(["resp_after".to_owned()].iter()) {
            assert!(store.get(id).is_ok(), "{id}");
        }
        assert!(
            store.get(&refused).is_err(),
            "a refused line is not on disk"
        );
    }

    /// What the gateway does at shutdown: the lines queued (waited for or not) are written, and
    /// the directory is free once the close resolves; the store goes on in memory.
    #[test]
    fn closing_the_journal_writes_what_is_queued_and_frees_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = reopen(dir.path(), 8, 1 << 20);
        let writes: Vec<_> = (0..5)
            .map(|i| {
                store
                    .insert(format!("resp_{i}"), conversation("queued"))
                    .journal
                    .unwrap()
            })
            .collect();
        store.close_journal().unwrap().wait().unwrap();
        for write in writes {
            write.wait().unwrap();
        }
        let (_, found) = reopen(dir.path(), 8, 1 << 20);
        assert_eq!(found.responses, 5);
        let inserted = store.insert("resp_later".into(), conversation("memory"));
        assert!(inserted.stored && inserted.journal.is_none());
        assert!(store.get("resp_later").is_ok());
        assert!(store.close_journal().is_none());
    }

    #[test]
    fn one_directory_serves_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = reopen(dir.path(), 8, 1 << 20);
        let err = ResponseStore::open(dir.path(), 8, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
        drop(first);
        assert!(ResponseStore::open(dir.path(), 8, 1 << 20).is_ok());
    }
}
