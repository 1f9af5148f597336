use switchyard_policy_sdk::testing::{RouterHarness, idle_workers, outcome};
use switchyard_policy_sdk::{Outcome, Request};

use super::Bandit;

/// Routes `rounds` requests over 3 idle workers where worker 1 answers in 20 ms and the others
/// in 200 ms; returns how often worker 1 was picked in the last half.
fn fast_worker_share(rounds: usize) -> (f64, RouterHarness<Bandit>) {
    let mut harness = RouterHarness::new(Bandit::default());
    let workers = idle_workers(3);
    let request = Request::new(64, 16);
    let mut fast = 0;
    for round in 0..rounds {
        let i = harness
            .route(&request, &workers)
            .expect("bandit always chooses");
        if round >= rounds / 2 && i == 1 {
            fast += 1;
        }
        let ttft = if i == 1 { 20.0 } else { 200.0 };
        harness.observe(&outcome(&workers, i, ttft));
    }
    (fast as f64 / (rounds / 2) as f64, harness)
}

#[test]
fn learns_to_prefer_the_fast_worker() {
    let (share, harness) = fast_worker_share(400);
    assert!(share > 0.9, "fast worker share {share}");
    let learnt = harness.policy().mean_ttft_ms(1, 0).expect("observed");
    assert!((learnt - 20.0).abs() < 1.0, "learnt {learnt}");
}

#[test]
fn explores_every_worker_at_first() {
    let mut harness = RouterHarness::new(Bandit::default());
    let workers = idle_workers(4);
    let mut seen = [false; 4];
    for _ in 0..40 {
        let i = harness
            .route(&Request::new(64, 16), &workers)
            .expect("chooses");
        seen[i] = true;
        harness.observe(&outcome(&workers, i, 100.0));
    }
    assert_eq!(seen, [true; 4]);
}

#[test]
fn decisions_replay_identically() {
    let picks = |_| {
        let mut harness = RouterHarness::new(Bandit::default());
        let workers = idle_workers(5);
        (0..50)
            .map(|_| harness.route(&Request::new(64, 16), &workers))
            .collect::<Vec<_>>()
    };
    assert_eq!(picks(0), picks(1));
}

#[test]
fn cache_still_matters() {
    let mut harness = RouterHarness::new(Bandit::default());
    let mut workers = idle_workers(2);
    // Worker 0 holds the whole 64-block prefix; worker 1 holds none. Equal TTFT history.
    workers.device_blocks[0] = 64;
    for i in 0..2 {
        for _ in 0..20 {
            harness.observe(&outcome(&workers, i, 50.0));
        }
    }
    let request = Request::new(1024, 16);
    let zero = (0..50)
        .filter(|_| harness.route(&request, &workers) == Some(0))
        .count();
    assert!(zero >= 48, "cached worker picked {zero}/50");
}

#[test]
fn errors_count_as_slow_and_missing_ttft_is_ignored() {
    let mut harness = RouterHarness::new(Bandit::default());
    let workers = idle_workers(2);
    harness.observe(&outcome(&workers, 0, 10.0));
    harness.observe(&Outcome {
        error: Some("reset".into()),
        ..outcome(&workers, 1, 0.0)
    });
    harness.observe(&Outcome {
        ttft_ms: None,
        ..outcome(&workers, 0, 0.0)
    });
    let fast = harness.policy().mean_ttft_ms(0, 0).expect("observed");
    let failed = harness.policy().mean_ttft_ms(1, 0).expect("observed");
    assert_eq!(fast, 10.0);
    assert!(failed > fast, "{failed} vs {fast}");
}
