//! `/metrics` under vLLM's names (engine-protocols.md section 4), read from the engine task's
//! latest stats at scrape time.

use crate::hints::HintCounters;
use crate::pool::PoolCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use switchyard_core::engine::EngineStats;
use tokio::sync::watch;

/// Renders the engine's stats in the Prometheus text format.
#[derive(Debug)]
struct EngineCollector {
    stats: watch::Receiver<EngineStats>,
    pool: Option<Arc<PoolCounters>>,
    hints: Arc<HintCounters>,
    /// `(tier, memory)`: where each tier's bytes are (see `TierSlabs::memory`).
    tier_memory: Vec<(&'static str, &'static str)>,
    model_name: String,
    block_size: String,
    num_blocks: String,
}

/// A registry holding the engine's metrics.
pub(crate) fn registry(
    stats: watch::Receiver<EngineStats>,
    pool: Option<Arc<PoolCounters>>,
    hints: Arc<HintCounters>,
    tier_memory: Vec<(&'static str, &'static str)>,
    model_name: &str,
    block_size: usize,
    num_blocks: usize,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(EngineCollector {
        stats,
        pool,
        hints,
        tier_memory,
        model_name: model_name.to_owned(),
        block_size: block_size.to_string(),
        num_blocks: num_blocks.to_string(),
    }));
    registry
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = *self.stats.borrow();
        let model = [("model_name", self.model_name.as_str())];
        let mut put = |name: &str, help: &str, metric: &dyn EncodeMetric| {
            let mut family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family.encode_family(&model)?)
        };
        put(
            "vllm:num_requests_running",
            "Requests in model execution batches.",
            &ConstGauge::new(stats.running as i64),
        )?;
        put(
            "vllm:num_requests_waiting",
            "Requests waiting to be processed.",
            &ConstGauge::new(stats.waiting as i64),
        )?;
        put(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            &ConstGauge::new(stats.kv_usage),
        )?;
        // Ours (vLLM has no such gauge): what a consistency check compares the router's index
        // with.
        put(
            "mock_prefix_cache_blocks",
            "Blocks in the device prefix cache (in use or free but reusable): what the KV events describe.",
            &ConstGauge::new(stats.cached_blocks as i64),
        )?;
        // Counter names get their `_total` suffix from the encoder.
        let counters = [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in queried tokens.",
                stats.prefix_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in cached tokens.",
                stats.prefix_hits,
            ),
            (
                "vllm:prompt_tokens",
                "Prefill tokens processed.",
                stats.prompt_tokens,
            ),
            (
                "vllm:generation_tokens",
                "Generation tokens processed.",
                stats.generation_tokens,
            ),
            (
                "vllm:request_success",
                "Successfully processed requests.",
                stats.finished,
            ),
        ];
        for (name, help, value) in counters {
            put(name, help, &ConstCounter::new(value))?;
        }
        if stats.tiers.host_capacity_blocks > 0 || self.pool.is_some() {
            encode_kvbm(&mut encoder, &stats, &self.block_size, &self.num_blocks)?;
        }
        if let Some(pool) = &self.pool {
            encode_pool(&mut encoder, &stats, pool)?;
        }
        encode_hints(&mut encoder, &self.hints)?;
        if !self.tier_memory.is_empty() {
            // Ours: whether the GPU tier really is on the GPU (a fallback to host memory is
            // silent otherwise).
            let tiers: Vec<_> = (self.tier_memory.iter())
                .map(|&(tier, memory)| [("tier", tier), ("memory", memory)])
                .collect();
            encode_info(
                &mut encoder,
                "mock_kv_tier_memory_info",
                "Where a KV tier's bytes are: cuda, host, pinned or pageable.",
                &tiers,
            )?;
        }
        let config = [
            ("block_size", self.block_size.as_str()),
            ("num_gpu_blocks", self.num_blocks.as_str()),
        ];
        encode_info(
            &mut encoder,
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            &[config],
        )
    }
}

