//! ThunderAgent's program-aware admission (agentic-serving.md section 4; arXiv 2602.13692).
//!
//! Per worker, every tick:
//!
//! ```text
//! used(w) = sum over active programs on w of (token_total * (ACTING ? acting_weight : 1) + 100)
//! U(w)    = used(w) / kv_capacity_tokens(w)
//! ```
//!
//! - `U >= 0.95`: pause ACTING programs, smallest first, until `U <= 0.80`; if that is not enough,
//!   pause the smallest REASONING ones, which the controller turns into "pause at the next tool
//!   boundary" (their running request finishes; the next one is held).
//! - `0.80 <= U < 0.95`: soft demotion, priority -2 (seconds of router-queue head start) for the
//!   programs there, for 1.5 ticks unless renewed.
//! - Resume while the worker stays at `U <= 0.85` with the program on it: paused programs in the
//!   order REASONING (a request is waiting), new, ACTING, each by `token_total` ascending; the
//!   program's previous worker if it fits, else the best fit (the fullest worker it fits on). On
//!   this side ACTING programs count `token_total * 2^(-idle_s / 1.0)`. A resumed program gets +1
//!   priority until its request is released. A program paused for 30 minutes is resumed onto the
//!   least-loaded worker whatever the load.
//! - `migrate_after` (ours, default 0 = the reference): a paused program resumes only on its own
//!   worker until it has been paused that long. The reference moves it to the best fit at once,
//!   as if its KV were gone; an engine with a host tier still has it, and recomputing ~100K
//!   tokens elsewhere costs more than the wait (docs/benchmarks.md (g)).
//! - A new program waits (paused) while any program is paused or no worker has room for it; else
//!   it is placed on the worker with the least decayed load.
//!
//! Programs stay on their worker ([`ThunderAgentConfig::sticky`]): [`AdmissionPolicy::placement`]
//! answers the worker a program was placed on, so the router bypasses its own choice for it.
//! Everything is a function of the [`AdmissionView`] plus three small maps (demotions, boosts,
//! placements), so a Wasm twin can port it line by line.

use super::{ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, Arrival, SessionPhase};
use crate::admission::SessionView;
use crate::worker::Rank;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// ThunderAgent's parameters; the defaults are the reference's.
#[derive(Debug, Clone, PartialEq)]
pub struct ThunderAgentConfig {
    /// Interval of the host's ticks (the demotion lasts `demotion_ticks` of them). Default: 5 s.
    pub tick_interval: Duration,
    /// Weight of an ACTING program's tokens in `used(w)`. Default: 1.0 (its KV is all still there).
    pub acting_weight: f64,
    /// Tokens added per program (its growth before the next tick). Default: 100.
    pub program_overhead_tokens: u64,
    /// Pause when `U(w)` reaches this. Default: 0.95.
    pub pause_threshold: f64,
    /// Pause until `U(w)` is down to this; also the bottom of the soft-demotion band. Default: 0.80.
    pub pause_target: f64,
    /// Resume only while `U(w) <= pause_threshold - resume_hysteresis`. Default: 0.10 (so 0.85).
    pub resume_hysteresis: f64,
    /// Priority added to programs in the soft-demotion band. Default: -2 (2 s of head start lost).
    pub demotion_priority: i32,
    /// How long a demotion lasts without renewal, in ticks. Default: 1.5.
    pub demotion_ticks: f64,
    /// Priority of a resumed program until its request is released. Default: +1.
    pub resume_priority: i32,
    /// A program paused this long is resumed regardless of load. Default: 30 minutes.
    pub forced_resume_after: Duration,
    /// A paused program resumes only on its own worker, where its KV is, until it has been
    /// paused this long; then on the best fit, like a new one. Default: 0 (the reference's
    /// best fit at once).
    pub migrate_after: Duration,
    /// Half-life of an ACTING program's tokens on the resume side. Default: 1 s.
    pub decay_half_life: Duration,
    /// Keep every program on the worker it was placed on (ThunderAgent's backend affinity).
    /// Default: true.
    pub sticky: bool,
}

