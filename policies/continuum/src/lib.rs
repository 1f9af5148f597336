//! `continuum`: Continuum-style TTL retention (agentic-serving.md section 4, "related
//! policies"), the native `switchyard_core::admission::Continuum` compiled to Wasm.
//!
//! The algorithm lives in the core only (it learns each tool's duration from the programs that
//! come back from it, pins a program's tokens on its worker for the tool's TTL, and holds
//! arrivals that would not fit next to what runs and what is pinned). [`admission_adapter`]
//! converts the host's columns (ranks, capacities and the tool a program called come as the
//! host's `switchyard.*` extension columns) into the core's view and its actions back, so for
//! millisecond-aligned times the actions are exactly the native policy's. The native policy
//! also renders its leases as KV pin hints (`Continuum::pins`); that belongs to the `kv-hints`
//! world, not to this component.
//!
//! **Parameters.** It runs [`ContinuumConfig::default`] (the native defaults, listed in its
//! metadata) unless WIT 1.1's `configure` gives it others: the same `key=value` pairs as the
//! native spec.

use admission_adapter::{Builtin, Native, metadata, param_ms};
use switchyard_core::admission::{Continuum, ContinuumConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's Continuum.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = Continuum;

    fn policy() -> Continuum {
        Continuum::new(ContinuumConfig::default())
    }

    fn configure(params: &switchyard_policy_sdk::Params) -> Result<Continuum, String> {
        let mut config = ContinuumConfig::default();
        for (key, value) in params {
            config.set(key, value).map_err(|e| e.to_string())?;
        }
        Ok(Continuum::new(config))
    }

    fn metadata(policy: &Continuum) -> PolicyMetadata {
        let c = policy.config();
        let params = [
            ("quantile", c.quantile.to_string()),
            ("window", c.window.to_string()),
            ("min_samples", c.min_samples.to_string()),
            ("default_ttl", param_ms(c.default_ttl)),
            ("max_ttl", param_ms(c.max_ttl)),
            ("memory_threshold", c.memory_threshold.to_string()),
            (
                "program_overhead_tokens",
                c.program_overhead_tokens.to_string(),
            ),
        ];
        metadata(
            "continuum",
            env!("CARGO_PKG_VERSION"),
            "Continuum: hold arrivals that would evict KV pinned for running tool calls",
            params,
        )
    }
}

switchyard_policy_sdk::export_admission!(Component);

#[cfg(test)]
mod tests;
