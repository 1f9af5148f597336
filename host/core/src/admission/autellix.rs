//! Autellix's PLAS: program-level least attained service first (agentic-serving.md section 4,
//! "related policies").
//!
//! A program's attained service is the summed run time of its finished requests
//! ([`SessionView::service`]). Programs are sorted into levels by it, as in a multi-level
//! feedback queue: level 0 below `quantum`, level `k` below `quantum * growth^k`, up to
//! `levels - 1`. Each level lowers the program's priority by `level_priority` points, so in the
//! router queue short programs (new ones, subagents) overtake long-running ones. The policy only
//! adjusts priority: it never holds or pauses, and it acts only through the queue, which orders
//! requests only when every worker is saturated.

use super::{ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, Arrival};
use crate::admission::SessionView;
use std::collections::BTreeMap;
use std::time::Duration;

/// Autellix's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct AutellixConfig {
    /// Service below which a program is at level 0. Default: 2 s.
    pub quantum: Duration,
    /// Each level's bound is this times the previous one's. Default: 2.0.
    pub growth: f64,
    /// Levels (the last one is unbounded). Default: 8.
    pub levels: u32,
    /// Priority points per level (negative: a level lower). At the router queue's default 1 s
    /// head start per point, -60 makes levels strict for requests queued within a minute.
    /// Default: -60.
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
    fn align(&mut self, view: &AdmissionView) -> Vec<AdmissionAction> {
        self.applied
            .retain(|id, _| view.sessions.iter().any(|s| &s.session_id == id));
        let mut actions = Vec::new();
        for s in &view.sessions {
            let SessionView {
                session_id,
                service,
                ..
            } = s;
            let target = (self.level(*service) as i32).saturating_mul(self.config.level_priority);
            let applied = self.applied.entry(session_id.clone()).or_insert(0);
            if *applied != target {
                actions.push(AdmissionAction::new(
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
    fn name(&self) -> &str {
        "autellix"
    }

    fn tick(&mut self, view: &AdmissionView, _now: Duration) -> Vec<AdmissionAction> {
        self.align(view)
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        _arrival: &Arrival<'_>,
        _now: Duration,
    ) -> Vec<AdmissionAction> {
        self.align(view)
    }
}

#[cfg(test)]
mod tests;
