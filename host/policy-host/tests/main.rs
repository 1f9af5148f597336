//! Integration tests of the policy host: loading, containment, hot reload, shadow mode.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod admission;
mod admission_builtins;
mod builtins;
mod compat;
mod examples;
mod fuzz;
mod kv_hints;
mod wasi;
mod worlds;

use std::sync::Arc;
use std::time::Duration;
use switchyard_core::index::Overlap;
use switchyard_core::router::{Candidate, PolicyRequest, RoutingPolicy, Selection};
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::{
    self as wat, GROW, Meta, POISON_TOKENS, ROUTER_META, Router, SPIN, TRAP, route, when_poisoned,
};
use switchyard_policy_host::{
    EngineConfig, PolicyEngine, PolicyError, PolicyRegistry, PolicySource, PolicyStats, Role,
    WasmRouter,
};

fn engine() -> PolicyEngine {
    PolicyEngine::new(EngineConfig::default()).unwrap()
}

/// The default limits, except a deadline that a CPU-starved CI machine cannot hit: for tests that
/// compare answers (the deadline itself is tested in `containment`).
fn patient_engine() -> PolicyEngine {
    PolicyEngine::new(EngineConfig {
        deadline: Duration::from_secs(2),
        ..EngineConfig::default()
    })
    .unwrap()
}

/// `n` milliseconds (the `now` of the admission and KV-hint tests).
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Assert that a load failed as the wrong world, with `mentions` in the message.
fn assert_wrong_world<T: std::fmt::Debug>(loaded: Result<T, PolicyError>, mentions: &str) {
    let err = loaded.unwrap_err();
    assert!(
        matches!(&err, PolicyError::WrongWorld(m) if m.contains(mentions)),
        "{err}"
    );
}

/// Write like cargo or an editor: a temporary file renamed into place.
fn install(dir: &std::path::Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    // Whatever the umask: the registry refuses group- or other-writable policy files.
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

fn candidates(n: u32) -> Vec<Candidate> {
    (0..n)
        .map(|w| Candidate {
            rank: Rank::new(w, 0),
            // The last worker holds the prefix: kv-cost picks it, `PICK_FIRST` does not.
            overlap: Overlap {
                device: if w == n - 1 { 8 } else { 0 },
                ..Overlap::default()
            },
            shared_blocks: 0,
            indexed_blocks: 0,
            active_prefill_tokens: 0,
            active_decode_blocks: 0,
            active_requests: 0,
        })
        .collect()
}

fn request(tokens: u32) -> PolicyRequest<'static> {
    PolicyRequest {
        tokens,
        blocks: tokens.div_ceil(16),
        block_size: 16,
        ..PolicyRequest::default()
    }
}

fn wasm_router(component: &Router<'_>) -> WasmRouter {
    let loaded = engine().load_router(&component.bytes()).unwrap();
    WasmRouter::new(loaded, Arc::new(PolicyStats::default()))
}

mod load {
    use super::*;

    #[test]
    fn a_good_component_loads_with_its_metadata() {
        let loaded = engine().load_router(&Router::default().bytes()).unwrap();
        assert_eq!(loaded.metadata().name, "test-router");
        assert_eq!(loaded.metadata().wit_version, "1.0.0");
    }

    #[test]
    fn garbage_bytes_are_rejected() {
        let err = engine().load_router(b"\0asm garbage").unwrap_err();
        assert!(matches!(err, PolicyError::Compile(_)), "{err}");
    }

    #[test]
    fn another_world_is_rejected() {
        let err = engine()
            .load_router(&wat::admission_component())
            .unwrap_err();
        assert!(
            matches!(&err, PolicyError::WrongWorld(m) if m.contains("admission")),
            "{err}"
        );
        let claims_admission = Router {
            meta: Meta {
                world: "admission",
                ..ROUTER_META
            },
            ..Router::default()
        };
        let err = engine().load_router(&claims_admission.bytes()).unwrap_err();
        assert!(matches!(err, PolicyError::WrongWorld(_)), "{err}");
    }

