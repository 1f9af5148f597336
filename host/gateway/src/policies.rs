//! Wasm policies in the gateway: the `[policies]` settings, the registry (routing, admission and
//! KV hints) with its directory watcher, the handles the request path calls, and their metrics
//! (read from the registry at scrape time).

use crate::config::ConfigError;
use crate::secrets::Source;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::AdmissionPolicy;
use switchyard_core::kv_hints::KvHintPolicy;
use switchyard_policy_host::{
    EngineConfig, PolicyEngine, PolicyRegistry, PolicyWatcher, RegistryAdmission, RegistryKvHints,
    RegistryPolicy, Role,
};

/// `[policies]`: Wasm policies for every decision point, hot-reloaded from a directory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoliciesConfig {
    /// Directory of policy components (`<name>.wasm`), watched for changes. Absent: only
    /// built-in and native policies.
    pub dir: Option<PathBuf>,
    /// The routing policy: a file in `dir` (`<name>` or `<name>.wasm`), a built-in component
    /// name, or `native:<name>`. Default: `native:` + `router.policy`.
    pub router: Option<String>,
    /// A routing policy run in shadow mode beside the active one (decisions compared, never
    /// applied).
    pub shadow: Option<String>,
    /// The admission policy (world `admission`): a file in `dir`, a built-in component
    /// (`thunder-agent`, `continuum`, `autellix`; its native twin answers when it fails), or
    /// `native:<name>` (the native twin alone, which also places programs on workers). A file
    /// `dir/<name>.wasm` written later replaces it. Default: `[admission] policy`, natively.
    pub admission: Option<String>,
    /// The KV-hint policy (world `kv-hints`), in the same forms as `admission`. Default: native
    /// `no-hints`.
    pub kv_hints: Option<String>,
    /// Bearer token of the `/admin/policies` API with full access (as a `write` entry of
    /// `admin_tokens`); kept for older configurations. Without it and without `admin_tokens`
    /// the API refuses every call.
    pub admin_token: Option<String>,
    /// Bearer tokens of the `/admin/policies` API, each with a role: `read` (the listing) or
    /// `write` (listing, load, unload, rollback). Each gives its secret in exactly one of
    /// `token`, `token_env` (an environment variable) or `token_file` (a file, trailing
    /// whitespace trimmed), so the secret need not sit in the configuration.
    pub admin_tokens: Vec<AdminTokenConfig>,
    /// How long the directory must be quiet before a change is reloaded. Default: 250 ms.
    #[serde(with = "humantime_serde")]
    pub debounce: Duration,
    /// Longest a policy call may run before the native policy answers instead. Default: 5 ms.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Longest a policy's first instance may take to start (instantiation and first call, where
    /// a language runtime such as componentize-py's CPython initializes), at load. Default:
    /// 50 ms.
    #[serde(with = "humantime_serde")]
    pub startup_deadline: Duration,
    /// Memory cap of each policy instance. Default: 16 MiB.
    pub max_memory_bytes: usize,
    /// Memory caps for single policies, by the name in their metadata, replacing
    /// `max_memory_bytes` for that policy only (e.g. `"least-load-python" = 33554432`: a
    /// componentize-py guest starts at 12.3 MiB and grows ~40 bytes per call). Default: none.
    pub max_memory_bytes_per_policy: BTreeMap<String, usize>,
    /// Per-model policies, overriding the ones above for that model: a routing policy name, or
    /// a table `{ router = "...", admission = "...", kv_hints = "..." }`.
    pub models: BTreeMap<String, ModelPolicies>,
}

/// What an admin token may do. `write` includes `read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminRole {
    /// `GET /admin/policies`.
    Read,
    /// Everything: also load, unload and rollback.
    Write,
}

impl AdminRole {
    /// The role's name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// One `[[policies.admin_tokens]]` entry: a role and where its secret comes from.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminTokenConfig {
    /// What the token may do.
    pub role: AdminRole,
    /// The token itself.
    pub token: Option<String>,
    /// An environment variable holding the token.
    pub token_env: Option<String>,
    /// A file holding the token (trailing whitespace and newline trimmed), e.g. a mounted
    /// Kubernetes Secret.
    pub token_file: Option<PathBuf>,
}

