//! The KV index shared between the event writer and request handlers.
//!
//! Readers must never wait behind event application, so the index is kept twice with
//! `left-right`: handlers read one copy lock-free while the writer task applies a batch of events
//! to the other, then the two swap. Memory doubles; `docs/benchmarks.md` measures the alternative
//! (one index behind a `RwLock`) and shows lookups stalling behind writes. Each burst is applied
//! to the second copy as soon as the writer is idle (a second publish), not when the next burst
//! arrives, so a burst's publish applies that burst only.

use left_right::{Absorb, ReadHandleFactory, WriteHandle};
use switchyard_core::index::{IndexOp, KvIndex};
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

/// Create the index and the task that applies `IndexOp`s sent on the returned channel.
pub fn spawn_index_writer(
    shutdown: CancellationToken,
) -> (
    mpsc::Sender<IndexOp>,
    IndexReader,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(4096);
    let (write, read) = left_right::new_from_empty::<IndexCopy, IndexOp>(IndexCopy::default());
    let reader = IndexReader(read.factory());
    let task = tokio::task::spawn_blocking(move || write_loop(write, rx, shutdown));
    (tx, reader, task)
}

/// Apply ops as they arrive, publishing after each burst so readers see a consistent batch.
fn write_loop(
    mut write: WriteHandle<IndexCopy, IndexOp>,
    mut rx: mpsc::Receiver<IndexOp>,
    shutdown: CancellationToken,
) {
    // A blocking thread: left-right's publish waits for readers to leave the old copy. It ends
    // when every sender is gone or on shutdown, whichever comes first (the fleet keeps a sender
    // for workers that join later).
    let next = |rx: &mut mpsc::Receiver<IndexOp>| {
        futures::executor::block_on(async {
            tokio::select! {
                op = rx.recv() => op,
                () = shutdown.cancelled() => None,
            }
        })
    };
    while let Some(op) = next(&mut rx) {
        write.append(op);
        // Bound a burst so a flood of events cannot hide all of them from readers for long.
        for _ in 1..MAX_OPS_PER_PUBLISH {
            match rx.try_recv() {
                Ok(op) => write.append(op),
                Err(_) => break,
            };
        }
        write.publish();
        if rx.is_empty() {
            // Idle: bring the other copy up to date now. left-right would apply this burst to
            // it at the next publish, before the next burst, and readers would wait for both.
            write.publish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::hash::BlockHasher;
    use switchyard_core::worker::{Rank, Tier};

    #[tokio::test]
    async fn readers_see_published_ops() {
        let (tx, reader, _task) = spawn_index_writer(CancellationToken::new());
        let blocks = BlockHasher::new(4).sequence(&[1; 16]);
        tx.send(IndexOp::Store {
            rank: Rank::new(0, 0),
            tier: Tier::Device,
            blocks: blocks.clone(),
            locals: Vec::new(),
        })
        .await
        .unwrap();
        for _ in 0..200 {
            if reader.read(|i| i.find_matches(&blocks).len()) == 1 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("op never became visible");
    }
}
