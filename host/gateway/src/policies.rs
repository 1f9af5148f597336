//! Wasm routing policies in the gateway: the `[policies]` settings, the registry with its
//! directory watcher, and their metrics (read from the registry at scrape time).

use crate::config::ConfigError;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_policy_host::{
    EngineConfig, PolicyEngine, PolicyRegistry, PolicyWatcher, RegistryPolicy, Role,
};

/// `[policies]`: Wasm routing policies, hot-reloaded from a directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoliciesConfig {
    /// Directory of policy components (`<name>.wasm`), watched for changes. Absent: only
    /// built-in and native policies.
    pub dir: Option<PathBuf>,
    /// The routing policy: a file in `dir` (`<name>` or `<name>.wasm`), a built-in component
    /// name, or `native:<name>`. Default: `native:` + `router.policy`.
    pub router: Option<String>,
    /// A policy run in shadow mode beside the active one (decisions compared, never applied).
    pub shadow: Option<String>,
    /// Bearer token of the `/admin/policies` API; absent: the API refuses every call.
    pub admin_token: Option<String>,
    /// How long the directory must be quiet before a change is reloaded. Default: 250 ms.
    #[serde(with = "humantime_serde")]
    pub debounce: Duration,
    /// Longest a policy call may run before the native policy answers instead. Default: 5 ms.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Memory cap of each policy instance. Default: 16 MiB.
    pub max_memory_bytes: usize,
    /// Per-model routing policy (same forms as `router`), overriding `router` for that model.
    pub models: BTreeMap<String, String>,
}

impl Default for PoliciesConfig {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            dir: None,
            router: None,
            shadow: None,
            admin_token: None,
            debounce: Duration::from_millis(250),
            deadline: engine.deadline,
            max_memory_bytes: engine.max_memory_bytes,
            models: BTreeMap::new(),
        }
    }
}

/// The loaded policies and what keeps them fresh.
#[derive(Debug)]
pub(crate) struct PolicyRuntime {
    pub(crate) registry: Arc<PolicyRegistry>,
    pub(crate) admin_token: Option<String>,
    /// Reloads stop when this is dropped (with the gateway).
    _watcher: Option<PolicyWatcher>,
}

impl PolicyRuntime {
    /// Build the engine, load the configured router (and shadow) for `model`, watch the
    /// directory. `native` is `router.policy`, used when `[policies]` names no router.
    pub(crate) fn start(
        config: &PoliciesConfig,
        native: &str,
        model: &str,
    ) -> Result<Self, ConfigError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            ConfigError::Invalid(format!("policies.{what}: {e}"))
        };
        let engine = PolicyEngine::new(EngineConfig {
            deadline: config.deadline,
            max_memory_bytes: config.max_memory_bytes,
            ..EngineConfig::default()
        })
        .map_err(|e| invalid("engine", &e))?;
        if let Some(dir) = &config.dir
            && !dir.is_dir()
        {
            return Err(invalid(
                "dir",
                &format!("{} is not a directory", dir.display()),
            ));
        }
        let registry = PolicyRegistry::new(
            engine,
            config.dir.clone(),
            switchyard_policy_artifacts::builtin(),
            model,
        );
        let router = config
            .models
            .get(model)
            .or(config.router.as_ref())
            .cloned()
            .unwrap_or_else(|| format!("native:{native}"));
        registry
            .load_named(Role::Router, &router)
            .map_err(|e| invalid("router", &format!("{router}: {e}")))?;
        if let Some(shadow) = &config.shadow {
            registry
                .load_named(Role::Shadow, shadow)
                .map_err(|e| invalid("shadow", &format!("{shadow}: {e}")))?;
        }
        let watcher = match &config.dir {
            Some(_) => Some(
                PolicyWatcher::start(registry.clone(), config.debounce)
                    .map_err(|e| invalid("dir", &e))?,
            ),
            None => None,
        };
        Ok(Self {
            registry,
            admin_token: config.admin_token.clone(),
            _watcher: watcher,
        })
    }

    /// The routing policy to give the core router.
    pub(crate) fn policy(&self) -> RegistryPolicy {
        self.registry.policy()
    }
}

/// `switchyard_policy_*` metrics, read from the registry at scrape time. Counters belong to a
/// loaded version: a reload starts them again at 0, which Prometheus treats as a counter reset.
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    pub(crate) registry: Arc<PolicyRegistry>,
}

impl Collector for PolicyMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows: Vec<_> = self
            .registry
            .list()
            .into_iter()
            .filter(|row| row.role == "router" || row.role == "shadow")
            .collect();
        let labels = |row: &switchyard_policy_host::PolicyInfo| {
            vec![("policy", row.name.clone()), ("role", row.role.clone())]
        };
        let mut calls = encoder.encode_descriptor(
            "policy_calls",
            "Routing decisions asked of the policy",
            None,
            MetricType::Counter,
        )?;
        for row in &rows {
            ConstCounter::new(row.stats.calls).encode(calls.encode_family(&labels(row))?)?;
        }
        let mut fallbacks = encoder.encode_descriptor(
            "policy_fallbacks",
            "Decisions answered by the native policy because the Wasm policy failed",
            None,
            MetricType::Counter,
        )?;
        for row in &rows {
            for (reason, count) in &row.stats.fallbacks {
                let mut set = labels(row);
                set.push(("reason", reason.clone()));
                ConstCounter::new(*count).encode(fallbacks.encode_family(&set)?)?;
            }
        }
        let mut disagreements = encoder.encode_descriptor(
            "policy_shadow_disagreements",
            "Shadow decisions that chose another worker than the active policy",
            None,
            MetricType::Counter,
        )?;
        for row in rows.iter().filter(|row| row.role == "shadow") {
            ConstCounter::new(row.stats.shadow_disagreements)
                .encode(disagreements.encode_family(&labels(row))?)?;
        }
        Ok(())
    }
}
