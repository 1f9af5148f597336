//! The admission controller: programs, held requests and an [`AdmissionPolicy`]'s actions.
//!
//! One controller per gateway (or simulation). The driver reports what happens to requests and
//! asks what may go to the router:
//!
//! ```text
//! arrival(request)          -> ArrivalOutcome { admitted: Some(release) | None (held), released }
//! tick(now)                 -> releases (policy tick, re-offered holds, forced releases)
//! request_started(id, rank)    request_finished(id, turn end)    cancel(id)    end_session(id)
//! ```
//!
//! Actions apply to programs: `Pause` holds a program's *next* requests (a running one is never
//! preempted), `Resume` releases them, `Hold` keeps an arrival waiting until a later tick re-offers
//! it (with its wait so far), `Admit` releases a session's waiting requests, `AdjustPriority` adds
//! to the priority its released requests carry. No request waits longer than
//! [`AdmissionConfig::max_hold`]: it is then released and its program resumed (a forced resume).
//! Requests without a session id are not programs: they are admitted at once.

use super::{
    ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, Arrival, RankUtilization,
};
use crate::programs::{ProgramConfig, ProgramCounts, ProgramTracker, TurnEnd};
use crate::router::{PolicyRequest, RequestId};
use crate::worker::Rank;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::time::Duration;

/// Controller settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// How often the policy's `tick` runs and held requests are offered again.
    ///
    /// Default: 5 s (ThunderAgent's scheduler interval).
    pub tick_interval: Duration,
    /// Longest a request is held; then it is released and its program resumed.
    ///
    /// Default: 30 minutes.
    pub max_hold: Duration,
    /// Program tracking (idle expiry).
    pub programs: ProgramConfig,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            tick_interval: Duration::from_secs(5),
            max_hold: Duration::from_secs(30 * 60),
            programs: ProgramConfig::default(),
        }
    }
}

/// A request offered to admission.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionRequest<'a> {
    /// The driver's id of the request (the router's id, so one id follows it everywhere).
    pub id: RequestId,
    /// The request as policies see it; `session_id` names its program.
    pub request: PolicyRequest<'a>,
    /// The harness marked it the session's last (`x-dynamo-session-final`): the program ends
    /// when it finishes.
    pub session_final: bool,
}

/// A request admission lets go to the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The request.
    pub id: RequestId,
    /// Its session, if any.
    pub session_id: Option<String>,
    /// Its own priority plus its program's admission adjustments: the priority to route and
    /// queue it with.
    pub priority: i32,
    /// Where the policy wants it placed (bypassing the router's choice); `None`: the router
    /// decides.
    pub rank: Option<Rank>,
    /// How long admission held it.
    pub waited: Duration,
    /// Released because it reached [`AdmissionConfig::max_hold`].
    pub forced: bool,
}

/// What an arrival led to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArrivalOutcome {
    /// The arriving request, when admitted at once; `None`: held (a later tick releases it).
    pub admitted: Option<Release>,
    /// Other held requests the policy's answer released (e.g. resumed programs).
    pub released: Vec<Release>,
}

/// Counters and gauges of a controller.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionMetrics {
    /// Programs by state now.
    pub programs: ProgramCounts,
    /// Requests offered.
    pub arrivals: u64,
    /// Arrivals that were held rather than admitted at once.
    pub holds: u64,
    /// Held requests released later (forced ones included).
    pub released: u64,
    /// Held requests released by [`AdmissionConfig::max_hold`].
    pub forced_releases: u64,
    /// Paused programs resumed by [`AdmissionConfig::max_hold`].
    pub forced_resumes: u64,
    /// `Pause` actions that paused an active program.
    pub pauses: u64,
    /// `Resume` actions that resumed a paused program.
    pub resumes: u64,
    /// `AdjustPriority` actions applied.
    pub priority_adjustments: u64,
    /// Actions naming a session the controller does not track (ignored).
    pub unknown_session_actions: u64,
    /// Policy ticks run.
    pub ticks: u64,
    /// Summed time released requests were held.
    pub hold_time: Duration,
    /// Summed time programs spent paused (running pauses included).
    pub paused_time: Duration,
    /// Most programs paused at once.
    pub max_paused: usize,
}

/// A request waiting for admission, with what a re-offer needs.
#[derive(Debug, Clone)]
struct Held {
    id: RequestId,
    session: String,
    parent: Option<String>,
    tokens: u32,
    blocks: u32,
    block_size: u32,
    priority: i32,
    osl: Option<u32>,
    since: Duration,
}

#[derive(Debug, Clone)]
struct Active {
    session: Option<String>,
    started: Option<Duration>,
}

/// What one policy answer asked for, per session.
#[derive(Debug, Default)]
struct Effects {
    admit: BTreeSet<String>,
    hold: BTreeSet<String>,
    resumed: BTreeSet<String>,
}

