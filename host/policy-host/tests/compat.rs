//! WIT 1.1 to 1.3 on the host: 1.0 components (prebuilt, `tests/fixtures/wit-1.0/`) keep
//! loading and deciding as before, and refuse parameters they cannot take; 1.1 components get
//! their parameters (which change their decisions), refuse bad ones with their reason, and hear
//! what became of their hints; a 1.1 router (prebuilt, `tests/fixtures/wit-1.1/`) is asked
//! through `route`, a 1.2 one through `route-packed`; a 1.2 admission component (prebuilt,
//! `tests/fixtures/wit-1.2/`) through `tick`, `arrival` and `placement`, a 1.3 one through
//! their packed forms. (The 1.0 and 1.2 fixtures also run the native/Wasm equality properties
//! of `builtins`, `admission_builtins` and `kv_hints::builtins`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::kv_hints::actions::{ActionType, Outcome};
use switchyard_core::kv_hints::{
    HintKind, HintOutcome, IndexState, KvHint, KvHintPolicy, LifecycleEvent, LifecycleKind,
    RankUsage, SessionResidency, native_kv_hints,
};
use switchyard_core::router::{KvCost, PolicyRequest, RoutingPolicy};
use switchyard_core::worker::Rank;
use switchyard_policy_host::{
    PolicyError, PolicyRegistry, PolicyStats, Role, WasmAdmission, WasmKvHints, WasmRouter,
    split_params,
};

/// The 1.0 build of demote-on-tool-call.
pub(crate) const V1_0_DEMOTE: &str = "wit-1.0:demote-on-tool-call";
/// The 1.0 build of thunder-agent.
pub(crate) const V1_0_THUNDER: &str = "wit-1.0:thunder-agent";
/// The 1.2 build of thunder-agent (no packed admission calls).
pub(crate) const V1_2_THUNDER: &str = "wit-1.2:thunder-agent";
/// The 1.0 build of kv-cost.
const V1_0_KV_COST: &str = "wit-1.0:kv-cost";
/// The 1.1 build of kv-cost (no `route-packed`).
const V1_1_KV_COST: &str = "wit-1.1:kv-cost";

/// The component bytes of `name`: a built-in, or with a `wit-1.x:` prefix the prebuilt fixture
/// of that version.
pub(crate) fn bytes(name: &str) -> Vec<u8> {
    match name.split_once(':') {
        Some((version, fixture)) => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
            std::fs::read(dir.join(version).join(format!("{fixture}.wasm"))).unwrap()
        }
        None => switchyard_policy_artifacts::find(name).unwrap().to_vec(),
    }
}

/// The native twin of `name`.
pub(crate) fn native_name(name: &str) -> &str {
    name.split_once(':').map_or(name, |(_, fixture)| fixture)
}

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn v1_0_components_load_export_nothing_new_and_take_no_parameters() {
    let engine = crate::patient_engine();
    let router = engine.load_router(&bytes(V1_0_KV_COST)).unwrap();
    let admission = engine.load_admission(&bytes(V1_0_THUNDER)).unwrap();
    let hints = engine.load_kv_hints(&bytes(V1_0_DEMOTE)).unwrap();
    for m in [router.metadata(), admission.metadata(), hints.metadata()] {
        assert_eq!(m.wit_version, "1.0.0", "{m:?}");
    }
    assert!(!router.configurable() && !router.has_queue_key_at());
    assert!(!admission.configurable() && !admission.has_placement());
    assert!(!hints.configurable() && !hints.has_on_outcomes());

    // No parameters: fine. Any: refused, never silently ignored.
    let stats = || Arc::new(PolicyStats::default());
    let mut wasm = WasmKvHints::new(hints.clone(), stats());
    wasm.configure(Vec::new()).unwrap();
    let err = wasm
        .configure(params(&[("demote_threshold", "1s")]))
        .unwrap_err();
    assert!(matches!(err, PolicyError::Params(_)), "{err}");
    assert!(err.to_string().contains("takes no parameters"), "{err}");
    assert!(err.to_string().contains("demote_threshold"), "{err}");
    let mut wasm = WasmAdmission::new(admission, stats());
    assert!(wasm.configure(params(&[("sticky", "false")])).is_err());
    let mut wasm = WasmRouter::new(router, stats());
    assert!(wasm.configure(params(&[("x", "1")])).is_err());
}

/// `name`, loaded, passes the conformance suite and decides like the native `KvCost`.
fn decides_like_native_kv_cost(name: &str) -> WasmRouter {
    let component = crate::patient_engine().load_router(&bytes(name)).unwrap();
    let mut wasm = WasmRouter::new(component, Arc::new(PolicyStats::default()));
    crate::builtins::conforms(name, &mut wasm);
    for n in [1, 7, 64] {
        let candidates = crate::candidates(n);
        let ours = wasm.try_select(&kv_request(), &candidates).unwrap();
        let native = KvCost.select(&kv_request(), &candidates);
        assert_eq!(
            crate::builtins::cheapest(&ours),
            crate::builtins::cheapest(&native),
            "{name}"
        );
    }
    wasm
}

