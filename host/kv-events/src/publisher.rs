//! The engine side: a PUB stream plus a ROUTER replay socket, as vLLM runs them.
//!
//! Used by the mock engine and by tests. One task owns both sockets; [`Publisher`] is a handle that
//! sends it batches, so it can be shared across tasks.

use crate::Error;
use crate::wire::{Encoding, EventBatch, encode_batch};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Sequence frame of the replay socket's end marker: -1 as a big-endian i64.
pub(crate) const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

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
    mut replay: Option<RouterSocket>,
    mut batches: mpsc::Receiver<Outgoing>,
    buffer_steps: usize,
    faults: Arc<PublisherFaults>,
) {
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    let mut next_seq = 0u64;
    loop {
        tokio::select! {
            outgoing = batches.recv() => {
                let Some(Outgoing { payload, lost, reply }) = outgoing else {
                    break;
                };
                let seq = next_seq;
                next_seq += 1;
                let sent = if lost {
                    Ok(())
                } else {
                    let frames = vec![Bytes::new(), seq_frame(seq), payload.clone()];
                    stream.send(message(frames)).await.map_err(Error::from)
                };
                if buffer_steps > 0 {
                    if buffer.len() == buffer_steps {
                        buffer.pop_front();
                    }
                    buffer.push_back((seq, payload));
                }
                // The caller may have stopped waiting; the batch is out either way.
                let _ = reply.send(sent.map(|()| seq));
            }
            request = next_request(&mut replay) => {
                let silent = faults.replay_silent.load(Ordering::Relaxed);
                let answered = match (request, replay.as_mut()) {
                    (Ok(_), Some(_)) if silent => Ok(()),
                    (Ok(request), Some(router)) => answer(router, request, &buffer).await,
                    (Err(error), _) => Err(error.into()),
                    (Ok(_), None) => Ok(()),
                };
                if let Err(error) = answered {
                    tracing::debug!(%error, "KV event replay request failed");
                }
            }
        }
    }
    let _ = stream.close().await;
    if let Some(router) = replay {
        let _ = router.close().await;
    }
}

async fn next_request(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(router) => router.recv().await,
        None => std::future::pending().await,
    }
}

/// Answer `[identity, b"", start_seq]` with every buffered batch from `start_seq` on, then the
/// end marker, framed as vLLM and SGLang do today: `[b"", topic, seq, payload]` (the live stream's
/// frames) and `[b"", b"", -1, b""]`.
async fn answer(
    router: &mut RouterSocket,
    request: ZmqMessage,
    buffer: &VecDeque<(u64, Bytes)>,
) -> Result<(), Error> {
    let frames = request.into_vec();
    let [identity, _empty, start] = frames.as_slice() else {
        return Err(Error::BadReplay);
    };
    let start = <[u8; 8]>::try_from(start.as_ref())
        .map(u64::from_be_bytes)
        .map_err(|_| Error::BadReplay)?;
    for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
        let frames = vec![
            identity.clone(),
            Bytes::new(),
            Bytes::new(), // topic
            seq_frame(*seq),
            payload.clone(),
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
