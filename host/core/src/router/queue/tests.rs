use super::*;
use crate::hash::BlockHasher;
use crate::index::IndexOp;
use crate::router::{Candidate, RoundRobin};
use crate::router::{KvCost, PolicyRequest, RouterConfig, RoutingPolicy, Selection};
use crate::worker::Tier;

const BLOCK: u32 = 4;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn router(ranks: u32, policy: Box<dyn RoutingPolicy>) -> Router {
    let mut r = Router::new(
        RouterConfig {
            block_size: BLOCK,
            ..RouterConfig::default()
        },
        policy,
    );
    for w in 0..ranks {
        r.add_rank(Rank::new(w, 0), false);
    }
    r
}

/// One request in flight per rank at most.
fn one_each() -> QueueConfig {
    QueueConfig {
        max_requests: Some(1),
        ..QueueConfig::default()
    }
}

/// A request of `tokens` distinct tokens (seeded by `id`) with `priority`.
fn req(id: u64, tokens: u32, priority: i32) -> QueuedRequest {
    let prompt: Vec<u32> = (0..tokens).map(|t| id as u32 * 100_000 + t).collect();
    QueuedRequest {
        priority,
        ..QueuedRequest::new(
            RequestId(id),
            &RouteRequest {
                hashes: &BlockHasher::new(BLOCK as usize).sequence(&prompt),
                tokens,
                ..RouteRequest::default()
            },
        )
    }
}

/// Fill every rank with one request each (id 1000 + rank on that rank).
fn saturate(q: &mut RouterQueue, r: &mut Router, index: &KvIndex) {
    let ranks = r.ranks().count() as u64;
    for i in 0..ranks {
        let mut blocker = req(1_000 + i, 8, 0);
        blocker.pinned_rank = Some(Rank::new(i as u32, 0));
        let out = q.submit(blocker, r, index, secs(0)).unwrap();
        assert!(matches!(out, Submitted::Routed(_)));
    }
}

/// Finish request `done` and drain; the ids that left, in order.
fn release(q: &mut RouterQueue, r: &mut Router, index: &KvIndex, done: u64, at: u64) -> Vec<u64> {
    r.finish(RequestId(done), secs(at));
    q.drain(r, index, secs(at))
        .into_iter()
        .map(|d| {
            assert!(d.result.is_ok());
            d.request.id.0
        })
        .collect()
}

/// Submit `requests` (each at its own second) to a saturated one-rank router, then let them out
/// one at a time; the order they left in.
fn order(config: QueueConfig, requests: Vec<QueuedRequest>) -> Vec<u64> {
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let mut q = RouterQueue::new(config);
    saturate(&mut q, &mut r, &index);
    let n = requests.len();
    for (t, request) in requests.into_iter().enumerate() {
        let out = q
            .submit(request, &mut r, &index, secs(t as u64 + 1))
            .unwrap();
        assert!(matches!(out, Submitted::Queued { .. }));
    }
    let mut left = release(&mut q, &mut r, &index, 1_000, 100);
    while left.len() < n {
        let last = *left.last().expect("something left");
        left.extend(release(
            &mut q,
            &mut r,
            &index,
            last,
            100 + left.len() as u64,
        ));
    }
    left
}

#[test]
fn fcfs_serves_in_arrival_order() {
    let got = order(one_each(), vec![req(1, 8, 0), req(2, 8, 0), req(3, 8, 0)]);
    assert_eq!(got, [1, 2, 3]);
}

#[test]
fn priority_is_a_head_start_in_seconds() {
    // Arrivals at 1, 2, 3 s. Request 2 with priority 2 counts as arrived at 0 s: first. Request 3
    // with priority 1 counts as 2 s: after 1 (1 s), tied with nothing.
    let got = order(one_each(), vec![req(1, 8, 0), req(2, 8, 2), req(3, 8, 1)]);
    assert_eq!(got, [2, 1, 3]);
    // A head start smaller than the gap does not overtake.
    let got = order(one_each(), vec![req(1, 8, 0), req(2, 8, 0), req(3, 8, 1)]);
    assert_eq!(
        got,
        [1, 2, 3],
        "3 counts as arrived at 2 s: tied with 2, which came first"
    );
}

#[test]
fn lcfs_serves_the_newest_first() {
    let config = QueueConfig {
        order: QueueOrder::Lcfs,
        ..one_each()
    };
    let got = order(config, vec![req(1, 8, 0), req(2, 8, 0), req(3, 8, 0)]);
    assert_eq!(got, [3, 2, 1]);
}

