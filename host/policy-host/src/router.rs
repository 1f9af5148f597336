//! [`WasmRouter`]: a `router` component behind the core's [`RoutingPolicy`] trait, with the
//! native policy of the same name answering whenever the guest cannot.

use crate::bindings;
use crate::convert;
use crate::engine::{HostState, RouterComponent};
use crate::error::PolicyError;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_core::router::{
    Candidate, KvCost, Outcome, PolicyRequest, RoutingPolicy, Selection, native_policy,
};
use wasmtime::Store;

/// Consecutive failed calls after which the guest is skipped for [`BREAKER_COOLDOWN`]: a guest
/// that loops forever would otherwise cost a full deadline on every request.
const BREAKER_THRESHOLD: u32 = 3;
const BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
/// Fallbacks within this long of the last logged one are counted, not logged.
const LOG_BURST: Duration = Duration::from_secs(10);

/// A routing policy running in a Wasm component.
///
/// One instance serves every call in order (the gateway holds the router under a lock), so a
/// stateful policy sees all `route` and `observe` calls. Measured: reusing the store costs about
/// a microsecond less per call than instantiating afresh, and keeps the guest's state.
/// After any failure the store is dropped (a trap poisons it) and rebuilt on the next call.
#[derive(Debug)]
pub struct WasmRouter {
    component: RouterComponent,
    live: Option<Live>,
    fallback: Box<dyn RoutingPolicy>,
    stats: Arc<PolicyStats>,
    model: String,
    /// Reused column buffers.
    columns: bindings::Workers,
    consecutive_failures: u32,
    skip_until: Option<Instant>,
    last_logged: Option<Instant>,
    unlogged: u64,
}

struct Live {
    store: Store<HostState>,
    instance: bindings::Router,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
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
        Self {
            component,
            live: None,
            fallback,
            stats,
            model: String::new(),
            columns: convert::empty_workers(),
            consecutive_failures: 0,
            skip_until: None,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// Set the model name the guest sees in `request.model`.
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.model = model.into();
    }

    /// The component this router runs.
    pub fn component(&self) -> &RouterComponent {
        &self.component
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<PolicyStats> {
        &self.stats
    }

    /// Ask the guest, with no fallback: the answer, checked, or why there is none. The store is
    /// dropped on failure.
    pub fn try_select(
        &mut self,
        request: &PolicyRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<Selection, PolicyError> {
        convert::fill_workers(&mut self.columns, candidates);
        let req = convert::request(request, &self.model);
        let columns = &self.columns;
        let decision = Self::call(&self.component, &mut self.live, |live| {
            live.instance.call_route(&mut live.store, &req, columns)
        })?;
        convert::selection(decision, candidates.len())
    }

    /// The guest's queue key for `request` (lower is served first).
    pub fn queue_key(&mut self, request: &PolicyRequest<'_>) -> Result<f64, PolicyError> {
        let req = convert::request(request, &self.model);
        let key = Self::call(&self.component, &mut self.live, |live| {
            live.instance.call_queue_key(&mut live.store, &req)
        })?;
        if key.is_nan() {
            return Err(PolicyError::BadOutput("queue key is NaN".into()));
        }
        Ok(key)
    }

    /// Run `f` on the live instance (instantiating it first if needed) under the deadline.
    fn call<R>(
        component: &RouterComponent,
        live: &mut Option<Live>,
        f: impl FnOnce(&mut Live) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let current = match live {
            Some(current) => current,
            None => {
                let (store, instance) = component.instantiate()?;
                live.insert(Live { store, instance })
            }
        };
        component.engine().arm_deadline(&mut current.store);
        match f(current) {
            Ok(value) => Ok(value),
            Err(e) => {
                let err = PolicyError::from_call(&e, current.store.data());
                *live = None;
                Err(err)
            }
        }
    }

    fn fall_back(
        &mut self,
        err: &PolicyError,
        request: &PolicyRequest<'_>,
        candidates: &[Candidate],
    ) -> Selection {
        let name = &self.component.metadata().name;
        self.stats
            .record_fallback(err.reason(), Some(format!("{name}: {err}")));
        self.consecutive_failures += 1;
        if self.consecutive_failures >= BREAKER_THRESHOLD {
            self.skip_until = Some(Instant::now() + BREAKER_COOLDOWN);
        }
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= LOG_BURST)
        {
            tracing::warn!(
                policy = %name,
                error = %err,
                suppressed = self.unlogged,
                "policy failed; the native policy answers for now"
            );
            self.last_logged = Some(now);
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
        self.fallback.select(request, candidates)
    }
}

impl RoutingPolicy for WasmRouter {
    fn name(&self) -> &str {
        &self.component.metadata().name
    }

    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        if let Some(until) = self.skip_until {
            if Instant::now() < until {
                self.stats.record_fallback("circuit_open", None);
                return self.fallback.select(request, candidates);
            }
            self.skip_until = None;
        }
        let started = Instant::now();
        let answer = self.try_select(request, candidates);
        self.stats.record_call(started.elapsed());
        match answer {
            Ok(selection) => {
                self.consecutive_failures = 0;
                selection
            }
            Err(err) => self.fall_back(&err, request, candidates),
        }
    }

    fn observe(&mut self, outcome: &Outcome) {
        self.fallback.observe(outcome);
        let feedback = convert::outcome(outcome);
        let result = Self::call(&self.component, &mut self.live, |live| {
            live.instance.call_observe(&mut live.store, &feedback)
        });
        if let Err(err) = result {
            self.stats.record_fallback(
                err.reason(),
                Some(format!(
                    "{}: observe: {err}",
                    self.component.metadata().name
                )),
            );
        }
    }
}
