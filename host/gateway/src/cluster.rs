//! In-flight load shared between gateway replicas over NATS Core (`[cluster]`).
//!
//! Each replica's router records the changes to its own bookings (booked, prefill done,
//! finished); the request path hands them to a bounded queue without waiting (a full queue
//! drops them and counts it), and one publisher task sends them in batches to
//! `switchyard.<cluster>.bookings`. A subscriber task takes the other replicas' messages (its
//! own are ignored by replica id) and adds their bookings to the router as peer load, keyed by
//! replica and request id, each forgotten after `booking_ttl` if no `finished` came.
//!
//! Soft state only: the server may be absent or die at any time. The client connects in the
//! background and reconnects with backoff; while it is down, changes are dropped (counted) and
//! peers' bookings expire, so routing falls back to what this replica sees itself.

use crate::config::ClusterConfig;
use crate::metrics::{DirectionLabels, Metrics};
use crate::server::Shared;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::router::{BookingDelta, PeerId, RequestId};
use switchyard_core::worker::Rank;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Most booking changes sent in one message.
const BATCH: usize = 256;
/// Longest a publish may wait for the client's own queue before its changes are dropped.
const PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// The request path's end of the cluster: where booking changes go.
#[derive(Debug)]
pub(crate) struct Cluster {
    tx: mpsc::Sender<Vec<BookingDelta>>,
    metrics: Arc<Metrics>,
}

/// The background end, started once the shared state exists.
#[derive(Debug)]
pub(crate) struct ClusterTasks {
    config: ClusterConfig,
    replica: String,
    rx: mpsc::Receiver<Vec<BookingDelta>>,
}

/// One message on the bookings subject.
#[derive(Debug, Serialize, Deserialize)]
struct Message {
    /// The sending replica.
    replica: String,
    /// How long its bookings stand without a `finished`, in milliseconds.
    ttl_ms: u64,
    deltas: Vec<Delta>,
}

/// One booking change; workers are named by URL (ids differ between replicas).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Delta {
    Booked {
        id: u64,
        worker: String,
        dp_rank: u32,
        prefill_tokens: u64,
        decode_blocks: u64,
    },
    PrefillDone {
        id: u64,
    },
    Finished {
        id: u64,
    },
}

impl Cluster {
    /// The queue for `config` and the tasks that drain it.
    pub(crate) fn new(config: &ClusterConfig, metrics: Arc<Metrics>) -> (Cluster, ClusterTasks) {
        let (tx, rx) = mpsc::channel(config.buffer);
        let replica = config.replica_id.clone().unwrap_or_else(random_id);
        (
            Cluster { tx, metrics },
            ClusterTasks {
                config: config.clone(),
                replica,
                rx,
            },
        )
    }

    /// Queue the router's booking changes for the other replicas; never waits.
    pub(crate) fn publish(&self, deltas: Vec<BookingDelta>) {
        if deltas.is_empty() {
            return;
        }
        let n = deltas.len() as u64;
        if self.tx.try_send(deltas).is_err() {
            count(&self.metrics, "dropped", n);
        }
    }
}

