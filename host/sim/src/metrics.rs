//! What a run recorded, and the statistics computed from it.

use crate::report::{
    AdmissionStats, KvHintsReport, KvUtilization, LatencyStats, RunReport, TierReport,
};
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_core::admission::AdmissionMetrics;
use switchyard_core::router::queue::QueueStats;

/// The life of one request on the virtual clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Session index in the workload.
    pub session: usize,
    /// Request index in its session.
    pub request: usize,
    /// Worker it was routed to; `None` if routing or admission failed.
    pub worker: Option<usize>,
    /// Gateway replica the load balancer sent it to (0 with one replica).
    pub replica: usize,
    /// Sent by the client (offered to admission).
    pub sent: Duration,
    /// Let go by admission (to the router, or its queue); `None` if never released.
    pub released: Option<Duration>,
    /// Admitted by the engine (prefill began).
    pub admitted: Option<Duration>,
    /// First token.
    pub first_token: Option<Duration>,
    /// Last token; `None` if the request failed.
    pub finished: Option<Duration>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Tokens generated (when finished).
    pub output_tokens: u32,
    /// Prompt tokens found in the engine's prefix cache.
    pub cached_tokens: u32,
}

impl RequestRecord {
    pub(crate) fn new(
        session: usize,
        request: usize,
        sent: Duration,
        prompt: &[u32],
        output: u32,
    ) -> Self {
        Self {
            session,
            request,
            worker: None,
            replica: 0,
            sent,
            released: None,
            admitted: None,
            first_token: None,
            finished: None,
            input_tokens: prompt.len() as u32,
            output_tokens: output,
            cached_tokens: 0,
        }
    }
}

/// Everything a run produced; [`Outcome::report`] summarises it.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Routing policy.
    pub policy: String,
    /// Admission policy.
    pub admission: String,
    /// The admission controller's counters at the last finish.
    pub admission_metrics: AdmissionMetrics,
    /// The router queue's counters, when there was one.
    pub queue_stats: Option<QueueStats>,
    /// Workers.
    pub workers: usize,
    /// Gateway replicas (admission and router-queue counters are summed over them).
    pub replicas: usize,
    /// How requests were spread over the replicas.
    pub replica_affinity: crate::sim::ReplicaAffinity,
    /// What the replicas' indexes learned from.
    pub index: crate::sim::IndexMode,
    /// Root sessions in flight at most.
    pub concurrency: Option<usize>,
    /// Arrival speed-up.
    pub speedup: f64,
    /// Tokens per block.
    pub block_size: u32,
    /// One per request sent, indexed by request id.
    pub records: Vec<RequestRecord>,
    /// Prompt tokens computed again although some worker had computed them before.
    pub recomputed_tokens: u64,
    /// Requests whose engine answered whole, so that no first token reached the router
    /// (`RouterConfig::engine_stream`).
    pub whole_answers: u64,
    /// Time between KV utilization samples.
    pub sample_interval: Duration,
    /// Per worker, the fraction of KV blocks in use at each sample.
    pub kv_samples: Vec<Vec<f64>>,
    /// The engines' lower-tier counters summed over workers; `None` without a host tier or a
    /// pool.
    pub tiers: Option<switchyard_core::engine::TierStats>,
    /// The shared pool's counters; `None` without one.
    pub pool: Option<crate::pool::PoolStats>,
    /// What the KV-hint path did; `None` without one.
    pub kv_hints: Option<KvHintsReport>,
}

/// Latencies are kept in microseconds, up to an hour, to 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid")
}

