//! The built-in admission guests (`thunder-agent`, `continuum`, `autellix`) through the real
//! host: on random sequences of ticks and arrivals they act exactly like their native twins,
//! every one loads and passes the canary, and their names resolve like the routers'.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{
    ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, Arrival, Continuum,
    ContinuumConfig, RankUtilization, SessionPhase, SessionView, native_admission,
};
use switchyard_core::router::PolicyRequest;
use switchyard_core::worker::Rank;
use switchyard_policy_host::{
    AdmissionComponent, PolicyRegistry, PolicySource, PolicyStats, Role, WasmAdmission,
};

/// The admission twins, by name.
const TWINS: [&str; 3] = ["thunder-agent", "continuum", "autellix"];

/// Tools the random sessions call: plain, unknown (`""`), and one with the column separator
/// and a quote, which must survive the extension column.
const TOOLS: [&str; 3] = ["bash", "", "mcp, \"search\""];

/// One call of a scenario: the view the host reports, and what it asks.
#[derive(Debug, Clone)]
struct Step {
    /// Milliseconds since the previous call.
    dt_ms: u64,
    sessions: Vec<SessionView>,
    /// `None`: a tick. `Some((i, waited_ms))`: an arrival for session `i` of the view (an id
    /// the view lacks when `i` is past its end).
    arrival: Option<(usize, u64)>,
}

/// Ranks with their capacities, then the calls.
#[derive(Debug, Clone)]
struct Scenario {
    workers: Vec<RankUtilization>,
    steps: Vec<Step>,
}

fn workers() -> impl Strategy<Value = Vec<RankUtilization>> {
    let rank = (
        prop::sample::select(vec![0u64, 60_000, 100_000, 100_000, 160_000]),
        prop::bool::weighted(0.9),
        0.0f32..1.0,
    );
    prop::collection::vec(rank, 1..5).prop_map(|ranks| {
        ranks
            .into_iter()
            .enumerate()
            .map(
                |(i, (kv_capacity_tokens, healthy, kv_usage))| RankUtilization {
                    // Two data-parallel ranks per server, so ranks differ in both fields.
                    rank: Rank::new(i as u32 / 2, i as u32 % 2),
                    kv_usage,
                    active_requests: i as u32,
                    queue_depth: 0,
                    healthy,
                    kv_capacity_tokens,
                },
            )
            .collect()
    })
}

/// Session `id` in any state, on one of three ranks (few, so programs share workers and press
/// on their capacity; a rank may be missing from a view with fewer workers). Durations are whole
/// milliseconds: the WIT carries milliseconds.
fn session(id: String) -> impl Strategy<Value = SessionView> {
    let phase = prop::sample::select(vec![
        SessionPhase::Queued,
        SessionPhase::Running,
        SessionPhase::ToolCall,
        SessionPhase::Paused,
        SessionPhase::Idle,
    ]);
    let requests = prop_oneof![3 => Just(0u32), 1 => 1u32..3];
    let paused_for = prop_oneof![
        2 => Just(0u64),
        1 => 0u64..1_800_000,
        1 => 1_799_000u64..1_900_000,
    ];
    // One common tool, so it is seen often enough (`min_samples`) for its TTL to be learnt.
    let tool = prop::option::weighted(
        0.8,
        prop_oneof![6 => Just(TOOLS[0]), 1 => Just(TOOLS[1]), 1 => Just(TOOLS[2])],
    );
    // Short tool calls and long ones: the learnt p90 (~50 s) lands well away from the 30 s
    // default TTL, so learning changes answers.
    let idle = prop_oneof![0u64..10_000, 20_000u64..60_000];
    (
        (phase, requests.clone(), requests, 0u64..150_000, -3i32..4),
        (idle, 0u64..600_000, prop::option::weighted(0.85, 0u32..3)),
        (prop::bool::ANY, paused_for, 0u64..300_000, tool),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            move |(
                (phase, active, queued, tokens, priority),
                (idle, age, rank),
                (paused, paused_for, service, tool),
                child,
            )| SessionView {
                session_id: id.clone(),
                parent_session_id: child.then(|| "s0".to_string()),
                phase,
                priority,
                active_requests: active,
                queued_requests: queued,
                context_tokens: tokens,
                age: Duration::from_millis(age),
                idle: Duration::from_millis(idle),
                rank: rank.map(|r| Rank::new(r / 2, r % 2)),
                paused,
                paused_for: Duration::from_millis(paused_for),
                service: Duration::from_millis(service),
                tool: tool.map(str::to_string),
            },
        )
}