fn kv_request() -> PolicyRequest<'static> {
    PolicyRequest {
        tokens: 640,
        blocks: 40,
        block_size: 16,
        ..PolicyRequest::default()
    }
}

#[test]
fn a_v1_0_router_decides_as_before() {
    let mut wasm = decides_like_native_kv_cost(V1_0_KV_COST);
    // Without `queue-key-at` the queue keeps its own order, as for any 1.0 router.
    let request = kv_request();
    assert_eq!(wasm.try_queue_key_at(&request, Duration::ZERO), Ok(None));
    assert_eq!(wasm.queue_key_at(&request, Duration::ZERO), None);
}

#[test]
fn a_v1_1_router_decides_through_route() {
    let wasm = decides_like_native_kv_cost(V1_1_KV_COST);
    let component = wasm.component();
    assert_eq!(component.metadata().wit_version, "1.1.0");
    assert!(component.has_queue_key_at() && !component.has_route_packed());
    let current = decides_like_native_kv_cost("kv-cost");
    assert!(current.component().has_route_packed());
}

#[test]
fn a_v1_2_router_is_asked_through_route_packed() {
    use switchyard_policy_host::test_util::{self, Router, route};
    let both = Router {
        route: test_util::TRAP.into(),
        route_packed: Some(route::PICK_FIRST.into()),
        ..Router::default()
    };
    let component = crate::patient_engine().load_router(&both.bytes()).unwrap();
    assert!(component.has_route_packed());
    let mut wasm = WasmRouter::new(component, Arc::new(PolicyStats::default()));
    let candidates = crate::candidates(5);
    assert_eq!(
        wasm.try_select(&kv_request(), &candidates),
        Ok(switchyard_core::router::Selection::Pick(0)),
        "`route` traps: only `route-packed` answers"
    );
}

#[test]
fn a_v1_2_admission_component_is_asked_through_the_unpacked_calls() {
    let engine = crate::patient_engine();
    let old = engine.load_admission(&bytes(V1_2_THUNDER)).unwrap();
    assert_eq!(old.metadata().wit_version, "1.2.0");
    assert!(old.configurable() && old.has_placement() && !old.has_packed());
    let new = engine.load_admission(&bytes("thunder-agent")).unwrap();
    assert!(new.has_packed(), "the SDK exports the packed calls");
    // Both decide as the native policy on every path: the properties of `admission_builtins`
    // run the 1.2 build beside the built-ins.
}

#[test]
fn a_v1_0_admission_component_never_places() {
    use switchyard_core::admission::{AdmissionPolicy, AdmissionView};
    let component = crate::patient_engine()
        .load_admission(&bytes(V1_0_THUNDER))
        .unwrap();
    let mut wasm = WasmAdmission::new(component, Arc::new(PolicyStats::default()));
    let view = AdmissionView::default();
    assert_eq!(wasm.try_placement(&view, "s", Duration::ZERO), Ok(None));
    assert_eq!(wasm.placement(&view, "s", Duration::ZERO), None);
}

/// One session `s` on rank 0.1 calls a tool at 0 ms; then ticks at `ticks_ms`.
fn tool_call_scenario() -> (Vec<LifecycleEvent>, IndexState) {
    let rank = Rank::new(0, 1);
    let index = IndexState {
        residency: vec![SessionResidency {
            session_id: "s".into(),
            rank,
            device_blocks: 64,
            host_blocks: 0,
            disk_blocks: 0,
        }],
        // A device short of room (95% used): demote-on-tool-call's usage gate is open.
        usage: vec![RankUsage {
            rank,
            device_used_blocks: 950,
            device_capacity_blocks: 1_000,
            host_used_blocks: 0,
            host_capacity_blocks: 10_000,
        }],
    };
    let events = vec![LifecycleEvent {
        session_id: "s".into(),
        at: Duration::ZERO,
        kind: LifecycleKind::TurnEndWithToolCall {
            tool_name: Some("bash".into()),
            context_tokens: 1_024,
        },
    }];
    (events, index)
}

fn demote_outcome(outcome: Outcome) -> HintOutcome {
    HintOutcome {
        session_id: Some("s".into()),
        rank: Rank::new(0, 1),
        action: ActionType::Demote,
        outcome,
        blocks: 64,
    }
}

/// The hints of the tool-call scenario, with `outcomes` heard after the first call, from
/// `policy`: the call itself, then a tick when a 10 s tool is due back.
fn run(policy: &mut dyn KvHintPolicy, outcomes: &[HintOutcome]) -> Vec<Vec<KvHint>> {
    let (events, index) = tool_call_scenario();
    let first = policy.on_events(&events, &index, Duration::ZERO);
    policy.on_outcomes(outcomes, Duration::from_millis(5));
    let due = policy.on_events(&[], &index, Duration::from_millis(9_500));
    vec![first, due]
}

fn wasm_demote(params: Vec<(String, String)>) -> WasmKvHints {
    let component = crate::patient_engine()
        .load_kv_hints(&bytes("demote-on-tool-call"))
        .unwrap();
    assert!(component.configurable() && component.has_on_outcomes());
    let mut wasm = WasmKvHints::new(component, Arc::new(PolicyStats::default()));
    wasm.configure(params).unwrap();
    wasm
}

