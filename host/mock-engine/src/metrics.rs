//! `/metrics` under vLLM's names (engine-protocols.md section 4), read from the engine task's
//! latest stats at scrape time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use switchyard_core::engine::EngineStats;
use tokio::sync::watch;

/// Renders the engine's stats in the Prometheus text format.
#[derive(Debug)]
struct EngineCollector {
    stats: watch::Receiver<EngineStats>,
    model_name: String,
    block_size: String,
    num_blocks: String,
}

/// A registry holding the engine's metrics.
pub(crate) fn registry(
    stats: watch::Receiver<EngineStats>,
    model_name: &str,
    block_size: usize,
    num_blocks: usize,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(EngineCollector {
        stats,
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
        // vLLM publishes its cache configuration as labels of a gauge fixed at 1.
        let config = [
            ("block_size", self.block_size.as_str()),
            ("num_gpu_blocks", self.num_blocks.as_str()),
        ];
        let gauge = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig.",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(family.encode_family(&config)?)
    }
}
