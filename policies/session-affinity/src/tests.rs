use switchyard_policy_sdk::testing::{RouterHarness, idle_workers, outcome};
use switchyard_policy_sdk::{Decision, Request, Workers};

use super::SessionAffinity;
use super::sessions::SessionMap;

fn turn(tokens: u32) -> Request {
    Request::new(tokens, 16).with_session("agent-1")
}

#[test]
fn without_a_session_it_is_kv_cost() {
    let mut harness = RouterHarness::new(SessionAffinity::default());
    let workers = idle_workers(2);
    let request = Request::new(64, 16);
    assert_eq!(
        harness.select(&request, &workers),
        Decision::Costs(vec![8.0, 8.0])
    );
}

#[test]
fn sticks_while_within_the_margin() {
    let mut harness = RouterHarness::new(SessionAffinity::default());
    let mut workers = idle_workers(3);
    workers.indexed_blocks = vec![5, 0, 5];
    // First turn: all equal, the emptier worker 1 wins and becomes the session's home.
    assert_eq!(harness.route(&turn(64), &workers), Some(1));
    assert_eq!(harness.policy().sticky_worker("agent-1"), Some((1, 0)));
    // Worker 1 got a little busier (6 blocks more than the best): still within 8 blocks.
    workers.active_decode_blocks[1] = 6;
    assert_eq!(harness.route(&turn(64), &workers), Some(1));
}

#[test]
fn moves_when_its_worker_is_much_worse() {
    let mut harness = RouterHarness::new(SessionAffinity::default());
    let mut workers = idle_workers(2);
    assert_eq!(harness.route(&turn(64), &workers), Some(0));
    workers.active_decode_blocks[0] = 100;
    assert_eq!(harness.route(&turn(64), &workers), Some(1));
    assert_eq!(harness.policy().sticky_worker("agent-1"), Some((1, 0)));
}

#[test]
fn follows_the_worker_across_a_reordered_pool() {
    let mut harness = RouterHarness::new(SessionAffinity::default());
    assert_eq!(harness.route(&turn(64), &idle_workers(3)), Some(0));
    // Same workers, listed in another order: the session's worker 0 is now at index 2.
    let reordered: Workers = [2, 1, 0]
        .into_iter()
        .map(switchyard_policy_sdk::testing::worker)
        .collect();
    assert_eq!(harness.route(&turn(64), &reordered), Some(2));
}

#[test]
fn an_error_forgets_the_home_and_success_records_it() {
    let mut harness = RouterHarness::new(SessionAffinity::default());
    let workers = idle_workers(2);
    let mut done = outcome(&workers, 1, 30.0);
    done.session_id = Some("agent-1".into());
    harness.observe(&done);
    assert_eq!(harness.policy().sticky_worker("agent-1"), Some((1, 0)));
    done.error = Some("engine died".into());
    harness.observe(&done);
    assert_eq!(harness.policy().sticky_worker("agent-1"), None);
}

#[test]
fn the_session_map_is_bounded_and_keeps_recent_sessions() {
    let mut map = SessionMap::new(8);
    for i in 0..8 {
        map.insert(&format!("s{i}"), (i, 0));
    }
    // Touch s0 so it is the most recently used, then overflow.
    assert_eq!(map.get("s0"), Some((0, 0)));
    map.insert("s8", (8, 0));
    assert!(map.len() <= 8);
    assert_eq!(map.peek("s0"), Some((0, 0)));
    assert_eq!(map.peek("s8"), Some((8, 0)));
    assert_eq!(map.peek("s1"), None);
    for i in 9..100 {
        map.insert(&format!("s{i}"), (i, 0));
        assert!(map.len() <= 8);
    }
}