/// A view of up to 8 sessions drawn from ids `s0..s7`, so sessions come, stay and go between
/// calls (state about them is kept, renewed and forgotten).
fn sessions() -> impl Strategy<Value = Vec<SessionView>> {
    let slots: Vec<_> = (0..8)
        .map(|i| prop::option::weighted(0.75, session(format!("s{i}"))))
        .collect();
    slots.prop_map(|slots| slots.into_iter().flatten().collect())
}

fn step() -> impl Strategy<Value = Step> {
    let arrival = prop::option::weighted(
        0.6,
        (0usize..9, prop_oneof![3 => Just(0u64), 1 => 1u64..20_000]),
    );
    (
        // Often whole quarter seconds, so times meet exactly (a demotion lapsing on the tick
        // it is due), as with a real tick interval.
        prop_oneof![Just(0u64), (1u64..48).prop_map(|q| q * 250), 1u64..12_000],
        sessions(),
        arrival,
    )
        .prop_map(|(dt_ms, sessions, arrival)| Step {
            dt_ms,
            sessions,
            arrival,
        })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (workers(), prop::collection::vec(step(), 1..60))
        .prop_map(|(workers, steps)| Scenario { workers, steps })
}

thread_local! {
    /// Each twin compiled once per test thread; every scenario gets a fresh instance.
    static COMPONENTS: std::cell::RefCell<BTreeMap<&'static str, AdmissionComponent>> =
        const { std::cell::RefCell::new(BTreeMap::new()) };
}

fn component(name: &'static str) -> AdmissionComponent {
    COMPONENTS.with_borrow_mut(|components| {
        components
            .entry(name)
            .or_insert_with(|| {
                let bytes = crate::compat::bytes(name);
                crate::patient_engine().load_admission(&bytes).unwrap()
            })
            .clone()
    })
}

/// Run `scenario` through a fresh Wasm instance of `name` and its fresh native twin; the
/// actions of every call, or the first call where they differ.
fn run_both(name: &'static str, scenario: &Scenario) -> Result<Vec<Vec<AdmissionAction>>, String> {
    let mut wasm = WasmAdmission::new(component(name), Arc::new(PolicyStats::default()));
    let mut native = native_admission(crate::compat::native_name(name)).unwrap();
    let mut now = Duration::ZERO;
    let mut answers = Vec::new();
    for (i, step) in scenario.steps.iter().enumerate() {
        now += Duration::from_millis(step.dt_ms);
        let view = AdmissionView {
            sessions: step.sessions.clone(),
            workers: scenario.workers.clone(),
        };
        let (from_wasm, from_native) = match step.arrival {
            None => (wasm.try_tick(&view, now), native.tick(&view, now)),
            Some((who, waited_ms)) => {
                let id = step
                    .sessions
                    .get(who)
                    .map_or("unknown", |s| s.session_id.as_str());
                let arrival = Arrival {
                    request: PolicyRequest {
                        tokens: 512,
                        blocks: 32,
                        block_size: 16,
                        session_id: Some(id),
                        ..PolicyRequest::default()
                    },
                    waited: Duration::from_millis(waited_ms),
                };
                (
                    wasm.try_arrival(&view, &arrival, now),
                    native.arrival(&view, &arrival, now),
                )
            }
        };
        let from_wasm = from_wasm.map_err(|e| format!("{name} step {i}: guest failed: {e}"))?;
        if from_wasm != from_native {
            return Err(format!(
                "{name} step {i} ({:?}): wasm {from_wasm:?} native {from_native:?}",
                step.arrival
            ));
        }
        // Where each program would run if admitted now (WIT 1.1 `placement`; a 1.0 component
        // never places, see `compat`).
        let places = component(name).has_placement();
        for session in step.sessions.iter().filter(|_| places) {
            let id = session.session_id.as_str();
            let placed = wasm
                .try_placement(&view, id, now)
                .map_err(|e| format!("{name} step {i}: placement failed: {e}"))?;
            let native_placed = native.placement(&view, id, now);
            if placed != native_placed {
                return Err(format!(
                    "{name} step {i}: {id} placed on {placed:?} by wasm, {native_placed:?} natively"
                ));
            }
        }
        answers.push(from_wasm);
    }
    Ok(answers)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn wasm_twins_act_exactly_like_the_native_policies(scenario in scenario()) {
        let fixtures = [crate::compat::V1_0_THUNDER, crate::compat::V1_2_THUNDER];
        for name in TWINS.into_iter().chain(fixtures) {
            if let Err(diff) = run_both(name, &scenario) {
                return Err(TestCaseError::fail(diff));
            }
        }
    }
}

