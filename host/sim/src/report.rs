//! The report of one `simulate` command: its JSON schema and its terminal table.
//!
//! `docs/simulate.md` documents every field; keep the two in step.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Schema name of [`Report`].
pub const REPORT_SCHEMA: &str = "switchyard.simulate.report.v1";

/// Every run of one command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`REPORT_SCHEMA`].
    pub schema: String,
    /// The trace simulated.
    pub trace: String,
    /// One per policy and concurrency, in command-line order.
    pub runs: Vec<RunReport>,
}

/// One policy at one concurrency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Routing policy.
    pub policy: String,
    /// Admission policy as configured (`none` / `admit-all`: request-level routing alone).
    #[serde(default = "admit_all")]
    pub admission: String,
    /// What admission and the router queue did.
    #[serde(default)]
    pub admission_stats: AdmissionStats,
    /// Root sessions in flight at most; `null`: unlimited.
    pub concurrency: Option<usize>,
    /// Simulated workers.
    pub workers: usize,
    /// Gateway replicas over the workers, each with its own router, index and admission.
    #[serde(default = "one")]
    pub replicas: usize,
    /// How the load balancer spread requests over the replicas: `session`, `random`,
    /// `round-robin`.
    #[serde(default = "session")]
    pub replica_affinity: String,
    /// What the replicas' indexes learned from: `events` (every engine's KV events) or
    /// `approximate` (each replica's own decisions).
    #[serde(default = "events")]
    pub index: String,
    /// Arrival and gap speed-up.
    pub speedup: f64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Requests finished.
    pub requests: u64,
    /// Requests that could not be placed or admitted (e.g. longer than a worker's cache).
    pub failed_requests: u64,
    /// Virtual seconds from the first send to the last finish.
    pub duration_s: f64,
    /// Time to first token, from the send.
    pub ttft_ms: LatencyStats,
    /// Inter-token latency, one value per request: decode time / (output tokens - 1).
    pub itl_ms: LatencyStats,
    /// End to end, send to last token.
    pub e2e_ms: LatencyStats,
    /// Output tokens per virtual second.
    pub output_tokens_per_s: f64,
    /// Requests finished per virtual second.
    pub requests_per_s: f64,
    /// Mean over multi-request sessions of their requests per minute; `null` without such.
    pub agent_steps_per_min: Option<f64>,
    /// Cached prompt tokens / prompt tokens, as the engines counted them.
    pub prefix_hit_ratio: f64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Of those, found in the prefix cache.
    pub cached_tokens: u64,
    /// Prompt tokens prefilled although some worker had computed them before.
    pub recomputed_tokens: u64,
    /// Requests whose engine answered whole rather than streamed (the simulated clients do not
    /// stream: `--engine-stream`).
    #[serde(default)]
    pub whole_answers: u64,
    /// TTFT distribution: `[ms, cumulative fraction]` at 101 evenly spaced fractions.
    pub ttft_cdf: Vec<(f64, f64)>,
    /// Per-worker KV utilization over time.
    pub kv_utilization: KvUtilization,
    /// Hits and traffic of the engines' host tier and the shared pool, summed over workers;
    /// absent without either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TierReport>,
    /// What the KV-hint path did; absent without `--kv-hints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_hints: Option<KvHintsReport>,
}

/// What the KV-hint path did in a run, summed over the gateway replicas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvHintsReport {
    /// The policy: a native spec (parameters included) or a component's name.
    pub policy: String,
    /// Times a replica asked the policy: when events arrived, and every tick while a session
    /// waited on a tool.
    pub policy_calls: u64,
    /// Session-level hints the policy answered.
    pub hints: u64,
    /// Lifecycle events by kind (`turn_end_with_tool_call`, `tool_result`, `subagent_spawn`,
    /// `subagent_end`, `compaction`, `session_end`).
    pub events: BTreeMap<String, u64>,
    /// Block actions by action (`demote`, `prefetch`, `evict`, `retain`, `pin`) and outcome
    /// (`accepted`, `clipped`, `deferred`, `rejected`, `missing`), as the engines answered.
    pub actions: BTreeMap<String, BTreeMap<String, HintCount>>,
    /// Blocks hints named that the rank holds in no tier, so its engine has no name for them;
    /// left out of the actions, as the gateway does.
    pub unnamed_blocks: u64,
}