/// An information metric as vLLM publishes its cache configuration: a gauge fixed at 1 whose
/// labels carry the values, one sample per label set.
fn encode_info(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label_sets: &[[(&str, &str); 2]],
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(1i64);
    let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    for labels in label_sets {
        gauge.encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// The block manager's metrics under Dynamo's `kvbm_*` names (the names of
/// `switchyard_kvbm::KvbmMetrics::samples`), per tier `g1` (device) and `g2` (host).
fn encode_kvbm(
    encoder: &mut DescriptorEncoder,
    stats: &EngineStats,
    block_size: &str,
    num_blocks: &str,
) -> Result<(), std::fmt::Error> {
    let block_size: u64 = block_size.parse().unwrap_or(1).max(1);
    let tiers = &stats.tiers;
    let device_capacity: i64 = num_blocks.parse().unwrap_or(0);
    let device_used = (stats.kv_usage * device_capacity as f64).round() as i64;
    let per_tier: [(&str, &str, [i64; 2]); 4] = [
        (
            "kvbm_tier_usage_blocks",
            "Blocks held, per tier.",
            [device_used, tiers.host_blocks as i64],
        ),
        (
            "kvbm_tier_capacity_blocks",
            "Capacity in blocks, per tier.",
            [device_capacity, tiers.host_capacity_blocks as i64],
        ),
        (
            "kvbm_hits_total",
            "Prefix blocks found, per tier.",
            [
                (stats.prefix_hits / block_size) as i64,
                tiers.onboarded_blocks as i64,
            ],
        ),
        (
            "kvbm_evictions_total",
            "Blocks evicted, per tier (the device's are not counted here).",
            [0, tiers.host_evictions as i64],
        ),
    ];
    for (name, help, values) in per_tier {
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
        for (tier, value) in ["g1", "g2"].into_iter().zip(values) {
            ConstGauge::new(value).encode(family.encode_family(&[("tier", tier)])?)?;
        }
    }
    let flows = [
        (
            "kvbm_matched_tokens",
            "Prompt tokens found in any tier.",
            stats.prefix_hits + tiers.host_hit_tokens + tiers.pool_hit_tokens,
        ),
        (
            "kvbm_offload_blocks_d2h",
            "Blocks written through from device to host.",
            tiers.offloaded_blocks,
        ),
        (
            "kvbm_offload_bytes_total",
            "Bytes written through.",
            tiers.offloaded_bytes,
        ),
        (
            "kvbm_onboard_blocks_h2d",
            "Blocks loaded from host to device.",
            tiers.onboarded_blocks,
        ),
        (
            "kvbm_onboard_bytes_total",
            "Bytes loaded into the device.",
            tiers.onboarded_bytes,
        ),
        (
            "kvbm_prefetch_blocks",
            "Blocks prefetch hints loaded into the device in the background.",
            tiers.prefetched_blocks,
        ),
        (
            "kvbm_demoted_blocks",
            "Blocks demote hints moved to a lower tier.",
            tiers.demoted_blocks,
        ),
        (
            "kvbm_ephemeral_blocks",
            "Computed blocks past their request's max_offload_tokens, never written through.",
            tiers.ephemeral_blocks,
        ),
    ];
    for (name, help, value) in flows {
        let gauge = ConstGauge::new(value as i64);
        let family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
        gauge.encode(family)?;
    }
    Ok(())
}

/// What became of the KV hints, per action type and outcome: actions, and the blocks they
/// acted on.
fn encode_hints(
    encoder: &mut DescriptorEncoder,
    hints: &HintCounters,
) -> Result<(), std::fmt::Error> {
    let samples = hints.samples();
    let actions = samples.iter().map(|s| (s.action, s.outcome, s.actions));
    let help = "KV hint actions applied, by action type and outcome.";
    encode_hint_family(encoder, "mock_kv_hints", help, actions)?;
    let blocks = samples.iter().map(|s| (s.action, s.outcome, s.blocks));
    let help = "Blocks KV hint actions acted on, by action type and outcome.";
    encode_hint_family(encoder, "mock_kv_hint_blocks", help, blocks)
}

/// One counter family labelled by `action` and `outcome`.
fn encode_hint_family<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (&'a str, &'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let counter = ConstCounter::new(0u64);
    let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
    for (action, outcome, value) in values {
        let labels = [("action", action), ("outcome", outcome)];
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The shared pool's side, in kvbm's names where Dynamo has one (`kvbm_onboard_blocks_g4`).
fn encode_pool(
    encoder: &mut DescriptorEncoder,
    stats: &EngineStats,
    pool: &PoolCounters,
) -> Result<(), std::fmt::Error> {
    let tiers = &stats.tiers;
    let read = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let counters = [
        (
            "kvbm_onboard_blocks_g4",
            "Blocks loaded from the shared pool into the device.",
            tiers.pool_fetched_blocks,
        ),
        (
            "kvbm_pool_hit_tokens",
            "Prompt tokens loaded from the shared pool (part of cached_tokens).",
            tiers.pool_hit_tokens,
        ),
        (
            "kvbm_offload_blocks_g4",
            "Blocks written through to the shared pool.",
            read(&pool.published),
        ),
        (
            "kvbm_pool_publish_failed",
            "Blocks whose write to the shared pool failed.",
            read(&pool.publish_failed),
        ),
        (
            "kvbm_pool_publish_dropped",
            "Blocks not written to the shared pool because its queue was full.",
            read(&pool.publish_dropped),
        ),
        (
            "kvbm_pool_unavailable",
            "Pool lookups that found it unreachable or too slow (the engine recomputed).",
            read(&pool.unavailable),
        ),
        (
            "kvbm_pool_refused",
            "Pool requests refused with a 4xx (block size, token or version).",
            read(&pool.refused),
        ),
    ];
    for (name, help, value) in counters {
        let counter = ConstCounter::new(value);
        let family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
        counter.encode(family)?;
    }
    Ok(())
}
