//! The embedded default: mock engines in this process, so `switchyard serve` works at once.

use switchyard_gateway::config::{
    EngineKind, HintDelivery, ModelConfig, UpstreamMode, WorkerConfig,
};
use switchyard_kv_events::wire::Encoding;
use switchyard_mock_engine::{HostTierConfig, MockEngineConfig, MockEngineHandle};
use switchyard_tokenizer::ModelTokenizer;
use tokio_util::sync::CancellationToken;

/// Bytes per KV block in the embedded engines' tier memory: small, so that a laptop holds
/// device and host tiers of several engines (48 MiB each) while every block still moves bytes.
const EMBEDDED_BLOCK_BYTES: u64 = 1024;

/// The embedded engines' host tier: twice the device, so a newcomer sees tiered hits
/// (`kvbm_onboard_blocks_h2d` in an engine's `/metrics`, `CPU` KV events in the gateway's index).
fn host_tier() -> HostTierConfig {
    HostTierConfig {
        block_bytes: EMBEDDED_BLOCK_BYTES,
        ..HostTierConfig::blocks(2 * MockEngineConfig::default().num_blocks)
    }
}

/// Start `count` mock engines on loopback ports chosen by the OS, each publishing KV events,
/// each with a host KV tier.
pub(crate) async fn start(
    count: u32,
    tokenizer: &ModelTokenizer,
    shutdown: CancellationToken,
) -> anyhow::Result<Vec<MockEngineHandle>> {
    let mut engines = Vec::new();
    for _ in 0..count {
        let config = MockEngineConfig {
            host: std::net::Ipv4Addr::LOCALHOST.into(),
            port: 0,
            kv_events: Some("tcp://127.0.0.1:0".into()),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            encoding: Encoding::Map,
            host_tier: Some(host_tier()),
            ..MockEngineConfig::default()
        };
        engines.push(
            switchyard_mock_engine::spawn(config, tokenizer.clone(), shutdown.clone()).await?,
        );
    }
    Ok(engines)
}

/// How the gateway reaches one embedded engine.
pub(crate) fn worker_config(engine: &MockEngineHandle) -> WorkerConfig {
    let defaults = MockEngineConfig::default();
    WorkerConfig {
        url: engine.base_url(),
        kind: EngineKind::Mock,
        kv_events: engine.kv_events_endpoint().map(str::to_string),
        replay: engine.replay_endpoint().map(str::to_string),
        dp_size: 1,
        kv_capacity_tokens: Some((defaults.num_blocks * defaults.block_size) as u64),
        block_size: defaults.block_size as u32,
        // The embedded engines share the gateway's tokenizer: send them exact token ids.
        upstream: UpstreamMode::Tokens,
        // The mock engines execute hints on their own block manager and answer each outcome.
        kv_hints: HintDelivery::Endpoint,
    }
}

/// The embedded default routes with the built-in Wasm `kv-cost` component and hints with the
/// built-in `demote-on-tool-call` (each one's native twin answers any call it cannot, and runs
/// alone if this binary carries no such component), so a newcomer sees the policy platform at
/// work: the startup log's `policy loaded` lines, `switchyard_policy_calls_total` and, once a
/// turn ends in a slow tool, `switchyard_kv_hint_actions_total` in `/metrics`.
pub(crate) fn policies() -> switchyard_gateway::policies::PoliciesConfig {
    let builtin = |name: &str| match switchyard_policy_artifacts::find(name) {
        Some(_) => name.to_string(),
        None => format!("native:{name}"),
    };
    switchyard_gateway::policies::PoliciesConfig {
        router: Some(builtin("kv-cost")),
        kv_hints: Some(builtin("demote-on-tool-call")),
        ..Default::default()
    }
}

/// The mock model's context window: a coding agent's first prompt alone is ~20K tokens, and
/// harnesses assume 128K or more (SmolLM2's own 8K would refuse them).
const CONTEXT_LENGTH: u32 = 131_072;

/// Claude Code's own model names (its default, and `claude-haiku-*` for side requests), which
/// it sends whatever the gateway serves: the embedded default answers them with the mock model,
/// so `claude` works against it as installed.
const CLAUDE_MODELS: &str = "claude-*";

/// What the gateway is told about the embedded mock model, where the config leaves it open: its
/// context window, its reasoning format (`<think>`, which the mock engines write when a script
/// asks), so that thinking never reaches a harness as text, and Claude Code's model names as
/// aliases.
pub(crate) fn model(model: &mut ModelConfig) {
    model.context_length.get_or_insert(CONTEXT_LENGTH);
    model.reasoning_parser.get_or_insert_with(|| "qwen3".into());
    if model.aliases.is_empty() {
        model.aliases.push(CLAUDE_MODELS.into());
    }
}
