//! [`WasmAdmission`]: an `admission` component behind the core's [`AdmissionPolicy`] trait, with
//! the native policy of the same name answering whenever the guest cannot.

use crate::bindings::admission::{
    Action, ActionKind as WitActionKind, Incoming, SessionPhase as WitPhase, Sessions, Utilization,
};
use crate::component::AdmissionComponent;
use crate::convert;
use crate::error::PolicyError;
use crate::guest::Guest;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{
    ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, AdmitAll, Arrival, SessionPhase,
    native_admission,
};

/// An admission policy running in a Wasm component.
///
/// One instance sees every `tick` and `arrival` in order, so a policy may keep per-session state
/// (e.g. ThunderAgent's paused set). After any failure the store is rebuilt on the next call,
/// which loses that state: the native fallback answers meanwhile.
#[derive(Debug)]
pub struct WasmAdmission {
    guest: Guest<AdmissionComponent>,
    fallback: Box<dyn AdmissionPolicy>,
    model: String,
}

impl WasmAdmission {
    /// Admission over `component`; the guest is instantiated on the first call. The fallback is
    /// the native policy named like the component, else [`AdmitAll`].
    pub fn new(component: AdmissionComponent, stats: Arc<PolicyStats>) -> Self {
        let fallback =
            native_admission(&component.metadata().name).unwrap_or_else(|| Box::new(AdmitAll));
        Self::with_fallback(component, stats, fallback)
    }

    /// Admission with an explicit native fallback.
    pub fn with_fallback(
        component: AdmissionComponent,
        stats: Arc<PolicyStats>,
        fallback: Box<dyn AdmissionPolicy>,
    ) -> Self {
        Self {
            guest: Guest::new(component, stats),
            fallback,
            model: String::new(),
        }
    }

    /// Set the model name the guest sees in an arrival's `req.model`.
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.model = model.into();
    }

    /// The component this policy runs.
    pub fn component(&self) -> &AdmissionComponent {
        self.guest.component()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<PolicyStats> {
        self.guest.stats()
    }

    /// Ask the guest's `tick`, with no fallback: the actions, checked, or why there are none.
    pub fn try_tick(
        &mut self,
        view: &AdmissionView,
        now: Duration,
    ) -> Result<Vec<AdmissionAction>, PolicyError> {
        ask_tick(&mut self.guest, view, now)
    }

    /// Ask the guest's `arrival`, with no fallback.
    pub fn try_arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Result<Vec<AdmissionAction>, PolicyError> {
        ask_arrival(&mut self.guest, view, arrival, now, &self.model)
    }
}

impl AdmissionPolicy for WasmAdmission {
    fn name(&self) -> &str {
        self.guest.name()
    }

    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction> {
        match self.guest.decide(|guest| ask_tick(guest, view, now)) {
            Some(actions) => actions,
            None => self.fallback.tick(view, now),
        }
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction> {
        let model = &self.model;
        match self
            .guest
            .decide(|guest| ask_arrival(guest, view, arrival, now, model))
        {
            Some(actions) => actions,
            None => self.fallback.arrival(view, arrival, now),
        }
    }
}

// Free functions rather than methods so `decide` can lend them the guest while `self.model`
// stays readable.

fn ask_tick(
    guest: &mut Guest<AdmissionComponent>,
    view: &AdmissionView,
    now: Duration,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let (sessions, workers) = (sessions(view), utilization(view));
    let raw = guest.call(|instance, store| {
        instance.call_tick(store, convert::millis(now), &sessions, &workers)
    })?;
    checked(raw, view, None)
}

fn ask_arrival(
    guest: &mut Guest<AdmissionComponent>,
    view: &AdmissionView,
    arrival: &Arrival<'_>,
    now: Duration,
    model: &str,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let incoming = Incoming {
        req: convert::request(&arrival.request, model),
        waited_ms: convert::millis(arrival.waited),
    };
    let (sessions, workers) = (sessions(view), utilization(view));
    let raw = guest.call(|instance, store| {
        instance.call_arrival(store, convert::millis(now), &incoming, &sessions, &workers)
    })?;
    checked(raw, view, Some(arrival))
}

fn sessions(view: &AdmissionView) -> Sessions {
    let s = &view.sessions;
    Sessions {
        session_ids: s.iter().map(|s| s.session_id.clone()).collect(),
        parent_session_ids: s.iter().map(|s| s.parent_session_id.clone()).collect(),
        phases: s.iter().map(|s| phase(s.phase)).collect(),
        priorities: s.iter().map(|s| s.priority).collect(),
        active_requests: s.iter().map(|s| s.active_requests).collect(),
        queued_requests: s.iter().map(|s| s.queued_requests).collect(),
        context_tokens: s.iter().map(|s| s.context_tokens).collect(),
        age_ms: s.iter().map(|s| convert::millis(s.age)).collect(),
        idle_ms: s.iter().map(|s| convert::millis(s.idle)).collect(),
        extensions: Vec::new(),
    }
}

fn phase(phase: SessionPhase) -> WitPhase {
    match phase {
        SessionPhase::Queued => WitPhase::Queued,
        SessionPhase::Running => WitPhase::Running,
        SessionPhase::ToolCall => WitPhase::ToolCall,
        SessionPhase::Paused => WitPhase::Paused,
        SessionPhase::Idle => WitPhase::Idle,
    }
}

fn utilization(view: &AdmissionView) -> Utilization {
    let w = &view.workers;
    Utilization {
        worker_ids: w.iter().map(|w| w.rank.worker.0).collect(),
        dp_ranks: w.iter().map(|w| w.rank.dp_rank).collect(),
        kv_usage: w.iter().map(|w| w.kv_usage).collect(),
        active_requests: w.iter().map(|w| w.active_requests).collect(),
        queue_depth: w.iter().map(|w| w.queue_depth).collect(),
        healthy: w.iter().map(|w| w.healthy).collect(),
        extensions: Vec::new(),
    }
}

/// Convert the guest's actions and refuse the whole answer if one names a session the host
/// did not report: it cannot be applied, and the rest of the answer was computed from the same
/// confusion.
fn checked(
    raw: Vec<Action>,
    view: &AdmissionView,
    arrival: Option<&Arrival<'_>>,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let actions: Vec<AdmissionAction> = raw
        .into_iter()
        .map(|a| AdmissionAction {
            session_id: a.session_id,
            kind: match a.kind {
                WitActionKind::Admit => ActionKind::Admit,
                WitActionKind::Hold(reason) => ActionKind::Hold(reason),
                WitActionKind::Pause => ActionKind::Pause,
                WitActionKind::Resume => ActionKind::Resume,
                WitActionKind::AdjustPriority(delta) => ActionKind::AdjustPriority(delta),
            },
        })
        .collect();
    match view.unknown_session(&actions, arrival) {
        Some(unknown) => Err(PolicyError::BadOutput(format!(
            "action for unknown session `{unknown}`"
        ))),
        None => Ok(actions),
    }
}