    #[test]
    fn a_missing_export_is_named() {
        let component = Router {
            without_queue_key: true,
            ..Router::default()
        };
        let err = engine().load_router(&component.bytes()).unwrap_err();
        assert_eq!(err, PolicyError::MissingExport("queue-key".into()));
    }

    #[test]
    fn a_newer_major_version_is_rejected() {
        let component = Router {
            meta: Meta {
                wit_version: "2.0.0",
                ..ROUTER_META
            },
            ..Router::default()
        };
        let err = engine().load_router(&component.bytes()).unwrap_err();
        assert!(matches!(err, PolicyError::IncompatibleVersion(_)), "{err}");
    }

    #[test]
    fn a_memory_too_large_to_start_is_out_of_memory() {
        let component = Router {
            pages: 1024, // 64 MiB, over the 16 MiB default cap
            ..Router::default()
        };
        let err = engine().load_router(&component.bytes()).unwrap_err();
        assert!(matches!(err, PolicyError::OutOfMemory { .. }), "{err}");
    }

    #[test]
    fn engine_settings_are_validated() {
        let tiny = EngineConfig {
            max_memory_bytes: 1 << 20,
            ..EngineConfig::default()
        };
        assert!(matches!(
            PolicyEngine::new(tiny),
            Err(PolicyError::Engine(_))
        ));
        let tiny_for_one = EngineConfig {
            max_memory_bytes_per_policy: [("p".to_string(), 1 << 20)].into(),
            ..EngineConfig::default()
        };
        let err = PolicyEngine::new(tiny_for_one).unwrap_err().to_string();
        assert!(err.contains("max_memory_bytes_per_policy[\"p\"]"), "{err}");
    }

    #[test]
    fn a_per_policy_memory_cap_applies_to_that_policy_only() {
        let engine = PolicyEngine::new(EngineConfig {
            max_memory_bytes_per_policy: [("roomy".to_string(), 128 << 20)].into(),
            ..EngineConfig::default()
        })
        .unwrap();
        let named = |name| Meta {
            name,
            ..ROUTER_META
        };
        // Growing by 64 MiB: within the roomy policy's cap, past everyone else's 16 MiB.
        for (name, out_of_memory) in [("roomy", None), ("test-router", Some(&1))] {
            let component = Router {
                meta: named(name),
                route: when_poisoned(GROW),
                ..Router::default()
            };
            let loaded = engine.load_router(&component.bytes()).unwrap();
            let mut router = WasmRouter::new(loaded, Arc::new(PolicyStats::default()));
            router.select(&request(POISON_TOKENS), &candidates(2));
            let stats = router.stats().snapshot();
            assert_eq!(
                stats.fallbacks.get("out_of_memory"),
                out_of_memory,
                "{name}"
            );
        }
        // A policy that starts above the default cap runs under its own; the load itself runs
        // under the largest cap, so only the cramped one's instances then fail.
        for (name, out_of_memory) in [("roomy", None), ("cramped", Some(&1))] {
            let large = Router {
                meta: named(name),
                pages: 1024,
                ..Router::default()
            };
            let loaded = engine.load_router(&large.bytes()).unwrap();
            let mut router = WasmRouter::new(loaded, Arc::new(PolicyStats::default()));
            router.select(&request(100), &candidates(2));
            let stats = router.stats().snapshot();
            assert_eq!(
                stats.fallbacks.get("out_of_memory"),
                out_of_memory,
                "{name}"
            );
        }
    }
}

mod containment {
    use super::*;

