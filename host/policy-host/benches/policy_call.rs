//! Per-decision cost of a routing policy, native against Wasm, over 16, 64 and 256 workers, and
//! the cost of loading (compile + check + canary) a component.
//!
//! `cargo bench -p switchyard-policy-host --bench policy_call`
//! Wasm guests: always the inline WAT test router (`chosen(0)`, i.e. pure host overhead) with and
//! without 1.2's `route-packed` and the 1.1 build of `kv-cost` (the compatibility fixture, which
//! has no `route-packed`); the built-in `kv-cost`, and another build of it when
//! `SWITCHYARD_KV_COST_WASM` names its file (another build of `thunder-agent` beside the built-in
//! when `SWITCHYARD_THUNDER_AGENT_WASM` does);
//! the C, JS and Python example guests when `examples/build-policies.sh` has built them
//! (`target/examples/`).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{
    AdmissionPolicy, AdmissionView, Arrival, RankUtilization, SessionPhase, SessionView,
    ThunderAgent,
};
use switchyard_core::index::Overlap;
use switchyard_core::router::{Candidate, KvCost, PolicyRequest, RoutingPolicy};
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::{BareRoute, Router, noop_component, route};
use switchyard_policy_host::{EngineConfig, PolicyEngine, PolicyStats, WasmAdmission, WasmRouter};

const SIZES: [u32; 3] = [16, 64, 256];

fn candidates(n: u32) -> Vec<Candidate> {
    (0..n)
        .map(|w| Candidate {
            rank: Rank::new(w / 2, w % 2),
            overlap: Overlap {
                device: (w * 7) % 13,
                host: w % 3,
                disk: w % 2,
            },
            shared_blocks: 0,
            indexed_blocks: u64::from(w) * 64,
            active_prefill_tokens: u64::from((w * 97) % 4096),
            active_decode_blocks: u64::from((w * 31) % 512),
            active_requests: w % 9,
        })
        .collect()
}

fn request() -> PolicyRequest<'static> {
    PolicyRequest {
        tokens: 2048,
        blocks: 128,
        block_size: 16,
        session_id: Some("bench-session"),
        ..PolicyRequest::default()
    }
}

/// Guests to measure: (label, bytes).
fn guests() -> Vec<(String, Vec<u8>)> {
    // The no-op router in both shapes: 1.1 (`route` only) and 1.2 (the host calls
    // `route-packed`).
    let packed = Router {
        route_packed: Some(route::PICK_FIRST.into()),
        ..Router::default()
    };
    let mut guests = vec![
        ("wat-pick-first".to_string(), Router::default().bytes()),
        ("wat-pick-first-packed".to_string(), packed.bytes()),
    ];
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let v1_1 = manifest.join("tests/fixtures/wit-1.1/kv-cost.wasm");
    match std::fs::read(&v1_1) {
        Ok(bytes) => guests.push(("wasm-kv-cost-1.1".into(), bytes)),
        Err(e) => eprintln!("skipping {}: {e}", v1_1.display()),
    }
    guests.push((
        "wasm-kv-cost".into(),
        switchyard_policy_artifacts::KV_COST.to_vec(),
    ));
    // Another build of it (another profile, say), when named.
    if let Ok(path) = std::env::var("SWITCHYARD_KV_COST_WASM") {
        match std::fs::read(&path) {
            Ok(bytes) => guests.push(("wasm-kv-cost-file".into(), bytes)),
            Err(e) => eprintln!("skipping {path}: {e}"),
        }
    }
    // The example guests of examples/ (least-load in C, JavaScript and Python), when built by
    // examples/build-policies.sh.
    let examples = manifest.join("../../target/examples");
    for lang in ["c", "js", "python"] {
        if let Ok(bytes) = std::fs::read(examples.join(format!("policy-{lang}.wasm"))) {
            guests.push((format!("example-{lang}"), bytes));
        }
    }
    guests
}

/// The default limits but a deadline no noisy machine reaches: this measures costs, and a
/// fallback would measure the native policy instead (counted and reported below if any).
fn patient() -> EngineConfig {
    EngineConfig {
        deadline: Duration::from_secs(1),
        ..EngineConfig::default()
    }
}

