//! The KV index shared between the event writer and request handlers.
//!
//! Readers must never wait behind event application, so the index is kept twice with
//! `left-right`: handlers read one copy lock-free while the writer task applies a batch of events
//! to the other, then the two swap. Memory doubles; `docs/benchmarks.md` measures the alternative
//! (one index behind a `RwLock`) and shows lookups stalling behind writes. Each burst is applied
//! to the second copy as soon as the writer is idle (a second publish), not when the next burst
//! arrives, so a burst's publish applies that burst only. After each publish the writer hands
//! the burst's device stores to the router, whose prefill loads some of them end.

use left_right::{Absorb, ReadHandleFactory, WriteHandle};
use switchyard_core::hash::SequenceHash;
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::worker::Rank;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One copy of the index, as left-right keeps it.
#[derive(Debug, Clone, Default)]
pub struct IndexCopy(pub KvIndex);

impl Absorb<IndexOp> for IndexCopy {
    fn absorb_first(&mut self, op: &mut IndexOp, _: &Self) {
        self.0.apply(op);
    }

    fn absorb_second(&mut self, op: IndexOp, _: &Self) {
        self.0.apply(&op);
    }

    fn sync_with(&mut self, first: &Self) {
        self.0 = first.0.clone();
    }
}

/// Read access for request handlers: cheap to clone, `Sync`.
#[derive(Clone)]
pub struct IndexReader(ReadHandleFactory<IndexCopy>);

impl std::fmt::Debug for IndexReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexReader")
    }
}

impl IndexReader {
    /// Run `f` on the current published index.
    pub fn read<R>(&self, f: impl FnOnce(&KvIndex) -> R) -> R {
        let handle = self.0.handle();
        match handle.enter() {
            Some(guard) => f(&guard.0),
            // Only after the writer is gone (shutdown): answer from an empty index.
            None => f(&KvIndex::new()),
        }
    }
}

const MAX_OPS_PER_PUBLISH: usize = 1024;

/// The index's writing side, before its task runs ([`IndexWriter::spawn`]).
pub struct IndexWriter {
    write: WriteHandle<IndexCopy, IndexOp>,
    rx: mpsc::Receiver<IndexOp>,
    shutdown: CancellationToken,
}

/// Create the index: the channel that takes `IndexOp`s, read access, and the writer to start.
pub fn index_channel(
    shutdown: CancellationToken,
) -> (mpsc::Sender<IndexOp>, IndexReader, IndexWriter) {
    let (tx, rx) = mpsc::channel(4096);
    let (write, read) = left_right::new_from_empty::<IndexCopy, IndexOp>(IndexCopy::default());
    let reader = IndexReader(read.factory());
    (
        tx,
        reader,
        IndexWriter {
            write,
            rx,
            shutdown,
        },
    )
}

impl std::fmt::Debug for IndexWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexWriter")
    }
}

impl IndexWriter {
    /// Apply ops as they arrive, on a blocking thread. `on_stored` hears the device blocks
    /// each burst stored, by rank, once readers see them (the router ends prefill loads there).
    pub fn spawn(
        self,
        on_stored: impl FnMut(&[(Rank, SequenceHash)]) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::task::spawn_blocking(move || self.run(on_stored))
    }

    /// Publish after each burst so that readers see a consistent batch.
    fn run(self, mut on_stored: impl FnMut(&[(Rank, SequenceHash)])) {
        let IndexWriter {
            mut write,
            mut rx,
            shutdown,
        } = self;
        // A blocking thread: left-right's publish waits for readers to leave the old copy. It
        // ends when every sender is gone or on shutdown, whichever comes first (the fleet keeps
        // a sender for workers that join later).
        let next = |rx: &mut mpsc::Receiver<IndexOp>| {
            futures::executor::block_on(async {
                tokio::select! {
                    op = rx.recv() => op,
                    () = shutdown.cancelled() => None,
                }
            })
        };
        let mut stored = Vec::new();
        while let Some(op) = next(&mut rx) {
            append(&mut write, op, &mut stored);
            // Bound a burst so a flood of events cannot hide all of them from readers for long.
            for _ in 1..MAX_OPS_PER_PUBLISH {
                match rx.try_recv() {
                    Ok(op) => append(&mut write, op, &mut stored),
                    Err(_) => break,
                };
            }
            write.publish();
            if !stored.is_empty() {
                on_stored(&stored);
                stored.clear();
            }
            if rx.is_empty() {
                // Idle: bring the other copy up to date now. left-right would apply this burst
                // to it at the next publish, before the next burst, and readers would wait for
                // both.
                write.publish();
            }
        }
    }
}

/// Queue `op` for the next publish, noting the device blocks it stores.
fn append(
    write: &mut WriteHandle<IndexCopy, IndexOp>,
    op: IndexOp,
    stored: &mut Vec<(Rank, SequenceHash)>,
) {
    stored.extend(op.device_stores());
    write.append(op);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use switchyard_core::hash::BlockHasher;
    use switchyard_core::worker::Tier;

    #[tokio::test]
    async fn readers_see_published_ops_and_the_writer_tells_of_device_stores() {
        let (tx, reader, writer) = index_channel(CancellationToken::new());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let _task = writer.spawn({
            let heard = heard.clone();
            move |stored| heard.lock().unwrap().extend_from_slice(stored)
        });
        let rank = Rank::new(0, 0);
        let blocks = BlockHasher::new(4).sequence(&[1; 16]);
        let offloaded = BlockHasher::new(4).sequence(&[2; 8]);
        for (tier, blocks) in [(Tier::Host, &offloaded), (Tier::Device, &blocks)] {
            let op = IndexOp::Store {
                rank,
                tier,
                blocks: blocks.clone(),
                locals: Vec::new(),
            };
            tx.send(op).await.unwrap();
        }
        let device_stores: Vec<_> = blocks.iter().map(|&b| (rank, b)).collect();
        for _ in 0..200 {
            let visible = reader.read(|i| i.find_matches(&blocks).len()) == 1;
            if visible && *heard.lock().unwrap() == device_stores {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!(
            "ops never became visible or heard: {:?}",
            heard.lock().unwrap()
        );
    }
}