impl std::fmt::Debug for AdminTokenConfig {
    /// Never the secret itself: configurations are logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTokenConfig")
            .field("role", &self.role)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_env", &self.token_env)
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl AdminTokenConfig {
    fn source(&self) -> Source<'_> {
        Source {
            names: ["token", "token_env", "token_file"],
            inline: self.token.as_deref(),
            env: self.token_env.as_deref(),
            file: self.token_file.as_ref(),
        }
    }

    /// Exactly one source of the secret (`field` names the entry in errors).
    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        self.source().validate(field)
    }

    /// The secret, read from wherever it is; an empty one is an error.
    fn resolve(&self, field: &str) -> Result<String, ConfigError> {
        self.source().resolve(field)
    }
}

/// The admin API's tokens, resolved at start; compared in constant time.
#[derive(Clone, Default)]
pub(crate) struct AdminTokens(Vec<(AdminRole, String)>);

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(role, _)| role))
            .finish()
    }
}

impl AdminTokens {
    /// `admin_token` (full access) and every `admin_tokens` entry.
    pub(crate) fn from_config(config: &PoliciesConfig) -> Result<Self, ConfigError> {
        let mut tokens = Vec::new();
        if let Some(token) = &config.admin_token {
            if token.trim().is_empty() {
                return Err(ConfigError::Invalid(
                    "policies.admin_token is empty: give a token or leave it out".into(),
                ));
            }
            tokens.push((AdminRole::Write, token.clone()));
        }
        for (i, entry) in config.admin_tokens.iter().enumerate() {
            let field = format!("policies.admin_tokens[{i}]");
            tokens.push((entry.role, entry.resolve(&field)?));
        }
        Ok(Self(tokens))
    }

    /// A test's tokens.
    #[cfg(test)]
    pub(crate) fn new(tokens: &[(AdminRole, &str)]) -> Self {
        Self(tokens.iter().map(|(r, t)| (*r, (*t).to_string())).collect())
    }

    /// The role `given` carries, if it is one of the tokens. Every token is compared, each in
    /// constant time, so the time taken reveals neither which one matched nor how much of one.
    pub(crate) fn role_of(&self, given: &[u8]) -> Option<AdminRole> {
        let secrets = self.0.iter().map(|(_, token)| token.as_str());
        self.0
            .iter()
            .zip(crate::secrets::matches(secrets, given))
            .filter(|(_, matched)| *matched)
            .map(|((role, _), _)| *role)
            .max()
    }
}

/// The policies of one model (`[policies.models]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ModelPolicies {
    /// `model = "name"`: the routing policy only.
    Router(String),
    /// `model = { router = ..., admission = ..., kv_hints = ... }`; absent keys keep the
    /// section-wide setting.
    Table(ModelPolicyTable),
}

impl ModelPolicies {
    /// The table form (a bare name is the router).
    fn table(&self) -> ModelPolicyTable {
        match self {
            Self::Router(router) => ModelPolicyTable {
                router: Some(router.clone()),
                ..ModelPolicyTable::default()
            },
            Self::Table(table) => table.clone(),
        }
    }
}

/// `[policies.models]` entry in table form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPolicyTable {
    /// Routing policy for this model.
    pub router: Option<String>,
    /// Admission policy for this model.
    pub admission: Option<String>,
    /// KV-hint policy for this model.
    pub kv_hints: Option<String>,
}

/// The policies that apply to one model, each `None` when not configured (native default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectedPolicies {
    /// Routing policy name.
    pub router: Option<String>,
    /// Admission policy name.
    pub admission: Option<String>,
    /// KV-hint policy name.
    pub kv_hints: Option<String>,
}

impl Default for PoliciesConfig {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self {
            dir: None,
            router: None,
            shadow: None,
            admission: None,
            kv_hints: None,
            admin_token: None,
            admin_tokens: Vec::new(),
            debounce: Duration::from_millis(250),
            deadline: engine.deadline,
            startup_deadline: engine.startup_deadline,
            max_memory_bytes: engine.max_memory_bytes,
            max_memory_bytes_per_policy: BTreeMap::new(),
            models: BTreeMap::new(),
        }
    }
}

