//! `share-to-subagent`: share a parent's prefix with each subagent it spawns, and evict an
//! ended parent only once its subagents are done; the native
//! `switchyard_core::kv_hints::strategies::ShareToSubagent` compiled to Wasm through
//! [`kv_hints_adapter`], so its hints are exactly the native strategy's (checked by a property
//! test in `host/policy-host/tests`).
//!
//! **Parameters.** A component cannot read files: it runs
//! [`ShareToSubagentConfig::default`], listed in its metadata.

use kv_hints_adapter::{Builtin, Native, metadata};
use switchyard_core::kv_hints::strategies::{ShareToSubagent, ShareToSubagentConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's share-to-subagent with its default parameters.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = ShareToSubagent;

    fn policy() -> ShareToSubagent {
        ShareToSubagent::new(ShareToSubagentConfig::default())
    }

    fn metadata(policy: &ShareToSubagent) -> PolicyMetadata {
        let c = policy.config();
        metadata(
            "share-to-subagent",
            env!("CARGO_PKG_VERSION"),
            "share a parent's prefix with the subagents it spawns",
            [("max_sessions", c.max_sessions.to_string())],
        )
    }
}

switchyard_policy_sdk::export_kv_hints!(Component);

#[cfg(test)]
mod tests;
