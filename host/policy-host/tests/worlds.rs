//! The registry over every world: admission and KV-hint components load by name, answer through
//! the registry's handles, are refused in the wrong role, hot-swap from the watched directory
//! over their native namesake, roll back and unload like routers.

use crate::admission::view;
use crate::kv_hints::{events, index};
use crate::{engine, install, ms};
use std::time::{Duration, Instant};
use switchyard_core::admission::AdmissionPolicy;
use switchyard_core::kv_hints::KvHintPolicy;
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::worlds::{
    Admission, KvHints, POISON_NOW_MS, fixed_actions, fixed_hints, when_late,
};
use switchyard_policy_host::test_util::{Router, TRAP};
use switchyard_policy_host::{PolicyError, PolicyRegistry, PolicySource, PolicyWatcher, Role};

fn active(registry: &PolicyRegistry, role: Role) -> String {
    registry.info(role).unwrap().name
}

#[test]
fn every_world_loads_by_name_and_answers_through_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), "adm.wasm", &Admission::default().bytes());
    install(dir.path(), "hints.wasm", &KvHints::default().bytes());
    let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
    // Before anything is loaded: the native defaults, listed with their worlds.
    let worlds = |registry: &PolicyRegistry| -> Vec<(String, String, String)> {
        registry
            .list()
            .into_iter()
            .map(|row| (row.role, row.name, row.world))
            .collect()
    };
    let native = |role: &str, name: &str, world: &str| (role.into(), name.into(), world.into());
    assert_eq!(
        worlds(&registry),
        [
            native("router", "kv-cost", "router"),
            native("admission", "admit-all", "admission"),
            native("kv-hints", "no-hints", "kv-hints"),
        ]
    );

    registry.load_named(Role::Admission, "adm").unwrap();
    registry.load_named(Role::KvHints, "hints").unwrap();
    let listed = worlds(&registry);
    assert_eq!(
        listed[1..3],
        [
            native("admission", "test-admission", "admission"),
            native("kv-hints", "test-kv-hints", "kv-hints"),
        ]
    );
    assert_eq!(listed[3].0, "previous-admission");

    let mut admission = registry.admission();
    assert_eq!(admission.tick(&view(&["s1", "s2"]), ms(5)), fixed_actions());
    let mut hints = registry.kv_hints();
    let here = index(Rank::new(0, 0));
    assert_eq!(hints.on_events(&events(), &here, ms(5)), fixed_hints());
    assert_eq!(registry.info(Role::Admission).unwrap().stats.calls, 1);
}

#[test]
fn a_component_of_another_world_never_replaces_a_policy() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), "router.wasm", &Router::default().bytes());
    install(dir.path(), "adm.wasm", &Admission::default().bytes());
    let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
    let err = registry.load_named(Role::Admission, "router").unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err}");
    let err = registry.load_named(Role::Router, "adm").unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err}");
    let info = registry.info(Role::Admission).unwrap();
    assert_eq!(info.name, "admit-all");
    assert!(info.load_error.unwrap().contains("router.wasm"));
    assert_eq!(active(&registry, Role::Router), "kv-cost");
    // A name that is neither a file nor native to the world is refused before loading.
    assert!(registry.resolve_for(Role::KvHints, "admit-all").is_err());
}

#[test]
fn a_file_replaces_its_native_namesake_then_rolls_back_and_unloads() {
    let dir = tempfile::tempdir().unwrap();
    let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
    // A bare native name runs natively and watches `dir/<name>.wasm`.
    let info = registry.load_named(Role::Admission, "admit-all").unwrap();
    assert_eq!(info.source, "native:admit-all");
    registry.load_named(Role::KvHints, "no-hints").unwrap();
    let _watcher = PolicyWatcher::start(registry.clone(), Duration::from_millis(200)).unwrap();
    install(dir.path(), "admit-all.wasm", &Admission::default().bytes());
    install(dir.path(), "no-hints.wasm", &KvHints::default().bytes());
    let deadline = Instant::now() + Duration::from_secs(5);
    while active(&registry, Role::Admission) != "test-admission"
        || active(&registry, Role::KvHints) != "test-kv-hints"
    {
        assert!(Instant::now() < deadline, "no swap: {:?}", registry.list());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        registry.rollback(Role::Admission).unwrap().name,
        "admit-all"
    );
    assert_eq!(active(&registry, Role::Admission), "admit-all");
    assert_eq!(registry.unload("test-kv-hints").unwrap(), Role::KvHints);
    assert_eq!(active(&registry, Role::KvHints), "no-hints");
}

#[test]
fn a_failing_admission_guest_is_answered_by_its_native_namesake() {
    let dir = tempfile::tempdir().unwrap();
    let meta = switchyard_policy_host::test_util::Meta {
        name: "admit-all",
        ..switchyard_policy_host::test_util::worlds::ADMISSION_META
    };
    install(
        dir.path(),
        "late.wasm",
        &Admission {
            meta,
            tick: when_late(TRAP),
            ..Admission::default()
        }
        .bytes(),
    );
    let registry = PolicyRegistry::new(engine(), Some(dir.path().into()), &[], "m");
    // It passes its canary (which runs at 60 s), and fails at the poisoned time.
    registry
        .load(
            Role::Admission,
            PolicySource::File(dir.path().join("late.wasm")),
        )
        .unwrap();
    let mut admission = registry.admission();
    let state = view(&["s1", "s2"]);
    assert_eq!(admission.tick(&state, ms(5)), fixed_actions());
    assert!(admission.tick(&state, ms(POISON_NOW_MS)).is_empty());
    let stats = registry.info(Role::Admission).unwrap().stats;
    assert_eq!(stats.fallbacks.get("trap"), Some(&1), "{stats:?}");
}
