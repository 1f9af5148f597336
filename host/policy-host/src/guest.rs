//! [`Guest`]: the containment every Wasm decision point shares. It owns the live instance (built
//! on first use, dropped after any failed call because a trap poisons the store), arms the
//! deadline before each call, times and counts decisions, and on failure records the reason,
//! rate-limits the log line and opens a circuit breaker so a guest that fails repeatedly stops
//! costing a deadline per decision. The caller asks its native policy whenever it gets `None`.

use crate::component::{ComponentHandle, World};
use crate::engine::HostState;
use crate::error::PolicyError;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::Store;

/// Consecutive failed decisions after which the guest is skipped for [`BREAKER_COOLDOWN`]: a
/// guest that loops forever would otherwise cost a full deadline on every decision.
const BREAKER_THRESHOLD: u32 = 3;
const BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
/// Failures within this long of the last logged one are counted, not logged.
const LOG_BURST: Duration = Duration::from_secs(10);

/// A component's live instance and its containment state.
pub(crate) struct Guest<H: ComponentHandle> {
    component: H,
    live: Option<(Store<HostState>, H::World)>,
    /// What every new instance's 1.1 `configure` is given (empty: the policy's defaults).
    params: Vec<(String, String)>,
    /// Whether an instance was ever created (later ones get no startup allowance).
    started: bool,
    stats: Arc<PolicyStats>,
    consecutive_failures: u32,
    skip_until: Option<Instant>,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl<H: ComponentHandle> std::fmt::Debug for Guest<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("component", &self.component)
            .field("live", &self.live.is_some())
            .field("consecutive_failures", &self.consecutive_failures)
            .finish_non_exhaustive()
    }
}

impl<H: ComponentHandle> Guest<H> {
    /// A guest over `component`, instantiated on the first call.
    pub(crate) fn new(component: H, stats: Arc<PolicyStats>) -> Self {
        Self {
            component,
            live: None,
            params: Vec::new(),
            started: false,
            stats,
            consecutive_failures: 0,
            skip_until: None,
            last_logged: None,
            unlogged: 0,
        }
    }

    pub(crate) fn component(&self) -> &H {
        &self.component
    }

    pub(crate) fn stats(&self) -> &Arc<PolicyStats> {
        &self.stats
    }

    /// Configure the policy with `params` from now on: the live instance (if any) is dropped, and
    /// every new one gets them through 1.1's `configure` before anything else. Refused at once
    /// when the component takes no parameters (1.0: no `configure`) and `params` is not empty;
    /// the policy's own refusal surfaces on the next instantiation ([`Guest::warm_up`]).
    pub(crate) fn set_params(&mut self, params: Vec<(String, String)>) -> Result<(), PolicyError> {
        if !params.is_empty() && !H::World::pre_configurable(self.component.loaded().pre()) {
            let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            return Err(PolicyError::Params(format!(
                "`{}` takes no parameters (it exports no `configure`: built against \
                 switchyard:policy@{}), but was given {}",
                self.name(),
                self.component.loaded().metadata().wit_version,
                keys.join(", ")
            )));
        }
        self.params = params;
        self.live = None;
        Ok(())
    }

    /// The policy's name, from its metadata.
    pub(crate) fn name(&self) -> &str {
        &self.component.loaded().metadata().name
    }

    /// Run `f` on the live instance (instantiating it first if needed) under the deadline (the
    /// startup deadline for the first instance's instantiation and first call). On failure the
    /// store is dropped and the error classified.
    pub(crate) fn call<R>(
        &mut self,
        f: impl FnOnce(&H::World, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let loaded = self.component.loaded();
        // Only the guest's first instance gets the startup allowance; a rebuild after a failure
        // runs on the request path.
        let startup = self.live.is_none() && !self.started;
        let (store, instance) = match &mut self.live {
            Some(live) => live,
            None => {
                self.started = true;
                let (mut store, instance) = loaded.instantiate(startup)?;
                if let Some(configurable) = instance.configurable() {
                    loaded.engine().arm_deadline(&mut store, startup);
                    match configurable.call_configure(&mut store, &self.params) {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => return Err(PolicyError::Params(reason)),
                        Err(e) => return Err(PolicyError::from_call(&e, store.data())),
                    }
                }
                self.live.insert((store, instance))
            }
        };
        loaded.engine().arm_deadline(store, startup);
        match f(instance, store) {
            Ok(value) => Ok(value),
            Err(e) => {
                let err = PolicyError::from_call(&e, store.data());
                self.live = None;
                Err(err)
            }
        }
    }

    /// Start the first instance now, off the request path, by asking its metadata (which
    /// also runs a language runtime's lazy initialization). A failure rejects the load.
    pub(crate) fn warm_up(&mut self) -> Result<(), PolicyError> {
        self.call(|instance, store| instance.metadata(store))
            .map(drop)
            .map_err(|e| match e {
                // The policy's own reason, as it gave it.
                PolicyError::Params(_) => e,
                e => PolicyError::Canary(format!("warm-up: {e}")),
            })
    }

    /// One decision: `attempt` asks the guest (through [`Guest::call`]) and checks its answer.
    /// `None` means the caller's native policy must answer: the breaker is open, or the attempt
    /// failed (counted by reason, logged at most once per burst).
    pub(crate) fn decide<R>(
        &mut self,
        attempt: impl FnOnce(&mut Self) -> Result<R, PolicyError>,
    ) -> Option<R> {
        if let Some(until) = self.skip_until {
            if Instant::now() < until {
                self.stats.record_fallback("circuit_open", None);
                return None;
            }
            self.skip_until = None;
        }
        let started = Instant::now();
        let answer = attempt(self);
        self.stats.record_call(started.elapsed());
        match answer {
            Ok(value) => {
                self.consecutive_failures = 0;
                Some(value)
            }
            Err(err) => {
                self.failed(&err);
                None
            }
        }
    }

    fn failed(&mut self, err: &PolicyError) {
        let name = self.name().to_owned();
        self.stats
            .record_fallback(err.reason(), Some(format!("{name}: {err}")));
        self.consecutive_failures += 1;
        let now = Instant::now();
        if self.consecutive_failures >= BREAKER_THRESHOLD {
            self.skip_until = Some(now + BREAKER_COOLDOWN);
        }
        if self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= LOG_BURST)
        {
            tracing::warn!(
                policy = %name,
                world = H::World::NAME,
                error = %err,
                suppressed = self.unlogged,
                "policy failed; the native policy answers for now"
            );
            self.last_logged = Some(now);
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
    }
}