/// The property above is only as good as its inputs: on a fixed sample of scenarios every
/// stateful path of every twin must be taken (pauses and resumes, demotions lifted, boosts
/// taken back, holds, answers that only a learnt TTL explains, priority levels moved both
/// ways).
#[test]
fn the_random_scenarios_reach_every_stateful_path() {
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut decided_by_learning_total = 0;
    for _ in 0..48 {
        let scenario = scenario().new_tree(&mut runner).unwrap().current();
        for name in TWINS {
            let answers = run_both(name, &scenario).unwrap();
            for action in answers.iter().flatten() {
                let kind = match &action.kind {
                    ActionKind::Hold(_) => "hold".to_string(),
                    ActionKind::AdjustPriority(d) if name == "autellix" => {
                        format!("adjust {}", if *d < 0 { "down" } else { "up" })
                    }
                    other => format!("{other:?}"),
                };
                *seen.entry((name, kind)).or_default() += 1;
            }
        }
        decided_by_learning_total += decided_by_learning(&scenario);
    }
    let expected = [
        ("thunder-agent", "Pause"),
        ("thunder-agent", "Resume"),
        ("thunder-agent", "AdjustPriority(-2)"),
        ("thunder-agent", "AdjustPriority(2)"),
        ("thunder-agent", "AdjustPriority(1)"),
        ("thunder-agent", "AdjustPriority(-1)"),
        ("continuum", "hold"),
        ("autellix", "adjust down"),
        ("autellix", "adjust up"),
    ];
    for (name, kind) in expected {
        assert!(
            seen.contains_key(&(name, kind.to_string())),
            "{name} never answered {kind}: {seen:?}"
        );
    }
    assert!(
        decided_by_learning_total >= 3,
        "learnt TTLs changed only {decided_by_learning_total} answers"
    );
}

/// Calls of `scenario` where what the native Continuum learnt changed its answer: its actions
/// against those of one that never trusts a learnt TTL (`min_samples` unreachable).
fn decided_by_learning(scenario: &Scenario) -> usize {
    let mut learning = Continuum::new(ContinuumConfig::default());
    let mut forgetful = Continuum::new(ContinuumConfig {
        min_samples: usize::MAX,
        ..ContinuumConfig::default()
    });
    let mut now = Duration::ZERO;
    let mut decided = 0;
    for step in &scenario.steps {
        now += Duration::from_millis(step.dt_ms);
        let view = AdmissionView {
            sessions: step.sessions.clone(),
            workers: scenario.workers.clone(),
        };
        if let Some((who, waited_ms)) = step.arrival
            && let Some(s) = step.sessions.get(who)
        {
            let arrival = Arrival {
                request: PolicyRequest {
                    session_id: Some(&s.session_id),
                    ..PolicyRequest::default()
                },
                waited: Duration::from_millis(waited_ms),
            };
            let answer = learning.arrival(&view, &arrival, now);
            decided += usize::from(answer != forgetful.arrival(&view, &arrival, now));
        }
    }
    decided
}

/// Every admission built-in loads under its own name through the registry's checks (world,
/// metadata, canary).
#[test]
fn every_admission_builtin_loads_and_passes_the_canary() {
    let builtins = switchyard_policy_artifacts::builtin_for("admission");
    assert_eq!(builtins.iter().map(|(n, _)| *n).collect::<Vec<_>>(), TWINS);
    let registry = PolicyRegistry::new(crate::patient_engine(), None, builtins, "m");
    for (name, bytes) in builtins {
        let info = registry.load_named(Role::Admission, name).unwrap();
        assert_eq!(
            (info.name.as_str(), info.world.as_str()),
            (*name, "admission")
        );
        assert_eq!(info.source, format!("builtin:{name}"));
        let metadata = crate::patient_engine()
            .load_admission(bytes)
            .unwrap()
            .metadata()
            .clone();
        assert_eq!(metadata.wit_version, "1.3.0", "{name}");
    }
}