/// Actions of one type with one outcome, and the blocks the engines acted on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintCount {
    /// Actions.
    pub actions: u64,
    /// Blocks they acted on (moved, loaded, pinned, freed).
    pub blocks: u64,
}

impl KvHintsReport {
    /// Actions of type `action` (`demote`) with `outcome` (`accepted`).
    pub fn count(&self, action: &str, outcome: &str) -> HintCount {
        self.actions
            .get(action)
            .and_then(|by_outcome| by_outcome.get(outcome))
            .copied()
            .unwrap_or_default()
    }

    /// Every action of type `action`, whatever its outcome.
    pub fn total(&self, action: &str) -> HintCount {
        self.actions
            .get(action)
            .into_iter()
            .flat_map(BTreeMap::values)
            .fold(HintCount::default(), |sum, c| HintCount {
                actions: sum.actions + c.actions,
                blocks: sum.blocks + c.blocks,
            })
    }

    /// `done/all` for actions of type `action`: accepted or clipped, of all (`-` for none).
    fn cell(&self, action: &str) -> String {
        let all = self.total(action).actions;
        if all == 0 {
            return "-".to_owned();
        }
        let done = self.count(action, "accepted").actions + self.count(action, "clipped").actions;
        format!("{done}/{all}")
    }
}

/// What the KV tiers below the device did in a run: the engines' host tiers (G2) and the shared
/// pool (G4). Fields added after the first version default to 0 when read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TierReport {
    /// Prompt tokens found on the device (G1).
    pub device_hit_tokens: u64,
    /// Device hit tokens / prompt tokens.
    #[serde(default)]
    pub device_hit_ratio: f64,
    /// Host tier blocks, summed over workers (0: no host tier).
    #[serde(default)]
    pub host_capacity_blocks: usize,
    /// Prompt tokens loaded from the host tier instead of recomputed (G2).
    pub host_hit_tokens: u64,
    /// Host-tier hit tokens / prompt tokens.
    pub host_hit_ratio: f64,
    /// Blocks written through device -> host.
    pub offloaded_blocks: u64,
    /// Bytes written through device -> host.
    #[serde(default)]
    pub offloaded_bytes: u64,
    /// Blocks loaded host -> device.
    pub onboarded_blocks: u64,
    /// Bytes loaded host -> device (the modelled block size).
    pub onboarded_bytes: u64,
    /// Virtual seconds spent loading from the host tier, summed over workers.
    pub onboard_s: f64,
    /// Blocks the host tiers evicted.
    pub host_evictions: u64,
    /// Disk tier blocks, summed over workers (0: no disk tier).
    #[serde(default)]
    pub disk_capacity_blocks: usize,
    /// Prompt tokens loaded from the disk tier instead of recomputed (G3).
    #[serde(default)]
    pub disk_hit_tokens: u64,
    /// Disk hit tokens / prompt tokens.
    #[serde(default)]
    pub disk_hit_ratio: f64,
    /// Host evictions written to disk.
    #[serde(default)]
    pub disk_stored_blocks: u64,
    /// Blocks loaded disk -> device.
    #[serde(default)]
    pub disk_onboarded_blocks: u64,
    /// Bytes loaded disk -> device.
    #[serde(default)]
    pub disk_onboarded_bytes: u64,
    /// Virtual seconds spent loading from disk, summed over workers.
    #[serde(default)]
    pub disk_onboard_s: f64,
    /// Blocks the disk tiers evicted.
    #[serde(default)]
    pub disk_evictions: u64,
    /// Shared pool blocks (0: no pool).
    #[serde(default)]
    pub pool_capacity_blocks: usize,
    /// Prompt tokens fetched from the shared pool instead of recomputed (G4).
    #[serde(default)]
    pub pool_hit_tokens: u64,
    /// Pool hit tokens / prompt tokens.
    #[serde(default)]
    pub pool_hit_ratio: f64,
    /// Blocks fetched pool -> device.
    #[serde(default)]
    pub pool_fetched_blocks: u64,
    /// Bytes fetched pool -> device.
    #[serde(default)]
    pub pool_fetched_bytes: u64,
    /// Virtual seconds spent fetching from the pool, summed over workers.
    #[serde(default)]
    pub pool_onboard_s: f64,
    /// Computed blocks the engines published to the pool.
    #[serde(default)]
    pub pool_published_blocks: u64,
    /// Of those, blocks the pool did not have yet and stored.
    #[serde(default)]
    pub pool_stored_blocks: u64,
    /// Blocks the pool evicted.
    #[serde(default)]
    pub pool_evictions: u64,
    /// Blocks prefetch hints loaded into the device from the host or disk tier, off any
    /// request's critical path.
    #[serde(default)]
    pub prefetched_blocks: u64,
    /// Bytes of those loads.
    #[serde(default)]
    pub prefetched_bytes: u64,
    /// Virtual seconds those loads took, summed over workers: charged to no request (the engine
    /// model completes a prefetch at once).
    #[serde(default)]
    pub prefetch_s: f64,
    /// Blocks demote hints moved down a tier (their device copy freed, a copy kept below).
    #[serde(default)]
    pub demoted_blocks: u64,
}