fn decision(c: &mut Criterion) {
    let engine = match PolicyEngine::new(patient()) {
        Ok(engine) => engine,
        Err(e) => panic!("engine: {e}"),
    };
    let mut group = c.benchmark_group("policy-host/select");
    let req = request();
    // The floor: wasmtime's own cost of calling a component export that takes and returns
    // nothing (a default engine, a reused store).
    group.bench_function("wasmtime-noop-call", |b| {
        let engine = wasmtime::Engine::default();
        let component = wasmtime::component::Component::new(&engine, noop_component())
            .unwrap_or_else(|e| panic!("noop component: {e}"));
        let mut store = wasmtime::Store::new(&engine, ());
        let instance = wasmtime::component::Linker::new(&engine)
            .instantiate(&mut store, &component)
            .unwrap_or_else(|e| panic!("noop instance: {e}"));
        let noop = instance
            .get_typed_func::<(), ()>(&mut store, "noop")
            .unwrap_or_else(|e| panic!("noop export: {e}"));
        b.iter(|| noop.call(&mut store, ()).is_ok());
    });
    for n in SIZES {
        let workers = candidates(n);
        group.bench_with_input(BenchmarkId::new("native-kv-cost", n), &workers, |b, w| {
            let mut policy = KvCost;
            b.iter(|| black_box(policy.select(black_box(&req), black_box(w))));
        });
        for (label, bytes) in guests() {
            let component = match engine.load_router(&bytes) {
                Ok(component) => component,
                Err(e) => panic!("{label}: {e}"),
            };
            if label.starts_with("wat-pick-first") {
                // The same guest and arguments through wasmtime's bindings alone: what the host
                // adds is the difference to `reused-store`.
                let mut bare = BareRoute::new(&component, &req, &workers)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                if component.has_route_packed() {
                    group.bench_function(
                        BenchmarkId::new(format!("{label}/bare-route-packed"), n),
                        |b| b.iter(|| black_box(bare.call_packed())),
                    );
                } else {
                    group.bench_function(BenchmarkId::new(format!("{label}/bare-route"), n), |b| {
                        b.iter(|| black_box(bare.call()))
                    });
                }
            }
            let mut reused = WasmRouter::new(component.clone(), Arc::new(PolicyStats::default()));
            group.bench_with_input(
                BenchmarkId::new(format!("{label}/reused-store"), n),
                &workers,
                |b, w| {
                    b.iter(|| black_box(reused.select(black_box(&req), black_box(w))));
                },
            );
            let stats = reused.stats().snapshot();
            if stats.fallbacks_total() > 0 {
                eprintln!(
                    "warning: {label}/{n}: {} of {} calls fell back ({:?}; last: {}); the time \
                     mixes in the native policy's",
                    stats.fallbacks_total(),
                    stats.calls,
                    stats.fallbacks,
                    stats.last_error.unwrap_or_default()
                );
            }
            group.bench_with_input(
                BenchmarkId::new(format!("{label}/fresh-instance"), n),
                &workers,
                |b, w| {
                    b.iter(|| {
                        let mut fresh =
                            WasmRouter::new(component.clone(), Arc::new(PolicyStats::default()));
                        black_box(fresh.select(black_box(&req), black_box(w)))
                    });
                },
            );
        }
    }
    group.finish();
}

fn load(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy-host/load");
    group.sample_size(10);
    for (label, bytes) in guests() {
        group.bench_function(BenchmarkId::new("compile-check-canary", &label), |b| {
            b.iter(|| {
                // A new engine each time: the engine caches compiled code by content hash.
                let engine = match PolicyEngine::new(patient()) {
                    Ok(engine) => engine,
                    Err(e) => panic!("engine: {e}"),
                };
                let registry = switchyard_policy_host::PolicyRegistry::new(
                    engine,
                    None,
                    &[("p", &bytes)],
                    "m",
                );
                // A failed load would be measured as a fast one: refuse it.
                match registry.load_named(switchyard_policy_host::Role::Router, "p") {
                    Ok(info) => black_box(info),
                    Err(e) => panic!("{label}: {e}"),
                }
            });
        });
    }
    group.finish();
}