impl Default for ThunderAgentConfig {
    fn default() -> Self {
        Self {
            tick_interval: Duration::from_secs(5),
            acting_weight: 1.0,
            program_overhead_tokens: 100,
            pause_threshold: 0.95,
            pause_target: 0.80,
            resume_hysteresis: 0.10,
            demotion_priority: -2,
            demotion_ticks: 1.5,
            resume_priority: 1,
            forced_resume_after: Duration::from_secs(30 * 60),
            migrate_after: Duration::ZERO,
            decay_half_life: Duration::from_secs(1),
            sticky: true,
        }
    }
}

/// The ThunderAgent admission policy.
#[derive(Debug, Clone, Default)]
pub struct ThunderAgent {
    config: ThunderAgentConfig,
    /// Demoted programs and when their demotion lapses.
    demoted: BTreeMap<String, Duration>,
    /// Resumed programs whose boost is still applied.
    boosted: BTreeSet<String>,
    /// Where new and resumed programs were placed, until their request starts there.
    targets: BTreeMap<String, Rank>,
}

/// One worker's load as ThunderAgent counts it, in tokens.
#[derive(Debug, Clone, Copy)]
struct Load {
    rank: Rank,
    capacity: f64,
    /// `used(w)`: the pause side.
    used: f64,
    /// With ACTING programs decayed: the resume side.
    decayed: f64,
}

// === impl ThunderAgent ===

