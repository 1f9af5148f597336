//! One role of the registry, for any decision point: the active policy (native, or a component
//! with its native fallback), the version kept for rollback, the file it reloads from and the
//! last failed load. [`Kind`] is all that differs between the router, admission and KV-hint
//! worlds; [`Slot`] holds the one implementation of load, swap, rollback and unload, and
//! [`AnySlot`] lets the registry drive slots of every world alike.

use crate::engine::{ContentHash, Metadata, PolicyEngine};
use crate::error::PolicyError;
use crate::registry::{PolicyInfo, PolicySource};
use crate::stats::PolicyStats;
use arc_swap::ArcSwapOption;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What the registry needs to know about one decision point (a `switchyard:policy` world).
pub(crate) trait Kind: Send + Sync + 'static {
    /// The world's name (`router`, `admission`, `kv-hints`).
    const WORLD: &'static str;
    /// The native policy a role of this world runs when nothing else is named, or after an
    /// unload whose policy has no native namesake.
    const DEFAULT_NATIVE: &'static str;
    /// The core's trait object for this decision point (`dyn RoutingPolicy`, ...).
    type Policy: ?Sized + Send + fmt::Debug;

    /// The native policy called `name`.
    fn native(name: &str) -> Option<Box<Self::Policy>>;
    /// The native policy called `name` with `params` (its `name:key=value` spec); the reason
    /// when it has no such policy or parameter.
    fn native_with(name: &str, params: &[(String, String)]) -> Result<Box<Self::Policy>, String> {
        if let Some((key, _)) = params.first() {
            return Err(format!(
                "native {} policy `{name}` has no parameter `{key}`",
                Self::WORLD
            ));
        }
        Self::native(name).ok_or_else(|| format!("no native {} policy `{name}`", Self::WORLD))
    }
    /// A policy's own name.
    fn policy_name(policy: &Self::Policy) -> &str;
    /// Compile and check `bytes` as a component of this world, run its canary on sample
    /// inputs, and wrap it with its native fallback; `stats` count its calls, `model` is what
    /// the guest sees as the model name, `params` go to its 1.1 `configure` (refused for a 1.0
    /// component unless empty).
    fn load(
        engine: &PolicyEngine,
        bytes: &[u8],
        stats: Arc<PolicyStats>,
        model: &str,
        params: &[(String, String)],
    ) -> Result<(Metadata, Box<Self::Policy>), PolicyError>;
}

/// Where loads get their bytes and settings.
#[derive(Debug)]
pub(crate) struct LoadContext {
    pub(crate) engine: PolicyEngine,
    pub(crate) builtins: Vec<(String, Arc<[u8]>)>,
    pub(crate) model: String,
}

impl LoadContext {
    fn bytes(&self, source: &PolicySource) -> Result<Arc<[u8]>, PolicyError> {
        match source {
            PolicySource::Native(name) => Err(PolicyError::Io(format!(
                "`{name}` is native: no component bytes"
            ))),
            PolicySource::Builtin(name) => self
                .builtins
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, bytes)| bytes.clone())
                .ok_or_else(|| PolicyError::Io(format!("no built-in policy `{name}`"))),
            PolicySource::File(path) => Ok(crate::trust::read_trusted(path)?.into()),
        }
    }
}

/// A policy ready to answer.
pub(crate) struct Active<K: Kind> {
    name: String,
    metadata: Option<Metadata>,
    hash: Option<ContentHash>,
    source: PolicySource,
    /// What it was configured with.
    params: Vec<(String, String)>,
    pub(crate) stats: Arc<PolicyStats>,
    /// Native policies do not time themselves; Wasm ones do (they know the fallback path).
    native: bool,
    policy: Mutex<Box<K::Policy>>,
}

