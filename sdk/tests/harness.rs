//! The native harness answers as the host would.

use switchyard_policy_sdk::testing::{
    RouterHarness, cheapest, check_decision, check_metadata, idle_workers, take_logs, worker,
};
use switchyard_policy_sdk::{
    Decision, LogLevel, PolicyMetadata, Request, RouterPolicy, Worker, Workers, log,
};

/// Answers the decision it was built with.
struct Fixed(Decision);

impl RouterPolicy for Fixed {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new("fixed", "0.1.0", "answers what it was given")
    }

    fn select(&mut self, _request: &Request, _workers: &Workers) -> Decision {
        log(LogLevel::Debug, "selecting");
        self.0.clone()
    }
}

#[test]
fn costs_resolve_to_the_cheapest_then_the_emptiest() {
    let mut workers = idle_workers(3);
    workers.indexed_blocks = vec![9, 4, 1];
    assert_eq!(cheapest(&[2.0, 1.0, 1.0], &workers), Some(2));
    let mut harness = RouterHarness::new(Fixed(Decision::Costs(vec![3.0, 1.0, 2.0])));
    assert_eq!(harness.route(&Request::new(16, 16), &workers), Some(1));
    assert_eq!(take_logs(), [(LogLevel::Debug, "selecting".to_owned())]);
}

#[test]
fn answers_the_host_refuses_are_reported() {
    let workers = idle_workers(2);
    assert!(check_decision(&Decision::Chosen(2), &workers).is_err());
    assert!(check_decision(&Decision::Costs(vec![1.0]), &workers).is_err());
    assert!(check_decision(&Decision::Costs(vec![1.0, f64::NAN]), &workers).is_err());
    assert!(check_decision(&Decision::Queue("busy".into()), &workers).is_ok());
}

#[test]
#[should_panic(expected = "the host would refuse this decision")]
fn the_harness_panics_on_a_refused_decision() {
    let mut harness = RouterHarness::new(Fixed(Decision::Chosen(7)));
    harness.select(&Request::new(16, 16), &idle_workers(2));
}

#[test]
fn metadata_is_checked_like_the_host() {
    assert!(check_metadata(&PolicyMetadata::new("kv-cost", "1.2.3", "")).is_ok());
    assert!(check_metadata(&PolicyMetadata::new("KV cost", "1.2.3", "")).is_err());
    assert!(check_metadata(&PolicyMetadata::new("kv-cost", "1.2", "")).is_err());
    assert!(check_metadata(&PolicyMetadata::new("kv-cost", "1.2.3-rc.1", "")).is_ok());
}

#[test]
fn workers_round_trip_rows_and_tolerate_ragged_columns() {
    let rows = [
        Worker {
            dp_rank: 1,
            active_requests: 3,
            ..worker(7)
        },
        worker(8),
    ];
    let mut workers: Workers = rows.into_iter().collect();
    assert_eq!(workers.len(), 2);
    assert_eq!(workers.get(0), Some(rows[0]));
    assert_eq!(workers.position(8, 0), Some(1));
    assert_eq!(workers.position(7, 0), None);
    workers.kv_usage.pop();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers.get(1), None);
    assert_eq!(workers.iter().count(), 1);
}

#[test]
fn request_blocks_round_up() {
    assert_eq!(Request::new(33, 16).blocks, 3);
    assert_eq!(Request::new(32, 16).blocks, 2);
    assert_eq!(Request::new(5, 0).blocks, 5);
}
