//! `autellix`: Autellix's PLAS, program-level least attained service first (agentic-serving.md
//! section 4, "related policies"), a line-by-line port of the native
//! `switchyard_core::admission::Autellix`.
//!
//! A program's attained service is the summed run time of its finished requests. Programs are
//! sorted into levels by it, as in a multi-level feedback queue: level 0 below `quantum`, level
//! `k` below `quantum * growth^k`, up to `levels - 1`. Each level lowers the program's priority by
//! `level_priority` points, so in the router queue short programs overtake long-running ones. The
//! policy only adjusts priority: it never holds or pauses.
//!
//! **Inputs.** Attained service is not a WIT field yet: it comes from the host's
//! `switchyard.service-ms` extension column, decoded by [`Sessions::rows`] (0 from a host that
//! does not send it, so every program stays at level 0). It crosses the boundary in whole
//! milliseconds; for millisecond-aligned service the actions are exactly the native twin's.
//!
//! **Parameters.** A component cannot read files: [`AutellixConfig::default`] is what the
//! component runs (the native defaults), and its metadata lists them.

use std::collections::BTreeMap;
use std::time::Duration;
use switchyard_policy_sdk::{
    Action, ActionKind, AdmissionPolicy, Incoming, PolicyMetadata, SessionView, Sessions,
    Utilization,
};

/// Autellix's parameters; the defaults are the native twin's.
#[derive(Debug, Clone, PartialEq)]
pub struct AutellixConfig {
    /// Service below which a program is at level 0. Default: 2 s.
    pub quantum: Duration,
    /// Each level's bound is this times the previous one's. Default: 2.0.
    pub growth: f64,
    /// Levels (the last one is unbounded). Default: 8.
    pub levels: u32,
    /// Priority points per level (negative: a level lower). Default: -60.
    pub level_priority: i32,
}

impl Default for AutellixConfig {
    fn default() -> Self {
        Self {
            quantum: Duration::from_secs(2),
            growth: 2.0,
            levels: 8,
            level_priority: -60,
        }
    }
}

impl AutellixConfig {
    /// Every parameter as `(key, value)`, as the native spec string takes them.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("quantum", format!("{}ms", self.quantum.as_millis())),
            ("growth", self.growth.to_string()),
            ("levels", self.levels.to_string()),
            ("level_priority", self.level_priority.to_string()),
        ]
    }
}

/// The Autellix (PLAS) admission policy.
#[derive(Debug, Clone, Default)]
pub struct Autellix {
    config: AutellixConfig,
    /// Priority applied to each program so far.
    applied: BTreeMap<String, i32>,
}

// === impl Autellix ===

impl Autellix {
    /// The policy with `config`.
    pub fn new(config: AutellixConfig) -> Self {
        Self {
            config,
            applied: BTreeMap::new(),
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &AutellixConfig {
        &self.config
    }

    /// The level of a program with `service` attained.
    pub fn level(&self, service: Duration) -> u32 {
        let growth = if self.config.growth.is_finite() && self.config.growth > 1.0 {
            self.config.growth
        } else {
            2.0
        };
        let top = self.config.levels.saturating_sub(1);
        let mut bound = self.config.quantum.as_secs_f64();
        let mut level = 0;
        while level < top && service.as_secs_f64() >= bound {
            level += 1;
            bound *= growth;
        }
        level
    }

    /// Move every program to its level's priority; forget programs that are gone.
    fn align(&mut self, sessions: &Sessions) -> Vec<Action> {
        let rows = sessions.rows();
        self.applied
            .retain(|id, _| rows.iter().any(|s| &s.session_id == id));
        let mut actions = Vec::new();
        for s in &rows {
            let SessionView {
                session_id,
                service_ms,
                ..
            } = s;
            let service = Duration::from_millis(*service_ms);
            let target = (self.level(service) as i32).saturating_mul(self.config.level_priority);
            let applied = self.applied.entry(session_id.clone()).or_insert(0);
            if *applied != target {
                actions.push(Action::new(
                    session_id,
                    ActionKind::AdjustPriority(target.saturating_sub(*applied)),
                ));
                *applied = target;
            }
        }
        actions
    }
}

impl AdmissionPolicy for Autellix {
    fn metadata(&self) -> PolicyMetadata {
        let mut metadata = PolicyMetadata::new(
            "autellix",
            env!("CARGO_PKG_VERSION"),
            "Autellix PLAS: least attained service first, by priority levels",
        );
        for (key, value) in self.config.params() {
            metadata = metadata.with_extension(key, value);
        }
        metadata
    }

    fn tick(&mut self, _now_ms: u64, sessions: &Sessions, _workers: &Utilization) -> Vec<Action> {
        self.align(sessions)
    }

    fn arrival(
        &mut self,
        _now_ms: u64,
        _incoming: &Incoming,
        sessions: &Sessions,
        _workers: &Utilization,
    ) -> Vec<Action> {
        self.align(sessions)
    }
}

switchyard_policy_sdk::export_admission!(Autellix);

#[cfg(test)]
mod tests;