#[test]
fn wspt_weighs_priority_against_uncached_work() {
    let config = QueueConfig {
        order: QueueOrder::Wspt,
        ..one_each()
    };
    // Weights over tokens: 1/400, 1/100, 20/1000, 1/(1+1)/100 = 1/200.
    let got = order(
        config,
        vec![
            req(1, 400, 0),
            req(2, 100, 0),
            req(3, 1_000, 19),
            req(4, 100, -1),
        ],
    );
    assert_eq!(got, [3, 2, 4, 1]);
}

#[test]
fn wspt_counts_only_uncached_tokens() {
    let config = QueueConfig {
        order: QueueOrder::Wspt,
        ..one_each()
    };
    let mut index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let mut q = RouterQueue::new(config);
    saturate(&mut q, &mut r, &index);
    // 1 is long but 392 of its 400 tokens are cached: 8 to compute, less than 2's 100.
    let long = req(1, 400, 0);
    index.apply(&IndexOp::Store {
        rank: Rank::new(0, 0),
        tier: Tier::Device,
        blocks: long.hashes[..98].to_vec(),
        locals: Vec::new(),
    });
    q.submit(req(2, 100, 0), &mut r, &index, secs(1)).unwrap();
    q.submit(long, &mut r, &index, secs(2)).unwrap();
    assert_eq!(release(&mut q, &mut r, &index, 1_000, 10), [1]);
}

#[test]
fn strict_tiers_always_go_first() {
    let mut urgent = req(3, 8, -100);
    urgent.strict_priority = 1;
    let got = order(one_each(), vec![req(1, 8, 50), req(2, 8, 0), urgent]);
    assert_eq!(got, [3, 1, 2]);
}

#[test]
fn the_queue_is_bounded() {
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let mut q = RouterQueue::new(QueueConfig {
        capacity: 2,
        ..one_each()
    });
    saturate(&mut q, &mut r, &index);
    assert_eq!(
        q.submit(req(1, 8, 0), &mut r, &index, secs(1)),
        Ok(Submitted::Queued { depth: 1 })
    );
    q.submit(req(2, 8, 0), &mut r, &index, secs(1)).unwrap();
    assert_eq!(
        q.submit(req(3, 8, 0), &mut r, &index, secs(1)),
        Err(QueueError::Full { capacity: 2 })
    );
    assert_eq!(q.stats().rejected_full, 1);
    assert_eq!(q.stats().max_depth, 2);
}

#[test]
fn do_not_queue_gets_an_immediate_answer() {
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let mut q = RouterQueue::new(QueueConfig {
        retry_after: secs(3),
        ..one_each()
    });
    let mut eager = req(1, 8, 0);
    eager.do_not_queue = true;
    // Room: routed as usual.
    assert!(matches!(
        q.submit(eager.clone(), &mut r, &index, secs(0)),
        Ok(Submitted::Routed(_))
    ));
    eager.id = RequestId(2);
    assert!(q.would_queue(&eager, &r));
    assert_eq!(
        q.submit(eager, &mut r, &index, secs(0)),
        Err(QueueError::WouldQueue {
            retry_after: secs(3)
        })
    );
    assert!(q.is_empty());
    assert_eq!(q.stats().would_queue, 1);
}

#[test]
fn requests_wait_only_when_every_rank_is_saturated() {
    let index = KvIndex::new();
    let mut r = router(2, Box::new(RoundRobin::default()));
    let mut q = RouterQueue::new(QueueConfig {
        max_prefill_tokens: Some(100),
        ..QueueConfig::default()
    });
    // 150 uncached tokens put one rank over 100; the other still takes work.
    assert!(matches!(
        q.submit(req(1, 150, 0), &mut r, &index, secs(0)),
        Ok(Submitted::Routed(_))
    ));
    assert!(matches!(
        q.submit(req(2, 150, 0), &mut r, &index, secs(0)),
        Ok(Submitted::Routed(_))
    ));
    assert!(matches!(
        q.submit(req(3, 8, 0), &mut r, &index, secs(0)),
        Ok(Submitted::Queued { .. })
    ));
    // A first token releases the prefill load: the waiting request goes.
    r.first_token(RequestId(1), Duration::ZERO);
    let left = q.drain(&mut r, &index, secs(2));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].waited, secs(2));
    // Without thresholds nothing ever waits.
    let mut open = RouterQueue::new(QueueConfig::default());
    for i in 10..20 {
        assert!(matches!(
            open.submit(req(i, 1_000, 0), &mut r, &index, secs(3)),
            Ok(Submitted::Routed(_))
        ));
    }
}

