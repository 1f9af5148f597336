//! `continuum`: Continuum-style TTL retention (agentic-serving.md section 4, "related
//! policies"), a line-by-line port of the native `switchyard_core::admission::Continuum`.
//!
//! - **Learning.** When a program's next request arrives after a tool call, the tool's duration
//!   (the program's idle time) is recorded under the tool's name ([`ToolDurations`]: the last
//!   `window` durations per tool). `ttl(tool)` is their `quantile` (default p90), clamped to
//!   `max_ttl`; `default_ttl` until a tool has `min_samples`.
//! - **Retention through admission.** A program in a tool call for less than its TTL pins its
//!   `token_total` on its worker. An arrival is admitted when it is a pinned program coming back,
//!   or when its tokens fit next to what runs and what is pinned (`memory_threshold` of capacity)
//!   on its worker (any worker for a new program); otherwise it is held and offered again every
//!   tick.
//!
//! **Inputs.** Ranks, capacities and the tool a program called are not WIT fields yet: they
//! come from the host's `switchyard.*` extension columns, decoded by [`Sessions::rows`] and
//! [`Utilization::rows`]. Durations cross the boundary in whole milliseconds, so for
//! millisecond-aligned times the actions are exactly the native twin's. The native twin also
//! renders its leases as KV pin hints (`Continuum::pins`); that belongs to the `kv-hints` world,
//! not to this component.
//!
//! **Parameters.** A component cannot read files: [`ContinuumConfig::default`] is what the
//! component runs (the native defaults), and its metadata lists them.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use switchyard_policy_sdk::{
    Action, ActionKind, AdmissionPolicy, Incoming, PolicyMetadata, Rank, RankUtilization,
    SessionPhase, SessionView, Sessions, Utilization,
};

/// Continuum's parameters; the defaults are the native twin's.
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuumConfig {
    /// Quantile of a tool's durations used as its TTL. Default: 0.9.
    pub quantile: f64,
    /// Durations remembered per tool (the most recent ones). Default: 256.
    pub window: usize,
    /// Observations a tool needs before its own quantile is trusted. Default: 3.
    pub min_samples: usize,
    /// TTL of a tool with fewer observations. Default: 30 s.
    pub default_ttl: Duration,
    /// Longest TTL. Default: 10 minutes.
    pub max_ttl: Duration,
    /// Fraction of a worker's KV capacity that running and pinned programs may fill before
    /// arrivals wait. Default: 0.95.
    pub memory_threshold: f64,
    /// Tokens added per program (its growth). Default: 100.
    pub program_overhead_tokens: u64,
}

impl Default for ContinuumConfig {
    fn default() -> Self {
        Self {
            quantile: 0.9,
            window: 256,
            min_samples: 3,
            default_ttl: Duration::from_secs(30),
            max_ttl: Duration::from_secs(600),
            memory_threshold: 0.95,
            program_overhead_tokens: 100,
        }
    }
}

impl ContinuumConfig {
    /// Every parameter as `(key, value)`, as the native spec string takes them.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        vec![
            ("quantile", self.quantile.to_string()),
            ("window", self.window.to_string()),
            ("min_samples", self.min_samples.to_string()),
            ("default_ttl", ms(self.default_ttl)),
            ("max_ttl", ms(self.max_ttl)),
            ("memory_threshold", self.memory_threshold.to_string()),
            (
                "program_overhead_tokens",
                self.program_overhead_tokens.to_string(),
            ),
        ]
    }
}

/// Recent durations of each tool, and their quantiles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolDurations {
    window: usize,
    samples: BTreeMap<String, VecDeque<Duration>>,
}

/// The Continuum admission policy.
#[derive(Debug, Clone)]
pub struct Continuum {
    config: ContinuumConfig,
    durations: ToolDurations,
}

/// The host's inputs as rows (the native `AdmissionView`).
struct View {
    sessions: Vec<SessionView>,
    workers: Vec<RankUtilization>,
}

impl View {
    fn session(&self, session_id: &str) -> Option<&SessionView> {
        self.sessions.iter().find(|s| s.session_id == session_id)
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

// === impl ToolDurations ===

impl ToolDurations {
    /// Remember the last `window` durations of each tool (at least one).
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            samples: BTreeMap::new(),
        }
    }

    /// Record one call of `tool` that took `duration`.
    pub fn observe(&mut self, tool: &str, duration: Duration) {
        let samples = self.samples.entry(tool.to_owned()).or_default();
        if samples.len() == self.window {
            samples.pop_front();
        }
        samples.push_back(duration);
    }

    /// Durations remembered for `tool`.
    pub fn count(&self, tool: &str) -> usize {
        self.samples.get(tool).map_or(0, VecDeque::len)
    }

