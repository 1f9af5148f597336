//! The shared wasmtime engine: settings, the epoch ticker, the compile cache and loading a
//! `router` component into a pre-linked [`RouterComponent`].

use crate::bindings::{self, LogLevel, PolicyMetadata, RouterPre};
use crate::error::PolicyError;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store};

/// The `switchyard:policy` major version this host implements.
pub const WIT_MAJOR: u64 = 1;

/// Exports that identify the other worlds: a component with these and no `select` was built for
/// the wrong decision point.
const OTHER_WORLD_EXPORTS: [(&str, &str); 3] = [
    ("tick", "admission"),
    ("arrival", "admission"),
    ("on-events", "kv-hints"),
];

/// Exports of the `router` world.
const ROUTER_EXPORTS: [&str; 4] = ["metadata", "select", "observe", "queue-key"];

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
    /// How often the ticker thread advances the engine's epoch; the deadline's resolution.
    /// Shorter ticks bound a runaway call more tightly at the cost of a busier thread.
    /// Default: 1 ms.
    pub epoch_tick: Duration,
    /// Largest linear memory a guest may grow to, in bytes. Must be at least 2 MiB: Rust
    /// `wasm32-wasip2` guests declare about 1.1 MiB at start. A guest growing past it fails
    /// its call with [`PolicyError::OutOfMemory`]. Default: 16 MiB.
    pub max_memory_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(5),
            epoch_tick: Duration::from_millis(1),
            max_memory_bytes: 16 << 20,
        }
    }
}

