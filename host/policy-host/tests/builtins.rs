//! The built-in guests (`switchyard-policy-artifacts`) through the real host: the Wasm `kv-cost`
//! agrees with the native `KvCost` on random inputs, and every guest passes one conformance
//! suite.

use proptest::prelude::*;
use std::sync::Arc;
use switchyard_core::index::Overlap;
use switchyard_core::router::{
    Candidate, CostWeights, KvCost, Outcome, PolicyRequest, RoutingPolicy, Selection,
};
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::BareRoute;
use switchyard_policy_host::{PolicyStats, WasmRouter};

fn router(bytes: &[u8]) -> WasmRouter {
    let component = crate::patient_engine().load_router(bytes).unwrap();
    WasmRouter::new(component, Arc::new(PolicyStats::default()))
}

/// The cheapest index, ties to the lowest: how both answers are compared.
pub(crate) fn cheapest(selection: &Selection) -> usize {
    match selection {
        Selection::Pick(i) => *i,
        Selection::Costs(costs) => costs
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap(),
        Selection::Reject(reason) => panic!("rejected: {reason}"),
    }
}

fn candidate() -> impl Strategy<Value = Candidate> {
    (
        0u32..64,
        0u32..4,
        (0u32..200, 0u32..200, 0u32..200, 0u32..200),
        0u64..100_000,
        0u64..50_000,
        0u64..5_000,
        0u32..64,
    )
        .prop_map(
            |(w, dp, (device, host, disk, shared), indexed, prefill, decode, reqs)| Candidate {
                rank: Rank::new(w, dp),
                overlap: Overlap { device, host, disk },
                shared_blocks: shared,
                indexed_blocks: indexed,
                active_prefill_tokens: prefill,
                active_decode_blocks: decode,
                active_requests: reqs,
            },
        )
}

fn weights() -> impl Strategy<Value = CostWeights> {
    (
        0.0f64..2.0,
        0.0f64..2.0,
        0.0f64..2.0,
        0.0f64..2.0,
        0.0f64..4.0,
    )
        .prop_map(|(d, h, k, p, s)| CostWeights {
            device_credit: d,
            host_credit: h,
            disk_credit: k,
            shared_credit: p,
            prefill_load_scale: s,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn wasm_kv_cost_decides_like_the_native_one(
        candidates in prop::collection::vec(candidate(), 1..48),
        tokens in 1u32..20_000,
        block_size in prop::sample::select(vec![1u32, 16, 32, 64]),
        weights in weights(),
    ) {
        thread_local! {
            static WASM: std::cell::RefCell<WasmRouter> =
                std::cell::RefCell::new(router(switchyard_policy_artifacts::KV_COST));
        }
        let request = PolicyRequest {
            tokens,
            blocks: tokens.div_ceil(block_size),
            block_size,
            weights,
            ..PolicyRequest::default()
        };
        let native = KvCost.select(&request, &candidates);
        let wasm = WASM.with(|r| r.borrow_mut().select(&request, &candidates));
        let fallbacks = WASM.with(|r| r.borrow().stats().snapshot().fallbacks_total());
        prop_assert_eq!(fallbacks, 0);
        prop_assert_eq!(cheapest(&wasm), cheapest(&native), "wasm {:?} native {:?}", wasm, native);
        if let (Selection::Costs(w), Selection::Costs(n)) = (&wasm, &native) {
            for (a, b) in w.iter().zip(n) {
                prop_assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{} vs {}", a, b);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// 1.2's `route-packed` answers exactly as `route` (the SDK unpacks the columns the host
    /// packed): every built-in router, each export on its own fresh instance so stateful ones
    /// (round robin, the bandit) start alike.
    #[test]
    fn route_packed_answers_as_route(
        candidates in prop::collection::vec(candidate(), 1..48),
        tokens in 1u32..20_000,
        weights in weights(),
    ) {
        let request = PolicyRequest {
            tokens,
            blocks: tokens.div_ceil(16),
            block_size: 16,
            weights,
            session_id: Some("packed"),
            ..PolicyRequest::default()
        };
        for (name, bytes) in switchyard_policy_artifacts::builtin_for("router") {
            let component = crate::patient_engine().load_router(bytes).unwrap();
            prop_assert!(component.has_route_packed(), "{}", name);
            let bare = || BareRoute::new(&component, &request, &candidates).unwrap();
            let packed = bare().route_packed().expect("exported");
            prop_assert_eq!(packed, bare().route(), "{}", name);
        }
    }
}

fn candidates(n: u32) -> Vec<Candidate> {
    (0..n)
        .map(|w| Candidate {
            rank: Rank::new(w, 0),
            overlap: Overlap {
                device: (w * 3) % 7,
                ..Overlap::default()
            },
            shared_blocks: 0,
            indexed_blocks: u64::from(w),
            active_prefill_tokens: u64::from(w * 10),
            active_decode_blocks: u64::from(w % 4),
            active_requests: w % 3,
        })
        .collect()
}

/// What every router guest must do: load with matching metadata, answer a valid decision for 1
/// to 256 workers with no fallback, accept feedback, and give a finite queue key. (The
/// admission built-ins have their own suite in `admission_builtins`.)
#[test]
fn every_builtin_guest_conforms() {
    let engine = crate::patient_engine();
    for (name, bytes) in switchyard_policy_artifacts::builtin_for("router") {
        let component = engine
            .load_router(bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(component.metadata().name, *name);
        let mut policy = WasmRouter::new(component, Arc::new(PolicyStats::default()));
        conforms(name, &mut policy);
    }
}

/// The conformance suite on one loaded guest (built-in or not); panics naming `name`.
pub(crate) fn conforms(name: &str, policy: &mut WasmRouter) {
    assert_eq!(policy.component().metadata().world, "router", "{name}");
    for n in [1, 2, 16, 256] {
        let workers = candidates(n);
        for round in 0..4 {
            let request = PolicyRequest {
                tokens: 64 + round * 100,
                blocks: (64 + round * 100).div_ceil(16),
                block_size: 16,
                session_id: Some("conformance"),
                ..PolicyRequest::default()
            };
            let selection = policy.select(&request, &workers);
            assert!(
                cheapest(&selection) < workers.len(),
                "{name}: {selection:?}"
            );
            policy.observe(&Outcome {
                rank: workers[0].rank,
                candidate_index: 0,
                session_id: Some("conformance".into()),
                ttft: Some(std::time::Duration::from_millis(20)),
                itl: Some(std::time::Duration::from_millis(5)),
                cached_tokens: 32,
                prompt_tokens: request.tokens,
                output_tokens: 8,
                error: None,
            });
            let key = policy.queue_key(&request).unwrap();
            assert!(key.is_finite(), "{name}: queue key {key}");
        }
    }
    let stats = policy.stats().snapshot();
    assert_eq!(stats.fallbacks_total(), 0, "{name}: {stats:?}");
}