    /// Poisoned calls fall back to native kv-cost (which picks the last worker, holding the
    /// prefix), count the reason, and later calls reach the guest again.
    fn contained(body: &str, reason: &str) {
        let mut router = wasm_router(&Router {
            route: when_poisoned(body),
            ..Router::default()
        });
        let workers = candidates(4);
        assert_eq!(router.select(&request(100), &workers), Selection::Pick(0));
        let fallback = router.select(&request(POISON_TOKENS), &workers);
        let Selection::Costs(costs) = fallback else {
            panic!("expected kv-cost's costs, got {fallback:?}");
        };
        assert_eq!(costs.len(), 4);
        assert!(costs[3] < costs[0]);
        assert_eq!(router.select(&request(100), &workers), Selection::Pick(0));
        let stats = router.stats().snapshot();
        assert_eq!(stats.calls, 3);
        assert_eq!(stats.fallbacks.get(reason), Some(&1), "{stats:?}");
        assert!(stats.last_error.is_some());
    }

    #[test]
    fn a_trap_falls_back_and_the_store_is_rebuilt() {
        contained(TRAP, "trap");
    }

    #[test]
    fn an_infinite_loop_hits_the_deadline() {
        contained(SPIN, "deadline");
    }

    #[test]
    fn a_memory_bomb_is_out_of_memory() {
        contained(GROW, "out_of_memory");
    }

    #[test]
    fn the_last_worker_fixture_reads_the_columns() {
        let mut router = wasm_router(&Router {
            route: route::PICK_LAST.into(),
            ..Router::default()
        });
        for n in [1, 5, 64] {
            assert_eq!(
                router.select(&request(100), &candidates(n)),
                Selection::Pick(n as usize - 1)
            );
        }
    }

    #[test]
    fn impossible_answers_fall_back() {
        for body in [route::PICK_99, route::NAN_COST] {
            let mut router = wasm_router(&Router {
                route: body.into(),
                ..Router::default()
            });
            assert!(matches!(
                router.select(&request(100), &candidates(2)),
                Selection::Costs(_)
            ));
            assert_eq!(
                router.stats().snapshot().fallbacks.get("bad_output"),
                Some(&1)
            );
        }
    }

    #[test]
    fn repeated_failures_skip_the_guest_for_a_while() {
        let mut router = wasm_router(&Router {
            route: format!("{SPIN} {}", route::PICK_FIRST),
            ..Router::default()
        });
        for _ in 0..20 {
            router.select(&request(100), &candidates(2));
        }
        // Three calls ran into the deadline; the other 17 never entered the guest.
        let stats = router.stats().snapshot();
        assert_eq!(stats.fallbacks.get("deadline"), Some(&3), "{stats:?}");
        assert_eq!(stats.fallbacks.get("circuit_open"), Some(&17));
    }
}

mod registry {
    use super::*;
    use switchyard_policy_host::PolicyWatcher;

    fn pick_first() -> Vec<u8> {
        Router::default().bytes()
    }

    fn trapping() -> Vec<u8> {
        Router {
            route: TRAP.into(),
            ..Router::default()
        }
        .bytes()
    }

    fn active_name(registry: &PolicyRegistry) -> String {
        registry.info(Role::Router).unwrap().name
    }

