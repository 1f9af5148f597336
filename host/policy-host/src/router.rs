//! [`WasmRouter`]: a `router` component behind the core's [`RoutingPolicy`] trait, with the
//! native policy of the same name answering whenever the guest cannot.

use crate::bindings;
use crate::component::{Metadata, RouterComponent};
use crate::convert;
use crate::engine::PolicyEngine;
use crate::error::PolicyError;
use crate::guest::Guest;
use crate::slot::Kind;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::index::Overlap;
use switchyard_core::router::{
    Candidate, KvCost, Outcome, PolicyRequest, RoutingPolicy, Selection, native_policy,
};
use switchyard_core::worker::Rank;

/// A routing policy running in a Wasm component.
///
/// One instance serves every call in order (the gateway holds the router under a lock), so a
/// stateful policy sees all `route` and `observe` calls. Measured: reusing the store costs about
/// a microsecond less per call than instantiating afresh, and keeps the guest's state.
/// After any failure the store is dropped (a trap poisons it) and rebuilt on the next call.
#[derive(Debug)]
pub struct WasmRouter {
    guest: Guest<RouterComponent>,
    fallback: Box<dyn RoutingPolicy>,
    model: String,
    /// Reused column buffers: `route`'s, or 1.2 `route-packed`'s when the component has it.
    columns: Columns,
}

/// The candidates' columns in the shape the component takes, kept between calls.
#[derive(Debug)]
enum Columns {
    /// Boxed: sixteen columns against the packed five.
    Workers(Box<bindings::Workers>),
    Packed(bindings::PackedWorkers),
}

impl WasmRouter {
    /// A router over `component`; the guest is instantiated on the first call. The fallback is
    /// the native policy named like the component (`kv-cost`, `round-robin`), else [`KvCost`].
    pub fn new(component: RouterComponent, stats: Arc<PolicyStats>) -> Self {
        let fallback =
            native_policy(&component.metadata().name).unwrap_or_else(|| Box::new(KvCost));
        Self::with_fallback(component, stats, fallback)
    }

    /// A router with an explicit native fallback.
    pub fn with_fallback(
        component: RouterComponent,
        stats: Arc<PolicyStats>,
        fallback: Box<dyn RoutingPolicy>,
    ) -> Self {
        let columns = if component.has_route_packed() {
            Columns::Packed(convert::empty_packed())
        } else {
            Columns::Workers(Box::new(convert::empty_workers()))
        };
        Self {
            guest: Guest::new(component, stats),
            fallback,
            model: String::new(),
            columns,
        }
    }

    /// Set the model name the guest sees in `request.model`.
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.model = model.into();
    }

    /// The component this router runs.
    pub fn component(&self) -> &RouterComponent {
        self.guest.component()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<PolicyStats> {
        self.guest.stats()
    }

    /// Ask the guest, with no fallback: the answer, checked, or why there is none. The store is
    /// dropped on failure.
    pub fn try_select(
        &mut self,
        request: &PolicyRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<Selection, PolicyError> {
        ask_route(
            &mut self.guest,
            &mut self.columns,
            &self.model,
            request,
            candidates,
        )
    }

    /// The guest's queue key for `request` (lower is served first).
    pub fn queue_key(&mut self, request: &PolicyRequest<'_>) -> Result<f64, PolicyError> {
        let req = convert::request(request, &self.model);
        let key = self
            .guest
            .call(|instance, store| instance.core.call_queue_key(store, &req))?;
        if key.is_nan() {
            return Err(PolicyError::BadOutput("queue key is NaN".into()));
        }
        Ok(key)
    }

    /// The guest's 1.1 `queue-key-at` for `request` arriving at `arrival` (lower is served
    /// first), with no fallback; `None` when the guest gives no key or lacks the export (a 1.0
    /// component).
    pub fn try_queue_key_at(
        &mut self,
        request: &PolicyRequest<'_>,
        arrival: Duration,
    ) -> Result<Option<f64>, PolicyError> {
        ask_queue_key_at(&mut self.guest, &self.model, request, arrival)
    }

    /// Configure the policy with `params` (its 1.1 `configure`; every later instance gets them
    /// too) and start its instance. Refused with the policy's reason, or at once when it takes
    /// no parameters (a 1.0 component) and `params` is not empty.
    pub fn configure(&mut self, params: Vec<(String, String)>) -> Result<(), PolicyError> {
        self.guest.set_params(params)?;
        self.guest.warm_up()
    }
}

fn ask_queue_key_at(
    guest: &mut Guest<RouterComponent>,
    model: &str,
    request: &PolicyRequest<'_>,
    arrival: Duration,
) -> Result<Option<f64>, PolicyError> {
    let req = convert::request(request, model);
    let arrival_ms = convert::millis(arrival);
    let key = guest.call(|instance, store| match &instance.arrival {
        Some(arrival) => arrival.call_queue_key_at(store, &req, arrival_ms),
        None => Ok(None),
    })?;
    if key.is_some_and(f64::is_nan) {
        return Err(PolicyError::BadOutput("queue key is NaN".into()));
    }
    Ok(key)
}

/// One `route` call (1.2 `route-packed` when the component has it): the candidates as columns
/// in, the decision checked against them.
fn ask_route(
    guest: &mut Guest<RouterComponent>,
    columns: &mut Columns,
    model: &str,
    request: &PolicyRequest<'_>,
    candidates: &[Candidate],
) -> Result<Selection, PolicyError> {
    let req = convert::route_request(request, model, candidates);
    let decision = match columns {
        Columns::Workers(workers) => {
            convert::fill_workers(workers, candidates);
            let workers = &**workers;
            guest.call(|instance, store| instance.core.call_route(store, &req, workers))?
        }
        Columns::Packed(packed) => {
            convert::fill_packed(packed, candidates);
            let packed = &*packed;
            guest.call(|instance, store| match &instance.packed {
                Some(exports) => exports.call_route_packed(store, &req, packed),
                None => Err(wasmtime::format_err!("the component lost `route-packed`")),
            })?
        }
    };
    convert::selection(decision, candidates.len())
}

impl RoutingPolicy for WasmRouter {
    fn name(&self) -> &str {
        self.guest.name()
    }

    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        let (columns, model) = (&mut self.columns, &self.model);
        match self
            .guest
            .decide(|guest| ask_route(guest, columns, model, request, candidates))
        {
            Some(selection) => selection,
            None => self.fallback.select(request, candidates),
        }
    }

    fn queue_key_at(&mut self, request: &PolicyRequest<'_>, arrival: Duration) -> Option<f64> {
        if !self.guest.component().has_queue_key_at() {
            // A 1.0 component: the queue orders as it always did for a Wasm router.
            return self.fallback.queue_key_at(request, arrival);
        }
        let model = &self.model;
        match self
            .guest
            .decide(|guest| ask_queue_key_at(guest, model, request, arrival))
        {
            Some(key) => key,
            None => self.fallback.queue_key_at(request, arrival),
        }
    }

    fn observe(&mut self, outcome: &Outcome) {
        self.fallback.observe(outcome);
        let feedback = convert::outcome(outcome);
        let result = self
            .guest
            .call(|instance, store| instance.core.call_observe(store, &feedback));
        if let Err(err) = result {
            let detail = format!("{}: observe: {err}", self.guest.name());
            self.guest
                .stats()
                .record_fallback(err.reason(), Some(detail));
        }
    }
}

