//! `least-load`: the candidate with the fewest requests in flight, then the fewest decode blocks;
//! the first such candidate on a full tie. Ignores the cache. The same policy is written in C,
//! JavaScript and Python under `examples/` to show the contract is language-neutral.

use switchyard_policy_sdk::{Decision, PolicyMetadata, Request, RouterPolicy, Workers};

/// The least-loaded policy.
#[derive(Debug, Default)]
pub struct LeastLoad;

impl RouterPolicy for LeastLoad {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new(
            "least-load",
            env!("CARGO_PKG_VERSION"),
            "Fewest active requests, then fewest decode blocks",
        )
    }

    fn select(&mut self, _request: &Request, workers: &Workers) -> Decision {
        // `min_by_key` keeps the first of equal keys: ties go to the lowest index.
        let best = workers
            .iter()
            .min_by_key(|(_, w)| (w.active_requests, w.active_decode_blocks))
            .map_or(0, |(i, _)| i);
        Decision::Chosen(best)
    }
}

switchyard_policy_sdk::export_router!(LeastLoad);

#[cfg(test)]
mod tests {
    use switchyard_policy_sdk::Request;
    use switchyard_policy_sdk::testing::{RouterHarness, idle_workers};

    use super::LeastLoad;

    #[test]
    fn fewest_requests_then_fewest_decode_blocks() {
        let mut harness = RouterHarness::new(LeastLoad);
        let mut workers = idle_workers(4);
        workers.active_requests = vec![3, 1, 1, 2];
        workers.active_decode_blocks = vec![0, 90, 40, 0];
        assert_eq!(harness.route(&Request::new(64, 16), &workers), Some(2));
    }

    #[test]
    fn full_ties_go_to_the_first_candidate() {
        let mut harness = RouterHarness::new(LeastLoad);
        assert_eq!(
            harness.route(&Request::new(64, 16), &idle_workers(5)),
            Some(0)
        );
    }

    #[test]
    fn ignores_the_cache() {
        let mut harness = RouterHarness::new(LeastLoad);
        let mut workers = idle_workers(2);
        workers.device_blocks[0] = 100;
        workers.active_requests[0] = 1;
        assert_eq!(harness.route(&Request::new(64, 16), &workers), Some(1));
    }
}