    #[test]
    fn names_resolve_to_native_files_and_builtins() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), "mine.wasm", &pick_first());
        let builtin = pick_first();
        let builtins: [(&str, &[u8]); 1] = [("bundled", &builtin)];
        let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &builtins, "m");
        assert_eq!(
            registry.resolve("native:round-robin").unwrap(),
            PolicySource::Native("round-robin".into())
        );
        assert_eq!(
            registry.resolve("mine").unwrap(),
            PolicySource::File(dir.path().join("mine.wasm"))
        );
        assert_eq!(
            registry.resolve("bundled").unwrap(),
            PolicySource::Builtin("bundled".into())
        );
        assert!(registry.resolve("nothing").is_err());
        registry.load_named(Role::Router, "bundled").unwrap();
        assert_eq!(active_name(&registry), "test-router");
    }

    #[test]
    fn a_bad_file_never_replaces_a_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
        install(dir.path(), "p.wasm", &pick_first());
        registry.load_named(Role::Router, "p").unwrap();
        let good = registry.info(Role::Router).unwrap();

        install(dir.path(), "p.wasm", b"not a component");
        registry.file_changed(&dir.path().join("p.wasm"));
        install(dir.path(), "p.wasm", &trapping());
        registry.file_changed(&dir.path().join("p.wasm"));

        let now = registry.info(Role::Router).unwrap();
        assert_eq!(now.content_hash, good.content_hash);
        let error = now.load_error.unwrap();
        assert!(
            error.contains("p.wasm") && error.contains("canary"),
            "{error}"
        );
        let mut policy = registry.policy();
        assert_eq!(
            policy.select(&request(100), &candidates(3)),
            Selection::Pick(0)
        );
    }

    #[test]
    fn a_world_writable_file_never_replaces_a_good_policy() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
        install(dir.path(), "p.wasm", &pick_first());
        registry.load_named(Role::Router, "p").unwrap();
        let good = registry.info(Role::Router).unwrap();

        // A valid component, but anyone could have written it.
        let path = dir.path().join("p.wasm");
        let pick_last = Router {
            route: route::PICK_LAST.into(),
            ..Router::default()
        };
        std::fs::write(&path, pick_last.bytes()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        registry.file_changed(&path);
        let err = registry
            .load(Role::Router, PolicySource::File(path.clone()))
            .unwrap_err();
        assert!(matches!(err, PolicyError::Untrusted(_)), "{err}");
        assert_eq!(err.reason(), "untrusted");

        let now = registry.info(Role::Router).unwrap();
        assert_eq!(now.content_hash, good.content_hash);
        let error = now.load_error.unwrap();
        assert!(
            error.contains("p.wasm") && error.contains("writable by group or others (mode 0666)"),
            "{error}"
        );
        let mut policy = registry.policy();
        assert_eq!(
            policy.select(&request(100), &candidates(3)),
            Selection::Pick(0)
        );

        // Fixed in place: the next change loads it.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        registry.file_changed(&path);
        let fixed = registry.info(Role::Router).unwrap();
        assert_ne!(fixed.content_hash, good.content_hash);
        assert!(fixed.load_error.is_none());
    }

    #[test]
    fn the_watcher_swaps_within_a_debounce_window_and_rollback_restores() {
        let dir = tempfile::tempdir().unwrap();
        let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
        registry
            .load_named(Role::Router, "native:round-robin")
            .unwrap();
        // The file does not exist yet: watch the name it will have.
        registry.watch(Role::Router, dir.path().join("active.wasm"));
        let _watcher = PolicyWatcher::start(registry.clone(), Duration::from_millis(200)).unwrap();
        install(dir.path(), "active.wasm", &pick_first());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while active_name(&registry) != "test-router" {
            assert!(std::time::Instant::now() < deadline, "no swap");
            std::thread::sleep(Duration::from_millis(20));
        }
        let rolled = registry.rollback(Role::Router).unwrap();
        assert_eq!(rolled.name, "round-robin");
        assert_eq!(active_name(&registry), "round-robin");
    }

    #[test]
    fn a_shadow_sees_the_same_inputs_and_disagreements_are_counted() {
        let registry = PolicyRegistry::new(engine(), None, &[], "m");
        let component = pick_first();
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), "shadow.wasm", &component);
        registry
            .load(
                Role::Shadow,
                PolicySource::File(dir.path().join("shadow.wasm")),
            )
            .unwrap();
        let mut policy = registry.policy();
        for _ in 0..5 {
            // Active native kv-cost picks worker 2 (it holds the prefix); the shadow picks 0.
            policy.select(&request(100), &candidates(3));
        }
        let shadow = registry.info(Role::Shadow).unwrap();
        assert_eq!(shadow.stats.shadow_compared, 5);
        assert_eq!(shadow.stats.shadow_disagreements, 5);
        assert!(shadow.stats.shadow_mean_cost_delta > 0.0);
        assert_eq!(registry.unload("test-router").unwrap(), Role::Shadow);
        assert!(registry.info(Role::Shadow).is_none());
    }
}
