//! The shared wasmtime engine: settings, the epoch ticker, the compile cache and loading a
//! component of any policy world into a pre-linked, checked handle ([`RouterComponent`],
//! [`AdmissionComponent`], [`KvHintsComponent`]).

use crate::bindings::{self, LogLevel, admission, kv_hints};
pub(crate) use crate::component::{
    AdmissionComponent, KvHintsComponent, Metadata, RouterComponent,
};
use crate::component::{Loaded, World};
use crate::error::PolicyError;
use crate::wasi::{self, WasiState};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store};

/// The `switchyard:policy` major version this host implements.
pub const WIT_MAJOR: u64 = 1;

/// Exports of the `router` world.
const ROUTER_EXPORTS: [&str; 4] = ["metadata", "route", "observe", "queue-key"];

/// Every world's function exports: a component that lacks one of its world's exports but has
/// one only another world has was built for the wrong decision point.
const WORLD_EXPORTS: [(&str, &[&str]); 3] = [
    ("router", &ROUTER_EXPORTS),
    ("admission", &["metadata", "tick", "arrival"]),
    ("kv-hints", &["metadata", "on-events"]),
];

/// Compiled components kept by content hash (a reload of unchanged bytes costs nothing).
const COMPILE_CACHE_ENTRIES: usize = 64;

/// Settings of the policy engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Longest a single guest call may run before it is interrupted and the native policy
    /// answers instead. Enforced by epoch interruption, so the effective limit is rounded up to
    /// a whole number of `epoch_tick`s. Use a few milliseconds: routing decisions take
    /// microseconds, and the call runs under the router's lock. Default: 5 ms.
    pub deadline: Duration,
    /// Longest the start of a policy's first instance may take: instantiation plus its first
    /// call, where language runtimes initialize (componentize-py's CPython reads its
    /// environment and seeds `random`, and its 12 MiB memory image is mapped). Applies at load
    /// (the metadata check, the canary's first call, the warm-up of the instance that will
    /// answer); an instance rebuilt after a failure starts under the ordinary `deadline`, so a
    /// broken guest never costs more than that on the request path. A value below `deadline`
    /// counts as `deadline`. Default: 50 ms.
    pub startup_deadline: Duration,
    /// How often the ticker thread advances the engine's epoch; the deadline's resolution.
    /// Shorter ticks bound a runaway call more tightly at the cost of a busier thread.
    /// Default: 1 ms.
    pub epoch_tick: Duration,
    /// Largest linear memory a guest may grow to, in bytes. Must be at least 2 MiB: Rust
    /// `wasm32-wasip2` guests declare about 1.1 MiB at start. A guest growing past it fails
    /// its call with [`PolicyError::OutOfMemory`]. Default: 16 MiB.
    pub max_memory_bytes: usize,
    /// Memory caps for single policies, by the name their metadata reports, replacing
    /// `max_memory_bytes` for that policy only: for a guest whose language runtime needs more
    /// (componentize-py's CPython starts at 12.3 MiB and its runtime keeps ~40 bytes per call,
    /// so under 16 MiB it is rebuilt about every 100,000 decisions). A load runs under the
    /// largest cap configured until the metadata names the policy. Each must be at least 2 MiB.
    /// Default: none.
    pub max_memory_bytes_per_policy: BTreeMap<String, usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(5),
            startup_deadline: Duration::from_millis(50),
            epoch_tick: Duration::from_millis(1),
            max_memory_bytes: 16 << 20,
            max_memory_bytes_per_policy: BTreeMap::new(),
        }
    }
}

