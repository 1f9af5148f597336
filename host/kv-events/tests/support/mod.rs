//! A subscriber wired to a `KvIndex`, and event builders shared by the socket tests.

use std::sync::Arc;
use std::time::Duration;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::worker::Rank;
use switchyard_kv_events::ingest::WireFormat;
use switchyard_kv_events::subscriber::{
    SubscriberConfig, SubscriberSnapshot, SubscriberStats, run_subscriber,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Block size of every test engine.
pub(crate) const BLOCK_SIZE: u32 = 4;

/// Time for a SUB to join before the first publish (ZMQ's slow joiner).
pub(crate) const JOIN_TIME: Duration = Duration::from_millis(300);

/// Upper bound on any wait in these tests.
pub(crate) const DEADLINE: Duration = Duration::from_secs(15);

/// Our sequence hashes of `tokens`.
pub(crate) fn ours(tokens: &[u32]) -> Vec<SequenceHash> {
    BlockHasher::new(BLOCK_SIZE as usize).sequence(tokens)
}

/// A TCP endpoint on 127.0.0.1 that nothing listens on (for a socket that binds it).
pub(crate) fn free_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    format!("tcp://127.0.0.1:{port}")
}

/// A running `run_subscriber` whose ops are applied to `index` while waiting.
pub(crate) struct Harness {
    pub(crate) index: KvIndex,
    pub(crate) stats: Arc<SubscriberStats>,
    ops: mpsc::Receiver<IndexOp>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Harness {
    pub(crate) fn start(
        rank: Rank,
        endpoint: String,
        replay_endpoint: Option<String>,
        bind: bool,
    ) -> Self {
        let config = SubscriberConfig {
            rank,
            block_size: BLOCK_SIZE,
            endpoint,
            replay_endpoint,
            bind,
            topic: String::new(),
            format: WireFormat::Vllm,
            engine_names: None,
        };
        let (sink, ops) = mpsc::channel(256);
        let stats = Arc::new(SubscriberStats::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_subscriber(
            config,
            sink,
            stats.clone(),
            shutdown.clone(),
        ));
        Harness {
            index: KvIndex::new(),
            stats,
            ops,
            shutdown,
            task,
        }
    }

    /// Wait until the engine's publisher is attached (a bound socket: until the engine connects),
    /// then give the subscription time to reach it.
    pub(crate) async fn joined(&mut self) {
        self.wait_until("subscriber connected", |_, stats| stats.connected)
            .await;
        tokio::time::sleep(JOIN_TIME).await;
    }

    /// Apply incoming ops until `done` holds; panics after `DEADLINE`.
    pub(crate) async fn wait_until(
        &mut self,
        what: &str,
        done: impl Fn(&KvIndex, &SubscriberSnapshot) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !done(&self.index, &self.stats.snapshot()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; stats {:?}",
                self.stats.snapshot()
            );
            if let Ok(Some(op)) =
                tokio::time::timeout(Duration::from_millis(20), self.ops.recv()).await
            {
                self.index.apply(&op);
            }
        }
    }

    /// Apply ops until none has come for a while, so the index shows everything sent so far.
    pub(crate) async fn settle(&mut self) {
        while let Ok(Some(op)) = tokio::time::timeout(JOIN_TIME, self.ops.recv()).await {
            self.index.apply(&op);
        }
    }

    /// Stop the subscriber; it must exit promptly.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("subscriber stops on shutdown")
            .expect("subscriber task does not panic");
    }
}
