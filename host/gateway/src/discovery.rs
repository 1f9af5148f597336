//! `[discovery]`: where workers come from besides the file's `[[workers]]`. Plain data: the
//! `switchyard-discovery` crate watches the cluster (the gateway links no Kubernetes client) and
//! hands the workers it finds to the fleet as source `kubernetes`.

use crate::config::{ConfigError, EngineKind, UpstreamMode, WorkerConfig};
use serde::Deserialize;
use std::time::Duration;

/// `[discovery]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// The ready endpoints of a Kubernetes Service, from its EndpointSlices.
    pub kubernetes: Option<KubernetesDiscoveryConfig>,
}

/// `[discovery.kubernetes]`: one worker per ready address of the EndpointSlices labelled
/// `kubernetes.io/service-name=<service>`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesDiscoveryConfig {
    /// Namespace of the Service. Default: the client's (in a pod: the pod's own namespace).
    pub namespace: Option<String>,
    /// Name of the engines' Service.
    pub service: String,
    /// The engines' HTTP port: a port name of the EndpointSlices (`"http"`), or a number.
    pub port: PortRef,
    /// `http` or `https`. Default: `http`.
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Port of each engine's KV-event publisher, on the same address (rank r: port + r).
    /// Absent: the workers are routed in approximate mode.
    pub kv_events_port: Option<u16>,
    /// Port of each engine's replay socket, on the same address (rank r: port + r).
    pub replay_port: Option<u16>,
    /// Changes within this long of the first one are applied together (a rollout changes
    /// many endpoints at once). Default: 1 s.
    #[serde(default = "default_debounce", with = "humantime_serde")]
    pub debounce: Duration,
    /// The rest of every discovered worker's entry.
    #[serde(default)]
    pub worker: WorkerTemplate,
}

/// A port by name or number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    /// A port number.
    Number(u16),
    /// The name of a port of the EndpointSlices.
    Name(String),
}

/// `[discovery.kubernetes.worker]`: the fields of a `[[workers]]` entry that discovery does not
/// find itself, with the same defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerTemplate {
    /// Engine kind. Default: vllm.
    pub kind: EngineKind,
    /// Data-parallel ranks. Default: 1.
    pub dp_size: u32,
    /// KV block size in tokens. Default: 16.
    pub block_size: u32,
    /// KV cache capacity of each rank in tokens. Default: unknown.
    pub kv_capacity_tokens: Option<u64>,
    /// What the gateway sends the engine. Default: `chat`.
    pub upstream: UpstreamMode,
    /// How it takes KV hints. Default: `none`.
    pub kv_hints: crate::config::HintDelivery,
}

impl Default for WorkerTemplate {
    fn default() -> Self {
        Self {
            kind: crate::config::default_kind(),
            dp_size: crate::config::one(),
            block_size: crate::config::sixteen(),
            kv_capacity_tokens: None,
            upstream: UpstreamMode::default(),
            kv_hints: crate::config::HintDelivery::default(),
        }
    }
}

fn default_scheme() -> String {
    "http".into()
}
fn default_debounce() -> Duration {
    Duration::from_secs(1)
}

// === impl KubernetesDiscoveryConfig ===

impl KubernetesDiscoveryConfig {
    /// The label selector of the Service's EndpointSlices.
    pub fn label_selector(&self) -> String {
        format!("kubernetes.io/service-name={}", self.service)
    }