impl PoliciesConfig {
    /// What applies to `model`: its `[policies.models]` entry, else the section-wide names.
    pub fn for_model(&self, model: &str) -> SelectedPolicies {
        let table = self
            .models
            .get(model)
            .map(ModelPolicies::table)
            .unwrap_or_default();
        SelectedPolicies {
            router: table.router.or_else(|| self.router.clone()),
            admission: table.admission.or_else(|| self.admission.clone()),
            kv_hints: table.kv_hints.or_else(|| self.kv_hints.clone()),
        }
    }

    /// Refuse empty names (the field named), before anything is loaded.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let empty = |name: &Option<String>| name.as_deref().is_some_and(|n| n.trim().is_empty());
        for (field, name) in [
            ("router", &self.router),
            ("shadow", &self.shadow),
            ("admission", &self.admission),
            ("kv_hints", &self.kv_hints),
        ] {
            if empty(name) {
                return Err(ConfigError::Invalid(format!(
                    "policies.{field} is empty: name a policy or leave it out"
                )));
            }
        }
        for (i, entry) in self.admin_tokens.iter().enumerate() {
            entry.validate(&format!("policies.admin_tokens[{i}]"))?;
        }
        for (model, policies) in &self.models {
            let table = policies.table();
            for (field, name) in [
                ("router", &table.router),
                ("admission", &table.admission),
                ("kv_hints", &table.kv_hints),
            ] {
                if empty(name) {
                    return Err(ConfigError::Invalid(format!(
                        "policies.models.{model:?}.{field} is empty"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The loaded policies and what keeps them fresh.
#[derive(Debug)]
pub(crate) struct PolicyRuntime {
    pub(crate) registry: Arc<PolicyRegistry>,
    /// The admin API's tokens (none: it refuses every call).
    pub(crate) admin_tokens: AdminTokens,
    /// What `[policies]` names for the served model (`None`: nothing, so the native default or
    /// the caller's own native policy).
    pub(crate) selected: SelectedPolicies,
    /// Reloads stop when this is dropped (with the gateway).
    _watcher: Option<PolicyWatcher>,
}

impl PolicyRuntime {
    /// Build the engine, load the configured router (and shadow), admission and KV-hint
    /// policies for `model`, watch the directory. `native` is `router.policy`, used when
    /// `[policies]` names no router.
    pub(crate) fn start(
        config: &PoliciesConfig,
        native: &str,
        model: &str,
    ) -> Result<Self, ConfigError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            ConfigError::Invalid(format!("policies.{what}: {e}"))
        };
        config.validate()?;
        let admin_tokens = AdminTokens::from_config(config)?;
        let engine = PolicyEngine::new(EngineConfig {
            deadline: config.deadline,
            startup_deadline: config.startup_deadline,
            max_memory_bytes: config.max_memory_bytes,
            max_memory_bytes_per_policy: config.max_memory_bytes_per_policy.clone(),
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
        let selected = config.for_model(model);
        let router = selected
            .router
            .clone()
            .unwrap_or_else(|| format!("native:{native}"));
        for (role, field, name) in [
            (Role::Router, "router", Some(router)),
            (Role::Shadow, "shadow", config.shadow.clone()),
            (Role::Admission, "admission", selected.admission.clone()),
            (Role::KvHints, "kv_hints", selected.kv_hints.clone()),
        ] {
            if let Some(name) = name {
                registry
                    .load_named(role, &name)
                    .map_err(|e| invalid(field, &format!("{name}: {e}")))?;
            }
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
            admin_tokens,
            selected,
            _watcher: watcher,
        })
    }

    /// The routing policy to give the core router.
    pub(crate) fn policy(&self) -> RegistryPolicy {
        self.registry.policy()
    }

    /// The admission policy: always the active one of `[policies] admission` (a component, or
    /// the native policy it names; a failing component is answered by its native namesake).
    pub(crate) fn admission(&self) -> RegistryAdmission {
        self.registry.admission()
    }

    /// The KV-hint policy: always the active one of `[policies] kv_hints`.
    #[allow(
        dead_code,
        reason = "hints are consumed by the KV block manager, which is not built yet"
    )]
    pub(crate) fn kv_hints(&self) -> RegistryKvHints {
        self.registry.kv_hints()
    }
}

/// The admission policy for the request path: the registry's (hot-swapped, see
/// [`PolicyRuntime::admission`]) when `[policies]` names one for this model, else `native` (the
/// `[admission]` section's policy, or `admit-all`).
pub(crate) fn admission_policy(
    policies: Option<&PolicyRuntime>,
    native: Box<dyn AdmissionPolicy>,
) -> Box<dyn AdmissionPolicy> {
    match policies {
        Some(runtime) if runtime.selected.admission.is_some() => Box::new(runtime.admission()),
        _ => native,
    }
}

/// The KV-hint policy for the request path: the registry's when `[policies]` names one for this
/// model, else `native`.
pub(crate) fn kv_hint_policy(
    policies: Option<&PolicyRuntime>,
    native: Box<dyn KvHintPolicy>,
) -> Box<dyn KvHintPolicy> {
    match policies {
        Some(runtime) if runtime.selected.kv_hints.is_some() => Box::new(runtime.kv_hints()),
        _ => native,
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
        // The active policy of each role; the versions kept for rollback answer nothing.
        let rows: Vec<_> = self
            .registry
            .list()
            .into_iter()
            .filter(|row| !row.role.starts_with("previous-"))
            .collect();
        let labels = |row: &switchyard_policy_host::PolicyInfo| {
            vec![("policy", row.name.clone()), ("role", row.role.clone())]
        };
        let mut calls = encoder.encode_descriptor(
            "policy_calls",
            "Decisions asked of the policy (routing, admission or KV hints, by role)",
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

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::admission::{AdmissionAction, AdmissionView, Arrival};
    use switchyard_core::kv_hints::NoHints;

    fn parse(text: &str) -> PoliciesConfig {
        toml::from_str(text).unwrap()
    }

    /// A native admission policy the registry's handle cannot be mistaken for.
    #[derive(Debug)]
    struct NoAdmission;

    impl AdmissionPolicy for NoAdmission {
        fn name(&self) -> &str {
            "test-native"
        }

        fn tick(&mut self, _view: &AdmissionView, _now: Duration) -> Vec<AdmissionAction> {
            Vec::new()
        }

        fn arrival(
            &mut self,
            _view: &AdmissionView,
            _arrival: &Arrival<'_>,
            _now: Duration,
        ) -> Vec<AdmissionAction> {
            Vec::new()
        }
    }

    #[test]
    fn each_model_gets_its_own_policies_or_the_sections() {
        let config = parse(
            r#"
            router = "kv-cost"
            admission = "thunder-agent"
            kv_hints = "no-hints"
            [models]
            small = "round-robin"
            agentic = { admission = "continuum", kv_hints = "retain.wasm" }
            [max_memory_bytes_per_policy]
            "least-load-python" = 33554432
            "#,
        );
        assert_eq!(
            config.max_memory_bytes_per_policy.get("least-load-python"),
            Some(&(32 << 20))
        );
        assert_eq!(
            config.for_model("small"),
            SelectedPolicies {
                router: Some("round-robin".into()),
                admission: Some("thunder-agent".into()),
                kv_hints: Some("no-hints".into()),
            }
        );
        assert_eq!(
            config.for_model("agentic"),
            SelectedPolicies {
                router: Some("kv-cost".into()),
                admission: Some("continuum".into()),
                kv_hints: Some("retain.wasm".into()),
            }
        );
        assert_eq!(
            config.for_model("other").admission.as_deref(),
            Some("thunder-agent")
        );
        assert_eq!(
            PoliciesConfig::default().for_model("m"),
            SelectedPolicies::default()
        );
    }

    #[test]
    fn admin_tokens_come_from_the_config_a_variable_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        // Never set (set_var is unsafe in a threaded test): a missing variable names the entry.
        let var = "SWITCHYARD_TEST_ADMIN_TOKEN_ENV_ONLY_HERE";
        let config = parse(&format!(
            r#"
            admin_token = "legacy"
            [[admin_tokens]]
            role = "read"
            token = "inline"
            [[admin_tokens]]
            role = "write"
            token_file = {file:?}
            [[admin_tokens]]
            role = "read"
            token_env = "{var}"
            "#
        ));
        let err = AdminTokens::from_config(&config).unwrap_err().to_string();
        assert!(err.contains("policies.admin_tokens[2].token_env"), "{err}");
        let config = PoliciesConfig {
            admin_tokens: config.admin_tokens[..2].to_vec(),
            ..config
        };
        let tokens = AdminTokens::from_config(&config).unwrap();
        assert_eq!(tokens.role_of(b"legacy"), Some(AdminRole::Write));
        assert_eq!(tokens.role_of(b"inline"), Some(AdminRole::Read));
        assert_eq!(tokens.role_of(b"from-file"), Some(AdminRole::Write));
        assert_eq!(tokens.role_of(b"from-file\n"), None);
        assert_eq!(tokens.role_of(b""), None);
        // The secrets stay out of logs.
        let logged = format!("{config:?} {tokens:?}");
        assert!(
            !logged.contains("inline") && !logged.contains("from-file\""),
            "{logged}"
        );
        assert!(!format!("{tokens:?}").contains("legacy"));
    }

    #[test]
    fn admin_token_mistakes_name_the_entry() {
        for (text, needle) in [
            (
                "[[admin_tokens]]\nrole = \"read\"",
                "policies.admin_tokens[0]: give exactly one of token, token_env, token_file (found 0)",
            ),
            (
                "[[admin_tokens]]\nrole = \"write\"\ntoken = \"a\"\ntoken_env = \"B\"",
                "(found 2)",
            ),
        ] {
            let err = parse(text).validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(
            toml::from_str::<PoliciesConfig>("[[admin_tokens]]\nrole = \"admin\"\ntoken = \"a\"")
                .is_err()
        );
        for text in [
            "admin_token = \" \"",
            "[[admin_tokens]]\nrole = \"read\"\ntoken = \"\"",
            "[[admin_tokens]]\nrole = \"read\"\ntoken_file = \"/no/such/token\"",
        ] {
            let err = PolicyRuntime::start(&parse(text), "kv-cost", "m")
                .unwrap_err()
                .to_string();
            assert!(err.contains("policies.admin_token"), "{text}: {err}");
        }
    }

    #[test]
    fn mistakes_name_the_field() {
        for (text, needle) in [
            ("admission = \"\"", "policies.admission is empty"),
            (
                "[models]\nm = { kv_hints = \" \" }",
                "policies.models.\"m\".kv_hints",
            ),
        ] {
            let err = parse(text).validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(toml::from_str::<PoliciesConfig>("[models]\nm = { admision = \"x\" }").is_err());
        let unknown = parse("admission = \"no-such-admission\"");
        let err = PolicyRuntime::start(&unknown, "kv-cost", "m")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("policies.admission: no-such-admission"),
            "{err}"
        );
    }

    #[test]
    fn the_admission_handle_follows_the_registry() {
        let config = parse("admission = \"native:admit-all\"\nkv_hints = \"no-hints\"");
        let runtime = PolicyRuntime::start(&config, "kv-cost", "m").unwrap();
        let roles: Vec<(String, String)> = runtime
            .registry
            .list()
            .into_iter()
            .map(|row| (row.role, row.source))
            .collect();
        assert_eq!(
            roles,
            [
                ("router".to_string(), "native:kv-cost".to_string()),
                ("admission".into(), "native:admit-all".into()),
                ("kv-hints".into(), "native:no-hints".into()),
            ]
        );
        let view = AdmissionView::default();
        let native = || Box::new(NoAdmission) as Box<dyn AdmissionPolicy>;
        let mut admission = admission_policy(Some(&runtime), native());
        assert_eq!(admission.name(), "policy-registry");
        assert!(admission.tick(&view, Duration::ZERO).is_empty());
        let calls =
            |runtime: &PolicyRuntime| runtime.registry.info(Role::Admission).unwrap().stats.calls;
        assert_eq!(calls(&runtime), 1);
        let hints = kv_hint_policy(Some(&runtime), Box::new(NoHints));
        assert_eq!(hints.name(), "policy-registry");
        // Without `[policies]`, or without an admission policy named there: the caller's own.
        assert_eq!(admission_policy(None, native()).name(), "test-native");
        let routing_only =
            PolicyRuntime::start(&parse("router = \"round-robin\""), "kv-cost", "m").unwrap();
        let mut fallback = admission_policy(Some(&routing_only), native());
        assert_eq!(fallback.name(), "test-native");
        fallback.tick(&view, Duration::ZERO);
        assert_eq!(calls(&routing_only), 0);
        let hints = kv_hint_policy(Some(&routing_only), Box::new(NoHints));
        assert_eq!(hints.name(), "no-hints");
    }
}
