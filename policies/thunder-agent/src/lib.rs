//! `thunder-agent`: ThunderAgent's program-aware admission (agentic-serving.md section 4; arXiv
//! 2602.13692), the native `switchyard_core::admission::ThunderAgent` compiled to Wasm.
//!
//! The algorithm lives in the core only; [`admission_adapter`] converts the host's columns
//! (ranks, capacities, the paused flag and how long a program has been paused come as the
//! host's `switchyard.*` extension columns) into the core's view and its actions back, so for
//! millisecond-aligned times the actions are exactly the native policy's (checked by a property
//! test in `host/policy-host/tests`).
//!
//! **Placement.** Like the native policy, it answers WIT 1.1's `placement`: a released program
//! runs on the worker it was resumed onto (and, with `sticky`, stays on its worker).
//!
//! **Parameters.** It runs [`ThunderAgentConfig::default`] (the native defaults, listed in its
//! metadata) unless WIT 1.1's `configure` gives it others: the same `key=value` pairs as the
//! native spec (`[policies] admission = "thunder-agent:decay_half_life=1h"`).

use admission_adapter::{Builtin, Native, metadata, param_ms};
use switchyard_core::admission::{ThunderAgent, ThunderAgentConfig};
use switchyard_policy_sdk::PolicyMetadata;

/// The built-in: the core's ThunderAgent.
#[derive(Debug)]
pub enum Spec {}

/// The component's policy.
pub type Component = Native<Spec>;

impl Builtin for Spec {
    type Policy = ThunderAgent;

    fn policy() -> ThunderAgent {
        ThunderAgent::new(ThunderAgentConfig::default())
    }

    fn configure(params: &switchyard_policy_sdk::Params) -> Result<ThunderAgent, String> {
        let mut config = ThunderAgentConfig::default();
        for (key, value) in params {
            config.set(key, value).map_err(|e| e.to_string())?;
        }
        Ok(ThunderAgent::new(config))
    }

    fn metadata(policy: &ThunderAgent) -> PolicyMetadata {
        let c = policy.config();
        let params = [
            ("tick_interval", param_ms(c.tick_interval)),
            ("acting_weight", c.acting_weight.to_string()),
            (
                "program_overhead_tokens",
                c.program_overhead_tokens.to_string(),
            ),
            ("pause_threshold", c.pause_threshold.to_string()),
            ("pause_target", c.pause_target.to_string()),
            ("resume_hysteresis", c.resume_hysteresis.to_string()),
            ("demotion_priority", c.demotion_priority.to_string()),
            ("demotion_ticks", c.demotion_ticks.to_string()),
            ("resume_priority", c.resume_priority.to_string()),
            ("forced_resume_after", param_ms(c.forced_resume_after)),
            ("migrate_after", param_ms(c.migrate_after)),
            ("decay_half_life", param_ms(c.decay_half_life)),
            ("sticky", c.sticky.to_string()),
        ];
        metadata(
            "thunder-agent",
            env!("CARGO_PKG_VERSION"),
            "ThunderAgent: pause programs on overloaded workers, resume by best fit",
            params,
        )
    }
}

switchyard_policy_sdk::export_admission!(Component);

#[cfg(test)]
mod tests;