impl ClusterTasks {
    /// Connect (in the background, retried with backoff) and run the publisher and subscriber
    /// until `stop`.
    pub(crate) fn spawn(self, shared: Arc<Shared>, tasks: &TaskTracker, stop: CancellationToken) {
        let ClusterTasks {
            config,
            replica,
            rx,
        } = self;
        let metrics = shared.metrics.clone();
        let events = metrics.clone();
        let url = config.nats_url.clone();
        let options = async_nats::ConnectOptions::new()
            .name(format!("switchyard-{replica}"))
            .no_echo()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2))
            .reconnect_delay_callback(backoff)
            .event_callback(move |event| {
                let metrics = events.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            metrics.cluster_connected.set(1);
                            tracing::info!("cluster: connected to NATS");
                        }
                        async_nats::Event::Disconnected => {
                            metrics.cluster_connected.set(0);
                            tracing::warn!("cluster: NATS connection lost; reconnecting");
                        }
                        other => tracing::debug!(event = %other, "cluster: NATS event"),
                    }
                }
            });
        tracing::info!(%replica, subject = %config.subject(), url = %url, "cluster: sharing in-flight load");
        tasks.spawn(async move {
            let client = tokio::select! {
                _ = stop.cancelled() => return,
                client = options.connect(url.as_str()) => client,
            };
            let client = match client {
                Ok(client) => client,
                Err(e) => {
                    tracing::error!(error = %e, url = %url, "cluster: cannot use the NATS server; load is not shared");
                    return;
                }
            };
            let subject = config.subject();
            let publisher = publish_loop(
                client.clone(),
                subject.clone(),
                (replica.clone(), config.booking_ttl),
                rx,
                shared.clone(),
                stop.clone(),
            );
            let subscriber = subscribe_loop(client, subject, replica, shared, stop);
            tokio::join!(publisher, subscriber);
            metrics.cluster_connected.set(0);
        });
    }
}

/// Reconnect delay: 50 ms doubling to 5 s.
fn backoff(attempts: usize) -> Duration {
    let exp = attempts.min(7) as u32;
    Duration::from_millis(50 * 2u64.pow(exp)).min(Duration::from_secs(5))
}

fn count(metrics: &Metrics, direction: &'static str, n: u64) {
    metrics
        .cluster_messages
        .get_or_create(&DirectionLabels { direction })
        .inc_by(n);
}

/// A random replica id (16 hex digits).
fn random_id() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    std::process::id().hash(&mut hasher);
    std::time::SystemTime::now().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// The router's key for a replica id.
fn peer_id(replica: &str) -> PeerId {
    let mut hasher = std::hash::DefaultHasher::new();
    replica.hash(&mut hasher);
    PeerId(hasher.finish())
}

async fn publish_loop(
    client: async_nats::Client,
    subject: String,
    (replica, ttl): (String, Duration),
    mut rx: mpsc::Receiver<Vec<BookingDelta>>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let metrics = &shared.metrics;
    loop {
        let mut batch = tokio::select! {
            _ = stop.cancelled() => return,
            batch = rx.recv() => match batch {
                Some(batch) => batch,
                None => return,
            },
        };
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        if client.connection_state() != async_nats::connection::State::Connected {
            // Stale by the time a connection comes back: peers expire what they miss.
            count(metrics, "dropped", n);
            continue;
        }
        let message = Message {
            replica: replica.clone(),
            ttl_ms: ttl.as_millis() as u64,
            deltas: batch.iter().filter_map(|d| encode(&shared, d)).collect(),
        };
        let payload = match serde_json::to_vec(&message) {
            Ok(payload) => payload,
            Err(_) => continue,
        };
        let sent = tokio::time::timeout(
            PUBLISH_WAIT,
            client.publish(subject.clone(), payload.into()),
        )
        .await;
        match sent {
            Ok(Ok(())) => count(metrics, "sent", 1),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cluster: publish failed");
                count(metrics, "dropped", n);
            }
            Err(_) => count(metrics, "dropped", n),
        }
    }
}

fn encode(shared: &Shared, delta: &BookingDelta) -> Option<Delta> {
    Some(match *delta {
        BookingDelta::Booked {
            id,
            rank,
            prefill_tokens,
            decode_blocks,
        } => Delta::Booked {
            id: id.0,
            // A worker that left meanwhile: nobody needs to hear of it.
            worker: shared.fleet.get(rank.worker)?.upstream.base_url.clone(),
            dp_rank: rank.dp_rank,
            prefill_tokens,
            decode_blocks,
        },
        BookingDelta::PrefillDone { id } => Delta::PrefillDone { id: id.0 },
        BookingDelta::Finished { id } => Delta::Finished { id: id.0 },
    })
}