#[test]
fn a_pinned_request_waits_for_its_rank_and_lets_others_pass() {
    let index = KvIndex::new();
    let mut r = router(2, Box::new(KvCost));
    let mut q = RouterQueue::new(one_each());
    saturate(&mut q, &mut r, &index);
    let mut pinned = req(1, 8, 0);
    pinned.pinned_rank = Some(Rank::new(0, 0));
    q.submit(pinned, &mut r, &index, secs(1)).unwrap();
    q.submit(req(2, 8, 0), &mut r, &index, secs(2)).unwrap();
    // Rank 1 frees up: the pinned request cannot use it, the next one does.
    r.finish(RequestId(1_001), secs(3));
    let left = q.drain(&mut r, &index, secs(3));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].request.id, RequestId(2));
    assert_eq!(left[0].result.as_ref().map(|d| d.rank), Ok(Rank::new(1, 0)));
    r.finish(RequestId(1_000), secs(4));
    let left = q.drain(&mut r, &index, secs(4));
    assert_eq!(left[0].request.id, RequestId(1));
    assert_eq!(left[0].result.as_ref().map(|d| d.rank), Ok(Rank::new(0, 0)));
}

#[test]
fn leaving_the_queue_routes_against_the_current_index() {
    let mut index = KvIndex::new();
    let mut r = router(2, Box::new(KvCost));
    let mut q = RouterQueue::new(one_each());
    saturate(&mut q, &mut r, &index);
    let waiting = req(1, 64, 0);
    let blocks = waiting.hashes.clone();
    q.submit(waiting, &mut r, &index, secs(1)).unwrap();
    // While it waited, rank 1 cached its whole prefix.
    index.apply(&IndexOp::Store {
        rank: Rank::new(1, 0),
        tier: Tier::Device,
        blocks,
        locals: Vec::new(),
    });
    r.finish(RequestId(1_000), secs(2));
    r.finish(RequestId(1_001), secs(2));
    let left = q.drain(&mut r, &index, secs(2));
    let decision = left[0].result.as_ref().expect("routed");
    assert_eq!(decision.rank, Rank::new(1, 0));
    assert_eq!(decision.overlap.device, 16);
}

/// Orders by longest prompt first, to tell its key from the built-in one.
#[derive(Debug)]
struct LongestFirst;

impl RoutingPolicy for LongestFirst {
    fn name(&self) -> &str {
        "longest-first"
    }

    fn select(&mut self, _request: &PolicyRequest<'_>, _candidates: &[Candidate]) -> Selection {
        Selection::Pick(0)
    }

    fn queue_key(&mut self, request: &PolicyRequest<'_>) -> Option<f64> {
        Some(-f64::from(request.tokens))
    }
}

#[test]
fn the_routing_policy_may_supply_the_key() {
    let run = |use_policy_key| {
        let index = KvIndex::new();
        let mut r = router(1, Box::new(LongestFirst));
        let mut q = RouterQueue::new(QueueConfig {
            use_policy_key,
            ..one_each()
        });
        saturate(&mut q, &mut r, &index);
        for (i, tokens) in [(1, 8), (2, 64), (3, 32)] {
            q.submit(req(i, tokens, 0), &mut r, &index, secs(i))
                .unwrap();
        }
        let mut left = release(&mut q, &mut r, &index, 1_000, 10);
        while left.len() < 3 {
            let last = *left.last().unwrap();
            left.extend(release(&mut q, &mut r, &index, last, 11));
        }
        left
    };
    assert_eq!(run(true), [2, 3, 1]);
    assert_eq!(run(false), [1, 2, 3]);
}

#[test]
fn a_waiting_request_can_be_withdrawn() {
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let mut q = RouterQueue::new(one_each());
    saturate(&mut q, &mut r, &index);
    q.submit(req(1, 8, 0), &mut r, &index, secs(1)).unwrap();
    q.submit(req(2, 8, 0), &mut r, &index, secs(1)).unwrap();
    assert_eq!(q.remove(RequestId(1)).map(|w| w.id), Some(RequestId(1)));
    assert!(q.remove(RequestId(1)).is_none());
    assert_eq!(release(&mut q, &mut r, &index, 1_000, 2), [2]);
}