/// As for routers: a bare name picks the built-in component, `native:<name>` the native twin,
/// and without built-ins the bare name falls back to the native twin; a file written to the
/// policy directory later replaces the built-in (the name is watched).
#[test]
fn admission_names_resolve_like_router_names() {
    let dir = tempfile::tempdir().unwrap();
    let registry = PolicyRegistry::new(
        crate::patient_engine(),
        Some(dir.path().into()),
        switchyard_policy_artifacts::builtin(),
        "m",
    );
    assert_eq!(
        registry
            .resolve_for(Role::Admission, "thunder-agent")
            .unwrap(),
        PolicySource::Builtin("thunder-agent".into())
    );
    assert_eq!(
        registry
            .resolve_for(Role::Admission, "native:thunder-agent")
            .unwrap(),
        PolicySource::Native("thunder-agent".into())
    );
    let info = registry.load_named(Role::Admission, "continuum").unwrap();
    assert_eq!(info.source, "builtin:continuum");
    // The handle the gateway calls answers through the component.
    let mut handle = registry.admission();
    handle.tick(&AdmissionView::default(), Duration::ZERO);
    let stats = registry.info(Role::Admission).unwrap().stats;
    assert_eq!((stats.calls, stats.fallbacks_total()), (1, 0));
    let info = registry
        .load_named(Role::Admission, "native:continuum")
        .unwrap();
    assert_eq!(info.source, "native:continuum");

    let bare = PolicyRegistry::new(crate::patient_engine(), None, &[], "m");
    let info = bare.load_named(Role::Admission, "autellix").unwrap();
    assert_eq!(
        (info.source.as_str(), info.version.as_str()),
        ("native:autellix", "native")
    );
    // A router's name is not an admission policy, and the other way round.
    assert!(registry.load_named(Role::Admission, "kv-cost").is_err());
    assert!(registry.load_named(Role::Router, "thunder-agent").is_err());
}

/// The registry's handle asks for the admission view only when the active policy reads it:
/// admitting everything (`none`) spares the gateway a view of every program per arrival.
#[test]
fn the_handle_wants_the_view_only_when_the_active_policy_reads_it() {
    let registry = PolicyRegistry::new(
        crate::patient_engine(),
        None,
        switchyard_policy_artifacts::builtin(),
        "m",
    );
    let handle = registry.admission();
    for (spec, reads) in [
        ("none", false),
        ("thunder-agent", true),
        ("native:thunder-agent", true),
        ("continuum", true),
    ] {
        let info = registry.load_named(Role::Admission, spec).unwrap();
        assert_eq!(handle.reads_view(), reads, "{spec} ({})", info.source);
    }
}

/// Through the registry's handle, the component (WIT 1.1 `placement`) keeps a program on its
/// worker as `native:thunder-agent` does; configured `sticky=false`, neither does.
#[test]
fn the_component_places_programs_as_the_native_twin_does() {
    let registry = PolicyRegistry::new(
        crate::patient_engine(),
        None,
        switchyard_policy_artifacts::builtin(),
        "m",
    );
    let view = AdmissionView {
        sessions: vec![SessionView {
            session_id: "p".into(),
            parent_session_id: None,
            phase: SessionPhase::Queued,
            priority: 0,
            active_requests: 0,
            queued_requests: 1,
            context_tokens: 1_000,
            age: Duration::from_secs(60),
            idle: Duration::ZERO,
            rank: Some(Rank::new(1, 0)),
            paused: false,
            paused_for: Duration::ZERO,
            service: Duration::ZERO,
            tool: None,
        }],
        workers: (0..2)
            .map(|w| RankUtilization {
                rank: Rank::new(w, 0),
                kv_usage: 0.0,
                active_requests: 0,
                queue_depth: 0,
                healthy: true,
                kv_capacity_tokens: 100_000,
            })
            .collect(),
    };
    let mut handle = registry.admission();
    for (spec, placed) in [
        ("native:thunder-agent", Some(Rank::new(1, 0))),
        ("thunder-agent", Some(Rank::new(1, 0))),
        ("native:thunder-agent:sticky=false", None),
        ("thunder-agent:sticky=false", None),
    ] {
        let info = registry.load_named(Role::Admission, spec).unwrap();
        assert_eq!(
            handle.placement(&view, "p", Duration::ZERO),
            placed,
            "{spec} ({})",
            info.source
        );
    }
    // The component's own parameter check names the key.
    let err = registry
        .load_named(Role::Admission, "thunder-agent:stickiness=1")
        .unwrap_err();
    assert!(err.to_string().contains("stickiness"), "{err}");
}
