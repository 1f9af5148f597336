//! The engine side: a PUB stream plus a ROUTER replay socket, as vLLM runs them.
//!
//! Used by the mock engine, the KV pool and tests. One task owns the stream, another the replay
//! socket, so that a replay requester that stops reading never holds up the live stream (a ROUTER
//! send in the `zeromq` crate waits for room in the peer's queue, where libzmq's drops).
//! [`Publisher`] is a handle that sends batches to the stream's task, so it can be shared across
//! tasks.

use crate::Error;
use crate::wire::{Encoding, EventBatch, encode_batch};
use bytes::Bytes;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Sequence frame of the replay socket's end marker: -1 as a big-endian i64.
pub(crate) const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// Longest one replay answer may wait for room in its requester's queue: a requester that stops
/// reading is given up on (its replay ends without the end marker and times out there), so the
/// next requester is answered.
const REPLAY_ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Stalled requesters remembered (then forgotten together): each is one connection's identity.
const MAX_STALLED: usize = 1024;

/// The batches the replay socket can answer with: the last `buffer_steps`, shared by the stream's
/// task, which adds them, and the replay task, which reads them.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// A KV event publisher. Sequence numbers start at 0 and grow by one per batch.
#[derive(Debug)]
pub struct Publisher {
    batches: mpsc::Sender<Outgoing>,
    task: JoinHandle<()>,
    endpoint: String,
    replay_endpoint: Option<String>,
    encoding: Encoding,
    faults: Arc<PublisherFaults>,
}

/// Fault switches of a publisher, shared with its socket task so that a test (or the mock
/// engine's `--fault-switches`) can flip them while it publishes. All off by default.
#[derive(Debug, Default)]
pub struct PublisherFaults {
    lose: AtomicU64,
    replay_silent: AtomicBool,
}

impl PublisherFaults {
    /// The next `batches` batches take sequence numbers and enter the replay buffer but are not
    /// sent on the stream, as if the network lost them.
    pub fn lose(&self, batches: u64) {
        self.lose.fetch_add(batches, Ordering::Relaxed);
    }

    /// While `silent`, the replay socket reads requests and answers none (a replay socket that
    /// hangs or is unreachable): a subscriber's replay times out.
    pub fn silence_replay(&self, silent: bool) {
        self.replay_silent.store(silent, Ordering::Relaxed);
    }

    /// Whether the next batch is lost (and one fewer is left to lose).
    fn take_loss(&self) -> bool {
        self.lose
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A batch for the socket task; `reply` gets its sequence number.
#[derive(Debug)]
struct Outgoing {
    payload: Bytes,
    lost: bool,
    reply: oneshot::Sender<Result<u64, Error>>,
}

// === impl Publisher ===

impl Publisher {
    /// Bind the PUB socket at `endpoint` and, if given, a replay socket at `replay_endpoint`
    /// that keeps the last `buffer_steps` batches. Port 0 picks a free port: see
    /// [`endpoint`](Self::endpoint).
    pub async fn bind(
        endpoint: &str,
        replay_endpoint: Option<&str>,
        encoding: Encoding,
        buffer_steps: usize,
    ) -> Result<Publisher, Error> {
        let mut stream = PubSocket::new();
        let endpoint = stream.bind(endpoint).await?.to_string();
        let (replay, replay_endpoint) = match replay_endpoint {
            Some(requested) => {
                let mut router = RouterSocket::new();
                let bound = router.bind(requested).await?.to_string();
                (Some(router), Some(bound))
            }
            None => (None, None),
        };
        let (batches, receiver) = mpsc::channel(64);
        let faults = Arc::new(PublisherFaults::default());
        let task = tokio::spawn(serve(
            stream,
            replay,
            receiver,
            buffer_steps,
            faults.clone(),
        ));
        Ok(Publisher {
            batches,
            task,
            endpoint,
            replay_endpoint,
            encoding,
            faults,
        })
    }

    /// The bound PUB address, e.g. `tcp://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The bound replay address, if there is a replay socket.
    pub fn replay_endpoint(&self) -> Option<String> {
        self.replay_endpoint.clone()
    }

    /// Publish one batch; returns its sequence number.
    ///
    /// As with any PUB socket, a batch published before a subscriber has joined is not delivered
    /// to it (it stays in the replay buffer).
    pub async fn publish(&self, batch: &EventBatch) -> Result<u64, Error> {
        self.publish_payload(encode_batch(batch, self.encoding))
            .await
    }

    /// Publish one payload encoded by the caller (another format on the same three-frame
    /// stream, such as [`crate::wire::mooncake`]); returns its sequence number.
    pub async fn publish_payload(&self, payload: Vec<u8>) -> Result<u64, Error> {
        let (reply, seq) = oneshot::channel();
        let outgoing = Outgoing {
            payload: payload.into(),
            lost: self.faults.take_loss(),
            reply,
        };
        self.batches
            .send(outgoing)
            .await
            .map_err(|_| Error::PublisherClosed)?;
        seq.await.map_err(|_| Error::PublisherClosed)?
    }

    /// Test hook: the next batch takes a sequence number and enters the replay buffer but is not
    /// sent on the stream, as if the network lost it.
    pub fn skip_sequence(&self) {
        self.faults.lose(1);
    }

    /// This publisher's fault switches.
    pub fn faults(&self) -> Arc<PublisherFaults> {
        self.faults.clone()
    }

    /// Stop publishing and release the ports (an engine shutting down).
    pub async fn close(self) {
        drop(self.batches);
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "KV event publisher task failed");
        }
    }
}

