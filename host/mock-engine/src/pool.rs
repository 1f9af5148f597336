//! The shared KV pool (G4) from the engine's side: at arrival, fetch the run of the prompt's
//! blocks that `switchyard kv-pool` holds past those the engine holds itself on its device and
//! host tiers (the engine model loads them if its own still reach that run at admission, and
//! recomputes otherwise); after each step, write the blocks it computed through to the pool, in
//! batches, off the request path. A pool that is down or slow costs recompute, never a failed
//! request.

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use switchyard_core::hash::BlockHasher;
use switchyard_kv_pool::{ClientTls, PoolClient, PoolError, PutBlock};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where the pool is and how fast a fetch from it is.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSettings {
    /// Base URL of `switchyard kv-pool`, e.g. `http://127.0.0.1:5600`.
    pub url: String,
    /// Its bearer token, if it has one.
    pub token: Option<String>,
    /// An `https://` pool's private CA, and the engine's client certificate for a pool that
    /// asks for one.
    pub tls: ClientTls,
    /// Pool-to-device bandwidth the engine model charges a fetch at, in bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Longest wait for one pool call; past it the engine recomputes. Default 2 s.
    pub timeout: Duration,
}

/// Blocks waiting to be written to the pool; more are dropped (and counted), never waited for.
const PUT_QUEUE_BLOCKS: usize = 4096;
/// Blocks per put request.
const PUT_BATCH_BLOCKS: usize = 64;

/// What the pool link did, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct PoolCounters {
    /// Lookups or fetches that found the pool unreachable or too slow (the engine recomputed).
    pub(crate) unavailable: AtomicU64,
    /// Requests the pool refused with a 4xx (a misconfiguration: block size, token, version).
    pub(crate) refused: AtomicU64,
    /// Blocks written to the pool.
    pub(crate) published: AtomicU64,
    /// Blocks whose write failed.
    pub(crate) publish_failed: AtomicU64,
    /// Blocks dropped because the write queue was full.
    pub(crate) publish_dropped: AtomicU64,
}

/// The engine's connection to the pool.
#[derive(Debug)]
pub(crate) struct PoolLink {
    client: PoolClient,
    /// The engine's own block hashes (the model's seed): the pool is keyed by them.
    hasher: BlockHasher,
    puts: mpsc::Sender<PutBlock>,
    pub(crate) counters: Arc<PoolCounters>,
}

impl PoolLink {
    /// A link to the pool of `settings`, for blocks named by `hasher` (the engine's) of
    /// `block_bytes` bytes; its writer task stops with `shutdown`.
    pub(crate) fn start(
        settings: &PoolSettings,
        hasher: BlockHasher,
        block_bytes: u32,
        shutdown: CancellationToken,
    ) -> Result<PoolLink, PoolError> {
        let mut client = PoolClient::with_tls(&settings.url, block_bytes, &settings.tls)?
            .with_timeout(settings.timeout);
        if let Some(token) = &settings.token {
            client = client.with_token(token.clone());
        }
        let counters = Arc::new(PoolCounters::default());
        let (puts, queue) = mpsc::channel(PUT_QUEUE_BLOCKS);
        tokio::spawn(write_through(
            client.clone(),
            queue,
            counters.clone(),
            shutdown,
        ));
        Ok(PoolLink {
            client,
            hasher,
            puts,
            counters,
        })
    }

    /// The engine hashes of `prompt`'s blocks a fetch may ask for: every full block but the
    /// one of the last prompt token, which the engine computes to sample.
    pub(crate) fn prompt_hashes(&self, prompt: &[u32]) -> Vec<u64> {
        let block_size = self.hasher.block_size();
        let usable = prompt.len().saturating_sub(1) / block_size;
        (self.hasher.sequence(&prompt[..usable * block_size]))
            .into_iter()
            .map(|h| h.0)
            .collect()
    }

    /// The run of `hashes` from `from` on (the blocks before it the engine holds itself) that
    /// the pool holds, with their bytes, in order.
    pub(crate) async fn fetch_run(&self, hashes: &[u64], from: usize) -> Vec<(u64, Bytes)> {
        let wanted = &hashes[from.min(hashes.len())..];
        if wanted.is_empty() {
            return Vec::new();
        }
        let run = match self.client.exists(wanted).await {
            Ok(present) => present.iter().take_while(|p| **p).count(),
            Err(error) => {
                self.failed(&error);
                return Vec::new();
            }
        };
        if run == 0 {
            return Vec::new();
        }
        match self.client.get(&wanted[..run]).await {
            // A block evicted between the two calls ends the run there.
            Ok(blocks) => (wanted.iter().copied())
                .zip(blocks)
                .map_while(|(hash, bytes)| Some((hash, bytes?)))
                .collect(),
            Err(error) => {
                self.failed(&error);
                Vec::new()
            }
        }
    }

    /// Queue `block` for the pool; never waits.
    pub(crate) fn publish(&self, block: PutBlock) {
        if self.puts.try_send(block).is_err() {
            self.counters
                .publish_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn failed(&self, error: &PoolError) {
        if error.is_unavailable() {
            self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "KV pool unavailable: recomputing");
        } else {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "KV pool refused a request");
        }
    }
}

/// Write queued blocks to the pool in batches of up to [`PUT_BATCH_BLOCKS`].
async fn write_through(
    client: PoolClient,
    mut queue: mpsc::Receiver<PutBlock>,
    counters: Arc<PoolCounters>,
    shutdown: CancellationToken,
) {
    let mut batch = Vec::with_capacity(PUT_BATCH_BLOCKS);
    loop {
        let first = tokio::select! {
            block = queue.recv() => block,
            () = shutdown.cancelled() => return,
        };
        let Some(first) = first else { return };
        batch.push(first);
        while batch.len() < PUT_BATCH_BLOCKS {
            match queue.try_recv() {
                Ok(block) => batch.push(block),
                Err(_) => break,
            }
        }
        let count = batch.len() as u64;
        match client.put(&batch).await {
            Ok(_) => counters.published.fetch_add(count, Ordering::Relaxed),
            Err(error) => {
                tracing::debug!(%error, blocks = count, "KV pool write failed");
                counters.publish_failed.fetch_add(count, Ordering::Relaxed)
            }
        };
        batch.clear();
    }
}
