//! Counters in Dynamo's `kvbm_*` naming, as plain data the caller exports (the gateway turns
//! them into Prometheus series; the simulator into a report).

use crate::pool::PoolUsage;
use crate::types::Tier;

/// One local tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierMetrics {
    /// Blocks registered in the tier now (`kvbm_tier_usage_blocks`).
    pub usage_blocks: u64,
    /// The tier's capacity (`kvbm_tier_capacity_blocks`).
    pub capacity_blocks: u64,
    /// Blocks a lookup found in this tier (`kvbm_hits_total`).
    pub hits: u64,
    /// Blocks evicted from this tier (`kvbm_evictions_total`).
    pub evictions: u64,
    /// Pins refused by this tier's budget (`kvbm_pins_clipped_total`).
    pub pins_clipped: u64,
    /// Measured bandwidth of loads from this tier into the device, in bytes per second (the
    /// moving average behind the bypass rule; 0 until a load was recorded)
    /// (`kvbm_load_bandwidth_bytes_per_second`).
    pub load_bytes_per_s: u64,
}

/// Every counter of one block manager.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvbmMetrics {
    /// G1, G2, G3 in that order.
    pub tiers: [TierMetrics; 3],
    /// Tokens of lookups matched in any tier (`kvbm_matched_tokens`).
    pub matched_tokens: u64,
    /// Blocks written G1 -> G2 (`kvbm_offload_blocks_d2h`).
    pub offload_blocks_d2h: u64,
    /// Blocks written G2 -> G3 (`kvbm_offload_blocks_h2d`, host to disk).
    pub offload_blocks_h2d: u64,
    /// Bytes written through, all edges (`kvbm_offload_bytes_total`).
    pub offload_bytes: u64,
    /// Blocks loaded G2 -> G1 (`kvbm_onboard_blocks_h2d`).
    pub onboard_blocks_h2d: u64,
    /// Blocks loaded G3 -> G1 (`kvbm_onboard_blocks_d2d`, disk to device).
    pub onboard_blocks_d2d: u64,
    /// Blocks loaded G4 -> G1 (`kvbm_onboard_blocks_g4`).
    pub onboard_blocks_pool: u64,
    /// Blocks right after the local prefix a lookup found in the shared pool
    /// (`kvbm_pool_hits_total`).
    pub pool_hits: u64,
    /// Bytes onboarded, all tiers (`kvbm_onboard_bytes_total`).
    pub onboard_bytes: u64,
    /// Write-through candidates skipped because the tier below had them.
    pub offload_skipped_present: u64,
    /// Disk candidates skipped for being seen too rarely.
    pub offload_skipped_cold: u64,
    /// Ephemeral blocks never written through.
    pub offload_skipped_ephemeral: u64,
    /// Blocks not offloaded because the request's token cap was reached.
    pub offload_skipped_request_cap: u64,
    /// Transfers the caller reported as failed.
    pub transfers_failed: u64,
    /// Prefetches committed after their grace: dropped.
    pub prefetch_expired: u64,
    /// Blocks whose bytes failed their checksum or were truncated (`kvbm_checksum_failures_total`).
    pub checksum_failures: u64,
    /// Reads that skipped a tier because loading loses to recompute.
    pub bypassed_reads: u64,
}

/// One exported value: a metric name, an optional tier label, a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSample {
    /// `kvbm_*` name.
    pub name: &'static str,
    /// `g1`..`g3` for per-tier series.
    pub tier: Option<&'static str>,
    /// The value.
    pub value: u64,
}

impl KvbmMetrics {
    pub(crate) fn tier_mut(&mut self, tier: Tier) -> Option<&mut TierMetrics> {
        tier.local_index().map(|i| &mut self.tiers[i])
    }

    pub(crate) fn set_usage(&mut self, tier: Tier, usage: PoolUsage) {
        if let Some(metrics) = self.tier_mut(tier) {
            metrics.usage_blocks = usage.registered as u64;
            metrics.capacity_blocks = usage.capacity as u64;
        }
    }

    /// Every counter as a flat list of samples, ready for any exporter.
    pub fn samples(&self) -> Vec<MetricSample> {
        let mut out = Vec::new();
        for (tier, metrics) in Tier::LOCAL.iter().zip(&self.tiers) {
            let label = Some(tier.label());
            for (name, value) in [
                ("kvbm_tier_usage_blocks", metrics.usage_blocks),
                ("kvbm_tier_capacity_blocks", metrics.capacity_blocks),
                ("kvbm_hits_total", metrics.hits),
                ("kvbm_evictions_total", metrics.evictions),
                ("kvbm_pins_clipped_total", metrics.pins_clipped),
                (
                    "kvbm_load_bandwidth_bytes_per_second",
                    metrics.load_bytes_per_s,
                ),
            ] {
                out.push(MetricSample {
                    name,
                    tier: label,
                    value,
                });
            }
        }
        for (name, value) in [
            ("kvbm_matched_tokens", self.matched_tokens),
            ("kvbm_offload_blocks_d2h", self.offload_blocks_d2h),
            ("kvbm_offload_blocks_h2d", self.offload_blocks_h2d),
            ("kvbm_offload_bytes_total", self.offload_bytes),
            ("kvbm_onboard_blocks_h2d", self.onboard_blocks_h2d),
            ("kvbm_onboard_blocks_d2d", self.onboard_blocks_d2d),
            ("kvbm_onboard_blocks_g4", self.onboard_blocks_pool),
            ("kvbm_pool_hits_total", self.pool_hits),
            ("kvbm_onboard_bytes_total", self.onboard_bytes),
            (
                "kvbm_offload_skipped_present_total",
                self.offload_skipped_present,
            ),
            ("kvbm_offload_skipped_cold_total", self.offload_skipped_cold),
            (
                "kvbm_offload_skipped_ephemeral_total",
                self.offload_skipped_ephemeral,
            ),
            (
                "kvbm_offload_skipped_request_cap_total",
                self.offload_skipped_request_cap,
            ),
            ("kvbm_transfers_failed_total", self.transfers_failed),
            ("kvbm_prefetch_expired_total", self.prefetch_expired),
            ("kvbm_checksum_failures_total", self.checksum_failures),
            ("kvbm_bypassed_reads_total", self.bypassed_reads),
        ] {
            out.push(MetricSample {
                name,
                tier: None,
                value,
            });
        }
        out
    }
}