impl TierReport {
    /// The tiers a run had: `g1+g2`, `g1+g2+g3`, `g1+g4`, `g1+g2+g4`, ...
    pub fn name(&self) -> String {
        let mut name = "g1".to_owned();
        if self.host_capacity_blocks > 0 {
            name.push_str("+g2");
        }
        if self.disk_capacity_blocks > 0 {
            name.push_str("+g3");
        }
        if self.pool_capacity_blocks > 0 {
            name.push_str("+g4");
        }
        name
    }
}

/// What admission (and the router queue) did in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdmissionStats {
    /// Requests held by admission on arrival.
    pub held_requests: u64,
    /// Held requests released because they reached the longest hold.
    pub forced_releases: u64,
    /// Programs paused.
    pub pauses: u64,
    /// Programs resumed.
    pub resumes: u64,
    /// Priority adjustments applied.
    pub priority_adjustments: u64,
    /// Summed time requests were held, in seconds.
    pub hold_time_s: f64,
    /// Summed time programs were paused, in seconds.
    pub paused_time_s: f64,
    /// Most programs paused at once.
    pub max_paused: usize,
    /// Requests that waited in the router queue.
    pub router_queued: u64,
    /// Most requests in the router queue at once.
    pub router_queue_max_depth: usize,
}

/// Rows of the KV-hint path: actions done (accepted or clipped) of all, per action type, and
/// what the tiers moved for them.
fn hint_rows() -> Vec<Metric> {
    fn cell(r: &RunReport, action: &str) -> String {
        r.kv_hints
            .as_ref()
            .map_or_else(|| "-".to_owned(), |h| h.cell(action))
    }
    vec![
        ("hint calls", |r| {
            r.kv_hints
                .as_ref()
                .map_or_else(|| "-".to_owned(), |h| h.policy_calls.to_string())
        }),
        ("demote done/all", |r| cell(r, "demote")),
        ("prefetch done/all", |r| cell(r, "prefetch")),
        ("evict done/all", |r| cell(r, "evict")),
        ("retain done/all", |r| cell(r, "retain")),
        ("demoted blocks", |r| {
            format!("{}", r.tiers.unwrap_or_default().demoted_blocks)
        }),
        ("prefetched blocks", |r| {
            format!("{}", r.tiers.unwrap_or_default().prefetched_blocks)
        }),
    ]
}