impl ThunderAgent {
    /// The policy with `config`.
    pub fn new(config: ThunderAgentConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Parameters in force.
    pub fn config(&self) -> &ThunderAgentConfig {
        &self.config
    }

    fn resume_threshold(&self) -> f64 {
        self.config.pause_threshold - self.config.resume_hysteresis
    }

    /// The worker a program counts on: where it was just placed, else where it last ran.
    fn rank_of(&self, s: &SessionView) -> Option<Rank> {
        self.targets.get(&s.session_id).copied().or(s.rank)
    }

    /// ACTING in ThunderAgent's sense: off the GPU, KV waiting (a tool call, or its user).
    fn acting(s: &SessionView) -> bool {
        s.active_requests == 0
            && s.queued_requests == 0
            && matches!(s.phase, SessionPhase::ToolCall | SessionPhase::Idle)
    }

    /// Tokens `s` adds to `used(w)`.
    fn used_tokens(&self, s: &SessionView) -> f64 {
        let weight = if Self::acting(s) {
            self.config.acting_weight
        } else {
            1.0
        };
        s.context_tokens as f64 * weight + self.config.program_overhead_tokens as f64
    }

    /// Tokens `s` counts with on the resume side: ACTING ones decay with their idle time.
    fn decayed_tokens(&self, s: &SessionView) -> f64 {
        if !Self::acting(s) {
            return self.used_tokens(s);
        }
        let half_life = self.config.decay_half_life.as_secs_f64();
        let decay = if half_life > 0.0 {
            (-s.idle.as_secs_f64() / half_life).exp2()
        } else {
            0.0
        };
        s.context_tokens as f64 * self.config.acting_weight * decay
            + self.config.program_overhead_tokens as f64
    }

    /// What a program needs once it runs again.
    fn need(&self, s: &SessionView) -> f64 {
        s.context_tokens as f64 + self.config.program_overhead_tokens as f64
    }

    /// Healthy workers with a known capacity, loaded with the active programs on them.
    fn loads(&self, view: &AdmissionView) -> Vec<Load> {
        let mut loads: Vec<Load> = view
            .workers
            .iter()
            .filter(|w| w.healthy && w.kv_capacity_tokens > 0)
            .map(|w| Load {
                rank: w.rank,
                capacity: w.kv_capacity_tokens as f64,
                used: 0.0,
                decayed: 0.0,
            })
            .collect();
        for s in view.sessions.iter().filter(|s| !s.paused) {
            let Some(rank) = self.rank_of(s) else {
                continue;
            };
            if let Some(load) = loads.iter_mut().find(|l| l.rank == rank) {
                load.used += self.used_tokens(s);
                load.decayed += self.decayed_tokens(s);
            }
        }
        loads
    }

    /// Drop state about programs that are gone, and placements that took effect.
    fn forget_stale(&mut self, view: &AdmissionView) {
        let live: BTreeMap<&str, &SessionView> = view
            .sessions
            .iter()
            .map(|s| (s.session_id.as_str(), s))
            .collect();
        // Once the program ran where it was placed, its rank says the same.
        self.targets
            .retain(|id, rank| live.get(id.as_str()).is_some_and(|s| s.rank != Some(*rank)));
        self.demoted.retain(|id, _| live.contains_key(id.as_str()));
        self.boosted.retain(|id| live.contains_key(id.as_str()));
    }

    /// Pause programs on overloaded workers; returns the sessions paused.
    fn pause(
        &self,
        view: &AdmissionView,
        loads: &mut [Load],
        actions: &mut Vec<AdmissionAction>,
    ) -> BTreeSet<String> {
        let mut paused = BTreeSet::new();
        for load in loads.iter_mut() {
            if load.used / load.capacity < self.config.pause_threshold {
                continue;
            }
            let mut on_worker: Vec<&SessionView> = view
                .sessions
                .iter()
                .filter(|s| !s.paused && self.rank_of(s) == Some(load.rank))
                .collect();
            on_worker.sort_by(|a, b| {
                (a.context_tokens, &a.session_id).cmp(&(b.context_tokens, &b.session_id))
            });
            // ACTING first (pausing them costs nothing now), then REASONING at their boundary.
            let (acting, reasoning): (Vec<&SessionView>, Vec<&SessionView>) =
                on_worker.into_iter().partition(|s| Self::acting(s));
            for s in acting.into_iter().chain(reasoning) {
                if load.used / load.capacity <= self.config.pause_target {
                    break;
                }
                load.used -= self.used_tokens(s);
                load.decayed -= self.decayed_tokens(s);
                actions.push(AdmissionAction::new(&s.session_id, ActionKind::Pause));
                paused.insert(s.session_id.clone());
            }
        }
        paused
    }

    /// Demote programs on workers in the soft band; lift lapsed demotions.
    fn demote(
        &mut self,
        view: &AdmissionView,
        loads: &[Load],
        paused: &BTreeSet<String>,
        now: Duration,
        actions: &mut Vec<AdmissionAction>,
    ) {
        let until = now
            + self
                .config
                .tick_interval
                .mul_f64(self.config.demotion_ticks.max(0.0));
        for load in loads {
            let u = load.used / load.capacity;
            if u < self.config.pause_target || u >= self.config.pause_threshold {
                continue;
            }
            let here: Vec<&SessionView> = view
                .sessions
                .iter()
                .filter(|s| {
                    !s.paused
                        && !paused.contains(&s.session_id)
                        && self.rank_of(s) == Some(load.rank)
                })
                .collect();
            for s in here {
                if self.demoted.insert(s.session_id.clone(), until).is_none() {
                    actions.push(AdmissionAction::new(
                        &s.session_id,
                        ActionKind::AdjustPriority(self.config.demotion_priority),
                    ));
                }
            }
        }
        let lapsed: Vec<String> = self
            .demoted
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lapsed {
            self.demoted.remove(&id);
            actions.push(AdmissionAction::new(
                id,
                ActionKind::AdjustPriority(-self.config.demotion_priority),
            ));
        }
    }

    /// Take back the boost of resumed programs whose request has been released.
    fn unboost(&mut self, view: &AdmissionView, actions: &mut Vec<AdmissionAction>) {
        let released: Vec<String> = self
            .boosted
            .iter()
            .filter(|id| {
                view.session(id).is_some_and(|s| {
                    !matches!(s.phase, SessionPhase::Paused | SessionPhase::Queued)
                })
            })
            .cloned()
            .collect();
        for id in released {
            self.boosted.remove(&id);
            actions.push(AdmissionAction::new(
                id,
                ActionKind::AdjustPriority(-self.config.resume_priority),
            ));
        }
    }

    /// Resume paused programs that fit (best fit), and those paused too long.
    fn resume(
        &mut self,
        view: &AdmissionView,
        loads: &mut [Load],
        just_paused: &BTreeSet<String>,
        actions: &mut Vec<AdmissionAction>,
    ) {
        let mut waiting: Vec<&SessionView> = view
            .sessions
            .iter()
            .filter(|s| s.paused && s.active_requests == 0 && !just_paused.contains(&s.session_id))
            .collect();
        // REASONING (a request waits) first, then new programs, then ACTING; small first.
        let class = |s: &SessionView| {
            if s.rank.is_none() {
                1
            } else if s.queued_requests > 0 {
                0
            } else {
                2
            }
        };
        waiting.sort_by(|a, b| {
            (class(a), a.context_tokens, &a.session_id).cmp(&(
                class(b),
                b.context_tokens,
                &b.session_id,
            ))
        });
        let threshold = self.resume_threshold();
        for s in waiting {
            let need = self.need(s);
            let chosen = if s.paused_for >= self.config.forced_resume_after {
                // Forced: the least-loaded worker, whatever the load.
                loads
                    .iter()
                    .enumerate()
                    .min_by(|(_, a), (_, b)| {
                        (a.decayed / a.capacity).total_cmp(&(b.decayed / b.capacity))
                    })
                    .map(|(i, _)| i)
            } else {
                let fits = |l: &Load| (l.decayed + need) / l.capacity <= threshold;
                let home = loads.iter().position(|l| Some(l.rank) == s.rank);
                match home {
                    Some(i) if fits(&loads[i]) => Some(i),
                    // Its KV is there: waiting for room costs less than recomputing elsewhere.
                    Some(_) if s.paused_for < self.config.migrate_after => None,
                    _ => loads
                        .iter()
                        .enumerate()
                        .filter(|(_, l)| fits(l))
                        .max_by(|(_, a), (_, b)| {
                            ((a.decayed + need) / a.capacity)
                                .total_cmp(&((b.decayed + need) / b.capacity))
                        })
                        .map(|(i, _)| i),
                }
            };
            let Some(i) = chosen else {
                continue;
            };
            loads[i].decayed += need;
            loads[i].used += need;
            self.targets.insert(s.session_id.clone(), loads[i].rank);
            actions.push(AdmissionAction::new(&s.session_id, ActionKind::Resume));
            if self.boosted.insert(s.session_id.clone()) {
                actions.push(AdmissionAction::new(
                    &s.session_id,
                    ActionKind::AdjustPriority(self.config.resume_priority),
                ));
            }
        }
    }
}

impl AdmissionPolicy for ThunderAgent {
    fn name(&self) -> &str {
        "thunder-agent"
    }

    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction> {
        self.forget_stale(view);
        let mut actions = Vec::new();
        let mut loads = self.loads(view);
        let paused = self.pause(view, &mut loads, &mut actions);
        self.demote(view, &loads, &paused, now, &mut actions);
        self.unboost(view, &mut actions);
        self.resume(view, &mut loads, &paused, &mut actions);
        actions
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        _now: Duration,
    ) -> Vec<AdmissionAction> {
        let Some(s) = arrival.request.session_id.and_then(|id| view.session(id)) else {
            return Vec::new();
        };
        let is_new = s.rank.is_none() && !self.targets.contains_key(&s.session_id);
        if !is_new || s.paused {
            return Vec::new();
        }
        let loads = self.loads(view);
        if loads.is_empty() {
            // No capacity known: nothing to protect, the router places it.
            return Vec::new();
        }
        let behind_paused = view
            .sessions
            .iter()
            .any(|o| o.paused && o.active_requests == 0 && o.session_id != s.session_id);
        let need = self.need(s);
        let threshold = self.resume_threshold();
        let place = loads
            .iter()
            .filter(|l| (l.decayed + need) / l.capacity <= threshold)
            .min_by(|a, b| (a.decayed / a.capacity).total_cmp(&(b.decayed / b.capacity)));
        match place {
            Some(load) if !behind_paused => {
                self.targets.insert(s.session_id.clone(), load.rank);
                Vec::new()
            }
            _ => vec![AdmissionAction::new(&s.session_id, ActionKind::Pause)],
        }
    }

    fn placement(
        &mut self,
        view: &AdmissionView,
        session_id: &str,
        _now: Duration,
    ) -> Option<Rank> {
        if let Some(rank) = self.targets.get(session_id) {
            return Some(*rank);
        }
        if !self.config.sticky {
            return None;
        }
        let rank = view.session(session_id)?.rank?;
        view.workers
            .iter()
            .any(|w| w.rank == rank && w.healthy)
            .then_some(rank)
    }
}

#[cfg(test)]
mod tests;
