//! [`PolicyRegistry`]: the active policy of every decision point (routing, its shadow,
//! admission, KV hints), loaded from native code, built-in components or files, swapped
//! atomically, with the previous version kept for rollback. The per-world work is in
//! [`crate::slot`]; the handles the gateway calls are in [`crate::handles`].

use crate::admission::AdmissionKind;
use crate::engine::PolicyEngine;
use crate::error::PolicyError;
use crate::handles::{RegistryAdmission, RegistryKvHints, RegistryPolicy};
use crate::kv_hints::KvHintsKind;
use crate::router::RouterKind;
use crate::slot::{AnySlot, LoadContext, Slot, lock};
use crate::stats::StatsSnapshot;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Prefix naming a native policy (`native:kv-cost`).
const NATIVE_PREFIX: &str = "native:";

/// What a loaded policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Routes: its decisions are applied (world `router`).
    Router,
    /// Sees the router's inputs; its decisions are only compared with the active one's.
    Shadow,
    /// Decides which sessions may send work now (world `admission`).
    Admission,
    /// Advises engines where to keep sessions' KV blocks (world `kv-hints`).
    KvHints,
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
    /// `router`, `shadow`, `admission`, `kv-hints`, or `previous-<role>` for the version kept
    /// for rollback.
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

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Router => "router",
        Role::Shadow => "shadow",
        Role::Admission => "admission",
        Role::KvHints => "kv-hints",
    }
}

/// Every role, in listing order.
const ROLES: [Role; 4] = [Role::Router, Role::Shadow, Role::Admission, Role::KvHints];

/// The active policies of every decision point (the router, its shadow, admission and KV
/// hints). Loads (from the watcher or the admin API) compile, check and canary a component off
/// the request path, then swap it in atomically; calls in flight finish on the version they
/// started with.
#[derive(Debug)]
pub struct PolicyRegistry {
    ctx: LoadContext,
    dir: Option<PathBuf>,
    pub(crate) router: Slot<RouterKind>,
    pub(crate) shadow: Slot<RouterKind>,
    pub(crate) admission: Slot<AdmissionKind>,
    pub(crate) kv_hints: Slot<KvHintsKind>,
    /// One load at a time, so two reloads of one slot cannot interleave their swaps.
    loading: Mutex<()>,
}

impl PolicyRegistry {
    /// A registry running the native defaults (`kv-cost` routing, `admit-all` admission,
    /// `no-hints`) until something is loaded. `dir`: where policy files live (names resolve to
    /// `dir/<name>.wasm`); `builtins`: named component bytes compiled into the binary; `model`:
    /// what guests see as the model name.
    pub fn new(
        engine: PolicyEngine,
        dir: Option<PathBuf>,
        builtins: &[(&str, &[u8])],
        model: impl Into<String>,
    ) -> Arc<Self> {
        Arc::new(Self {
            ctx: LoadContext {
                engine,
                builtins: builtins
                    .iter()
                    .map(|(name, bytes)| ((*name).to_string(), Arc::from(*bytes)))
                    .collect(),
                model: model.into(),
            },
            dir,
            router: Slot::with_default(),
            shadow: Slot::empty(),
            admission: Slot::with_default(),
            kv_hints: Slot::with_default(),
            loading: Mutex::new(()),
        })
    }

    /// The engine components are compiled with.
    pub fn engine(&self) -> &PolicyEngine {
        &self.ctx.engine
    }

    /// The directory policy names resolve in, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Where `name` comes from as a routing policy; see [`PolicyRegistry::resolve_for`].
    pub fn resolve(&self, name: &str) -> Result<PolicySource, PolicyError> {
        self.resolve_for(Role::Router, name)
    }

