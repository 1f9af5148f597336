//! The gateway side: a ZMQ SUB socket per engine rank, feeding an [`Ingestor`].
//!
//! This is the I/O edge: it reads the clock (for lag), retries connections, replays lost messages
//! and never stops on bad input. Index changes go out on a channel to whoever owns the index.

use crate::Error;
use crate::ingest::{EngineNames, Gap, Ingested, Ingestor, WireFormat};
use crate::publisher::{END_OF_REPLAY, message};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use switchyard_core::index::IndexOp;
use switchyard_core::worker::Rank;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket};

/// A socket's connection events (zeromq's monitor).
type SocketEvents = futures::channel::mpsc::Receiver<SocketEvent>;

/// How long one connection attempt may take before the socket is rebuilt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the replay socket may take to connect or to send its next message.
const REPLAY_STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Backoff between socket rebuilds: doubles from the first value up to the second.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Where one rank's events come from.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// The rank whose cache the events describe.
    pub rank: Rank,
    /// The engine's tokens per block.
    pub block_size: u32,
    /// The engine's PUB address (`tcp://host:port`), or our address when `bind` is set.
    pub endpoint: String,
    /// The engine's replay (ROUTER) address; without it, lost messages clear the rank.
    pub replay_endpoint: Option<String>,
    /// Bind the SUB socket and let the engine connect, instead of connecting to the engine.
    pub bind: bool,
    /// Topic prefix to subscribe to (vLLM's default is empty: everything).
    pub topic: String,
    /// How the payloads are encoded (an engine's vLLM events, or a shared pool's Mooncake ones).
    pub format: WireFormat,
    /// Keep these names of the rank's blocks (ours -> the engine's), for KV hints; `None`:
    /// the rank takes no hints.
    pub engine_names: Option<Arc<EngineNames>>,
}

/// Live counters of one subscriber, shared with metrics.
#[derive(Debug, Default)]
pub struct SubscriberStats {
    messages: AtomicU64,
    malformed: AtomicU64,
    gaps: AtomicU64,
    replays: AtomicU64,
    replay_failures: AtomicU64,
    restarts: AtomicU64,
    clears: AtomicU64,
    keyed_stores: AtomicU64,
    unaligned_stores: AtomicU64,
    last_lag_ms: AtomicU64,
    connected: AtomicBool,
}

/// A copy of [`SubscriberStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberSnapshot {
    /// Messages received on the stream.
    pub messages: u64,
    /// Messages skipped: wrong frame count, bad sequence frame or undecodable payload.
    pub malformed: u64,
    /// Sequence gaps on the stream.
    pub gaps: u64,
    /// Replay requests sent.
    pub replays: u64,
    /// Replays that failed or came back incomplete.
    pub replay_failures: u64,
    /// Publisher restarts (sequence number went back).
    pub restarts: u64,
    /// Clears of the rank sent because messages were lost for good.
    pub clears: u64,
    /// Stores left out because the engine hashed their blocks with more than the tokens (a LoRA
    /// adapter, a cache salt, multimodal inputs), so no request of the router's could match them.
    pub keyed_stores: u64,
    /// Stores left out because their blocks are neither the rank's configured block size nor a
    /// whole fraction or multiple of it (or their tokens do not fill them): an engine started
    /// with another block size than the config's.
    pub unaligned_stores: u64,
    /// Wall-clock time now minus the last batch's engine timestamp, in ms (0 if negative).
    pub last_lag_ms: u64,
    /// Whether the engine's publisher is attached: from our connection (or, when we bind, the
    /// engine's) until the publisher goes away, which a socket that reconnects by itself would
    /// otherwise hide.
    pub connected: bool,
}

// === impl SubscriberStats ===

