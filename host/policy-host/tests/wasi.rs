//! The WASI subset (`src/wasi.rs`) through a fixture that imports WASI like a language runtime:
//! random is a fixed-seed stream restarted with each instance, the environment is empty, stderr
//! reaches the error of a failed call, and what is not granted (the clock) traps and falls back.

use crate::{candidates, engine, request};
use std::sync::Arc;
use switchyard_core::router::{RoutingPolicy, Selection};
use switchyard_policy_host::test_util::wasi::{PICK_ENV_LEN, WasiRouter, eprint_then, read_clock};
use switchyard_policy_host::test_util::{TRAP, route};
use switchyard_policy_host::{PolicyStats, WasmRouter};

fn router(fixture: &WasiRouter<'_>) -> WasmRouter {
    let component = engine().load_router(&fixture.bytes()).unwrap();
    WasmRouter::new(component, Arc::new(PolicyStats::default()))
}

fn picks(router: &mut WasmRouter, calls: usize) -> Vec<Selection> {
    let workers = candidates(64);
    (0..calls)
        .map(|_| router.select(&request(100), &workers))
        .collect()
}

#[test]
fn random_is_a_fixed_stream_per_instance() {
    let fixture = WasiRouter::default();
    let first = picks(&mut router(&fixture), 16);
    assert_eq!(first, picks(&mut router(&fixture), 16), "not reproducible");
    let distinct: std::collections::BTreeSet<String> =
        first.iter().map(|s| format!("{s:?}")).collect();
    assert!(distinct.len() > 4, "not a stream: {first:?}");
}

#[test]
fn the_environment_is_empty() {
    let mut router = router(&WasiRouter {
        route: PICK_ENV_LEN.into(),
        ..WasiRouter::default()
    });
    assert_eq!(
        router.select(&request(100), &candidates(3)),
        Selection::Pick(0)
    );
    assert_eq!(router.stats().snapshot().fallbacks_total(), 0);
}

#[test]
fn an_ungranted_import_traps_and_falls_back() {
    let mut router = router(&WasiRouter {
        route: read_clock(),
        ..WasiRouter::default()
    });
    // Native kv-cost answers: the last worker holds the prefix.
    let Selection::Costs(costs) = router.select(&request(100), &candidates(3)) else {
        panic!("expected the native fallback's costs");
    };
    assert!(costs[2] < costs[0]);
    let stats = router.stats().snapshot();
    assert_eq!(stats.fallbacks.get("trap"), Some(&1), "{stats:?}");
    let error = stats.last_error.unwrap();
    assert!(error.contains("wasi:clocks/monotonic-clock"), "{error}");
}

#[test]
fn stderr_is_accepted_and_explains_a_later_trap() {
    let mut quiet = router(&WasiRouter {
        route: eprint_then("just a note", route::PICK_FIRST),
        text: "just a note".into(),
        ..WasiRouter::default()
    });
    assert_eq!(
        quiet.select(&request(100), &candidates(3)),
        Selection::Pick(0)
    );
    assert_eq!(quiet.stats().snapshot().fallbacks_total(), 0);

    let mut failing = router(&WasiRouter {
        route: eprint_then("ValueError: boom", TRAP),
        text: "ValueError: boom".into(),
        ..WasiRouter::default()
    });
    failing.select(&request(100), &candidates(3));
    let error = failing.stats().snapshot().last_error.unwrap();
    assert!(error.contains("guest stderr: ValueError: boom"), "{error}");
}
