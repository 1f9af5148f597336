//! `demote-on-tool-call`: demote a session's KV to host memory while it waits on a slow tool
//! and prefetch it back just before the tool returns; the native
//! `switchyard_core::kv_hints::strategies::DemoteOnToolCall` compiled to Wasm.
//!
//! The strategy lives in the core only; [`kv_hints_adapter`] converts the host's events and
//! index (tool results come as the host's `switchyard.tool-result.*` extension columns) into
//! the core's and its hints back, so the hints are exactly the native strategy's (checked by a
//! property test in `host/policy-host/tests`).
//!
//! **Parameters** (WIT 1.1 `configure`): the native strategy's, with the same names and syntax
//! (`[policies] kv_hints = "demote-on-tool-call:demote_threshold=2s:demote_to=disk"`);
//! without any it runs [`DemoteOnToolCallConfig::default`] (the native defaults). Its metadata
//! lists the defaults. **Outcomes** (`on-outcomes`): a session whose demote no rank carried
//! out keeps its blocks, so its planned prefetch is cancelled, as the native strategy does.

use kv_hints_adapter::{Builtin, Native, metadata, param_ms};
use switchyard_core::kv_hints::strategies::{DemoteOnToolCall, DemoteOnToolCallConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's demote-on-tool-call with its default parameters.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = DemoteOnToolCall;

    fn policy() -> DemoteOnToolCall {
        DemoteOnToolCall::new(DemoteOnToolCallConfig::default())
    }

    fn configure(params: &switchyard_policy_sdk::Params) -> Result<DemoteOnToolCall, String> {
        let mut config = DemoteOnToolCallConfig::default();
        for (key, value) in params {
            config.set(key, value).map_err(|e| e.to_string())?;
        }
        Ok(DemoteOnToolCall::new(config))
    }

    fn metadata(policy: &DemoteOnToolCall) -> PolicyMetadata {
        let c = policy.config();
        let params = [
            ("unseen_tool_time", param_ms(c.unseen_tool_time)),
            ("ewma_weight", c.ewma_weight.to_string()),
            ("demote_threshold", param_ms(c.demote_threshold)),
            ("demote_above_usage", c.demote_above_usage.to_string()),
            ("prefetch_lead", param_ms(c.prefetch_lead)),
            (
                "demote_to",
                format!("{:?}", c.demote_to).to_ascii_lowercase(),
            ),
            ("max_tools", c.max_tools.to_string()),
            ("max_sessions", c.max_sessions.to_string()),
        ];
        metadata(
            "demote-on-tool-call",
            env!("CARGO_PKG_VERSION"),
            "demote a session's KV during a slow tool call, prefetch it before the tool returns",
            params,
        )
    }
}

switchyard_policy_sdk::export_kv_hints!(Component);

#[cfg(test)]
mod tests;
