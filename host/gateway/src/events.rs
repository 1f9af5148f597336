//! KV-event ingestion health per worker rank, read from the subscribers at scrape time, and
//! what the index holds per rank (to compare with what the engines report they hold).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;
use switchyard_kv_events::subscriber::{SubscriberSnapshot, SubscriberStats};

use crate::fleet::Fleet;
use crate::index::IndexReader;
use crate::metrics::{WorkerLabels, worker_label};
use prometheus_client::encoding::EncodeLabelSet;
use switchyard_core::worker::Tier;

/// The subscribers' statistics of the fleet's members (and of the shared pool's stream, as
/// `worker="pool"`), exposed as `switchyard_kv_events_*` metrics.
#[derive(Debug)]
pub struct EventMetrics {
    /// The workers.
    pub fleet: Arc<Fleet>,
    /// The shared KV pool's subscriber, if one is configured.
    pub pool: Option<Arc<SubscriberStats>>,
    /// The published index.
    pub index: IndexReader,
}

/// Labels of one rank's tier in the index.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    worker: String,
    tier: &'static str,
}

type Field = fn(&SubscriberSnapshot) -> u64;

const COUNTERS: [(&str, &str, Field); 9] = [
    ("kv_events_messages", "KV-event batches received", |s| {
        s.messages
    }),
    (
        "kv_events_malformed",
        "KV-event messages that could not be decoded (skipped)",
        |s| s.malformed,
    ),
    (
        "kv_events_gaps",
        "Sequence gaps detected in the KV-event stream",
        |s| s.gaps,
    ),
    (
        "kv_events_replays",
        "Gaps recovered from the engine's replay socket",
        |s| s.replays,
    ),
    (
        "kv_events_replay_failures",
        "Gaps the engine's replay socket could not fill (the worker's index entries were cleared)",
        |s| s.replay_failures,
    ),
    (
        "kv_events_restarts",
        "Engine restarts detected (sequence reset to 0)",
        |s| s.restarts,
    ),
    (
        "kv_events_clears",
        "Times the worker's index entries were cleared",
        |s| s.clears,
    ),
    (
        "kv_events_keyed_stores",
        "Stored events not indexed: their blocks were hashed with a LoRA adapter, a cache salt \
         or multimodal inputs, which the router's hashes of prompts do not cover",
        |s| s.keyed_stores,
    ),
    (
        "kv_events_unaligned_stores",
        "Stored events not indexed because their blocks are neither the worker's configured \
         block_size nor a whole fraction or multiple of it (an engine started with another \
         block or page size), or their tokens do not fill them",
        |s| s.unaligned_stores,
    ),
];

impl Collector for EventMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pool = self.pool.iter().map(|s| {
            let label = WorkerLabels {
                worker: "pool".into(),
            };
            (label, s.snapshot())
        });
        let snapshots: Vec<_> = self
            .fleet
            .members()
            .iter()
            .flat_map(|m| m.events.iter())
            .map(|(r, s)| (worker_label(*r), s.snapshot()))
            .chain(pool)
            .collect();
        for (name, help, field) in COUNTERS {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (label, snapshot) in &snapshots {
                ConstCounter::new(field(snapshot)).encode(family.encode_family(label)?)?;
            }
        }
        let mut lag = encoder.encode_descriptor(
            "kv_events_lag_seconds",
            "Delay between the engine stamping the last batch and the gateway receiving it",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (label, snapshot) in &snapshots {
            ConstGauge::new(snapshot.last_lag_ms as f64 / 1000.0)
                .encode(lag.encode_family(label)?)?;
        }
        let mut connected = encoder.encode_descriptor(
            "kv_events_connected",
            "1 while the engine's publisher is attached to the subscriber (it connected to us, \
             or we to it, and it has not gone away)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (label, snapshot) in &snapshots {
            ConstGauge::new(i64::from(snapshot.connected))
                .encode(connected.encode_family(label)?)?;
        }
        let ranks: Vec<_> = self
            .fleet
            .members()
            .iter()
            .flat_map(|m| m.events.iter().map(|(rank, _)| *rank))
            .collect();
        let tiers = [
            (Tier::Device, "device"),
            (Tier::Host, "host"),
            (Tier::Disk, "disk"),
        ];
        let counts: Vec<_> = self.index.read(|index| {
            ranks
                .iter()
                .flat_map(|rank| tiers.iter().map(move |t| (*rank, *t)))
                .map(|(rank, (tier, name))| {
                    let label = TierLabels {
                        worker: rank.to_string(),
                        tier: name,
                    };
                    (label, index.blocks(rank, tier))
                })
                .collect()
        });
        let mut blocks = encoder.encode_descriptor(
            "kv_index_blocks",
            "Blocks the KV index holds for the rank's tier, from its events",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (label, count) in &counts {
            ConstGauge::new(*count as i64).encode(blocks.encode_family(label)?)?;
        }
        Ok(())
    }
}