/// Programs, held requests and the policy that decides about them.
#[derive(Debug)]
pub struct AdmissionController {
    config: AdmissionConfig,
    policy: Box<dyn AdmissionPolicy>,
    programs: ProgramTracker,
    /// In arrival order, so releases are first come first served among equals.
    held: Vec<Held>,
    active: FxHashMap<RequestId, Active>,
    next_tick: Duration,
    metrics: AdmissionMetrics,
    /// The view the policy gets, kept between calls so its rows' strings are reused.
    view: AdmissionView,
}

// === impl Held ===

impl Held {
    fn request(&self) -> PolicyRequest<'_> {
        PolicyRequest {
            tokens: self.tokens,
            blocks: self.blocks,
            block_size: self.block_size,
            session_id: Some(&self.session),
            parent_session_id: self.parent.as_deref(),
            priority: self.priority,
            osl: self.osl,
            ..PolicyRequest::default()
        }
    }
}

// === impl AdmissionController ===

impl AdmissionController {
    /// A controller with no programs; the first policy tick is due at time zero.
    pub fn new(config: AdmissionConfig, policy: Box<dyn AdmissionPolicy>) -> Self {
        Self {
            programs: ProgramTracker::new(config.programs.clone()),
            config,
            policy,
            held: Vec::new(),
            active: FxHashMap::default(),
            next_tick: Duration::ZERO,
            metrics: AdmissionMetrics::default(),
            view: AdmissionView::default(),
        }
    }

    /// Settings in force.
    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Name of the policy.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// Replace the policy (programs and held requests are kept).
    pub fn set_policy(&mut self, policy: Box<dyn AdmissionPolicy>) {
        self.policy = policy;
    }

