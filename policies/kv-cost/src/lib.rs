//! `kv-cost`: the gateway's default routing policy as a component. Answers a KV cost per worker
//! (agentic-serving.md section 3) and lets the host pick with its temperature, exactly as it does
//! for the native `KvCost`, whose arithmetic `switchyard_policy_sdk::kv_cost` repeats.

use switchyard_policy_sdk::{Decision, PolicyMetadata, Request, RouterPolicy, Workers, kv_costs};

/// The KV-aware cost policy.
#[derive(Debug, Default)]
pub struct KvCost;

impl RouterPolicy for KvCost {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new(
            "kv-cost",
            env!("CARGO_PKG_VERSION"),
            "KV-aware cost: prefill left after cached prefix credit plus decode load",
        )
    }

    fn select(&mut self, request: &Request, workers: &Workers) -> Decision {
        Decision::Costs(kv_costs(request, workers))
    }
}

switchyard_policy_sdk::export_router!(KvCost);

#[cfg(test)]
mod tests;