async fn serve(
    mut stream: PubSocket,
    replay: Option<RouterSocket>,
    mut batches: mpsc::Receiver<Outgoing>,
    buffer_steps: usize,
    faults: Arc<PublisherFaults>,
) {
    let buffer = ReplayBuffer::default();
    let stop = CancellationToken::new();
    let replay = replay.map(|router| {
        tokio::spawn(serve_replay(
            router,
            buffer.clone(),
            faults.clone(),
            stop.clone(),
        ))
    });
    let mut next_seq = 0u64;
    while let Some(Outgoing {
        payload,
        lost,
        reply,
    }) = batches.recv().await
    {
        let seq = next_seq;
        next_seq += 1;
        // Buffered before it is sent: a subscriber that sees it and asks for the batches before
        // it (a gap) gets it in the answer too.
        if buffer_steps > 0 {
            let mut buffer = buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buffer.len() == buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload.clone()));
        }
        let sent = if lost {
            Ok(())
        } else {
            let frames = vec![Bytes::new(), seq_frame(seq), payload];
            stream.send(message(frames)).await.map_err(Error::from)
        };
        // The caller may have stopped waiting; the batch is out either way.
        let _ = reply.send(sent.map(|()| seq));
    }
    let _ = stream.close().await;
    stop.cancel();
    if let Some(replay) = replay {
        let _ = replay.await;
    }
}

/// Answer replay requests, one at a time, until `stop`; then release the socket's port. A
/// requester whose answer stalled is not answered again: it stopped reading, and each of its
/// queued requests would hold the others up for as long.
async fn serve_replay(
    mut router: RouterSocket,
    buffer: ReplayBuffer,
    faults: Arc<PublisherFaults>,
    stop: CancellationToken,
) {
    let mut stalled = HashSet::new();
    loop {
        let request = tokio::select! {
            () = stop.cancelled() => break,
            request = router.recv() => request,
        };
        if faults.replay_silent.load(Ordering::Relaxed) {
            continue;
        }
        let (identity, start) = match request.map_err(Error::from).and_then(replay_request) {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(%error, "KV event replay request failed");
                continue;
            }
        };
        if stalled.contains(&identity) {
            continue;
        }
        let answer = answer(&mut router, &identity, start, &buffer);
        let answered = tokio::select! {
            () = stop.cancelled() => break,
            answered = tokio::time::timeout(REPLAY_ANSWER_TIMEOUT, answer) => answered,
        };
        match answered {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "KV event replay request failed"),
            Err(_) => {
                tracing::debug!(
                    "a KV event replay requester took no answer within {REPLAY_ANSWER_TIMEOUT:?}: \
                     given up on"
                );
                if stalled.len() == MAX_STALLED {
                    stalled.clear();
                }
                stalled.insert(identity);
            }
        }
    }
    let _ = router.close().await;
}

/// A replay request, `[identity, b"", start_seq]`: who asked, and from which sequence number.
fn replay_request(request: ZmqMessage) -> Result<(Bytes, u64), Error> {
    let frames = request.into_vec();
    let [identity, _empty, start] = frames.as_slice() else {
        return Err(Error::BadReplay);
    };
    let start = <[u8; 8]>::try_from(start.as_ref())
        .map(u64::from_be_bytes)
        .map_err(|_| Error::BadReplay)?;
    Ok((identity.clone(), start))
}

/// Answer `identity` with every buffered batch from `start` on, then the end marker, framed as
/// vLLM and SGLang do today: `[b"", topic, seq, payload]` (the live stream's frames) and
/// `[b"", b"", -1, b""]`.
async fn answer(
    router: &mut RouterSocket,
    identity: &Bytes,
    start: u64,
    buffer: &ReplayBuffer,
) -> Result<(), Error> {
    // A snapshot (the payloads are shared, not copied): the stream's task never waits on a
    // requester's socket.
    let batches: Vec<(u64, Bytes)> = {
        let buffer = buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let first = buffer.partition_point(|(seq, _)| *seq < start);
        buffer.range(first..).cloned().collect()
    };
    for (seq, payload) in batches {
        let frames = vec![
            identity.clone(),
            Bytes::new(),
            Bytes::new(), // topic
            seq_frame(seq),
            payload,
        ];
        router.send(message(frames)).await?;
    }
    let end = vec![
        identity.clone(),
        Bytes::new(),
        Bytes::new(), // topic
        Bytes::from_static(&END_OF_REPLAY),
        Bytes::new(),
    ];
    router.send(message(end)).await?;
    Ok(())
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

/// A multi-frame message; `frames` is never empty here.
pub(crate) fn message(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("messages are built with at least one frame")
}
