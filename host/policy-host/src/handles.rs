//! The registry behind the core's policy traits: each call goes to whatever policy is active in
//! its role at that moment, so a swap takes effect on the next call and a call in flight
//! finishes on the version it started with. A Wasm policy answers with its native namesake's
//! decision whenever the guest cannot ([`crate::WasmRouter`], [`crate::WasmAdmission`],
//! [`crate::WasmKvHints`]).

use crate::registry::PolicyRegistry;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{AdmissionAction, AdmissionPolicy, AdmissionView, Arrival};
use switchyard_core::kv_hints::{HintOutcome, IndexState, KvHint, KvHintPolicy, LifecycleEvent};
use switchyard_core::router::{
    Candidate, KvCost, Outcome, PolicyRequest, RoutingPolicy, Selection,
};
use switchyard_core::worker::Rank;

/// The registry as the core router's policy: each call goes to the active router, and to the
/// shadow if one is loaded (its answer is compared, never applied).
#[derive(Debug, Clone)]
pub struct RegistryPolicy {
    registry: Arc<PolicyRegistry>,
}

impl RegistryPolicy {
    pub(crate) fn new(registry: Arc<PolicyRegistry>) -> Self {
        Self { registry }
    }
}

impl RoutingPolicy for RegistryPolicy {
    fn name(&self) -> &str {
        "policy-registry"
    }

    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        let active = self.registry.router.current.load_full();
        let selection = match &active {
            Some(active) => active.call(|p| p.select(request, candidates)),
            None => KvCost.select(request, candidates),
        };
        if let Some(shadow) = self.registry.shadow.current.load_full() {
            let counterfactual = shadow.call(|p| p.select(request, candidates));
            let ours = intended(&selection);
            let theirs = intended(&counterfactual);
            let delta = match (ours, theirs) {
                (Some(a), Some(b)) if a < candidates.len() && b < candidates.len() => {
                    KvCost::cost(request, &candidates[b]) - KvCost::cost(request, &candidates[a])
                }
                _ => 0.0,
            };
            shadow.stats.record_shadow(ours != theirs, delta);
        }
        selection
    }

    /// The active router's key (not the shadow's: the queue has one order).
    fn queue_key_at(&mut self, request: &PolicyRequest<'_>, arrival: Duration) -> Option<f64> {
        self.registry
            .router
            .current
            .load_full()
            .and_then(|active| active.call(|p| p.queue_key_at(request, arrival)))
    }

    fn observe(&mut self, outcome: &Outcome) {
        for slot in [&self.registry.router, &self.registry.shadow] {
            if let Some(policy) = slot.current.load_full() {
                policy.call(|p| p.observe(outcome));
            }
        }
    }
}

/// The candidate a selection means at temperature 0: the pick, or the cheapest (first on ties).
fn intended(selection: &Selection) -> Option<usize> {
    match selection {
        Selection::Pick(i) => Some(*i),
        Selection::Costs(costs) => costs
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i),
        Selection::Reject(_) => None,
    }
}

/// The registry as the gateway's admission policy: each call goes to the active admission
/// policy (`[policies] admission`), a component or a native policy. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RegistryAdmission {
    registry: Arc<PolicyRegistry>,
}

impl RegistryAdmission {
    pub(crate) fn new(registry: Arc<PolicyRegistry>) -> Self {
        Self { registry }
    }
}

impl AdmissionPolicy for RegistryAdmission {
    fn name(&self) -> &str {
        "policy-registry"
    }

    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction> {
        match self.registry.admission.current.load_full() {
            Some(active) => active.call(|p| p.tick(view, now)),
            // Nothing active (never: the slot starts native): admit everything.
            None => Vec::new(),
        }
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction> {
        match self.registry.admission.current.load_full() {
            Some(active) => active.call(|p| p.arrival(view, arrival, now)),
            None => Vec::new(),
        }
    }

    /// The active policy's placement: a native one may place (`native:thunder-agent`), and so
    /// may a component exporting 1.1's `placement` (a 1.0 component never does).
    fn placement(&mut self, view: &AdmissionView, session_id: &str, now: Duration) -> Option<Rank> {
        self.registry
            .admission
            .current
            .load_full()
            .and_then(|active| active.call(|p| p.placement(view, session_id, now)))
    }

    /// The active policy's answer, so that `none` spares the gateway a view of every program
    /// on each arrival.
    fn reads_view(&self) -> bool {
        self.registry
            .admission
            .current
            .load_full()
            .is_none_or(|active| active.ask(|p| p.reads_view()))
    }
}

/// The registry as the gateway's KV-hint policy: each call goes to the active KV-hint policy
/// (`[policies] kv_hints`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct RegistryKvHints {
    registry: Arc<PolicyRegistry>,
}

impl RegistryKvHints {
    pub(crate) fn new(registry: Arc<PolicyRegistry>) -> Self {
        Self { registry }
    }
}

impl KvHintPolicy for RegistryKvHints {
    fn name(&self) -> &str {
        "policy-registry"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint> {
        match self.registry.kv_hints.current.load_full() {
            Some(active) => active.call(|p| p.on_events(events, index, now)),
            None => Vec::new(),
        }
    }

    fn on_outcomes(&mut self, outcomes: &[HintOutcome], now: Duration) {
        if let Some(active) = self.registry.kv_hints.current.load_full() {
            active.call(|p| p.on_outcomes(outcomes, now));
        }
    }
}
