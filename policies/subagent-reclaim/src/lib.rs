//! `subagent-reclaim`: evict a subagent's KV when it ends (and any session's at its end); the
//! native `switchyard_core::kv_hints::strategies::SubagentReclaim` compiled to Wasm through
//! [`kv_hints_adapter`], so its hints are exactly the native strategy's (checked by a property
//! test in `host/policy-host/tests`).
//!
//! **Parameters.** A component cannot read files: it runs
//! [`SubagentReclaimConfig::default`], listed in its metadata.

use kv_hints_adapter::{Builtin, Native, metadata};
use switchyard_core::kv_hints::strategies::{SubagentReclaim, SubagentReclaimConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's subagent-reclaim with its default parameters.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = SubagentReclaim;

    fn policy() -> SubagentReclaim {
        SubagentReclaim::new(SubagentReclaimConfig::default())
    }

    fn metadata(policy: &SubagentReclaim) -> PolicyMetadata {
        let c = policy.config();
        metadata(
            "subagent-reclaim",
            env!("CARGO_PKG_VERSION"),
            "evict a subagent's KV when it ends",
            [("max_sessions", c.max_sessions.to_string())],
        )
    }
}

switchyard_policy_sdk::export_kv_hints!(Component);

#[cfg(test)]
mod tests;