/// Prompt tokens of the canary's sample requests.
pub(crate) const CANARY_TOKENS: u32 = 100;

/// The `router` world, for the registry.
#[derive(Debug)]
pub(crate) struct RouterKind;

impl Kind for RouterKind {
    const WORLD: &'static str = "router";
    const DEFAULT_NATIVE: &'static str = "kv-cost";
    type Policy = dyn RoutingPolicy;

    fn native(name: &str) -> Option<Box<Self::Policy>> {
        native_policy(name)
    }

    fn policy_name(policy: &Self::Policy) -> &str {
        policy.name()
    }

    fn load(
        engine: &PolicyEngine,
        bytes: &[u8],
        stats: Arc<PolicyStats>,
        model: &str,
        params: &[(String, String)],
    ) -> Result<(Metadata, Box<Self::Policy>), PolicyError> {
        let component = engine.load_router(bytes)?;
        canary(&component, params)?;
        let metadata = component.metadata().clone();
        let mut router = WasmRouter::new(component, stats);
        router.set_model(model);
        // The instance that will answer starts now, off the request path.
        router.configure(params.to_vec())?;
        Ok((metadata, Box::new(router)))
    }
}

/// Run a fresh instance on sample inputs (1, 8 and 64 workers); any failure rejects the load.
fn canary(component: &RouterComponent, params: &[(String, String)]) -> Result<(), PolicyError> {
    let mut trial = WasmRouter::new(component.clone(), Arc::new(PolicyStats::default()));
    trial.guest.set_params(params.to_vec())?;
    // The policy's refusal of its parameters is the load's error, as the policy gave it.
    trial.guest.warm_up()?;
    for workers in [1_u32, 8, 64] {
        let candidates: Vec<Candidate> = (0..workers)
            .map(|w| Candidate {
                rank: Rank::new(w / 2, w % 2),
                overlap: Overlap {
                    device: w % 5,
                    host: w % 3,
                    disk: w % 2,
                },
                shared_blocks: w % 4,
                indexed_blocks: u64::from(w) * 100,
                active_prefill_tokens: u64::from((w * 37) % 500),
                active_decode_blocks: u64::from((w * 11) % 40),
                active_requests: w % 7,
            })
            .collect();
        let request = PolicyRequest {
            tokens: CANARY_TOKENS,
            blocks: CANARY_TOKENS.div_ceil(16),
            block_size: 16,
            session_id: Some("canary"),
            osl: Some(64),
            ..PolicyRequest::default()
        };
        trial
            .try_select(&request, &candidates)
            .map_err(|e| PolicyError::Canary(format!("route on {workers} workers: {e}")))?;
        trial
            .queue_key(&request)
            .map_err(|e| PolicyError::Canary(format!("queue-key: {e}")))?;
        trial
            .try_queue_key_at(&request, Duration::from_secs(60))
            .map_err(|e| PolicyError::Canary(format!("queue-key-at: {e}")))?;
    }
    Ok(())
}
