//! Per-policy counters: calls, fallbacks by reason, call-time distribution, shadow comparisons.

use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of one loaded policy. Shared between its runner and the admin listing/metrics.
#[derive(Debug)]
pub struct PolicyStats {
    calls: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    fallbacks: BTreeMap<&'static str, u64>,
    /// Call times in nanoseconds (`None` only if hdrhistogram refused the constant bounds).
    call_time: Option<Histogram<u64>>,
    last_error: Option<String>,
    shadow_compared: u64,
    shadow_disagreements: u64,
    shadow_cost_delta_sum: f64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Decisions asked of the policy.
    pub calls: u64,
    /// Calls answered by the native fallback, by reason (`trap`, `deadline`, ...).
    pub fallbacks: BTreeMap<String, u64>,
    /// 99th percentile of the call time, in microseconds.
    pub p99_call_us: f64,
    /// The last call-time failure, if any.
    pub last_error: Option<String>,
    /// Shadow only: decisions compared with the active policy's.
    pub shadow_compared: u64,
    /// Shadow only: how many of them chose another worker.
    pub shadow_disagreements: u64,
    /// Shadow only: mean KV cost (native formula) of the shadow's pick minus the active's pick;
    /// negative means the shadow would have placed requests on cheaper workers.
    pub shadow_mean_cost_delta: f64,
}

impl StatsSnapshot {
    /// All fallbacks, whatever the reason.
    pub fn fallbacks_total(&self) -> u64 {
        self.fallbacks.values().sum()
    }
}

impl Default for PolicyStats {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                fallbacks: BTreeMap::new(),
                // 1 ns to 10 s at 2 significant digits: a few KiB.
                call_time: Histogram::new_with_bounds(1, 10_000_000_000, 2).ok(),
                last_error: None,
                shadow_compared: 0,
                shadow_disagreements: 0,
                shadow_cost_delta_sum: 0.0,
            }),
        }
    }
}

impl PolicyStats {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Counters only: a panic mid-update leaves at worst one sample off.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A decision was asked of the policy and took `elapsed`.
    pub fn record_call(&self, elapsed: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        if let Some(h) = &mut self.inner().call_time {
            h.saturating_record(nanos.max(1));
        }
    }

    /// The native policy answered instead, because of `reason`; `detail` is kept as last error.
    pub fn record_fallback(&self, reason: &'static str, detail: Option<String>) {
        let mut inner = self.inner();
        *inner.fallbacks.entry(reason).or_default() += 1;
        if detail.is_some() {
            inner.last_error = detail;
        }
    }

    /// A shadow decision was compared with the active one.
    pub fn record_shadow(&self, disagreed: bool, cost_delta: f64) {
        let mut inner = self.inner();
        inner.shadow_compared += 1;
        inner.shadow_disagreements += u64::from(disagreed);
        if cost_delta.is_finite() {
            inner.shadow_cost_delta_sum += cost_delta;
        }
    }

    /// Copy the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let inner = self.inner();
        StatsSnapshot {
            calls: self.calls.load(Ordering::Relaxed),
            fallbacks: inner
                .fallbacks
                .iter()
                .map(|(k, v)| ((*k).to_string(), *v))
                .collect(),
            p99_call_us: inner
                .call_time
                .as_ref()
                .map_or(0.0, |h| h.value_at_quantile(0.99) as f64 / 1e3),
            last_error: inner.last_error.clone(),
            shadow_compared: inner.shadow_compared,
            shadow_disagreements: inner.shadow_disagreements,
            shadow_mean_cost_delta: if inner.shadow_compared == 0 {
                0.0
            } else {
                inner.shadow_cost_delta_sum / inner.shadow_compared as f64
            },
        }
    }
}