    /// The programs.
    pub fn programs(&self) -> &ProgramTracker {
        &self.programs
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Nothing to watch: no program and no held request (a driver may stop ticking).
    pub fn is_idle(&self) -> bool {
        self.programs.is_empty() && self.held.is_empty()
    }

    /// The view a policy would see now.
    pub fn view(&self, workers: &[RankUtilization], now: Duration) -> AdmissionView {
        AdmissionView {
            sessions: self.programs.sessions(now),
            workers: workers.to_vec(),
        }
    }

    /// The view handed to the policy, refilled in the controller's buffer (empty for a policy
    /// that does not read it); give it back with [`AdmissionController::return_view`].
    fn take_view(&mut self, workers: &[RankUtilization], now: Duration) -> AdmissionView {
        let mut view = std::mem::take(&mut self.view);
        view.workers.clear();
        if self.policy.reads_view() {
            self.programs.sessions_into(&mut view.sessions, now);
            view.workers.extend_from_slice(workers);
        } else {
            view.sessions.clear();
        }
        view
    }

    fn return_view(&mut self, view: AdmissionView) {
        self.view = view;
    }

    /// Counters, with program states and paused time as of `now`.
    pub fn metrics(&self, now: Duration) -> AdmissionMetrics {
        let open: Duration = self
            .programs
            .iter()
            .filter(|p| p.paused)
            .map(|p| now.saturating_sub(p.paused_since))
            .sum();
        AdmissionMetrics {
            programs: self.programs.counts(),
            paused_time: self.metrics.paused_time + open,
            ..self.metrics.clone()
        }
    }

    /// When [`AdmissionController::tick`] has something to do next: the policy's tick or the
    /// earliest forced release.
    pub fn next_wakeup(&self) -> Duration {
        self.held
            .iter()
            .map(|h| h.since + self.config.max_hold)
            .fold(self.next_tick, Duration::min)
    }

    /// A request arrived: ask the policy, apply its answer, admit or hold the request.
    pub fn arrival(
        &mut self,
        request: &AdmissionRequest<'_>,
        workers: &[RankUtilization],
        now: Duration,
    ) -> ArrivalOutcome {
        self.metrics.arrivals += 1;
        let r = &request.request;
        let Some(session) = r.session_id else {
            self.active.insert(
                request.id,
                Active {
                    session: None,
                    started: None,
                },
            );
            let release = Release {
                id: request.id,
                session_id: None,
                priority: r.priority,
                rank: None,
                waited: Duration::ZERO,
                forced: false,
            };
            return ArrivalOutcome {
                admitted: Some(release),
                released: Vec::new(),
            };
        };
        self.programs
            .arrive(session, r.parent_session_id, r.tokens, now);
        if request.session_final {
            self.programs.mark_final(session);
        }
        self.held.push(Held {
            id: request.id,
            session: session.to_owned(),
            parent: r.parent_session_id.map(str::to_owned),
            tokens: r.tokens,
            blocks: r.blocks,
            block_size: r.block_size,
            priority: r.priority,
            osl: r.osl,
            since: now,
        });
        let view = self.take_view(workers, now);
        let arrival = Arrival {
            request: *r,
            waited: Duration::ZERO,
        };
        let actions = self.policy.arrival(&view, &arrival, now);
        self.return_view(view);
        let effects = self.apply(actions, now);
        let mut released = self.settle(&effects, Some(request.id), workers, now);
        let admitted = released
            .iter()
            .position(|rel| rel.id == request.id)
            .map(|i| released.remove(i));
        if admitted.is_none() {
            self.metrics.holds += 1;
        }
        ArrivalOutcome { admitted, released }
    }

    /// Periodic work, to call at [`AdmissionController::next_wakeup`] (calling more often is
    /// harmless): the policy's tick when due, held requests offered again (with their wait), and
    /// forced releases. Returns what may go to the router.
    pub fn tick(&mut self, workers: &[RankUtilization], now: Duration) -> Vec<Release> {
        let mut out = Vec::new();
        if now >= self.next_tick {
            let interval = self.config.tick_interval.max(Duration::from_millis(1));
            while self.next_tick <= now {
                self.next_tick += interval;
            }
            self.metrics.ticks += 1;
            for program in self.programs.expire(now) {
                if program.paused {
                    self.metrics.paused_time += now.saturating_sub(program.paused_since);
                }
            }
            let view = self.take_view(workers, now);
            let actions = self.policy.tick(&view, now);
            self.return_view(view);
            let effects = self.apply(actions, now);
            out.extend(self.settle(&effects, None, workers, now));
            let offers: Vec<RequestId> = self
                .held
                .iter()
                .filter(|h| self.programs.get(&h.session).is_some_and(|p| !p.paused))
                .map(|h| h.id)
                .collect();
            for id in offers {
                out.extend(self.offer_again(id, workers, now));
            }
        }
        out.extend(self.force_overdue(workers, now));
        out
    }

    /// An admitted request was placed on `rank` (sent to its engine).
    pub fn request_started(&mut self, id: RequestId, rank: Rank, now: Duration) {
        let Some(active) = self.active.get_mut(&id) else {
            return;
        };
        active.started = Some(now);
        if let Some(session) = &active.session {
            self.programs.start(session, rank);
        }
    }

    /// An admitted request ended; `end` carries the engine's usage and whether it ended with a
    /// tool call.
    pub fn request_finished(&mut self, id: RequestId, end: &TurnEnd, now: Duration) {
        let Some(active) = self.active.remove(&id) else {
            return;
        };
        let Some(session) = active.session else {
            return;
        };
        let ran = active
            .started
            .map_or(Duration::ZERO, |s| now.saturating_sub(s));
        let paused_since = self
            .programs
            .get(&session)
            .filter(|p| p.paused)
            .map(|p| p.paused_since);
        self.programs.finish(&session, end, ran, now);
        if let (Some(since), None) = (paused_since, self.programs.get(&session)) {
            // A paused program ended with its final request.
            self.metrics.paused_time += now.saturating_sub(since);
        }
    }

    /// The request went away (client gone, routing failed): forget it wherever it is. `false`
    /// if unknown.
    pub fn cancel(&mut self, id: RequestId, now: Duration) -> bool {
        if let Some(i) = self.held.iter().position(|h| h.id == id) {
            let held = self.held.remove(i);
            self.programs.withdraw(&held.session, now);
            return true;
        }
        if self.active.contains_key(&id) {
            self.request_finished(id, &TurnEnd::default(), now);
            return true;
        }
        false
    }

    /// The harness ended the session: forget its program and release its held requests (they
    /// run as requests of no program).
    pub fn end_session(&mut self, session_id: &str, now: Duration) -> Vec<Release> {
        if let Some(program) = self.programs.end(session_id)
            && program.paused
        {
            self.metrics.paused_time += now.saturating_sub(program.paused_since);
        }
        let (mine, rest): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.session == session_id);
        self.held = rest;
        mine.into_iter()
            .map(|h| {
                self.active.insert(
                    h.id,
                    Active {
                        session: None,
                        started: None,
                    },
                );
                self.metrics.released += 1;
                let waited = now.saturating_sub(h.since);
                self.metrics.hold_time += waited;
                Release {
                    id: h.id,
                    session_id: None,
                    priority: h.priority,
                    rank: None,
                    waited,
                    forced: false,
                }
            })
            .collect()
    }

    /// Offer held request `id` to the policy's `arrival` again.
    fn offer_again(
        &mut self,
        id: RequestId,
        workers: &[RankUtilization],
        now: Duration,
    ) -> Vec<Release> {
        let Some(held) = self.held.iter().find(|h| h.id == id).cloned() else {
            return Vec::new();
        };
        if self.programs.get(&held.session).is_none_or(|p| p.paused) {
            return Vec::new();
        }
        let view = self.take_view(workers, now);
        let arrival = Arrival {
            request: held.request(),
            waited: now.saturating_sub(held.since),
        };
        let actions = self.policy.arrival(&view, &arrival, now);
        self.return_view(view);
        let effects = self.apply(actions, now);
        self.settle(&effects, Some(id), workers, now)
    }