impl EngineConfig {
    /// For the simulator, where time is virtual: a call's wall-clock time must not change a
    /// run's results (a call cut off at 5 ms on a loaded machine would answer with the native
    /// fallback, or no hints, in one run and not the next). The deadlines only stop a guest
    /// that never returns.
    pub fn simulation() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            startup_deadline: Duration::from_secs(10),
            ..Self::default()
        }
    }

    /// Check the settings once, before the engine is built.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.epoch_tick.is_zero() || self.deadline < self.epoch_tick {
            return Err(PolicyError::Engine(format!(
                "deadline ({:?}) must be at least one epoch tick ({:?}), which must be non-zero",
                self.deadline, self.epoch_tick
            )));
        }
        let caps = std::iter::once(("max_memory_bytes".to_string(), self.max_memory_bytes)).chain(
            self.max_memory_bytes_per_policy
                .iter()
                .map(|(policy, cap)| (format!("max_memory_bytes_per_policy[{policy:?}]"), *cap)),
        );
        for (field, cap) in caps {
            if cap < 2 << 20 {
                return Err(PolicyError::Engine(format!(
                    "{field} {cap} is below 2 MiB (Rust guests start at ~1.1 MiB)"
                )));
            }
        }
        Ok(())
    }

    /// The memory cap of `policy`; `None` while loading, when its name is not known yet.
    fn memory_cap(&self, policy: Option<&str>) -> usize {
        match policy {
            Some(name) => self
                .max_memory_bytes_per_policy
                .get(name)
                .copied()
                .unwrap_or(self.max_memory_bytes),
            None => self
                .max_memory_bytes_per_policy
                .values()
                .copied()
                .fold(self.max_memory_bytes, usize::max),
        }
    }

    fn ticks(&self, limit: Duration) -> u64 {
        limit
            .as_nanos()
            .div_ceil(self.epoch_tick.as_nanos())
            .try_into()
            .unwrap_or(u64::MAX)
    }
}

/// A content hash of component bytes (xxh3-128), shown in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash(pub u128);

impl ContentHash {
    /// Hash `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(xxhash_rust::xxh3::xxh3_128(bytes))
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Caps a store's memory and records whether the cap was hit, so a failed call can be
/// classified as out-of-memory whatever the guest did next.
#[derive(Debug)]
pub(crate) struct MemoryCap {
    pub(crate) max_memory_bytes: usize,
    pub(crate) denied: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = desired <= self.max_memory_bytes;
        self.denied |= !allowed;
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A table entry is a pointer: cap tables at the same byte budget as memory.
        Ok(desired.saturating_mul(8) <= self.max_memory_bytes)
    }
}

/// What a guest's store carries: its memory cap, its name for log lines and its WASI state.
#[derive(Debug)]
pub(crate) struct HostState {
    pub(crate) limiter: MemoryCap,
    pub(crate) policy: Arc<str>,
    pub(crate) wasi: WasiState,
}

/// The `types` interface has types only: nothing to provide.
impl bindings::TypesHost for HostState {}
/// Types only, like `types`.
impl admission::AdmissionTypesHost for HostState {}
/// Types only, like `types`.
impl kv_hints::KvHintTypesHost for HostState {}

impl bindings::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        // Bounded so a chatty guest cannot flood the gateway's log.
        let message: String = message.chars().take(1024).collect();
        let policy = &*self.policy;
        match level {
            LogLevel::Trace => tracing::trace!(policy, "{message}"),
            LogLevel::Debug => tracing::debug!(policy, "{message}"),
            LogLevel::Info => tracing::info!(policy, "{message}"),
            LogLevel::Warn => tracing::warn!(policy, "{message}"),
            LogLevel::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// One wasmtime engine shared by every policy: compiled code, the epoch ticker and settings.
/// Cheap to clone.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    compiled: Mutex<HashMap<ContentHash, Component>>,
}