#[test]
fn a_v1_1_component_gets_its_parameters_and_they_change_its_decision() {
    // Defaults: an unseen tool is expected back in 1 s, under the 2 s threshold: no demote.
    let mut defaults = wasm_demote(Vec::new());
    assert_eq!(run(&mut defaults, &[]), vec![Vec::new(), Vec::new()]);
    // Expect unseen tools to take 10 s: demote now, prefetch 500 ms before it returns.
    let spec = "demote-on-tool-call:unseen_tool_time=10s";
    let (_, pairs) = split_params(spec);
    let mut configured = wasm_demote(pairs);
    let hints = run(&mut configured, &[]);
    assert!(
        matches!(
            hints[0][..],
            [KvHint {
                kind: HintKind::Demote(_),
                ..
            }]
        ),
        "{hints:?}"
    );
    assert!(
        matches!(
            hints[1][..],
            [KvHint {
                kind: HintKind::Prefetch(_),
                ..
            }]
        ),
        "{hints:?}"
    );
    // Exactly as the native strategy with the same spec.
    let mut native = native_kv_hints(spec).unwrap();
    assert_eq!(hints, run(&mut *native, &[]));
}

#[test]
fn a_v1_1_component_refuses_bad_parameters_with_its_reason() {
    let component = crate::patient_engine()
        .load_kv_hints(&bytes("demote-on-tool-call"))
        .unwrap();
    let mut wasm = WasmKvHints::new(component, Arc::new(PolicyStats::default()));
    for (pairs, says) in [
        (
            params(&[("demote_threshold", "soon")]),
            "demote_threshold=soon",
        ),
        (params(&[("speed", "2")]), "no parameter `speed`"),
        (params(&[("demote_to", "gpu")]), "host, disk or shared"),
    ] {
        let err = wasm.configure(pairs).unwrap_err();
        assert!(matches!(err, PolicyError::Params(_)), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[test]
fn a_v1_1_component_hears_what_became_of_its_hints() {
    let configured = || wasm_demote(params(&[("unseen_tool_time", "10s")]));
    let native = || native_kv_hints("demote-on-tool-call:unseen_tool_time=10s").unwrap();
    // No rank carried the demote out: the blocks never left, so no prefetch brings them back.
    let refused = [demote_outcome(Outcome::Rejected)];
    let hints = run(&mut configured(), &refused);
    assert!(hints[1].is_empty(), "{hints:?}");
    assert_eq!(hints, run(&mut *native(), &refused));
    // Accepted: the prefetch stays.
    let done = [demote_outcome(Outcome::Accepted)];
    let hints = run(&mut configured(), &done);
    assert_eq!(hints[1].len(), 1, "{hints:?}");
    assert_eq!(hints, run(&mut *native(), &done));
}

#[test]
fn the_registry_passes_spec_parameters_and_refuses_what_cannot_take_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("old-demote.wasm"), bytes(V1_0_DEMOTE)).unwrap();
    let registry = PolicyRegistry::new(
        crate::patient_engine(),
        Some(dir.path().to_path_buf()),
        switchyard_policy_artifacts::builtin(),
        "m",
    );
    // A 1.1 built-in with parameters, then a refused value: the first stays, the error names
    // the policy's reason.
    registry
        .load_named(Role::KvHints, "demote-on-tool-call:unseen_tool_time=10s")
        .unwrap();
    let err = registry
        .load_named(Role::KvHints, "demote-on-tool-call:unseen_tool_time=later")
        .unwrap_err();
    assert!(err.to_string().contains("unseen_tool_time"), "{err}");
    let info = registry.info(Role::KvHints).unwrap();
    assert_eq!(info.name, "demote-on-tool-call");
    assert!(info.load_error.is_some());
    // The 1.0 file loads without parameters and is refused with them.
    registry.load_named(Role::KvHints, "old-demote").unwrap();
    let err = registry
        .load_named(Role::KvHints, "old-demote:demote_threshold=1s")
        .unwrap_err();
    assert!(err.to_string().contains("takes no parameters"), "{err}");
    // Native policies take their spec the same way.
    registry
        .load_named(
            Role::KvHints,
            "native:demote-on-tool-call:demote_threshold=1s",
        )
        .unwrap();
    assert!(
        registry
            .load_named(Role::Admission, "native:thunder-agent:speed=2")
            .is_err()
    );
    registry
        .load_named(Role::Admission, "native:thunder-agent:sticky=false")
        .unwrap();
}

#[test]
fn spec_parameters_are_the_trailing_key_value_segments() {
    let own = |pairs: &[(&str, &str)]| params(pairs);
    assert_eq!(split_params("kv-cost"), ("kv-cost".into(), Vec::new()));
    assert_eq!(
        split_params("native:thunder-agent:sticky=false:acting_weight=0.5"),
        (
            "native:thunder-agent".into(),
            own(&[("sticky", "false"), ("acting_weight", "0.5")])
        )
    );
    assert_eq!(
        split_params("/p/x.wasm:a=1"),
        ("/p/x.wasm".into(), own(&[("a", "1")]))
    );
}