    /// Where `name` comes from for `role`: `native:<name>`, a path ending in `.wasm`,
    /// `dir/<name>.wasm` if that file exists, a built-in component, else a native policy of the
    /// role's world called `name` (`admit-all`). The built-ins are shared by every world, so a
    /// bare `thunder-agent` is the admission component and `native:thunder-agent` its native
    /// twin, as `kv-cost` and `native:kv-cost` are for routing.
    pub fn resolve_for(&self, role: Role, name: &str) -> Result<PolicySource, PolicyError> {
        let slot = self.slot(role);
        if let Some(native) = name.strip_prefix(NATIVE_PREFIX) {
            return if slot.has_native(native) {
                Ok(PolicySource::Native(native.to_string()))
            } else {
                Err(PolicyError::Io(format!(
                    "no native {} policy `{native}`",
                    slot.world()
                )))
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
        if self.ctx.builtins.iter().any(|(n, _)| n == name) {
            return Ok(PolicySource::Builtin(name.to_string()));
        }
        if slot.has_native(name) {
            return Ok(PolicySource::Native(name.to_string()));
        }
        Err(PolicyError::Io(format!(
            "no {} policy `{name}`: not `native:<name>`, not a file in the policy directory, \
             not built in, not native",
            slot.world()
        )))
    }

    fn dir_file(&self, name: &str) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{name}.wasm")))
    }

    /// Resolve `name` for `role` and load it. Unless it was named `native:<name>`, the role
    /// also watches `dir/<name>.wasm`, so a file written there later replaces a built-in or a
    /// native policy.
    ///
    /// `name` may carry parameters, `name:key=value:...` (a `native:` name too): they go to the
    /// component's 1.1 `configure` (a 1.0 component is refused any) or the native policy's
    /// spec, and every hot reload of the file gets them again.
    pub fn load_named(&self, role: Role, name: &str) -> Result<PolicyInfo, PolicyError> {
        let (name, params) = split_params(name);
        let name = name.as_str();
        let source = self.resolve_for(role, name)?;
        let watched = match &source {
            PolicySource::File(path) => Some(path.clone()),
            PolicySource::Native(_) if name.starts_with(NATIVE_PREFIX) => None,
            PolicySource::Native(native) | PolicySource::Builtin(native) => self.dir_file(native),
        };
        let info = {
            let _loading = lock(&self.loading);
            self.slot(role)
                .load(&self.ctx, role_name(role), &source, Some(params))?
        };
        self.slot(role).watch(watched);
        Ok(info)
    }

    /// Load `source` as `role`: compile, check, canary, swap. On failure the current policy stays
    /// and the error (naming the source) is kept for the listing.
    pub fn load(&self, role: Role, source: PolicySource) -> Result<PolicyInfo, PolicyError> {
        let _loading = lock(&self.loading);
        self.slot(role)
            .load(&self.ctx, role_name(role), &source, None)
    }

    /// Reload `role` whenever `path` changes (it need not exist yet).
    pub fn watch(&self, role: Role, path: PathBuf) {
        self.slot(role).watch(Some(path));
    }

    /// A file in the watched directory changed: reload every role watching it.
    pub fn file_changed(&self, path: &Path) {
        for role in ROLES {
            let watched = self.slot(role).watched();
            if watched.is_some_and(|w| same_file(&w, path)) && path.is_file() {
                // Errors are logged and listed by `load`.
                let _ = self.load(role, PolicySource::File(path.to_path_buf()));
            }
        }
    }

    /// Unload the policy named `name` (by metadata name or source): a shadow is dropped, any
    /// other role falls back to its native namesake, else its world's native default
    /// (`kv-cost`, `admit-all`, `no-hints`).
    pub fn unload(&self, name: &str) -> Result<Role, PolicyError> {
        let _loading = lock(&self.loading);
        [Role::Shadow, Role::Router, Role::Admission, Role::KvHints]
            .into_iter()
            .find(|role| self.slot(*role).unload(name, *role != Role::Shadow))
            .ok_or_else(|| PolicyError::Io(format!("no loaded policy named `{name}`")))
    }

    /// Put the previous version of `role` back (and keep the current one as previous).
    pub fn rollback(&self, role: Role) -> Result<PolicyInfo, PolicyError> {
        let _loading = lock(&self.loading);
        self.slot(role).rollback(role_name(role))
    }

    /// The policy in `role`, if any.
    pub fn info(&self, role: Role) -> Option<PolicyInfo> {
        self.slot(role).info(role_name(role))
    }

    /// Every loaded policy: the active router, the shadow, admission and KV hints, then the
    /// versions kept for rollback.
    pub fn list(&self) -> Vec<PolicyInfo> {
        let active = ROLES.into_iter().filter_map(|role| self.info(role));
        let previous = ROLES
            .into_iter()
            .filter_map(|role| self.slot(role).previous_info(role_name(role)));
        active.chain(previous).collect()
    }

    /// The routing policy to give the core router: it always asks whatever is active now.
    pub fn policy(self: &Arc<Self>) -> RegistryPolicy {
        RegistryPolicy::new(self.clone())
    }

    /// The admission policy for the gateway: it always asks whatever is active now.
    pub fn admission(self: &Arc<Self>) -> RegistryAdmission {
        RegistryAdmission::new(self.clone())
    }

    /// The KV-hint policy for the gateway: it always asks whatever is active now.
    pub fn kv_hints(self: &Arc<Self>) -> RegistryKvHints {
        RegistryKvHints::new(self.clone())
    }

    fn slot(&self, role: Role) -> &dyn AnySlot {
        match role {
            Role::Router => &self.router,
            Role::Shadow => &self.shadow,
            Role::Admission => &self.admission,
            Role::KvHints => &self.kv_hints,
        }
    }
}

/// `spec`'s name and its parameters: the trailing `:`-separated `key=value` segments
/// (`demote-on-tool-call:demote_threshold=2s`; `native:thunder-agent:sticky=false`).
pub fn split_params(spec: &str) -> (String, Vec<(String, String)>) {
    let mut segments: Vec<&str> = spec.split(':').collect();
    let mut params = Vec::new();
    while segments.len() > 1 {
        let Some((key, value)) = segments.last().and_then(|s| s.split_once('=')) else {
            break;
        };
        params.push((key.trim().to_owned(), value.trim().to_owned()));
        segments.pop();
    }
    params.reverse();
    (segments.join(":"), params)
}

/// The spec [`split_params`] splits: `name` and `key=value` segments, joined by `:`.
pub(crate) fn join_params(name: &str, params: &[(String, String)]) -> String {
    std::iter::once(name.to_owned())
        .chain(params.iter().map(|(k, v)| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(":")
}

/// Watcher events may name a file through another path than the configuration did.
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(a), Ok(b)) if a == b
        )
}