impl fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// Build the engine and start its epoch ticker (a thread that ends with the engine).
    pub fn new(config: EngineConfig) -> Result<Self, PolicyError> {
        config.validate()?;
        let mut wasm = Config::new();
        // Epochs rather than fuel: both are free at the call boundary, and only a runaway
        // guest needs stopping; epochs cost a load per loop back-edge, not a counter update.
        wasm.epoch_interruption(true);
        wasm.wasm_component_model(true);
        let engine = Engine::new(&wasm).map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        // The router world brings `host` and `types`; the other worlds add their type-only
        // interfaces, so one linker serves every world.
        bindings::RouterCore::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
            .and_then(|()| {
                admission::switchyard::policy::admission_types::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |state| state,
                )
            })
            .and_then(|()| {
                kv_hints::switchyard::policy::kv_hint_types::add_to_linker::<_, HasSelf<_>>(
                    &mut linker,
                    |state| state,
                )
            })
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        spawn_ticker(&engine, config.epoch_tick)?;
        Ok(Self {
            inner: Arc::new(EngineInner {
                engine,
                linker,
                config,
                compiled: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Settings in force.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Compile, link and check a `router` component from its bytes (binary or, for tests, WAT).
    pub fn load_router(&self, bytes: &[u8]) -> Result<RouterComponent, PolicyError> {
        self.load(bytes).map(RouterComponent::new)
    }

    /// Compile, link and check an `admission` component, as [`PolicyEngine::load_router`].
    pub fn load_admission(&self, bytes: &[u8]) -> Result<AdmissionComponent, PolicyError> {
        self.load(bytes).map(AdmissionComponent::new)
    }

    /// Compile, link and check a `kv-hints` component, as [`PolicyEngine::load_router`].
    pub fn load_kv_hints(&self, bytes: &[u8]) -> Result<KvHintsComponent, PolicyError> {
        self.load(bytes).map(KvHintsComponent::new)
    }

    /// Compile (cached by content), check the exports against world `W`, link, and read and
    /// check the metadata.
    fn load<W: World>(&self, bytes: &[u8]) -> Result<Loaded<W>, PolicyError> {
        let hash = ContentHash::of(bytes);
        let component = self.compile(hash, bytes)?;
        check_exports(&self.inner.engine, &component, W::NAME)?;
        let instance_pre = self.link(&component)?;
        let pre = W::pre(instance_pre).map_err(|e| PolicyError::WrongWorld(format!("{e:#}")))?;
        Loaded::new(self.clone(), pre, hash)
    }

    /// Pre-link `component`. Toolchains import WASI interfaces (Rust's `std` some that a policy
    /// never calls, componentize-py's CPython many): the deterministic subset of
    /// [`crate::wasi`] is answered, and every other WASI import is satisfied by a function that
    /// traps, so a call to one is contained like any other trap.
    fn link(&self, component: &Component) -> Result<InstancePre<HostState>, PolicyError> {
        let err = match self.inner.linker.instantiate_pre(component) {
            Ok(pre) => return Ok(pre),
            Err(err) => err,
        };
        let engine = &self.inner.engine;
        let only_wasi_missing = component
            .component_type()
            .imports(engine)
            .all(|(name, _)| name.starts_with("wasi:") || name.starts_with("switchyard:policy/"));
        if !only_wasi_missing {
            return Err(classify_link_error(&err));
        }
        let mut linker = self.inner.linker.clone();
        wasi::add_to_linker(&mut linker, engine, component)
            .and_then(|()| linker.define_unknown_imports_as_traps(component))
            .and_then(|()| linker.instantiate_pre(component))
            .map_err(|e| classify_link_error(&e))
    }

    /// The world a component is of, judged by its function exports: the world all of whose
    /// exports it has, else the one it has most of (`router` on a tie), so that loading it as
    /// that world names what is missing. Compiles the bytes (cached, as a load would).
    pub fn world_of(&self, bytes: &[u8]) -> Result<&'static str, PolicyError> {
        let component = self.compile(ContentHash::of(bytes), bytes)?;
        let ty = component.component_type();
        let exports: Vec<&str> = ty
            .exports(&self.inner.engine)
            .map(|(name, _)| name)
            .collect();
        Ok(closest_world(&exports))
    }

    /// [`PolicyEngine::load_router`] on a file's contents.
    pub fn load_router_file(&self, path: &Path) -> Result<RouterComponent, PolicyError> {
        let bytes = std::fs::read(path).map_err(|e| PolicyError::Io(e.to_string()))?;
        self.load_router(&bytes)
    }

    fn compile(&self, hash: ContentHash, bytes: &[u8]) -> Result<Component, PolicyError> {
        let mut cache = self
            .inner
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(component) = cache.get(&hash) {
            return Ok(component.clone());
        }
        // Compiling under the lock keeps two reloads of one file from compiling it twice; loads
        // run off the request path.
        let component = Component::new(&self.inner.engine, bytes)
            .map_err(|e| PolicyError::Compile(format!("{e:#}")))?;
        if cache.len() >= COMPILE_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(hash, component.clone());
        Ok(component)
    }

    /// A store for one instance of `policy` (`None` while loading, before its metadata names
    /// it). `startup`: its instantiation and first call get the startup deadline (a guest's
    /// first instance), else the ordinary one.
    pub(crate) fn new_store(&self, policy: Option<&str>, startup: bool) -> Store<HostState> {
        let state = HostState {
            limiter: MemoryCap {
                max_memory_bytes: self.inner.config.memory_cap(policy),
                denied: false,
            },
            policy: Arc::from(policy.unwrap_or("(loading)")),
            wasi: WasiState::default(),
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|state| &mut state.limiter);
        let config = &self.inner.config;
        let limit = if startup {
            config.startup_deadline.max(config.deadline)
        } else {
            config.deadline
        };
        store.set_epoch_deadline(config.ticks(limit));
        store
    }

    /// Arm the deadline (and reset the guest's output budget) before a call. `keep_startup`: the
    /// first call of a startup store keeps the allowance it shares with its instantiation.
    pub(crate) fn arm_deadline(&self, store: &mut Store<HostState>, keep_startup: bool) {
        if !keep_startup {
            let config = &self.inner.config;
            store.set_epoch_deadline(config.ticks(config.deadline));
        }
        store.data_mut().wasi.start_call();
    }
}

fn spawn_ticker(engine: &Engine, tick: Duration) -> Result<(), PolicyError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("policy-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .map(drop)
        .map_err(|e| PolicyError::Engine(format!("cannot start the epoch ticker: {e}")))
}

/// The world whose exports `exports` has all of, else the one it has most of; `router` on a tie.
fn closest_world(exports: &[&str]) -> &'static str {
    let present = |names: &[&str]| names.iter().filter(|n| exports.contains(n)).count();
    if let Some((world, _)) = WORLD_EXPORTS
        .iter()
        .find(|(_, names)| present(names) == names.len())
    {
        return world;
    }
    let mut best = WORLD_EXPORTS[0];
    for candidate in &WORLD_EXPORTS[1..] {
        if present(candidate.1) > present(best.1) {
            best = *candidate;
        }
    }
    best.0
}

fn check_exports(engine: &Engine, component: &Component, world: &str) -> Result<(), PolicyError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    let expected: &[&str] = WORLD_EXPORTS
        .iter()
        .find(|(name, _)| *name == world)
        .map_or(&[], |(_, names)| names);
    let Some(missing) = expected.iter().find(|name| !exports.contains(name)) else {
        return Ok(());
    };
    let foreign = WORLD_EXPORTS
        .iter()
        .filter(|(other, _)| *other != world)
        .find_map(|(other, names)| {
            names
                .iter()
                .find(|name| exports.contains(name) && !expected.contains(name))
                .map(|name| (*name, *other))
        });
    match foreign {
        Some((export, other)) => Err(PolicyError::WrongWorld(format!(
            "exports `{export}` of the `{other}` world, not the `{world}` world"
        ))),
        None => Err(PolicyError::MissingExport((*missing).into())),
    }
}