fn admit_all() -> String {
    "admit-all".to_owned()
}

fn one() -> usize {
    1
}

fn session() -> String {
    "session".to_owned()
}

fn events() -> String {
    "events".to_owned()
}

/// Mean and percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Values.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// KV blocks in use / KV blocks, per worker, sampled every `interval_s` from time 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvUtilization {
    /// Seconds between samples.
    pub interval_s: f64,
    /// `workers[w][i]`: worker `w` at `i * interval_s`.
    pub workers: Vec<Vec<f64>>,
}

impl KvUtilization {
    /// Mean over workers at each sample.
    pub fn mean(&self) -> Vec<f64> {
        let samples = self.workers.iter().map(Vec::len).max().unwrap_or(0);
        (0..samples)
            .map(|i| {
                let values: Vec<f64> = self
                    .workers
                    .iter()
                    .filter_map(|w| w.get(i).copied())
                    .collect();
                values.iter().sum::<f64>() / values.len().max(1) as f64
            })
            .collect()
    }
}

impl RunReport {
    /// Short column label: `policy@concurrency` (`policy+admission@concurrency` with an
    /// admission policy, `policy g1+g2@concurrency` with lower KV tiers, `policy r4-session@...`
    /// with replicas, `-approx` or ` approx` with approximate indexes, ` hints:<policy>` with
    /// the KV-hint path), and `xN` when arrivals are sped up.
    pub fn label(&self) -> String {
        let concurrency = self
            .concurrency
            .map_or_else(|| "unlimited".to_owned(), |c| c.to_string());
        let mut policy = if matches!(self.admission.as_str(), "none" | "admit-all") {
            self.policy.clone()
        } else {
            format!("{}+{}", self.policy, self.admission)
        };
        if let Some(tiers) = &self.tiers {
            policy = format!("{policy} {}", tiers.name());
        }
        if self.replicas > 1 {
            policy = format!("{policy} r{}-{}", self.replicas, self.replica_affinity);
        }
        if self.index == "approximate" {
            policy += if self.replicas > 1 {
                "-approx"
            } else {
                " approx"
            };
        }
        if let Some(hints) = &self.kv_hints {
            policy = format!("{policy} hints:{}", hints.policy);
        }
        let label = format!("{policy}@{concurrency}");
        if self.speedup == 1.0 {
            label
        } else {
            format!("{label} x{}", self.speedup)
        }
    }
}

