//! `bandit`: Thompson sampling over workers, learning from measured TTFT (`observe`).
//!
//! Each worker rank has a posterior over its TTFT; the pool's observations are the prior, so an
//! unseen worker starts as an average one with wide uncertainty (it gets explored). A decision
//! draws one TTFT per candidate and scales the candidate's KV cost by it: cache and load still
//! matter, and a worker that has been slow for the same work is penalised in proportion. The
//! random draws come from a seeded generator inside the guest (no WASI randomness), so a run is
//! reproducible.

mod posterior;
mod rng;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use switchyard_policy_sdk::{
    Decision, Outcome, PolicyMetadata, Request, RouterPolicy, Workers, kv_costs,
};

use posterior::Posterior;
use rng::SplitMix64;

/// Seed of the guest's generator: fixed, so decisions replay identically.
const SEED: u64 = 0x5eed_cafe_f00d_d00d;
/// Worker ranks tracked at most (a bound on memory whatever the host sends).
const MAX_ARMS: usize = 1024;
/// A failed request counts as this many times the pool's mean TTFT.
const ERROR_PENALTY: f64 = 4.0;

/// The Thompson-sampling policy.
#[derive(Debug)]
pub struct Bandit {
    // Fixed-key hashing: `RandomState` would import WASI randomness into the component.
    arms: HashMap<(u32, u32), Posterior, BuildHasherDefault<DefaultHasher>>,
    pool: Posterior,
    rng: SplitMix64,
}

impl Default for Bandit {
    fn default() -> Self {
        Self {
            arms: HashMap::default(),
            pool: Posterior::default(),
            rng: SplitMix64::new(SEED),
        }
    }
}

impl Bandit {
    /// Mean TTFT learnt for worker rank `(worker_id, dp_rank)`, if it was observed.
    pub fn mean_ttft_ms(&self, worker_id: u32, dp_rank: u32) -> Option<f64> {
        self.arms.get(&(worker_id, dp_rank)).map(Posterior::mean)
    }

    fn arm_mut(&mut self, key: (u32, u32)) -> &mut Posterior {
        if self.arms.len() >= MAX_ARMS && !self.arms.contains_key(&key) {
            // Forget the least-observed rank: it carries the least information.
            let weakest = self
                .arms
                .iter()
                .min_by(|a, b| a.1.weight().total_cmp(&b.1.weight()))
                .map(|(k, _)| *k);
            if let Some(weakest) = weakest {
                self.arms.remove(&weakest);
            }
        }
        self.arms.entry(key).or_default()
    }
}

impl RouterPolicy for Bandit {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new(
            "bandit",
            env!("CARGO_PKG_VERSION"),
            "Thompson sampling over workers on observed TTFT, scaling the KV cost",
        )
        .with_extension("seed", SEED.to_string())
    }

    fn select(&mut self, request: &Request, workers: &Workers) -> Decision {
        let costs = kv_costs(request, workers);
        let mut best = (0, f64::INFINITY);
        for ((i, w), cost) in workers.iter().zip(costs) {
            let arm = self.arms.get(&(w.worker_id, w.dp_rank));
            let ttft = Posterior::sample(arm, &self.pool, &mut self.rng);
            // `1 +` keeps an idle worker's draw meaningful (a zero cost would erase it).
            let score = (1.0 + cost) * ttft;
            if score < best.1 {
                best = (i, score);
            }
        }
        Decision::Chosen(best.0)
    }

    fn observe(&mut self, outcome: &Outcome) {
        let ttft = match (&outcome.error, outcome.ttft_ms) {
            (Some(_), _) => ERROR_PENALTY * self.pool.mean_or(1.0).max(1.0),
            (None, Some(ttft)) if ttft.is_finite() && ttft >= 0.0 => ttft,
            // No first token and no error (or a nonsense value): nothing to learn.
            (None, _) => return,
        };
        self.pool.update(ttft);
        self.arm_mut((outcome.worker_id, outcome.dp_rank))
            .update(ttft);
    }
}

switchyard_policy_sdk::export_router!(Bandit);

#[cfg(test)]
mod tests;