    /// The `q`-quantile (0..=1, nearest rank) of `tool`'s remembered durations.
    pub fn quantile(&self, tool: &str, q: f64) -> Option<Duration> {
        let samples = self.samples.get(tool).filter(|s| !s.is_empty())?;
        let mut sorted: Vec<Duration> = samples.iter().copied().collect();
        sorted.sort_unstable();
        let q = if q.is_finite() {
            q.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let rank = (q * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }
}

// === impl Continuum ===

impl Continuum {
    /// The policy with `config`.
    pub fn new(config: ContinuumConfig) -> Self {
        Self {
            durations: ToolDurations::new(config.window),
            config,
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &ContinuumConfig {
        &self.config
    }

    /// What was learnt so far.
    pub fn durations(&self) -> &ToolDurations {
        &self.durations
    }

    /// The TTL of a call of `tool`.
    pub fn ttl(&self, tool: &str) -> Duration {
        if self.durations.count(tool) < self.config.min_samples {
            return self.config.default_ttl.min(self.config.max_ttl);
        }
        self.durations
            .quantile(tool, self.config.quantile)
            .map_or(self.config.default_ttl, |d| d.min(self.config.max_ttl))
    }

    /// The lease left on `s`'s KV: its tool call is younger than the tool's TTL.
    fn lease(&self, s: &SessionView) -> Option<Duration> {
        if s.phase != SessionPhase::ToolCall {
            return None;
        }
        let ttl = self.ttl(s.tool.as_deref().unwrap_or(""));
        ttl.checked_sub(millis(s.idle_ms))
            .filter(|left| !left.is_zero())
    }

    /// Tokens running or pinned on `rank`, other than `except`'s.
    fn committed(&self, view: &View, rank: Rank, except: &str) -> f64 {
        view.sessions
            .iter()
            .filter(|s| s.rank == Some(rank) && s.session_id != except)
            .filter(|s| s.active_requests > 0 || self.lease(s).is_some())
            .map(|s| (s.context_tokens + self.config.program_overhead_tokens) as f64)
            .sum()
    }

    /// Whether `s`'s request fits on `rank` next to what runs and what is pinned there.
    fn fits(&self, view: &View, s: &SessionView, rank: Rank) -> bool {
        let Some(worker) = view
            .workers
            .iter()
            .find(|w| w.rank == rank && w.healthy && w.kv_capacity_tokens > 0)
        else {
            // Unknown capacity: nothing to protect.
            return true;
        };
        let need = (s.context_tokens + self.config.program_overhead_tokens) as f64;
        self.committed(view, rank, &s.session_id) + need
            <= self.config.memory_threshold * worker.kv_capacity_tokens as f64
    }
}

impl Default for Continuum {
    fn default() -> Self {
        Self::new(ContinuumConfig::default())
    }
}

impl AdmissionPolicy for Continuum {
    fn metadata(&self) -> PolicyMetadata {
        let mut metadata = PolicyMetadata::new(
            "continuum",
            env!("CARGO_PKG_VERSION"),
            "Continuum: hold arrivals that would evict KV pinned for running tool calls",
        );
        for (key, value) in self.config.params() {
            metadata = metadata.with_extension(key, value);
        }
        metadata
    }

    fn tick(&mut self, _now_ms: u64, _sessions: &Sessions, _workers: &Utilization) -> Vec<Action> {
        // Leases lapse by themselves; held arrivals are offered again by the host.
        Vec::new()
    }

    fn arrival(
        &mut self,
        _now_ms: u64,
        incoming: &Incoming,
        sessions: &Sessions,
        workers: &Utilization,
    ) -> Vec<Action> {
        let view = View {
            sessions: sessions.rows(),
            workers: workers.rows(),
        };
        let Some(s) = incoming
            .request
            .session_id
            .as_deref()
            .and_then(|id| view.session(id))
        else {
            return Vec::new();
        };
        let returning = s.rank.is_some() && s.active_requests == 0;
        if let (true, Some(tool)) = (returning, &s.tool) {
            // The tool just returned: its duration is the program's idle time. Learn it once,
            // on first arrival, and admit if the lease still held.
            if incoming.waited_ms == 0 {
                let idle = millis(s.idle_ms);
                let within = self.ttl(tool) > idle;
                self.durations.observe(tool, idle);
                if within {
                    return Vec::new();
                }
            }
        }
        let fits = match s.rank {
            Some(rank) => self.fits(&view, s, rank),
            None => {
                let healthy: Vec<Rank> = view
                    .workers
                    .iter()
                    .filter(|w| w.healthy)
                    .map(|w| w.rank)
                    .collect();
                healthy.is_empty() || healthy.into_iter().any(|r| self.fits(&view, s, r))
            }
        };
        if fits {
            Vec::new()
        } else {
            vec![Action::new(
                &s.session_id,
                ActionKind::Hold("continuum: KV pinned for running tool calls".into()),
            )]
        }
    }
}

switchyard_policy_sdk::export_admission!(Continuum);

#[cfg(test)]
mod tests;