/// A link failure is a version problem when the component imports `switchyard:policy` at
/// another major version, and a world problem otherwise (e.g. it imports WASI).
fn classify_link_error(err: &wasmtime::Error) -> PolicyError {
    let text = format!("{err:#}");
    let other_major = text
        .split("switchyard:policy/")
        .skip(1)
        .filter_map(|rest| rest.split('@').nth(1))
        .filter_map(|version| version.split('.').next()?.parse::<u64>().ok())
        .any(|major| major != WIT_MAJOR);
    if other_major {
        PolicyError::IncompatibleVersion(text)
    } else {
        PolicyError::WrongWorld(format!("imports what the host does not provide: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::closest_world;

    #[test]
    fn the_world_is_the_one_whose_exports_are_all_there_else_the_closest() {
        assert_eq!(closest_world(&["metadata", "on-events"]), "kv-hints");
        assert_eq!(closest_world(&["metadata", "tick", "arrival"]), "admission");
        assert_eq!(
            closest_world(&["metadata", "route", "observe", "queue-key"]),
            "router"
        );
        // Incomplete: the closest, so a load as that world names what is missing.
        assert_eq!(closest_world(&["tick"]), "admission");
        assert_eq!(closest_world(&["on-events"]), "kv-hints");
        assert_eq!(closest_world(&["metadata"]), "router");
        assert_eq!(closest_world(&[]), "router");
    }
}