impl EngineConfig {
    /// Check the settings once, before the engine is built.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.epoch_tick.is_zero() || self.deadline < self.epoch_tick {
            return Err(PolicyError::Engine(format!(
                "deadline ({:?}) must be at least one epoch tick ({:?}), which must be non-zero",
                self.deadline, self.epoch_tick
            )));
        }
        if self.max_memory_bytes < 2 << 20 {
            return Err(PolicyError::Engine(format!(
                "max_memory_bytes {} is below 2 MiB (Rust guests start at ~1.1 MiB)",
                self.max_memory_bytes
            )));
        }
        Ok(())
    }

    fn deadline_ticks(&self) -> u64 {
        self.deadline
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

/// What a guest's store carries: its memory cap and its name for log lines.
#[derive(Debug)]
pub(crate) struct HostState {
    pub(crate) limiter: MemoryCap,
    policy: Arc<str>,
}

/// The `types` interface has types only: nothing to provide.
impl bindings::TypesHost for HostState {}

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
        bindings::Router::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)
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
        let hash = ContentHash::of(bytes);
        let component = self.compile(hash, bytes)?;
        check_exports(&self.inner.engine, &component)?;
        let instance_pre = self.link(&component)?;
        let pre =
            RouterPre::new(instance_pre).map_err(|e| PolicyError::WrongWorld(format!("{e:#}")))?;
        let mut component = RouterComponent {
            inner: Arc::new(ComponentInner {
                engine: self.clone(),
                pre,
                metadata: Metadata::default(),
                hash,
            }),
        };
        let metadata = component.read_metadata()?;
        // Only this function holds the Arc so far.
        if let Some(inner) = Arc::get_mut(&mut component.inner) {
            inner.metadata = metadata;
        }
        Ok(component)
    }

    /// Pre-link `component`. Guests get no WASI; but Rust's `std` (and other toolchains) import
    /// some WASI interfaces that a policy never calls. Those imports, and only those, are
    /// satisfied by functions that trap, so a call to one is contained like any other trap.
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
        linker
            .define_unknown_imports_as_traps(component)
            .and_then(|()| linker.instantiate_pre(component))
            .map_err(|e| classify_link_error(&e))
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

    pub(crate) fn new_store(&self, policy: Arc<str>) -> Store<HostState> {
        let state = HostState {
            limiter: MemoryCap {
                max_memory_bytes: self.inner.config.max_memory_bytes,
                denied: false,
            },
            policy,
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.set_epoch_deadline(self.inner.config.deadline_ticks());
        store
    }

    /// Re-arm the deadline before a call.
    pub(crate) fn arm_deadline(&self, store: &mut Store<HostState>) {
        store.set_epoch_deadline(self.inner.config.deadline_ticks());
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

fn check_exports(engine: &Engine, component: &Component) -> Result<(), PolicyError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
    if !exports.contains(&"select")
        && let Some((export, world)) = OTHER_WORLD_EXPORTS
            .iter()
            .find(|(name, _)| exports.contains(name))
    {
        return Err(PolicyError::WrongWorld(format!(
            "exports `{export}` of the `{world}` world, not the `router` world"
        )));
    }
    match ROUTER_EXPORTS.iter().find(|name| !exports.contains(name)) {
        Some(missing) => Err(PolicyError::MissingExport((*missing).into())),
        None => Ok(()),
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

/// What a component said about itself at load.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Metadata {
    /// The policy's name (`kv-cost`).
    pub name: String,
    /// Its own version.
    pub version: String,
    /// The world it implements (`router`).
    pub world: String,
    /// The `switchyard:policy` version it was built against.
    pub wit_version: String,
    /// One line for humans.
    pub description: String,
}

impl Metadata {
    fn check(raw: PolicyMetadata) -> Result<Self, PolicyError> {
        if raw.world_name != "router" {
            return Err(PolicyError::WrongWorld(format!(
                "metadata says world `{}`, expected `router`",
                raw.world_name
            )));
        }
        let major = raw
            .wit_version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u64>().ok());
        if major != Some(WIT_MAJOR) {
            return Err(PolicyError::IncompatibleVersion(format!(
                "built against switchyard:policy@{}, this host implements {WIT_MAJOR}.x",
                raw.wit_version
            )));
        }
        if raw.name.is_empty() {
            return Err(PolicyError::BadOutput("metadata has an empty name".into()));
        }
        Ok(Self {
            name: raw.name,
            version: raw.version,
            world: raw.world_name,
            wit_version: raw.wit_version,
            description: raw.description,
        })
    }
}

/// A compiled, pre-linked and checked `router` component: instantiating it is cheap.
/// Cheap to clone.
#[derive(Clone)]
pub struct RouterComponent {
    inner: Arc<ComponentInner>,
}

struct ComponentInner {
    engine: PolicyEngine,
    pre: RouterPre<HostState>,
    metadata: Metadata,
    hash: ContentHash,
}

impl fmt::Debug for RouterComponent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterComponent")
            .field("metadata", &self.inner.metadata)
            .field("hash", &self.inner.hash)
            .finish_non_exhaustive()
    }
}

impl RouterComponent {
    /// What the component said about itself.
    pub fn metadata(&self) -> &Metadata {
        &self.inner.metadata
    }

    /// Hash of the bytes it was compiled from.
    pub fn hash(&self) -> ContentHash {
        self.inner.hash
    }

    pub(crate) fn engine(&self) -> &PolicyEngine {
        &self.inner.engine
    }

    /// A fresh instance in a fresh store.
    pub(crate) fn instantiate(&self) -> Result<(Store<HostState>, bindings::Router), PolicyError> {
        let name: Arc<str> = if self.inner.metadata.name.is_empty() {
            Arc::from("(loading)")
        } else {
            Arc::from(self.inner.metadata.name.as_str())
        };
        let mut store = self.inner.engine.new_store(name);
        match self.inner.pre.instantiate(&mut store) {
            Ok(instance) => Ok((store, instance)),
            Err(e) => Err(PolicyError::from_call(&e, store.data())),
        }
    }

    fn read_metadata(&self) -> Result<Metadata, PolicyError> {
        let (mut store, instance) = self.instantiate()?;
        let raw = instance
            .call_metadata(&mut store)
            .map_err(|e| PolicyError::from_call(&e, store.data()))?;
        Metadata::check(raw)
    }
}
