//! [`PolicyRegistry`]: the active and shadow routing policies, loaded from native code, built-in
//! components or files, swapped atomically, with the previous version kept for rollback.

use crate::engine::{ContentHash, Metadata, PolicyEngine, RouterComponent};
use crate::error::PolicyError;
use crate::router::WasmRouter;
use crate::stats::{PolicyStats, StatsSnapshot};
use arc_swap::ArcSwapOption;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use switchyard_core::index::Overlap;
use switchyard_core::router::{
    Candidate, KvCost, Outcome, PolicyRequest, RoutingPolicy, Selection, native_policy,
};
use switchyard_core::worker::Rank;

/// Prompt tokens of the canary's sample requests.
pub(crate) const CANARY_TOKENS: u32 = 100;

/// Prefix naming a native policy (`native:kv-cost`).
const NATIVE_PREFIX: &str = "native:";

/// What a loaded policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its decisions are applied.
    Router,
    /// It sees the same inputs; its decisions are only compared with the active one's.
    Shadow,
}

/// Where a policy comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicySource {
    /// A native policy of `switchyard-core` (`kv-cost`, `round-robin`).
    Native(String),
    /// A component compiled into the binary, by name.
    Builtin(String),
    /// A component file.
    File(PathBuf),
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Native(name) => write!(f, "{NATIVE_PREFIX}{name}"),
            Self::Builtin(name) => write!(f, "builtin:{name}"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One row of the admin listing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyInfo {
    /// Active router, shadow, or the version kept for rollback (`previous`).
    pub role: String,
    /// Name (from the component's metadata, or the native policy's).
    pub name: String,
    /// The policy's version (`native` for native policies).
    pub version: String,
    /// The world it implements.
    pub world: String,
    /// Hash of the component bytes (hex); `None` for native policies.
    pub content_hash: Option<String>,
    /// Where it was loaded from.
    pub source: String,
    /// Its counters.
    #[serde(flatten)]
    pub stats: StatsSnapshot,
    /// Total fallbacks.
    pub fallbacks_total: u64,
    /// The last failed load for this role (file and reason); the policy above kept running.
    pub load_error: Option<String>,
}

/// A policy ready to answer.
#[derive(Debug)]
struct Loaded {
    name: String,
    metadata: Option<Metadata>,
    hash: Option<ContentHash>,
    source: PolicySource,
    stats: Arc<PolicyStats>,
    /// Native runners do not time themselves; Wasm runners do (they know the fallback path).
    native: bool,
    runner: Mutex<Box<dyn RoutingPolicy>>,
}

impl Loaded {
    fn native(name: &str) -> Option<Self> {
        let runner = native_policy(name)?;
        Some(Self {
            name: runner.name().to_string(),
            metadata: None,
            hash: None,
            source: PolicySource::Native(name.to_string()),
            stats: Arc::new(PolicyStats::default()),
            native: true,
            runner: Mutex::new(runner),
        })
    }

    fn select(&self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        let started = Instant::now();
        let mut runner = self.runner.lock().unwrap_or_else(|e| e.into_inner());
        let selection = runner.select(request, candidates);
        if self.native {
            self.stats.record_call(started.elapsed());
        }
        selection
    }

    fn observe(&self, outcome: &Outcome) {
        self.runner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(outcome);
    }

    fn info(&self, role: &str, load_error: Option<String>) -> PolicyInfo {
        let stats = self.stats.snapshot();
        let (version, world) = match &self.metadata {
            Some(m) => (m.version.clone(), m.world.clone()),
            None => ("native".into(), "router".into()),
        };
        PolicyInfo {
            role: role.into(),
            name: self.name.clone(),
            version,
            world,
            content_hash: self.hash.map(|h| h.to_string()),
            source: self.source.to_string(),
            fallbacks_total: stats.fallbacks_total(),
            stats,
            load_error,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    current: ArcSwapOption<Loaded>,
    previous: Mutex<Option<Arc<Loaded>>>,
    /// File whose changes reload this slot.
    watched: Mutex<Option<PathBuf>>,
    load_error: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values: a panic elsewhere cannot leave them inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The active and shadow routing policies. Loads (from the watcher or the admin API) compile,
/// check and canary a component off the request path, then swap it in atomically; requests in
/// flight finish on the version they started with.
#[derive(Debug)]
pub struct PolicyRegistry {
    engine: PolicyEngine,
    dir: Option<PathBuf>,
    builtins: Vec<(String, Arc<[u8]>)>,
    model: String,
    router: Slot,
    shadow: Slot,
    /// One load at a time, so two reloads of one slot cannot interleave their swaps.
    loading: Mutex<()>,
}

impl PolicyRegistry {
    /// A registry whose active router is native `kv-cost` until something is loaded.
    /// `dir`: where policy files live (names resolve to `dir/<name>.wasm`); `builtins`: named
    /// component bytes compiled into the binary; `model`: what guests see in `request.model`.
    pub fn new(
        engine: PolicyEngine,
        dir: Option<PathBuf>,
        builtins: &[(&str, &[u8])],
        model: impl Into<String>,
    ) -> Arc<Self> {
        let registry = Self {
            engine,
            dir,
            builtins: builtins
                .iter()
                .map(|(name, bytes)| ((*name).to_string(), Arc::from(*bytes)))
                .collect(),
            model: model.into(),
            router: Slot::default(),
            shadow: Slot::default(),
            loading: Mutex::new(()),
        };
        registry
            .router
            .current
            .store(Loaded::native("kv-cost").map(Arc::new));
        Arc::new(registry)
    }

    /// The engine components are compiled with.
    pub fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    /// The directory policy names resolve in, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Where `name` comes from: `native:<name>`, a path ending in `.wasm`, `dir/<name>.wasm`
    /// if that file exists, else a built-in component.
    pub fn resolve(&self, name: &str) -> Result<PolicySource, PolicyError> {
        if let Some(native) = name.strip_prefix(NATIVE_PREFIX) {
            return match native_policy(native) {
                Some(_) => Ok(PolicySource::Native(native.to_string())),
                None => Err(PolicyError::Io(format!("no native policy `{native}`"))),
            };
        }
        if name.ends_with(".wasm") {
            let path = Path::new(name);
            return Ok(PolicySource::File(match &self.dir {
                Some(dir) if path.is_relative() => dir.join(path),
                _ => path.to_path_buf(),
            }));
        }
        if let Some(file) = self.dir_file(name).filter(|f| f.is_file()) {
            return Ok(PolicySource::File(file));
        }
        if self.builtins.iter().any(|(n, _)| n == name) {
            return Ok(PolicySource::Builtin(name.to_string()));
        }
        Err(PolicyError::Io(format!(
            "no policy `{name}`: not `native:<name>`, not a file in the policy directory, not built in"
        )))
    }

    fn dir_file(&self, name: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{name}.wasm")))
    }

    /// Resolve `name` and load it as `role`. A name that is not native also watches
    /// `dir/<name>.wasm`, so a file written there later replaces a built-in.
    pub fn load_named(&self, role: Role, name: &str) -> Result<PolicyInfo, PolicyError> {
        let source = self.resolve(name)?;
        let watched = match &source {
            PolicySource::Native(_) => None,
            PolicySource::File(path) => Some(path.clone()),
            PolicySource::Builtin(name) => self.dir_file(name),
        };
        let info = self.load(role, source)?;
        *lock(&self.slot(role).watched) = watched;
        Ok(info)
    }

    /// Load `source` as `role`: compile, check, canary, swap. On failure the current policy stays
    /// and the error (naming the source) is kept for the listing.
    pub fn load(&self, role: Role, source: PolicySource) -> Result<PolicyInfo, PolicyError> {
        let _loading = lock(&self.loading);
        let slot = self.slot(role);
        let result = self.build(role, &source);
        match result {
            Ok(Some(loaded)) => {
                let loaded = Arc::new(loaded);
                let info = loaded.info(role_name(role), None);
                if let PolicySource::File(path) = &source {
                    *lock(&slot.watched) = Some(path.clone());
                }
                let previous = slot.current.swap(Some(loaded));
                *lock(&slot.previous) = previous;
                *lock(&slot.load_error) = None;
                tracing::info!(role = role_name(role), policy = %info.name, version = %info.version, %source, "policy loaded");
                Ok(info)
            }
            Ok(None) => self
                .info(role)
                .ok_or_else(|| PolicyError::Io("no policy in this role".into())),
            Err(err) => {
                let message = format!("{source}: {err}");
                tracing::warn!(role = role_name(role), error = %message, "policy not loaded; the current one stays");
                *lock(&slot.load_error) = Some(message);
                Err(err)
            }
        }
    }

    /// A ready policy, or `None` when `source` holds the bytes already running.
    fn build(&self, role: Role, source: &PolicySource) -> Result<Option<Loaded>, PolicyError> {
        let bytes: Arc<[u8]> = match source {
            PolicySource::Native(name) => {
                return Loaded::native(name)
                    .map(Some)
                    .ok_or_else(|| PolicyError::Io(format!("no native policy `{name}`")));
            }
            PolicySource::Builtin(name) => self
                .builtins
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, bytes)| bytes.clone())
                .ok_or_else(|| PolicyError::Io(format!("no built-in policy `{name}`")))?,
            PolicySource::File(path) => std::fs::read(path)
                .map_err(|e| PolicyError::Io(e.to_string()))?
                .into(),
        };
        let hash = ContentHash::of(&bytes);
        let current = self.slot(role).current.load();
        if current.as_ref().is_some_and(|c| c.hash == Some(hash)) {
            return Ok(None);
        }
        let component = self.engine.load_router(&bytes)?;
        canary(&component)?;
        let stats = Arc::new(PolicyStats::default());
        let mut runner = WasmRouter::new(component.clone(), stats.clone());
        runner.set_model(self.model.clone());
        Ok(Some(Loaded {
            name: component.metadata().name.clone(),
            metadata: Some(component.metadata().clone()),
            hash: Some(hash),
            source: source.clone(),
            stats,
            native: false,
            runner: Mutex::new(Box::new(runner)),
        }))
    }

    /// Reload `role` whenever `path` changes (it need not exist yet).
    pub fn watch(&self, role: Role, path: PathBuf) {
        *lock(&self.slot(role).watched) = Some(path);
    }

    /// A file in the watched directory changed: reload every role watching it.
    pub fn file_changed(&self, path: &Path) {
        for role in [Role::Router, Role::Shadow] {
            let watched = lock(&self.slot(role).watched).clone();
            if watched.is_some_and(|w| same_file(&w, path)) && path.is_file() {
                // Errors are logged and listed by `load`.
                let _ = self.load(role, PolicySource::File(path.to_path_buf()));
            }
        }
    }

    /// Unload the policy named `name` (by metadata name or source): a shadow is dropped, an
    /// active router is replaced by its native counterpart (else native `kv-cost`).
    pub fn unload(&self, name: &str) -> Result<Role, PolicyError> {
        let _loading = lock(&self.loading);
        let matches = |l: &Loaded| l.name == name || l.source.to_string() == name;
        if self.shadow.current.load().as_deref().is_some_and(matches) {
            let previous = self.shadow.current.swap(None);
            *lock(&self.shadow.previous) = previous;
            *lock(&self.shadow.watched) = None;
            return Ok(Role::Shadow);
        }
        if self.router.current.load().as_deref().is_some_and(matches) {
            let native = Loaded::native(name)
                .or_else(|| Loaded::native("kv-cost"))
                .map(Arc::new);
            let previous = self.router.current.swap(native);
            *lock(&self.router.previous) = previous;
            *lock(&self.router.watched) = None;
            return Ok(Role::Router);
        }
        Err(PolicyError::Io(format!("no loaded policy named `{name}`")))
    }

    /// Put the previous version of `role` back (and keep the current one as previous).
    pub fn rollback(&self, role: Role) -> Result<PolicyInfo, PolicyError> {
        let _loading = lock(&self.loading);
        let slot = self.slot(role);
        let previous = lock(&slot.previous)
            .take()
            .ok_or_else(|| PolicyError::Io("no previous version to roll back to".into()))?;
        let info = previous.info(role_name(role), None);
        let replaced = slot.current.swap(Some(previous));
        *lock(&slot.previous) = replaced;
        Ok(info)
    }

    /// The policy in `role`, if any.
    pub fn info(&self, role: Role) -> Option<PolicyInfo> {
        let slot = self.slot(role);
        let error = lock(&slot.load_error).clone();
        slot.current
            .load()
            .as_ref()
            .map(|l| l.info(role_name(role), error))
    }

    /// Every loaded policy: the active router, the shadow, and the versions kept for rollback.
    pub fn list(&self) -> Vec<PolicyInfo> {
        let mut rows: Vec<PolicyInfo> = [Role::Router, Role::Shadow]
            .into_iter()
            .filter_map(|role| self.info(role))
            .collect();
        for role in [Role::Router, Role::Shadow] {
            if let Some(previous) = lock(&self.slot(role).previous).as_ref() {
                rows.push(previous.info(&format!("previous-{}", role_name(role)), None));
            }
        }
        rows
    }

    /// The routing policy to give the core router: it always asks whatever is active now.
    pub fn policy(self: &Arc<Self>) -> RegistryPolicy {
        RegistryPolicy {
            registry: self.clone(),
        }
    }

    fn slot(&self, role: Role) -> &Slot {
        match role {
            Role::Router => &self.router,
            Role::Shadow => &self.shadow,
        }
    }
}

/// Watcher events may name a file through another path than the configuration did.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Router => "router",
        Role::Shadow => "shadow",
    }
}