fn stats(values: impl Iterator<Item = Duration>) -> LatencyStats {
    let mut h = histogram();
    let (mut sum, mut n) = (0.0, 0u64);
    for v in values {
        let us = v.as_micros() as u64;
        h.saturating_record(us.max(1));
        sum += v.as_secs_f64() * 1000.0;
        n += 1;
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    LatencyStats {
        count: n,
        mean: if n == 0 { 0.0 } else { sum / n as f64 },
        p50: ms(0.5),
        p90: ms(0.9),
        p99: ms(0.99),
        max: h.max() as f64 / 1000.0,
    }
}

/// Points of the TTFT distribution for plots: (milliseconds, cumulative fraction).
fn cdf(values: &[Duration]) -> Vec<(f64, f64)> {
    let mut ms: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    const POINTS: usize = 100;
    if ms.is_empty() {
        return Vec::new();
    }
    (0..=POINTS)
        .map(|i| {
            let q = i as f64 / POINTS as f64;
            let at = ((ms.len() - 1) as f64 * q).round() as usize;
            (ms[at], q)
        })
        .collect()
}

impl Outcome {
    /// Summary statistics of the run.
    pub fn report(&self) -> RunReport {
        let done: Vec<&RequestRecord> = self
            .records
            .iter()
            .filter(|r| r.finished.is_some())
            .collect();
        let ttft: Vec<Duration> = done
            .iter()
            .filter_map(|r| Some(r.first_token? - r.sent))
            .collect();
        // Per request, as AIPerf does: decode time over the gaps between its tokens.
        let itl = done
            .iter()
            .filter(|r| r.output_tokens > 1)
            .filter_map(|r| Some((r.finished? - r.first_token?) / (r.output_tokens - 1)));
        let e2e = done.iter().filter_map(|r| Some(r.finished? - r.sent));
        let begin = self
            .records
            .iter()
            .map(|r| r.sent)
            .min()
            .unwrap_or_default();
        let end = done
            .iter()
            .filter_map(|r| r.finished)
            .max()
            .unwrap_or_default();
        let span = (end.saturating_sub(begin))
            .as_secs_f64()
            .max(f64::MIN_POSITIVE);
        let output: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
        let prompt: u64 = done.iter().map(|r| u64::from(r.input_tokens)).sum();
        let cached: u64 = done.iter().map(|r| u64::from(r.cached_tokens)).sum();
        let m = &self.admission_metrics;
        let queue = self.queue_stats.unwrap_or_default();
        RunReport {
            policy: self.policy.clone(),
            admission: self.admission.clone(),
            admission_stats: AdmissionStats {
                held_requests: m.holds,
                forced_releases: m.forced_releases,
                pauses: m.pauses,
                resumes: m.resumes,
                priority_adjustments: m.priority_adjustments,
                hold_time_s: m.hold_time.as_secs_f64(),
                paused_time_s: m.paused_time.as_secs_f64(),
                max_paused: m.max_paused,
                router_queued: queue.enqueued,
                router_queue_max_depth: queue.max_depth,
            },
            concurrency: self.concurrency,
            workers: self.workers,
            replicas: self.replicas,
            replica_affinity: self.replica_affinity.name().to_owned(),
            index: self.index.name().to_owned(),
            speedup: self.speedup,
            block_size: self.block_size,
            requests: done.len() as u64,
            failed_requests: (self.records.len() - done.len()) as u64,
            duration_s: span,
            ttft_ms: stats(ttft.iter().copied()),
            itl_ms: stats(itl),
            e2e_ms: stats(e2e),
            output_tokens_per_s: output as f64 / span,
            requests_per_s: done.len() as f64 / span,
            agent_steps_per_min: agent_steps_per_min(&done),
            prefix_hit_ratio: if prompt == 0 {
                0.0
            } else {
                cached as f64 / prompt as f64
            },
            prompt_tokens: prompt,
            cached_tokens: cached,
            recomputed_tokens: self.recomputed_tokens,
            whole_answers: self.whole_answers,
            ttft_cdf: cdf(&ttft),
            kv_utilization: KvUtilization {
                interval_s: self.sample_interval.as_secs_f64(),
                workers: self.kv_samples.clone(),
            },
            tiers: self.tiers.map(|t| {
                let ratio = |tokens: u64| {
                    if prompt == 0 {
                        0.0
                    } else {
                        tokens as f64 / prompt as f64
                    }
                };
                let lower = t.host_hit_tokens + t.disk_hit_tokens + t.pool_hit_tokens;
                let device = cached.saturating_sub(lower);
                let pool = self.pool.unwrap_or_default();
                TierReport {
                    device_hit_tokens: device,
                    device_hit_ratio: ratio(device),
                    host_capacity_blocks: t.host_capacity_blocks,
                    host_hit_tokens: t.host_hit_tokens,
                    host_hit_ratio: ratio(t.host_hit_tokens),
                    offloaded_blocks: t.offloaded_blocks,
                    offloaded_bytes: t.offloaded_bytes,
                    onboarded_blocks: t.onboarded_blocks,
                    onboarded_bytes: t.onboarded_bytes,
                    onboard_s: t.onboard_time.as_secs_f64(),
                    host_evictions: t.host_evictions,
                    disk_capacity_blocks: t.disk_capacity_blocks,
                    disk_hit_tokens: t.disk_hit_tokens,
                    disk_hit_ratio: ratio(t.disk_hit_tokens),
                    disk_stored_blocks: t.disk_stored_blocks,
                    disk_onboarded_blocks: t.disk_onboarded_blocks,
                    disk_onboarded_bytes: t.disk_onboarded_bytes,
                    disk_onboard_s: t.disk_onboard_time.as_secs_f64(),
                    disk_evictions: t.disk_evictions,
                    pool_capacity_blocks: pool.capacity_blocks,
                    pool_hit_tokens: t.pool_hit_tokens,
                    pool_hit_ratio: ratio(t.pool_hit_tokens),
                    pool_fetched_blocks: t.pool_fetched_blocks,
                    pool_fetched_bytes: t.pool_fetched_bytes,
                    pool_onboard_s: t.pool_onboard_time.as_secs_f64(),
                    pool_published_blocks: t.pool_published_blocks,
                    pool_stored_blocks: pool.stored_blocks,
                    pool_evictions: pool.evictions,
                    prefetched_blocks: t.prefetched_blocks,
                    prefetched_bytes: t.prefetched_bytes,
                    prefetch_s: t.prefetch_time.as_secs_f64(),
                    demoted_blocks: t.demoted_blocks,
                }
            }),
            kv_hints: self.kv_hints.clone(),
        }
    }
}

/// Mean over multi-request sessions of requests per minute from their first send to their last
/// finish: how fast an agent advances (gaps included, and equal for every policy). `None` when
/// no session has two requests (Mooncake's lone requests).
fn agent_steps_per_min(done: &[&RequestRecord]) -> Option<f64> {
    let mut spans: BTreeMap<usize, (Duration, Duration, u32)> = BTreeMap::new();
    for r in done {
        let Some(finished) = r.finished else { continue };
        let entry = spans.entry(r.session).or_insert((r.sent, finished, 0));
        entry.0 = entry.0.min(r.sent);
        entry.1 = entry.1.max(finished);
        entry.2 += 1;
    }
    let rates: Vec<f64> = spans
        .values()
        .filter(|(_, _, n)| *n > 1)
        .map(|(first, last, n)| f64::from(*n) / (*last - *first).as_secs_f64().max(1e-9) * 60.0)
        .collect();
    (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
}