/// An admission view of `n` programs on 4 ranks: every phase, ranks, pauses, tools, as the
/// gateway's controller builds it.
fn admission_view(n: u32) -> AdmissionView {
    let phases = [
        SessionPhase::Running,
        SessionPhase::ToolCall,
        SessionPhase::Paused,
        SessionPhase::Queued,
    ];
    let sessions = (0..n)
        .map(|i| SessionView {
            session_id: format!("session-{i:04}"),
            parent_session_id: (i % 5 == 4).then(|| format!("session-{:04}", i - 1)),
            phase: phases[i as usize % phases.len()],
            priority: 0,
            active_requests: u32::from(i % 4 == 0),
            queued_requests: u32::from(i % 4 == 2),
            context_tokens: 20_000 + u64::from(i) * 1_500,
            age: Duration::from_secs(60 + u64::from(i)),
            idle: Duration::from_millis(u64::from(i % 4) * 700),
            rank: (i % 7 != 6).then(|| Rank::new(i % 4, 0)),
            paused: i % 4 == 2,
            paused_for: Duration::from_millis(u64::from(i % 4 == 2) * 1_500),
            service: Duration::from_secs(u64::from(i % 9)),
            tool: (i % 4 == 1).then(|| "Bash".to_owned()),
        })
        .collect();
    let workers = (0..4)
        .map(|w| RankUtilization {
            rank: Rank::new(w, 0),
            kv_usage: 0.7 + 0.05 * w as f32,
            active_requests: 4 + w,
            queue_depth: w,
            healthy: true,
            kv_capacity_tokens: 1 << 20,
        })
        .collect();
    AdmissionView { sessions, workers }
}

/// One admission `arrival` (the call every request makes when an admission policy is on):
/// ThunderAgent native against its Wasm twin, over 16 to 256 programs. The twin runs twice:
/// built against WIT 1.3 (the host makes the packed call) and the 1.2 build kept as a test
/// fixture (`arrival` over the 1.0 records).
fn admission(c: &mut Criterion) {
    let engine = match PolicyEngine::new(patient()) {
        Ok(engine) => engine,
        Err(e) => panic!("engine: {e}"),
    };
    let load = |bytes: &[u8]| match engine.load_admission(bytes) {
        Ok(component) => component,
        Err(e) => panic!("thunder-agent: {e}"),
    };
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/wit-1.2/thunder-agent.wasm"
    );
    let mut twins = vec![
        (
            "wasm-thunder-agent",
            load(switchyard_policy_artifacts::THUNDER_AGENT),
        ),
        (
            "wasm-1.2-thunder-agent",
            load(&std::fs::read(fixture).unwrap_or_default()),
        ),
    ];
    // Another build of it (another profile, say), when named.
    if let Ok(path) = std::env::var("SWITCHYARD_THUNDER_AGENT_WASM") {
        match std::fs::read(&path) {
            Ok(bytes) => twins.push(("wasm-thunder-agent-file", load(&bytes))),
            Err(e) => eprintln!("skipping {path}: {e}"),
        }
    }
    let mut group = c.benchmark_group("policy-host/admission-arrival");
    for n in [16, 64, 256] {
        let view = admission_view(n);
        let arrival = Arrival {
            request: PolicyRequest {
                session_id: Some("session-0001"),
                ..request()
            },
            waited: Duration::ZERO,
        };
        let now = Duration::from_secs(600);
        group.bench_with_input(
            BenchmarkId::new("native-thunder-agent", n),
            &view,
            |b, v| {
                let mut policy = ThunderAgent::default();
                b.iter(|| black_box(policy.arrival(black_box(v), &arrival, now)));
            },
        );
        for (name, component) in &twins {
            let mut wasm = WasmAdmission::new(component.clone(), Arc::new(PolicyStats::default()));
            group.bench_with_input(BenchmarkId::new(*name, n), &view, |b, v| {
                b.iter(|| black_box(wasm.try_arrival(black_box(v), &arrival, now)));
            });
            if let Err(e) = wasm.try_arrival(&view, &arrival, now) {
                panic!("{name} on {n} programs: {e}");
            }
        }
    }
    group.finish();
}

criterion_group!(benches, decision, admission, load);
criterion_main!(benches);
