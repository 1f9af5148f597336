//! `autellix`: Autellix's PLAS, program-level least attained service first (agentic-serving.md
//! section 4, "related policies"), the native `switchyard_core::admission::Autellix` compiled
//! to Wasm.
//!
//! The algorithm lives in the core only (programs sorted into geometric levels by attained
//! service, each level lowering the priority by `level_priority` points; it never holds or
//! pauses). [`admission_adapter`] converts the host's columns (attained service comes as the
//! host's `switchyard.service-ms` extension column, 0 from a host that does not send it) into
//! the core's view and its actions back, so for millisecond-aligned service the actions are
//! exactly the native policy's.
//!
//! **Parameters.** It runs [`AutellixConfig::default`] (the native defaults, listed in its
//! metadata) unless WIT 1.1's `configure` gives it others: the same `key=value` pairs as the
//! native spec.

use admission_adapter::{Builtin, Native, metadata, param_ms};
use switchyard_core::admission::{Autellix, AutellixConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's Autellix.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = Autellix;

    fn policy() -> Autellix {
        Autellix::new(AutellixConfig::default())
    }

    fn configure(params: &switchyard_policy_sdk::Params) -> Result<Autellix, String> {
        let mut config = AutellixConfig::default();
        for (key, value) in params {
            config.set(key, value).map_err(|e| e.to_string())?;
        }
        Ok(Autellix::new(config))
    }

    fn metadata(policy: &Autellix) -> PolicyMetadata {
        let c = policy.config();
        let params = [
            ("quantum", param_ms(c.quantum)),
            ("growth", c.growth.to_string()),
            ("levels", c.levels.to_string()),
            ("level_priority", c.level_priority.to_string()),
        ];
        metadata(
            "autellix",
            env!("CARGO_PKG_VERSION"),
            "Autellix PLAS: least attained service first, by priority levels",
            params,
        )
    }
}

switchyard_policy_sdk::export_admission!(Component);

#[cfg(test)]
mod tests;
