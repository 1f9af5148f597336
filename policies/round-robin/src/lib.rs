//! `round-robin`: rotate over the candidates, ignoring the cache; the baseline KV routing is
//! measured against. Same rotation as the gateway's native `RoundRobin`.

use switchyard_policy_sdk::{Decision, PolicyMetadata, Request, RouterPolicy, Workers};

/// The rotating policy; `next` counts decisions.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RouterPolicy for RoundRobin {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new(
            "round-robin",
            env!("CARGO_PKG_VERSION"),
            "Rotate over the candidates, ignoring the cache",
        )
    }

    fn select(&mut self, _request: &Request, workers: &Workers) -> Decision {
        let i = self.next % workers.len().max(1);
        self.next = self.next.wrapping_add(1);
        Decision::Chosen(i)
    }
}

switchyard_policy_sdk::export_router!(RoundRobin);

#[cfg(test)]
mod tests {
    use switchyard_policy_sdk::Request;
    use switchyard_policy_sdk::testing::{RouterHarness, idle_workers};

    use super::RoundRobin;

    #[test]
    fn rotates_over_every_candidate() {
        let mut harness = RouterHarness::new(RoundRobin::default());
        let workers = idle_workers(3);
        let request = Request::new(16, 16);
        let picks: Vec<_> = (0..7).map(|_| harness.route(&request, &workers)).collect();
        let expected = [0, 1, 2, 0, 1, 2, 0].map(Some);
        assert_eq!(picks, expected);
    }

    #[test]
    fn follows_a_shrinking_pool() {
        let mut harness = RouterHarness::new(RoundRobin::default());
        let request = Request::new(16, 16);
        assert_eq!(harness.route(&request, &idle_workers(4)), Some(0));
        assert_eq!(harness.route(&request, &idle_workers(4)), Some(1));
        assert_eq!(harness.route(&request, &idle_workers(4)), Some(2));
        assert_eq!(harness.route(&request, &idle_workers(2)), Some(1));
    }
}