    /// Release requests held for [`AdmissionConfig::max_hold`], resuming their programs.
    fn force_overdue(&mut self, workers: &[RankUtilization], now: Duration) -> Vec<Release> {
        let max_hold = self.config.max_hold;
        let overdue: BTreeSet<String> = self
            .held
            .iter()
            .filter(|h| now.saturating_sub(h.since) >= max_hold)
            .map(|h| h.session.clone())
            .collect();
        if overdue.is_empty() {
            return Vec::new();
        }
        for session in &overdue {
            if let Some(p) = self.programs.get_mut(session)
                && p.paused
            {
                p.paused = false;
                self.metrics.paused_time += now.saturating_sub(p.paused_since);
                self.metrics.forced_resumes += 1;
            }
        }
        let effects = Effects {
            admit: overdue,
            ..Effects::default()
        };
        let mut released = self.settle(&effects, None, workers, now);
        for release in &mut released {
            release.forced = true;
        }
        self.metrics.forced_releases += released.len() as u64;
        released
    }

    /// Apply a policy's actions to the programs; what they ask of held requests is returned.
    fn apply(&mut self, actions: Vec<AdmissionAction>, now: Duration) -> Effects {
        let mut effects = Effects::default();
        if actions.is_empty() {
            return effects;
        }
        for AdmissionAction { session_id, kind } in actions {
            let Some(program) = self.programs.get_mut(&session_id) else {
                self.metrics.unknown_session_actions += 1;
                continue;
            };
            match kind {
                ActionKind::Admit => {
                    effects.hold.remove(&session_id);
                    effects.admit.insert(session_id);
                }
                ActionKind::Hold(_) => {
                    effects.admit.remove(&session_id);
                    effects.hold.insert(session_id);
                }
                ActionKind::Pause => {
                    if !program.paused {
                        program.paused = true;
                        program.paused_since = now;
                        self.metrics.pauses += 1;
                    }
                }
                ActionKind::Resume => {
                    if program.paused {
                        program.paused = false;
                        self.metrics.paused_time += now.saturating_sub(program.paused_since);
                        self.metrics.resumes += 1;
                    }
                    effects.resumed.insert(session_id);
                }
                ActionKind::AdjustPriority(delta) => {
                    program.priority = program.priority.saturating_add(delta);
                    self.metrics.priority_adjustments += 1;
                }
            }
        }
        let paused = self.programs.iter().filter(|p| p.paused).count();
        self.metrics.max_paused = self.metrics.max_paused.max(paused);
        effects
    }

    /// Release the held requests `effects` (and, for `offered`, the absence of a hold) let go.
    fn settle(
        &mut self,
        effects: &Effects,
        offered: Option<RequestId>,
        workers: &[RankUtilization],
        now: Duration,
    ) -> Vec<Release> {
        let go: Vec<bool> = self
            .held
            .iter()
            .map(|h| {
                let paused = self.programs.get(&h.session).is_some_and(|p| p.paused);
                if effects.admit.contains(&h.session) {
                    true
                } else if effects.hold.contains(&h.session) || paused {
                    false
                } else {
                    offered == Some(h.id) || effects.resumed.contains(&h.session)
                }
            })
            .collect();
        if !go.contains(&true) {
            return Vec::new();
        }
        let mut leaving = Vec::new();
        let mut staying = Vec::new();
        for (held, go) in std::mem::take(&mut self.held).into_iter().zip(go) {
            if go {
                leaving.push(held);
            } else {
                staying.push(held);
            }
        }
        self.held = staying;
        for held in &leaving {
            self.programs.admit(&held.session);
        }
        if leaving.is_empty() {
            return Vec::new();
        }
        // Placement sees the programs as they are after the answer was applied.
        let view = self.take_view(workers, now);
        let released = leaving
            .into_iter()
            .map(|held| {
                let program_priority = self.programs.get(&held.session).map_or(0, |p| p.priority);
                let rank = self.policy.placement(&view, &held.session, now);
                let waited = now.saturating_sub(held.since);
                if offered != Some(held.id) || !waited.is_zero() {
                    self.metrics.released += 1;
                    self.metrics.hold_time += waited;
                }
                self.active.insert(
                    held.id,
                    Active {
                        session: Some(held.session.clone()),
                        started: None,
                    },
                );
                Release {
                    id: held.id,
                    session_id: Some(held.session),
                    priority: held.priority.saturating_add(program_priority),
                    rank,
                    waited,
                    forced: false,
                }
            })
            .collect();
        self.return_view(view);
        released
    }
}

#[cfg(test)]
mod tests;
