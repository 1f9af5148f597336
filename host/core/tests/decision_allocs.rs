//! A routing decision allocates nothing once the router's buffers have grown (issue #13), the
//! policy's own answer aside: allocations counted around `Router::route` and `finish`.
#![expect(unsafe_code, reason = "a global allocator is an unsafe trait")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::{IndexOp, KvIndex};
use switchyard_core::router::{
    KvCost, RequestId, RoundRobin, RouteRequest, Router, RouterConfig, RoutingPolicy,
};
use switchyard_core::worker::{Rank, Tier};

thread_local! {
    /// Allocations made by this thread (other tests' threads do not count).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread's own teardown may allocate after its locals are gone.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

/// The system allocator, counting allocations per thread.
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `alloc`'s contract, which `System.alloc` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as for `dealloc`, and the caller upholds `realloc`'s size contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations over `DECISIONS` decisions, in steady state: prompts of several lengths over ranks with and
/// without KV events, each decision a TTL after the last so that it also expires bookings.
fn allocations_in_steady_state(policy: Box<dyn RoutingPolicy>) -> u64 {
    let hasher = BlockHasher::new(16);
    let prompts: Vec<Vec<SequenceHash>> = [4096u32, 256, 1024, 64]
        .iter()
        .enumerate()
        .map(|(i, &len)| hasher.sequence(&(0..len).map(|t| t * 7 + i as u32).collect::<Vec<_>>()))
        .collect();
    let mut index = KvIndex::new();
    index.apply(&IndexOp::Store {
        rank: Rank::new(1, 0),
        tier: Tier::Device,
        blocks: prompts[0][..100].to_vec(),
        locals: Vec::new(),
    });
    let config = RouterConfig {
        approx_ttl: Duration::from_secs(2),
        ..RouterConfig::default()
    };
    let mut router = Router::new(config, policy);
    for worker in 0..4 {
        router.add_rank(Rank::new(worker, 0), worker % 2 == 0);
    }
    let mut now = Duration::ZERO;
    let mut decide = |n: u64| {
        now += Duration::from_secs(3);
        let hashes = &prompts[n as usize % prompts.len()];
        let request = RouteRequest {
            hashes,
            tokens: hashes.len() as u32 * 16,
            ..Default::default()
        };
        router
            .route(RequestId(n), &request, &index, now)
            .expect("healthy ranks");
        router.finish(RequestId(n), now);
    };
    let warm_up = allocations();
    for n in 0..200 {
        decide(n);
    }
    assert!(allocations() > warm_up, "the counter counts");
    let before = allocations();
    for n in 200..200 + DECISIONS {
        decide(n);
    }
    allocations() - before
}

const DECISIONS: u64 = 400;

#[test]
fn a_decision_allocates_nothing_but_the_policys_answer() {
    assert_eq!(
        allocations_in_steady_state(Box::new(RoundRobin::default())),
        0
    );
    // `KvCost` answers with a `Vec` of costs: the one allocation left.
    assert_eq!(allocations_in_steady_state(Box::new(KvCost)), DECISIONS);
}