/// Run a fresh instance on sample inputs (1, 8 and 64 workers); any failure rejects the load.
fn canary(component: &RouterComponent) -> Result<(), PolicyError> {
    let mut trial = WasmRouter::new(component.clone(), Arc::new(PolicyStats::default()));
    for workers in [1_u32, 8, 64] {
        let candidates: Vec<Candidate> = (0..workers)
            .map(|w| Candidate {
                rank: Rank::new(w / 2, w % 2),
                overlap: Overlap {
                    device: w % 5,
                    host: w % 3,
                    disk: w % 2,
                },
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
    }
    Ok(())
}

/// The registry as the core router's policy: each call goes to the active policy, and to the
/// shadow if one is loaded (its answer is compared, never applied).
#[derive(Debug, Clone)]
pub struct RegistryPolicy {
    registry: Arc<PolicyRegistry>,
}

impl RoutingPolicy for RegistryPolicy {
    fn name(&self) -> &str {
        "policy-registry"
    }

    fn select(&mut self, request: &PolicyRequest<'_>, candidates: &[Candidate]) -> Selection {
        let active = self.registry.router.current.load_full();
        let selection = match &active {
            Some(active) => active.select(request, candidates),
            None => KvCost.select(request, candidates),
        };
        if let Some(shadow) = self.registry.shadow.current.load_full() {
            let counterfactual = shadow.select(request, candidates);
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

    fn observe(&mut self, outcome: &Outcome) {
        if let Some(active) = self.registry.router.current.load_full() {
            active.observe(outcome);
        }
        if let Some(shadow) = self.registry.shadow.current.load_full() {
            shadow.observe(outcome);
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
