use switchyard_policy_sdk::testing::{RouterHarness, idle_workers};
use switchyard_policy_sdk::{Decision, Request, Worker};

use super::KvCost;

#[test]
fn costs_follow_the_formula() {
    let mut harness = RouterHarness::new(KvCost);
    let mut workers = idle_workers(2);
    // Worker 1: 4 of 10 blocks cached on the device, 2 more in host memory, 160 prefill tokens
    // and 7 decode blocks in flight.
    workers.device_blocks[1] = 4;
    workers.host_blocks[1] = 2;
    workers.active_prefill_tokens[1] = 160;
    workers.active_decode_blocks[1] = 7;
    let request = Request::new(160, 16);
    let Decision::Costs(costs) = harness.select(&request, &workers) else {
        panic!("kv-cost answers costs");
    };
    // Idle: prefill 10 + decode 10.
    assert_eq!(costs[0], 20.0);
    // prefill (160/16 + 10 - 4 - 0.75 * 2) = 14.5, decode 7 + (10 - 4) = 13.
    assert_eq!(costs[1], 27.5);
}

#[test]
fn the_cached_worker_wins_when_load_is_equal() {
    let mut harness = RouterHarness::new(KvCost);
    let workers = [0, 1, 2]
        .into_iter()
        .map(|id| Worker {
            worker_id: id,
            device_blocks: if id == 2 { 8 } else { 0 },
            healthy: true,
            ..Worker::default()
        })
        .collect();
    assert_eq!(harness.route(&Request::new(128, 16), &workers), Some(2));
}

#[test]
fn request_weights_are_honoured() {
    let mut harness = RouterHarness::new(KvCost);
    let mut workers = idle_workers(1);
    workers.device_blocks[0] = 4;
    let mut request = Request::new(64, 16);
    request.weights.device_credit = 0.0;
    request.weights.prefill_load_scale = 2.0;
    // No credit: prefill 4 blocks * 2, decode 4 - 4 = 0 new blocks.
    assert_eq!(
        harness.select(&request, &workers),
        Decision::Costs(vec![8.0])
    );
}