    /// The worker at `address` (an IP, or a name), HTTP on `port`.
    pub fn worker_at(&self, address: &str, port: u16) -> WorkerConfig {
        // An IPv6 address goes in brackets in a URL and in a ZMQ endpoint alike.
        let host = if address.contains(':') {
            format!("[{address}]")
        } else {
            address.to_string()
        };
        WorkerConfig {
            url: format!("{}://{host}:{port}", self.scheme),
            kind: self.worker.kind,
            kv_events: self.kv_events_port.map(|p| format!("tcp://{host}:{p}")),
            replay: self.replay_port.map(|p| format!("tcp://{host}:{p}")),
            dp_size: self.worker.dp_size,
            kv_capacity_tokens: self.worker.kv_capacity_tokens,
            block_size: self.worker.block_size,
            upstream: self.worker.upstream,
            kv_hints: self.worker.kv_hints,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |msg: String| Err(ConfigError::Invalid(format!("discovery.kubernetes.{msg}")));
        // Both end up in a label selector or a URL path: DNS labels only.
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if !dns_label(&self.service) {
            return invalid(format!(
                "service must be a Service name (lowercase letters, digits, '-'), got {:?}",
                self.service
            ));
        }
        if let Some(namespace) = &self.namespace
            && !dns_label(namespace)
        {
            return invalid(format!(
                "namespace must be a namespace name (lowercase letters, digits, '-'), got {namespace:?}"
            ));
        }
        match &self.port {
            PortRef::Number(0) => return invalid("port must not be 0".into()),
            PortRef::Name(name) if name.trim().is_empty() => {
                return invalid("port must be a port name or number".into());
            }
            _ => {}
        }
        if self.scheme != "http" && self.scheme != "https" {
            return invalid(format!(
                "scheme must be \"http\" or \"https\", got {:?}",
                self.scheme
            ));
        }
        if self.kv_events_port == Some(0) || self.replay_port == Some(0) {
            return invalid("kv_events_port and replay_port must not be 0".into());
        }
        if self.debounce > Duration::from_secs(60) {
            return invalid("debounce must be at most 60s".into());
        }
        // The template as a whole worker: the same checks as a `[[workers]]` entry.
        let port = match self.port {
            PortRef::Number(port) => port,
            PortRef::Name(_) => 80,
        };
        self.worker_at("0.0.0.0", port)
            .validate("discovery.kubernetes.worker", self.worker.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<KubernetesDiscoveryConfig, String> {
        let config: KubernetesDiscoveryConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn ports_by_name_or_number_and_template_defaults() {
        let named = parse("service = \"vllm\"\nport = \"http\"").unwrap();
        assert_eq!(named.port, PortRef::Name("http".into()));
        assert_eq!(named.scheme, "http");
        assert_eq!(named.worker, WorkerTemplate::default());
        assert_eq!(named.label_selector(), "kubernetes.io/service-name=vllm");
        let numbered = parse("service = \"vllm\"\nport = 8000\nkv_events_port = 5557").unwrap();
        assert_eq!(numbered.port, PortRef::Number(8000));
        let worker = numbered.worker_at("10.0.0.5", 8000);
        assert_eq!(worker.url, "http://10.0.0.5:8000");
        assert_eq!(worker.kv_events.as_deref(), Some("tcp://10.0.0.5:5557"));
        assert_eq!(worker.replay, None);
        let v6 = numbered.worker_at("fd00::5", 8000);
        assert_eq!(v6.url, "http://[fd00::5]:8000");
        assert_eq!(v6.kv_events.as_deref(), Some("tcp://[fd00::5]:5557"));
    }

    #[test]
    fn mistakes_are_named() {
        for (text, needle) in [
            (
                "service = \"Vllm\"\nport = 1",
                "discovery.kubernetes.service",
            ),
            ("service = \"vllm\"\nport = 0", "discovery.kubernetes.port"),
            (
                "service = \"vllm\"\nport = \"\"",
                "discovery.kubernetes.port",
            ),
            (
                "service = \"vllm\"\nnamespace = \"a/b\"\nport = 1",
                "discovery.kubernetes.namespace",
            ),
            (
                "service = \"vllm\"\nport = 1\nscheme = \"tcp\"",
                "discovery.kubernetes.scheme",
            ),
            (
                "service = \"vllm\"\nport = 1\nreplay_port = 5558",
                "discovery.kubernetes.worker: replay without kv_events",
            ),
            (
                "service = \"vllm\"\nport = 1\n[worker]\ndp_size = 0",
                "discovery.kubernetes.worker: block_size and dp_size",
            ),
            (
                "service = \"vllm\"\nport = 1\nkv_events_port = 65535\n[worker]\ndp_size = 2",
                "discovery.kubernetes.worker.kv_events",
            ),
            ("service = \"vllm\"\nport = 1\nbogus = 1", "unknown field"),
            ("port = 1", "missing field `service`"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
