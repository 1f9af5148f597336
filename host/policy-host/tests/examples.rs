//! The example guests of `examples/` (least-load in C, JavaScript and Python) through the real
//! host: each loads through the registry (compile, check, canary, swap), passes the same
//! conformance suite as the built-ins, and decides exactly like the Rust built-in `least-load`.
//!
//! The artifacts come from `examples/build-policies.sh` (`target/examples/policy-<lang>.wasm`).
//! Without one a test prints a note and passes, unless `CI` is set: CI builds them first, so a
//! missing artifact there is a failure.

use crate::builtins::{cheapest, conforms};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_core::index::Overlap;
use switchyard_core::router::{Candidate, PolicyRequest, RoutingPolicy};
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::BareRoute;
use switchyard_policy_host::{PolicyRegistry, PolicySource, PolicyStats, Role, WasmRouter};

/// Where `examples/build-policies.sh` puts the `lang` guest.
fn artifact(lang: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/examples")
        .join(format!("policy-{lang}.wasm"))
}

/// The `lang` guest's path, or `None` (with a note) when it is not built and this is not CI.
fn built(lang: &str) -> Option<PathBuf> {
    let path = artifact(lang);
    if path.is_file() {
        return Some(path);
    }
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    assert!(
        !ci,
        "CI is set but the {lang} example guest {} is missing: run examples/build-policies.sh \
         before the tests",
        path.display()
    );
    eprintln!(
        "note: skipping the {lang} example guest: {} not built (examples/build-policies.sh)",
        path.display()
    );
    None
}

/// Candidate sets with many ties on requests and decode blocks (`seed` varies them).
fn workers(n: u32, seed: u32) -> Vec<Candidate> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = move |m: u32| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x % m
    };
    (0..n)
        .map(|w| Candidate {
            rank: Rank::new(w, 0),
            overlap: Overlap {
                device: next(8),
                ..Overlap::default()
            },
            shared_blocks: 0,
            indexed_blocks: u64::from(next(100)),
            active_prefill_tokens: u64::from(next(1000)),
            active_decode_blocks: u64::from(next(4)),
            active_requests: next(3),
        })
        .collect()
}

fn example_conforms(lang: &str) {
    let Some(path) = built(lang) else { return };
    let name = format!("least-load-{lang}");
    let engine = crate::patient_engine();

    // The real load path: compile, check world and metadata, canary, swap.
    let registry = PolicyRegistry::new(engine.clone(), None, &[], "conformance-model");
    let info = registry
        .load(Role::Router, PolicySource::File(path.clone()))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(info.name, name);

    let component = engine.load_router_file(&path).unwrap();
    assert_eq!(component.metadata().name, name);
    assert_eq!(component.metadata().wit_version, "1.3.0");
    let mut policy = WasmRouter::new(component, Arc::new(PolicyStats::default()));
    conforms(&name, &mut policy);

    // Same decisions as the Rust built-in least-load, on sets with ties.
    let reference = engine
        .load_router(switchyard_policy_artifacts::LEAST_LOAD)
        .unwrap();
    let mut reference = WasmRouter::new(reference, Arc::new(PolicyStats::default()));
    let request = PolicyRequest {
        tokens: 512,
        blocks: 32,
        block_size: 16,
        ..PolicyRequest::default()
    };
    let component = policy.component().clone();
    assert!(component.has_route_packed(), "{name}");
    let mut bare = None;
    for seed in 0..64 {
        let candidates = workers(1 + seed % 40, seed);
        let ours = policy.select(&request, &candidates);
        let expected = reference.select(&request, &candidates);
        assert_eq!(
            cheapest(&ours),
            cheapest(&expected),
            "{name} on seed {seed}: {ours:?}, the Rust least-load {expected:?}"
        );
        // The host asks `route-packed`; `route` (for 1.1 hosts) must answer alike. One
        // instance for all seeds: a language runtime's start-up is slow.
        let bare = bare.get_or_insert_with(|| BareRoute::new(&component, &request, &[]).unwrap());
        bare.set_candidates(&request, &candidates);
        assert_eq!(bare.route(), Ok(ours), "{name} on seed {seed}: `route`");
    }
    let stats = policy.stats().snapshot();
    assert_eq!(stats.fallbacks_total(), 0, "{name}: {stats:?}");
}

#[test]
fn c_guest_conforms() {
    example_conforms("c");
}

#[test]
fn js_guest_conforms() {
    example_conforms("js");
}

/// componentize-py's runtime calls WASI on its first export call (`wasi:cli/environment`, then
/// `wasi:random` to seed `random`): the host's deterministic WASI subset answers them.
#[test]
fn python_guest_conforms() {
    example_conforms("python");
}