async fn subscribe_loop(
    client: async_nats::Client,
    subject: String,
    replica: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut attempts = 0;
    loop {
        let subscription = tokio::select! {
            _ = stop.cancelled() => return,
            s = client.subscribe(subject.clone()) => s,
        };
        let mut subscription = match subscription {
            Ok(s) => s,
            Err(e) => {
                attempts += 1;
                tracing::warn!(error = %e, "cluster: cannot subscribe; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff(attempts)) => continue,
                }
            }
        };
        attempts = 0;
        // The client subscribes again by itself after a reconnect: this stream only ends
        // when the client closes.
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                m = subscription.next() => m,
            };
            let Some(message) = message else { break };
            apply(&shared, &replica, &message.payload);
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff(1)) => {}
        }
    }
}

/// Add a peer's message to the router (ignored: our own, and what does not parse).
fn apply(shared: &Shared, replica: &str, payload: &[u8]) {
    let Ok(message) = serde_json::from_slice::<Message>(payload) else {
        tracing::debug!("cluster: ignored a message that does not parse");
        return;
    };
    if message.replica == replica {
        return;
    }
    count(&shared.metrics, "received", 1);
    let peer = peer_id(&message.replica);
    let ttl = Duration::from_millis(message.ttl_ms);
    // Worker URLs to this replica's ranks, before taking the router's lock.
    let members = shared.fleet.members();
    let rank_of = |url: &str, dp_rank: u32| {
        let url = url.trim_end_matches('/');
        members
            .iter()
            .find(|m| m.upstream.base_url == url && dp_rank < m.upstream.dp_size)
            .map(|m| Rank {
                worker: m.upstream.id,
                dp_rank,
            })
    };
    let deltas: Vec<(Delta, Option<Rank>)> = message
        .deltas
        .into_iter()
        .map(|d| {
            let rank = match &d {
                Delta::Booked {
                    worker, dp_rank, ..
                } => rank_of(worker, *dp_rank),
                _ => None,
            };
            (d, rank)
        })
        .collect();
    let now = shared.now();
    let mut router = shared.router();
    router.expire_peers(now);
    tracing::debug!(peer = %message.replica, changes = deltas.len(), held = router.peer_bookings(), "cluster: peer bookings");
    for (delta, rank) in deltas {
        match delta {
            Delta::Booked {
                id,
                prefill_tokens,
                decode_blocks,
                ..
            } => match rank {
                Some(rank) => {
                    router.peer_booked(
                        peer,
                        RequestId(id),
                        rank,
                        (prefill_tokens, decode_blocks),
                        now + ttl,
                    );
                }
                // A worker we do not have: forget any earlier booking of the request.
                None => router.peer_finished(peer, RequestId(id)),
            },
            Delta::PrefillDone { id } => router.peer_prefill_done(peer, RequestId(id)),
            Delta::Finished { id } => router.peer_finished(peer, RequestId(id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_in_their_documented_shape() {
        let message = Message {
            replica: "a".into(),
            ttl_ms: 30_000,
            deltas: vec![
                Delta::Booked {
                    id: 7,
                    worker: "http://w:1".into(),
                    dp_rank: 0,
                    prefill_tokens: 64,
                    decode_blocks: 4,
                },
                Delta::PrefillDone { id: 7 },
                Delta::Finished { id: 7 },
            ],
        };
        let text = serde_json::to_string(&message).unwrap();
        assert_eq!(
            text,
            r#"{"replica":"a","ttl_ms":30000,"deltas":[{"op":"booked","id":7,"worker":"http://w:1","dp_rank":0,"prefill_tokens":64,"decode_blocks":4},{"op":"prefill_done","id":7},{"op":"finished","id":7}]}"#
        );
        let back: Message = serde_json::from_str(&text).unwrap();
        assert_eq!(back.deltas.len(), 3);
    }

    #[test]
    fn backoff_grows_to_five_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(100), Duration::from_secs(5));
        assert_ne!(random_id(), random_id());
        assert_eq!(peer_id("x"), peer_id("x"));
    }
}
