//! `GET /metrics`: the pool's numbers under Dynamo's `kvbm_*` names, with a `tier` label
//! (`memory`, `disk`) where a number is per tier. Read from the pool at scrape time.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::store::{Pool, PoolTier};

/// Refusals by reason, counted by the service.
#[derive(Debug, Default)]
pub struct Refusals {
    counts: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl Refusals {
    /// Count one refusal of `kind`.
    pub fn count(&self, kind: &'static str) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry(kind).or_insert(0) += 1;
    }

    fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

#[derive(Debug)]
struct PoolCollector {
    pool: Arc<Pool>,
    refusals: Arc<Refusals>,
}

/// A registry holding the pool's metrics.
pub fn registry(pool: Arc<Pool>, refusals: Arc<Refusals>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(PoolCollector { pool, refusals }));
    registry
}

/// One family, one sample per `(labels, value)`.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(&[(&str, &str)], M)],
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = samples.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    if let [(labels, metric)] = samples
        && labels.is_empty()
    {
        // An unlabelled sample: no `{}` after the name.
        return metric.encode(family);
    }
    for (labels, metric) in samples {
        metric.encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = self.pool.counters();
        let disk = self.pool.disk_counters();
        let memory = [("tier", PoolTier::Memory.label())];
        let on_disk = [("tier", PoolTier::Disk.label())];
        let tiers: Vec<(&[(&str, &str)], _)> = [PoolTier::Memory, PoolTier::Disk]
            .into_iter()
            .zip([&memory[..], &on_disk[..]])
            .filter_map(|(tier, labels)| self.pool.usage(tier).map(|u| (labels, u)))
            .collect();
        let gauge =
            |f: fn(&crate::store::TierUsage) -> usize| -> Vec<(&[(&str, &str)], ConstGauge)> {
                tiers
                    .iter()
                    .map(|(l, u)| (*l, ConstGauge::new(f(u) as i64)))
                    .collect()
            };
        family(
            &mut encoder,
            "kvbm_tier_usage_blocks",
            "Blocks held, per tier.",
            &gauge(|u| u.blocks),
        )?;
        family(
            &mut encoder,
            "kvbm_tier_capacity_blocks",
            "Capacity in blocks, per tier.",
            &gauge(|u| u.capacity),
        )?;
        // Counter names get their `_total` suffix from the encoder.
        let evictions: Vec<(&[(&str, &str)], _)> = tiers
            .iter()
            .map(|(l, u)| (*l, ConstCounter::new(u.evictions)))
            .collect();
        family(
            &mut encoder,
            "kvbm_evictions",
            "Blocks evicted, per tier (from memory: written to disk when there is one).",
            &evictions,
        )?;
        let with_disk = |memory_value: u64, disk_value: u64| {
            let mut samples: Vec<(&[(&str, &str)], ConstCounter)> =
                vec![(&memory[..], ConstCounter::new(memory_value))];
            if disk.is_some() {
                samples.push((&on_disk[..], ConstCounter::new(disk_value)));
            }
            samples
        };
        family(
            &mut encoder,
            "kvbm_hits",
            "Blocks served by get, per tier.",
            &with_disk(c.memory_hits, c.disk_hits),
        )?;
        family(
            &mut encoder,
            "kvbm_misses",
            "Blocks a get did not find, per tier (disk: missed both).",
            &with_disk(c.memory_misses, c.disk_misses),
        )?;
        let none: &[(&str, &str)] = &[];
        let plain = [
            ("kvbm_pool_puts", "Blocks stored by put.", c.puts),
            (
                "kvbm_pool_duplicate_puts",
                "Put blocks already present (touched, not written).",
                c.duplicate_puts,
            ),
            (
                "kvbm_pool_bytes_in",
                "Block bytes received by put.",
                c.bytes_in,
            ),
            (
                "kvbm_pool_bytes_out",
                "Block bytes sent by get.",
                c.bytes_out,
            ),
            (
                "kvbm_pool_promotions",
                "Blocks a get read from disk and moved back to memory.",
                c.promoted,
            ),
            (
                "kvbm_pool_adopted",
                "Blocks found on disk at start, left by an earlier run.",
                c.adopted,
            ),
        ];
        for (name, help, value) in plain {
            family(
                &mut encoder,
                name,
                help,
                &[(none, ConstCounter::new(value))],
            )?;
        }
        if let Some(disk) = disk {
            let disk_counters = [
                (
                    "kvbm_offload_blocks_h2d",
                    "Blocks written from memory to disk (Dynamo's name).",
                    c.spilled,
                ),
                (
                    "kvbm_checksum_failures",
                    "Disk records that failed their checksum (served as misses).",
                    disk.checksum_failures,
                ),
                (
                    "kvbm_disk_writes_skipped_full",
                    "Disk writes skipped while the disk was full.",
                    disk.writes_skipped_full,
                ),
            ];
            for (name, help, value) in disk_counters {
                family(
                    &mut encoder,
                    name,
                    help,
                    &[(&on_disk[..], ConstCounter::new(value))],
                )?;
            }
        }
        let refusals = self.refusals.snapshot();
        let labels: Vec<[(&str, &str); 1]> =
            refusals.iter().map(|(k, _)| [("reason", *k)]).collect();
        let samples: Vec<(&[(&str, &str)], ConstCounter)> = labels
            .iter()
            .zip(&refusals)
            .map(|(l, (_, v))| (&l[..], ConstCounter::new(*v)))
            .collect();
        family(
            &mut encoder,
            "kvbm_pool_refused",
            "Requests refused (4xx), by reason.",
            &samples,
        )
    }
}
