//! The pool's event stream: every store and removal, as Mooncake Store's master publishes them,
//! on a ZMQ PUB with a replay ROUTER (the crate `switchyard-kv-events` [`Publisher`]: sequence
//! numbers, replay buffer).

use std::time::{SystemTime, UNIX_EPOCH};

use switchyard_kv_events::Error as EventsError;
use switchyard_kv_events::publisher::Publisher;
use switchyard_kv_events::wire::Encoding;
use switchyard_kv_events::wire::mooncake::{MooncakeBatch, MooncakeEvent, encode};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Batches the replay socket keeps.
pub const REPLAY_BUFFER_BATCHES: usize = 1024;
/// Most event maps in one published batch (calls queued together are sent together).
const MAX_EVENTS_PER_BATCH: usize = 256;

/// The bound addresses of a running stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEndpoints {
    /// The PUB socket.
    pub publish: String,
    /// The replay socket, if any.
    pub replay: Option<String>,
}

/// Bind the sockets and start publishing what arrives on the returned sender.
pub async fn start(
    endpoint: &str,
    replay_endpoint: Option<&str>,
) -> Result<
    (
        mpsc::UnboundedSender<Vec<MooncakeEvent>>,
        EventEndpoints,
        JoinHandle<()>,
    ),
    EventsError,
> {
    // The encoding is vLLM's, unused here: payloads are encoded as Mooncake's.
    let publisher = Publisher::bind(
        endpoint,
        replay_endpoint,
        Encoding::Array,
        REPLAY_BUFFER_BATCHES,
    )
    .await?;
    let endpoints = EventEndpoints {
        publish: publisher.endpoint(),
        replay: publisher.replay_endpoint(),
    };
    let (sender, receiver) = mpsc::unbounded_channel();
    let task = tokio::spawn(publish(publisher, receiver));
    Ok((sender, endpoints, task))
}

/// Publish until every sender is gone (the pool stopped), then release the ports.
async fn publish(publisher: Publisher, mut receiver: mpsc::UnboundedReceiver<Vec<MooncakeEvent>>) {
    while let Some(mut events) = receiver.recv().await {
        while events.len() < MAX_EVENTS_PER_BATCH {
            match receiver.try_recv() {
                Ok(more) => events.extend(more),
                Err(_) => break,
            }
        }
        let batch = MooncakeBatch {
            ts_ms: now_ms(),
            events,
            dp_rank: None,
        };
        if let Err(error) = publisher.publish_payload(encode(&batch)).await {
            tracing::warn!(%error, "kv pool events: publish failed");
        }
    }
    publisher.close().await;
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