impl SubscriberStats {
    /// The counters now.
    pub fn snapshot(&self) -> SubscriberSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        SubscriberSnapshot {
            messages: load(&self.messages),
            malformed: load(&self.malformed),
            gaps: load(&self.gaps),
            replays: load(&self.replays),
            replay_failures: load(&self.replay_failures),
            restarts: load(&self.restarts),
            clears: load(&self.clears),
            keyed_stores: load(&self.keyed_stores),
            unaligned_stores: load(&self.unaligned_stores),
            last_lag_ms: load(&self.last_lag_ms),
            connected: self.connected.load(Ordering::Relaxed),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Receive one rank's events and send the index changes to `sink` until `shutdown` fires or the
/// sink's receiver is dropped.
///
/// Bad messages are counted and skipped; a failed socket is rebuilt with backoff. Lost messages
/// are replayed from `replay_endpoint`; when that is impossible the rank is cleared, because the
/// index must not keep claiming blocks whose removal it may have missed.
pub async fn run_subscriber(
    config: SubscriberConfig,
    sink: mpsc::Sender<IndexOp>,
    stats: Arc<SubscriberStats>,
    shutdown: CancellationToken,
) {
    let mut driver = Driver {
        ingestor: {
            let ingestor = Ingestor::with_format(config.rank, config.block_size, config.format);
            match &config.engine_names {
                Some(names) => ingestor.naming(names.clone()),
                None => ingestor,
            }
        },
        config,
        sink,
        stats,
    };
    let mut backoff = BACKOFF.0;
    loop {
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = driver.open() => opened,
        };
        match opened {
            Ok((mut socket, mut monitor)) => {
                // A bound socket has no publisher until the engine connects.
                driver.set_connected(!driver.config.bind);
                backoff = BACKOFF.0;
                let keep_going = tokio::select! {
                    () = shutdown.cancelled() => false,
                    keep_going = driver.receive(&mut socket, &mut monitor) => keep_going,
                };
                driver.set_connected(false);
                if !keep_going {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(rank = %driver.config.rank, endpoint = %driver.config.endpoint,
                    %error, "KV event socket failed; retrying");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// One subscriber's state across socket rebuilds.
struct Driver {
    config: SubscriberConfig,
    ingestor: Ingestor,
    sink: mpsc::Sender<IndexOp>,
    stats: Arc<SubscriberStats>,
}

/// The sink's receiver is gone: nobody wants the index changes any more.
struct SinkClosed;

impl Driver {
    /// The socket, subscribed and connected (or bound), and its connection events.
    async fn open(&self) -> Result<(SubSocket, SocketEvents), Error> {
        let mut options = SocketOptions::default();
        options.connect_timeout(CONNECT_TIMEOUT);
        let mut socket = SubSocket::with_options(options);
        let monitor = socket.monitor();
        socket.subscribe(&self.config.topic).await?;
        if self.config.bind {
            socket.bind(&self.config.endpoint).await?;
        } else {
            // Retries (within the timeout) until the engine's PUB socket is up.
            socket.connect(&self.config.endpoint).await?;
        }
        Ok((socket, monitor))
    }

    /// Handle messages until the socket fails (true: rebuild it) or the sink closes (false).
    ///
    /// The first connection catches up on what the publisher sent before it ([`Driver::join`]).
    /// The socket reconnects by itself when the publisher goes away and comes back; a
    /// reconnection after a disconnection starts the stream over ([`Driver::resync`]), since
    /// the messages published before it were dropped and a restarted publisher's first ones
    /// may be all there is.
    async fn receive(&mut self, socket: &mut SubSocket, monitor: &mut SocketEvents) -> bool {
        let mut peer_lost = false;
        loop {
            let frames = tokio::select! {
                // Connection events first: a join must come before the first live message.
                biased;
                event = monitor.next() => {
                    let caught_up = match event {
                        Some(SocketEvent::Disconnected(_)) => {
                            peer_lost = true;
                            self.set_connected(false);
                            Ok(())
                        }
                        // `Connected` when we connect, `Accepted` when we bind.
                        Some(SocketEvent::Connected(..) | SocketEvent::Accepted(..)) => {
                            self.set_connected(true);
                            if std::mem::take(&mut peer_lost) {
                                self.resync().await
                            } else if self.ingestor.is_fresh() {
                                self.join().await
                            } else {
                                Ok(())
                            }
                        }
                        _ => Ok(()),
                    };
                    if caught_up.is_err() {
                        return false;
                    }
                    continue;
                }
                received = socket.recv() => match received {
                    Ok(message) => message.into_vec(),
                    Err(error) => {
                        tracing::warn!(rank = %self.config.rank, %error, "KV event stream failed");
                        return true;
                    }
                },
            };
            if self.handle(&frames).await.is_err() {
                return false;
            }
        }
    }

    fn set_connected(&self, connected: bool) {
        self.stats.connected.store(connected, Ordering::Relaxed);
    }

    /// The first connection: what the publisher sent before we subscribed (a gateway started
    /// after its engines, or restarted) is in its replay buffer, applied from sequence 0 on. A
    /// buffer that no longer starts at 0 gives nothing, and the index learns from the live
    /// stream on: it may miss blocks the engine cached before, never claim lost ones. Not
    /// counted as a replay (those are for gaps).
    async fn join(&mut self) -> Result<(), SinkClosed> {
        let Some(endpoint) = self.config.replay_endpoint.clone() else {
            return Ok(());
        };
        // Nothing is indexed yet, so the clear that starting over returns has nothing to clear.
        let _ = self.ingestor.start_over();
        match self.replay(&endpoint, 0).await {
            Ok(()) => {}
            Err(ReplayError::Socket(error)) => {
                tracing::debug!(rank = %self.config.rank, %error, "KV event history unavailable");
            }
            Err(ReplayError::SinkClosed) => return Err(SinkClosed),
        }
        self.ingestor.replay_done();
        Ok(())
    }

    /// The publisher is back after a disconnection: clear the rank, then apply what its replay
    /// socket holds from sequence 0 (all of a restarted engine's stream); without a replay
    /// socket, or if it fails, the rank stays cleared until new events come.
    async fn resync(&mut self) -> Result<(), SinkClosed> {
        let rank = self.config.rank;
        tracing::info!(%rank, "KV event publisher reconnected; resyncing the rank");
        SubscriberStats::bump(&self.stats.clears);
        let clear = self.ingestor.start_over();
        self.send(clear).await?;
        if self.replay_from(0).await? == Some(false) {
            SubscriberStats::bump(&self.stats.replay_failures);
        }
        self.ingestor.replay_done();
        Ok(())
    }

    /// Replay from `start`, if there is a replay socket (`None`: there is not); whether the
    /// socket answered to its end (a failure is logged).
    async fn replay_from(&mut self, start: u64) -> Result<Option<bool>, SinkClosed> {
        let Some(endpoint) = self.config.replay_endpoint.clone() else {
            return Ok(None);
        };
        SubscriberStats::bump(&self.stats.replays);
        match self.replay(&endpoint, start).await {
            Ok(()) => Ok(Some(true)),
            Err(ReplayError::Socket(error)) => {
                tracing::warn!(rank = %self.config.rank, start, %error, "KV event replay failed");
                Ok(Some(false))
            }
            Err(ReplayError::SinkClosed) => Err(SinkClosed),
        }
    }

    async fn handle(&mut self, frames: &[Bytes]) -> Result<(), SinkClosed> {
        SubscriberStats::bump(&self.stats.messages);
        let [_topic, seq, payload] = frames else {
            SubscriberStats::bump(&self.stats.malformed);
            return Ok(());
        };
        let Ok(seq) = <[u8; 8]>::try_from(seq.as_ref()).map(u64::from_be_bytes) else {
            SubscriberStats::bump(&self.stats.malformed);
            return Ok(());
        };
        let ingested = self.ingestor.on_message(seq, payload);
        if ingested.restarted {
            tracing::info!(rank = %self.config.rank, "KV event publisher restarted; rank cleared");
            SubscriberStats::bump(&self.stats.restarts);
        }
        let gap = ingested.gap;
        self.forward(ingested).await?;
        if let Some(gap) = gap {
            SubscriberStats::bump(&self.stats.gaps);
            self.recover(gap).await?;
        }
        Ok(())
    }

    /// Replay the lost messages, or clear the rank if they cannot all be had.
    async fn recover(&mut self, gap: Gap) -> Result<(), SinkClosed> {
        let rank = self.config.rank;
        if self.replay_from(gap.expected).await?.is_some() && self.ingestor.missing().is_some() {
            SubscriberStats::bump(&self.stats.replay_failures);
        }
        if let Some(missing) = self.ingestor.missing() {
            tracing::warn!(%rank, ?missing, "KV events lost; clearing the rank");
            SubscriberStats::bump(&self.stats.clears);
            let clear = self.ingestor.reset();
            self.send(clear).await?;
        }
        Ok(())
    }

    /// Ask the replay socket for everything from `start` and feed what is still missing.
    async fn replay(&mut self, endpoint: &str, start: u64) -> Result<(), ReplayError> {
        let mut dealer = DealerSocket::new();
        tokio::time::timeout(REPLAY_STEP_TIMEOUT, dealer.connect(endpoint))
            .await
            .map_err(|_| Error::ReplayTimeout(REPLAY_STEP_TIMEOUT))?
            .map_err(Error::from)?;
        let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
        dealer.send(message(request)).await.map_err(Error::from)?;
        while self.ingestor.missing().is_some() {
            let frames = tokio::time::timeout(REPLAY_STEP_TIMEOUT, dealer.recv())
                .await
                .map_err(|_| Error::ReplayTimeout(REPLAY_STEP_TIMEOUT))?
                .map_err(Error::from)?
                .into_vec();
            // vLLM and SGLang answer with the live stream's frames, `[b"", topic, seq, payload]`;
            // older vLLM releases left the topic out.
            let (seq, payload) = match frames.as_slice() {
                [_empty, _, seq, payload] | [_empty, seq, payload] => (seq, payload),
                _ => return Err(Error::BadReplay.into()),
            };
            if seq.as_ref() == END_OF_REPLAY {
                break;
            }
            let seq = <[u8; 8]>::try_from(seq.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| Error::BadReplay)?;
            let replayed = self.ingestor.on_replayed(seq, payload);
            self.forward(replayed).await?;
        }
        Ok(())
    }

    /// Count what `ingested` reports and send its ops.
    async fn forward(&mut self, ingested: Ingested) -> Result<(), SinkClosed> {
        if ingested.malformed {
            SubscriberStats::bump(&self.stats.malformed);
        }
        let skipped = self.ingestor.stats();
        let keyed = skipped.skipped_lora + skipped.skipped_extra_keys;
        self.stats.keyed_stores.store(keyed, Ordering::Relaxed);
        let unaligned = skipped.skipped_unaligned;
        self.stats
            .unaligned_stores
            .store(unaligned, Ordering::Relaxed);
        if let Some(ts) = ingested.ts {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            let lag_ms = ((now - ts) * 1000.0).max(0.0) as u64;
            self.stats.last_lag_ms.store(lag_ms, Ordering::Relaxed);
        }
        for op in ingested.ops {
            self.send(op).await?;
        }
        Ok(())
    }

    async fn send(&self, op: IndexOp) -> Result<(), SinkClosed> {
        self.sink.send(op).await.map_err(|_| SinkClosed)
    }
}

/// Why a replay stopped early: the socket, or nobody left to send ops to.
enum ReplayError {
    Socket(Error),
    SinkClosed,
}

impl From<Error> for ReplayError {
    fn from(error: Error) -> Self {
        ReplayError::Socket(error)
    }
}

impl From<SinkClosed> for ReplayError {
    fn from(SinkClosed: SinkClosed) -> Self {
        ReplayError::SinkClosed
    }
}