/// A table row: its name and how to format a run's value.
type Metric = (&'static str, fn(&RunReport) -> String);

impl Report {
    /// Runs side by side: one column per run, one row per metric.
    pub fn table(&self) -> String {
        let labels: Vec<String> = self.runs.iter().map(RunReport::label).collect();
        let mut rows: Vec<Metric> = vec![
            ("requests", |r| format!("{}", r.requests)),
            ("failed", |r| format!("{}", r.failed_requests)),
            ("TTFT mean ms", |r| format!("{:.1}", r.ttft_ms.mean)),
            ("TTFT p50 ms", |r| format!("{:.1}", r.ttft_ms.p50)),
            ("TTFT p90 ms", |r| format!("{:.1}", r.ttft_ms.p90)),
            ("TTFT p99 ms", |r| format!("{:.1}", r.ttft_ms.p99)),
            ("ITL p50 ms", |r| format!("{:.2}", r.itl_ms.p50)),
            ("ITL p99 ms", |r| format!("{:.2}", r.itl_ms.p99)),
            ("E2E p50 ms", |r| format!("{:.0}", r.e2e_ms.p50)),
            ("E2E p99 ms", |r| format!("{:.0}", r.e2e_ms.p99)),
            ("output tok/s", |r| format!("{:.0}", r.output_tokens_per_s)),
            ("requests/s", |r| format!("{:.2}", r.requests_per_s)),
            ("agent steps/min", |r| {
                r.agent_steps_per_min
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
            }),
            ("prefix hit ratio", |r| format!("{:.3}", r.prefix_hit_ratio)),
            ("recomputed Mtok", |r| {
                format!("{:.1}", r.recomputed_tokens as f64 / 1e6)
            }),
            ("whole answers", |r| format!("{}", r.whole_answers)),
            ("held requests", |r| {
                format!("{}", r.admission_stats.held_requests)
            }),
            ("paused prog-s", |r| {
                format!("{:.0}", r.admission_stats.paused_time_s)
            }),
            ("router queued", |r| {
                format!("{}", r.admission_stats.router_queued)
            }),
            // vLLM's `kv_cache_usage_perc`: blocks referenced by running requests. A lightly
            // loaded fleet sits at a few per cent, so three decimals, as the hit ratios.
            ("mean KV util", |r| {
                let mean = r.kv_utilization.mean();
                format!("{:.3}", mean.iter().sum::<f64>() / mean.len().max(1) as f64)
            }),
        ];
        if self.runs.iter().any(|r| r.tiers.is_some()) {
            rows.push(("device hit ratio", |r| match r.tiers {
                Some(tiers) => format!("{:.3}", tiers.device_hit_ratio),
                None => format!("{:.3}", r.prefix_hit_ratio),
            }));
            rows.push(("host hit ratio", |r| {
                format!("{:.3}", r.tiers.unwrap_or_default().host_hit_ratio)
            }));
            rows.push(("onboarded GB", |r| {
                format!(
                    "{:.2}",
                    r.tiers.unwrap_or_default().onboarded_bytes as f64 / 1e9
                )
            }));
            rows.push(("onboard s", |r| {
                format!("{:.2}", r.tiers.unwrap_or_default().onboard_s)
            }));
        }
        if self
            .runs
            .iter()
            .any(|r| r.tiers.is_some_and(|t| t.disk_capacity_blocks > 0))
        {
            rows.push(("disk hit ratio", |r| {
                format!("{:.3}", r.tiers.unwrap_or_default().disk_hit_ratio)
            }));
            rows.push(("disk loaded GB", |r| {
                format!(
                    "{:.2}",
                    r.tiers.unwrap_or_default().disk_onboarded_bytes as f64 / 1e9
                )
            }));
            rows.push(("disk load s", |r| {
                format!("{:.2}", r.tiers.unwrap_or_default().disk_onboard_s)
            }));
        }
        if self
            .runs
            .iter()
            .any(|r| r.tiers.is_some_and(|t| t.pool_capacity_blocks > 0))
        {
            rows.push(("pool hit ratio", |r| {
                format!("{:.3}", r.tiers.unwrap_or_default().pool_hit_ratio)
            }));
            rows.push(("pool fetched GB", |r| {
                format!(
                    "{:.2}",
                    r.tiers.unwrap_or_default().pool_fetched_bytes as f64 / 1e9
                )
            }));
            rows.push(("pool fetch s", |r| {
                format!("{:.2}", r.tiers.unwrap_or_default().pool_onboard_s)
            }));
        }
        if self.runs.iter().any(|r| r.kv_hints.is_some()) {
            rows.extend(hint_rows());
        }
        let width = labels.iter().map(String::len).max().unwrap_or(0).max(10);
        let mut out = String::new();
        let _ = write!(out, "{:<18}", "");
        for label in &labels {
            let _ = write!(out, " {label:>width$}");
        }
        out.push('\n');
        for (name, value) in &rows {
            let _ = write!(out, "{name:<18}");
            for run in &self.runs {
                let _ = write!(out, " {:>width$}", value(run));
            }
            out.push('\n');
        }
        out
    }
}
