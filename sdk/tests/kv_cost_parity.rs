//! `kv_cost` must equal the gateway's native `KvCost::cost` bit for bit: the Wasm `kv-cost`
//! policy and the native fallback have to make the same decision on every input.

use switchyard_core::index::Overlap;
use switchyard_core::router::{Candidate, CostWeights as CoreWeights, KvCost, PolicyRequest};
use switchyard_core::worker::Rank;
use switchyard_policy_sdk::{CostWeights, Request, Worker, kv_cost};

/// A small deterministic generator, so the test needs no extra dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn matches_the_native_cost_on_random_inputs() {
    let mut rng = Lcg(42);
    for _ in 0..20_000 {
        let weights = CostWeights {
            device_credit: rng.next(300) as f64 / 100.0,
            host_credit: rng.next(300) as f64 / 100.0,
            disk_credit: rng.next(300) as f64 / 100.0,
            shared_credit: rng.next(300) as f64 / 100.0,
            prefill_load_scale: rng.next(400) as f64 / 100.0,
        };
        let block_size = rng.next(65) as u32; // 0 included: both clamp it to 1
        let tokens = rng.next(100_000) as u32;
        let mut request = Request::new(tokens, block_size);
        request.weights = weights;
        let worker = Worker {
            device_blocks: rng.next(5_000) as u32,
            host_blocks: rng.next(5_000) as u32,
            disk_blocks: rng.next(5_000) as u32,
            shared_blocks: rng.next(5_000) as u32,
            active_prefill_tokens: rng.next(1 << 40),
            active_decode_blocks: rng.next(1 << 40),
            ..Worker::default()
        };
        let native = KvCost::cost(
            &PolicyRequest {
                tokens,
                blocks: request.blocks,
                block_size,
                weights: CoreWeights {
                    device_credit: weights.device_credit,
                    host_credit: weights.host_credit,
                    disk_credit: weights.disk_credit,
                    shared_credit: weights.shared_credit,
                    prefill_load_scale: weights.prefill_load_scale,
                },
                ..PolicyRequest::default()
            },
            &Candidate {
                rank: Rank::new(0, 0),
                overlap: Overlap {
                    device: worker.device_blocks,
                    host: worker.host_blocks,
                    disk: worker.disk_blocks,
                },
                shared_blocks: worker.shared_blocks,
                indexed_blocks: 0,
                active_prefill_tokens: worker.active_prefill_tokens,
                active_decode_blocks: worker.active_decode_blocks,
                active_requests: 0,
            },
        );
        let sdk = kv_cost(&request, &worker);
        assert_eq!(sdk.to_bits(), native.to_bits(), "{request:?} {worker:?}");
    }
}

#[test]
fn default_weights_match_the_native_defaults() {
    let sdk = CostWeights::default();
    let native = CoreWeights::default();
    assert_eq!(
        [
            sdk.device_credit,
            sdk.host_credit,
            sdk.disk_credit,
            sdk.shared_credit,
            sdk.prefill_load_scale
        ],
        [
            native.device_credit,
            native.host_credit,
            native.disk_credit,
            native.shared_credit,
            native.prefill_load_scale
        ]
    );
}