impl<K: Kind> fmt::Debug for Active<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Active")
            .field("world", &K::WORLD)
            .field("name", &self.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl<K: Kind> Active<K> {
    fn native(name: &str) -> Option<Self> {
        Self::native_with(name, &[]).ok()
    }

    fn native_with(name: &str, params: &[(String, String)]) -> Result<Self, PolicyError> {
        let policy = K::native_with(name, params).map_err(PolicyError::Params)?;
        Ok(Self {
            name: K::policy_name(&*policy).to_string(),
            metadata: None,
            hash: None,
            source: PolicySource::Native(name.to_string()),
            params: params.to_vec(),
            stats: Arc::new(PolicyStats::default()),
            native: true,
            policy: Mutex::new(policy),
        })
    }

    /// Run `f` on the policy (one caller at a time: policies keep state between calls).
    pub(crate) fn call<R>(&self, f: impl FnOnce(&mut K::Policy) -> R) -> R {
        let started = Instant::now();
        let result = f(&mut **lock(&self.policy));
        if self.native {
            self.stats.record_call(started.elapsed());
        }
        result
    }

    /// Ask the policy something that is not a decision (no call counted).
    pub(crate) fn ask<R>(&self, f: impl FnOnce(&K::Policy) -> R) -> R {
        f(&**lock(&self.policy))
    }

    fn matches(&self, name: &str) -> bool {
        self.name == name || self.source.to_string() == name
    }

    fn info(&self, role: &str, load_error: Option<String>) -> PolicyInfo {
        let stats = self.stats.snapshot();
        let (version, world) = match &self.metadata {
            Some(m) => (m.version.clone(), m.world.clone()),
            None => ("native".into(), K::WORLD.into()),
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

/// One role: what answers now, what answered before, and where it reloads from.
pub(crate) struct Slot<K: Kind> {
    pub(crate) current: ArcSwapOption<Active<K>>,
    previous: Mutex<Option<Arc<Active<K>>>>,
    watched: Mutex<Option<PathBuf>>,
    /// The parameters of the last successful load, for reloads of the watched file.
    params: Mutex<Vec<(String, String)>>,
    load_error: Mutex<Option<String>>,
}

impl<K: Kind> fmt::Debug for Slot<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("world", &K::WORLD)
            .field("current", &self.current.load().as_deref().map(|a| &a.name))
            .field("watched", &*lock(&self.watched))
            .finish_non_exhaustive()
    }
}

impl<K: Kind> Slot<K> {
    /// An empty slot (a shadow before one is loaded).
    pub(crate) fn empty() -> Self {
        Self {
            current: ArcSwapOption::empty(),
            previous: Mutex::new(None),
            watched: Mutex::new(None),
            params: Mutex::new(Vec::new()),
            load_error: Mutex::new(None),
        }
    }

    /// A slot running the world's default native policy.
    pub(crate) fn with_default() -> Self {
        let slot = Self::empty();
        slot.current
            .store(Active::native(K::DEFAULT_NATIVE).map(Arc::new));
        slot
    }

    /// A ready policy, or `None` when `source` holds the bytes already running.
    fn build(
        &self,
        ctx: &LoadContext,
        source: &PolicySource,
        params: &[(String, String)],
    ) -> Result<Option<Active<K>>, PolicyError> {
        let current = self.current.load();
        let same_params = current.as_ref().is_some_and(|c| c.params == params);
        if let PolicySource::Native(name) = source {
            // Already running natively: nothing to swap (like unchanged component bytes).
            if same_params && current.as_ref().is_some_and(|c| c.source == *source) {
                return Ok(None);
            }
            if K::native(name).is_none() {
                return Err(PolicyError::Io(format!(
                    "no native {} policy `{name}`",
                    K::WORLD
                )));
            }
            return Active::native_with(name, params).map(Some);
        }
        let bytes = ctx.bytes(source)?;
        let hash = ContentHash::of(&bytes);
        if same_params && current.as_ref().is_some_and(|c| c.hash == Some(hash)) {
            return Ok(None);
        }
        let stats = Arc::new(PolicyStats::default());
        let (metadata, policy) = K::load(&ctx.engine, &bytes, stats.clone(), &ctx.model, params)?;
        Ok(Some(Active {
            name: metadata.name.clone(),
            metadata: Some(metadata),
            hash: Some(hash),
            source: source.clone(),
            params: params.to_vec(),
            stats,
            native: false,
            policy: Mutex::new(policy),
        }))
    }
}

/// Slots of every world, driven alike by the registry (which holds one lock around these).
pub(crate) trait AnySlot: Send + Sync + fmt::Debug {
    /// The slot's world.
    fn world(&self) -> &'static str;
    /// Whether `name` is a native policy of this world.
    fn has_native(&self, name: &str) -> bool;
    /// Load `source` (compile, check, canary) configured with `params` (`None`: those of the
    /// last successful load, for a reload) and swap it in; on failure keep the current policy
    /// and remember the error (naming the source) for the listing.
    fn load(
        &self,
        ctx: &LoadContext,
        role: &str,
        source: &PolicySource,
        params: Option<Vec<(String, String)>>,
    ) -> Result<PolicyInfo, PolicyError>;
    /// Put the previous version back (the current one becomes previous).
    fn rollback(&self, role: &str) -> Result<PolicyInfo, PolicyError>;
    /// If the active policy is `name` (metadata name or source), replace it with its native
    /// namesake, the world's default (`native_default`), or nothing; true if it was.
    fn unload(&self, name: &str, native_default: bool) -> bool;
    /// The active policy.
    fn info(&self, role: &str) -> Option<PolicyInfo>;
    /// The version kept for rollback.
    fn previous_info(&self, role: &str) -> Option<PolicyInfo>;
    /// The file whose changes reload this slot.
    fn watched(&self) -> Option<PathBuf>;
    /// Reload from `path` from now on (`None`: from nothing).
    fn watch(&self, path: Option<PathBuf>);
}

impl<K: Kind> AnySlot for Slot<K> {
    fn world(&self) -> &'static str {
        K::WORLD
    }

    fn has_native(&self, name: &str) -> bool {
        K::native(name).is_some()
    }

    fn load(
        &self,
        ctx: &LoadContext,
        role: &str,
        source: &PolicySource,
        params: Option<Vec<(String, String)>>,
    ) -> Result<PolicyInfo, PolicyError> {
        let params = params.unwrap_or_else(|| lock(&self.params).clone());
        match self.build(ctx, source, &params) {
            Ok(Some(active)) => {
                *lock(&self.params) = params;
                let active = Arc::new(active);
                let info = active.info(role, None);
                if let PolicySource::File(path) = source {
                    self.watch(Some(path.clone()));
                }
                let previous = self.current.swap(Some(active));
                *lock(&self.previous) = previous;
                *lock(&self.load_error) = None;
                tracing::info!(role, world = K::WORLD, policy = %info.name, version = %info.version, %source, "policy loaded");
                Ok(info)
            }
            Ok(None) => self
                .info(role)
                .ok_or_else(|| PolicyError::Io(format!("no policy in role {role}"))),
            Err(err) => {
                let message = format!("{source}: {err}");
                tracing::warn!(role, world = K::WORLD, error = %message, "policy not loaded; the current one stays");
                *lock(&self.load_error) = Some(message);
                Err(err)
            }
        }
    }

    fn rollback(&self, role: &str) -> Result<PolicyInfo, PolicyError> {
        let previous = lock(&self.previous)
            .take()
            .ok_or_else(|| PolicyError::Io("no previous version to roll back to".into()))?;
        let info = previous.info(role, None);
        let replaced = self.current.swap(Some(previous));
        *lock(&self.previous) = replaced;
        Ok(info)
    }

    fn unload(&self, name: &str, native_default: bool) -> bool {
        if !self
            .current
            .load()
            .as_deref()
            .is_some_and(|a| a.matches(name))
        {
            return false;
        }
        let replacement = if native_default {
            Active::native(name)
                .or_else(|| Active::native(K::DEFAULT_NATIVE))
                .map(Arc::new)
        } else {
            None
        };
        let previous = self.current.swap(replacement);
        *lock(&self.previous) = previous;
        self.watch(None);
        true
    }

    fn info(&self, role: &str) -> Option<PolicyInfo> {
        let error = lock(&self.load_error).clone();
        self.current
            .load()
            .as_ref()
            .map(|active| active.info(role, error))
    }

    fn previous_info(&self, role: &str) -> Option<PolicyInfo> {
        lock(&self.previous)
            .as_ref()
            .map(|previous| previous.info(&format!("previous-{role}"), None))
    }

    fn watched(&self) -> Option<PathBuf> {
        lock(&self.watched).clone()
    }

    fn watch(&self, path: Option<PathBuf>) {
        *lock(&self.watched) = path;
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain values: a panic elsewhere cannot leave them inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
