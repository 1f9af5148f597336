//! Types every decision point shares: metadata, log levels and the request being placed.

/// Extra signals as `(key, value)` pairs with namespaced keys (`vendor.signal`). Ignore keys you
/// do not know: this is how new signals reach policies before they earn a typed field.
pub type Extensions = Vec<(String, String)>;

/// Severity of a message sent with [`crate::log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Very detailed tracing, normally discarded.
    Trace,
    /// Diagnostic detail.
    Debug,
    /// Normal operation worth recording.
    Info,
    /// Something unexpected that the policy handled.
    Warn,
    /// Something the policy could not handle.
    Error,
}

/// Who a policy is. The SDK adds the world and the WIT version itself, so they cannot be wrong.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyMetadata {
    /// Short unique name, kebab-case (`kv-cost`, `bandit`); shown in metrics and the admin API.
    pub name: String,
    /// The policy's own semver version, e.g. `env!("CARGO_PKG_VERSION")`.
    pub version: String,
    /// One line for humans.
    pub description: String,
    /// Free-form extra facts (author, source URL, parameters).
    pub extensions: Extensions,
}

impl PolicyMetadata {
    /// Metadata with no extensions.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            description: description.into(),
            extensions: Vec::new(),
        }
    }

    /// Adds one extension fact.
    #[must_use]
    pub fn with_extension(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extensions.push((key.into(), value.into()));
        self
    }
}

/// Weights of the KV cost (agentic-serving.md section 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostWeights {
    /// Credit per prefix block already on the device (GPU).
    pub device_credit: f64,
    /// Credit per further prefix block in host memory.
    pub host_credit: f64,
    /// Credit per further prefix block on disk.
    pub disk_credit: f64,
    /// Credit per further prefix block in the shared pool, beyond what the worker holds itself.
    /// WIT 1.0's weights record has no field for it: the host sends it as the request extension
    /// [`SHARED_CREDIT_EXTENSION`] with `route` when a candidate has shared blocks; absent (no
    /// shared blocks, another call, or an older host), it is 0 and the pool earns nothing.
    pub shared_credit: f64,
    /// Weight of prefill work against decode load.
    pub prefill_load_scale: f64,
}

/// Request extension carrying [`CostWeights::shared_credit`] (a decimal number).
pub const SHARED_CREDIT_EXTENSION: &str = "switchyard.shared-credit";

impl Default for CostWeights {
    /// The gateway's defaults, so natively tested policies see what they will see in production.
    fn default() -> Self {
        Self {
            device_credit: 1.0,
            host_credit: 0.75,
            disk_credit: 0.25,
            shared_credit: 0.5,
            prefill_load_scale: 1.0,
        }
    }
}

/// Weights a single request asked for; `None` means "the configured default".
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CostOverrides {
    /// Override of [`CostWeights::device_credit`].
    pub device_credit: Option<f64>,
    /// Override of [`CostWeights::host_credit`].
    pub host_credit: Option<f64>,
    /// Override of [`CostWeights::disk_credit`].
    pub disk_credit: Option<f64>,
    /// Override of [`CostWeights::prefill_load_scale`].
    pub prefill_load_scale: Option<f64>,
}

/// The request to place, as a policy sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// Model name the client asked for.
    pub model: String,
    /// Prompt tokens.
    pub tokens: u32,
    /// Prompt blocks: `tokens / block_size` rounded up (a partial block still takes a slot).
    pub blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Cost weights in force: configured defaults with `overrides` applied.
    pub weights: CostWeights,
    /// What the request itself overrode (to tell a client's wish from the default).
    pub overrides: CostOverrides,
    /// Agent session (program) the request belongs to, if known.
    pub session_id: Option<String>,
    /// Session that spawned this one (a subagent's parent), if any.
    pub parent_session_id: Option<String>,
    /// Scheduling priority; higher is more urgent, 0 is normal.
    pub priority: i32,
    /// Expected output tokens, if the client hinted it.
    pub osl: Option<u32>,
    /// Extra request signals.
    pub extensions: Extensions,
}

impl Request {
    /// A request of `tokens` prompt tokens with `block_size`-token blocks and default weights,
    /// its block count rounded up as the host does.
    pub fn new(tokens: u32, block_size: u32) -> Self {
        Self {
            tokens,
            blocks: tokens.div_ceil(block_size.max(1)),
            block_size,
            ..Self::default()
        }
    }

    /// The same request tagged with a session.
    #[must_use]
    pub fn with_session(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// The value of extension `key`, if the host sent it.
    pub fn extension(&self, key: &str) -> Option<&str> {
        find_extension(&self.extensions, key)
    }
}

/// The value of `key` in `extensions`, if present.
pub fn find_extension<'a>(extensions: &'a [(String, String)], key: &str) -> Option<&'a str> {
    extensions
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A policy's configured parameters (WIT 1.1 `params`): `(key, value)` in the configuration's
/// order (`[policies] kv_hints = "my-policy:threshold=2s"`).
pub type Params = [(String, String)];

/// The default answer to `configure` for a policy that takes no parameters: none is fine, any
/// is refused, naming it (the host then refuses the load with this reason).
pub fn no_params(policy: &str, params: &Params) -> Result<(), String> {
    match params.first() {
        None => Ok(()),
        Some((key, _)) => Err(format!("policy {policy} has no parameter `{key}`")),
    }
}
