//! The built-in KV-hint guests (`demote-on-tool-call`, `subagent-reclaim`, `share-to-subagent`)
//! through the real host: on random sequences of events and ticks they hint exactly like their
//! native twins, tool results (which reach a WIT 1.0 guest only as extension columns) included;
//! every one loads and passes the canary, and their names resolve like the other worlds'.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::kv_hints::{
    HintKind, IndexState, KvHint, KvHintPolicy, LifecycleEvent, LifecycleKind, RankUsage,
    SessionResidency, native_kv_hints,
};
use switchyard_core::worker::Rank;
use switchyard_policy_host::{
    KvHintsComponent, PolicyRegistry, PolicySource, PolicyStats, Role, WasmKvHints,
};

/// The KV-hint twins, by name.
const TWINS: [&str; 3] = [
    "demote-on-tool-call",
    "subagent-reclaim",
    "share-to-subagent",
];

/// Sessions of the random scenarios: few, so they spawn, end and come back often.
const SESSIONS: usize = 6;

/// Tools the random sessions call: plain, empty-named, one with the column separator and a
/// quote (which must survive the extension column), and unnamed calls.
const TOOLS: [Option<&str>; 4] = [Some("bash"), Some(""), Some("mcp, \"search\""), None];

fn session(i: usize) -> String {
    // One id holds the column separator too.
    if i == 5 {
        "s,5".to_string()
    } else {
        format!("s{i}")
    }
}

/// One call: milliseconds since the previous one, the events (empty: a tick), which sessions
/// the index holds, and the rank's device usage (used, capacity) in blocks.
#[derive(Debug, Clone)]
struct Step {
    dt_ms: u64,
    events: Vec<(usize, u64, LifecycleKind)>,
    resident: Vec<bool>,
    device: (u64, u64),
}

fn tool() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        5 => Just(TOOLS[0]),
        1 => Just(TOOLS[1]),
        1 => Just(TOOLS[2]),
        1 => Just(TOOLS[3]),
    ]
    .prop_map(|t| t.map(str::to_string))
}

/// Any event kind; tool calls and results most often. Waits are short or long, so tools are
/// learnt on either side of the demotion threshold.
fn kind() -> impl Strategy<Value = LifecycleKind> {
    let waited = prop_oneof![0u64..1_500, 2_500u64..40_000].prop_map(Duration::from_millis);
    let child = (0..SESSIONS).prop_map(session);
    prop_oneof![
        4 => (tool(), 0u64..100_000).prop_map(|(tool_name, context_tokens)| {
            LifecycleKind::TurnEndWithToolCall { tool_name, context_tokens }
        }),
        4 => (tool(), waited).prop_map(|(tool_name, waited)| {
            LifecycleKind::ToolResult { tool_name, waited }
        }),
        2 => child.clone().prop_map(LifecycleKind::SubagentSpawn),
        2 => child.prop_map(LifecycleKind::SubagentEnd),
        1 => (0u64..100_000, 0u64..10_000).prop_map(|(tokens_before, tokens_after)| {
            LifecycleKind::Compaction { tokens_before, tokens_after }
        }),
        1 => (0u64..200_000).prop_map(|at_token| LifecycleKind::ThinkingStart { at_token }),
        1 => (0u64..200_000, 0u32..4_000)
            .prop_map(|(at_token, tokens)| LifecycleKind::ThinkingEnd { at_token, tokens }),
        2 => Just(LifecycleKind::SessionEnd),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    // Half the calls are ticks; an event happened up to 300 ms before the call.
    let events = prop_oneof![
        1 => Just(Vec::new()),
        1 => prop::collection::vec((0..SESSIONS, 0u64..300, kind()), 1..5),
    ];
    (
        // Often the host's 100 ms tick, so a prefetch falls due exactly on a call.
        prop_oneof![
            3 => Just(100u64),
            1 => Just(0u64),
            1 => 1u64..3_000,
            1 => (1u64..40).prop_map(|q| q * 500),
        ],
        events,
        prop::collection::vec(prop::bool::weighted(0.85), SESSIONS),
        // demote-on-tool-call's usage gate (0.9 by default): at it, on either side, unknown.
        prop_oneof![
            2 => Just((900u64, 1_000u64)),
            2 => (850u64..=1_000).prop_map(|used| (used, 1_000)),
            2 => (0u64..850).prop_map(|used| (used, 1_000)),
            1 => Just((0, 0)),
        ],
    )
        .prop_map(|(dt_ms, events, resident, device)| Step {
            dt_ms,
            events,
            resident,
            device,
        })
}

fn scenario() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..80)
}

/// The call of `step` at `now`: its events and index.
fn inputs(step: &Step, now: Duration) -> (Vec<LifecycleEvent>, IndexState) {
    let events = step
        .events
        .iter()
        .map(|(who, ago_ms, kind)| LifecycleEvent {
            session_id: session(*who),
            at: now.saturating_sub(Duration::from_millis(*ago_ms)),
            kind: kind.clone(),
        })
        .collect();
    let rank = Rank::new(0, 1);
    let index = IndexState {
        residency: (0..SESSIONS)
            .filter(|i| step.resident[*i])
            .map(|i| SessionResidency {
                session_id: session(i),
                rank,
                device_blocks: 100 * i as u32,
                host_blocks: 10,
                disk_blocks: 0,
            })
            .collect(),
        usage: vec![RankUsage {
            rank,
            device_used_blocks: step.device.0,
            device_capacity_blocks: step.device.1,
            host_used_blocks: 100,
            host_capacity_blocks: 10_000,
        }],
    };
    (events, index)
}

thread_local! {
    /// Each twin compiled once per test thread; every scenario gets a fresh instance.
    static COMPONENTS: std::cell::RefCell<BTreeMap<&'static str, KvHintsComponent>> =
        const { std::cell::RefCell::new(BTreeMap::new()) };
}

fn component(name: &'static str) -> KvHintsComponent {
    COMPONENTS.with_borrow_mut(|components| {
        components
            .entry(name)
            .or_insert_with(|| {
                let bytes = crate::compat::bytes(name);
                crate::patient_engine().load_kv_hints(&bytes).unwrap()
            })
            .clone()
    })
}

/// Run `steps` through a fresh Wasm instance of `name` and its fresh native twin; the hints of
/// every call, or the first call where they differ.
fn run_both(name: &'static str, steps: &[Step]) -> Result<Vec<Vec<KvHint>>, String> {
    let mut wasm = WasmKvHints::new(component(name), Arc::new(PolicyStats::default()));
    let mut native = if name == crate::compat::V1_0_DEMOTE {
        // The frozen 1.0 build predates the usage gate: the native twin with the gate off.
        native_kv_hints("demote-on-tool-call:demote_above_usage=0").unwrap()
    } else {
        native_kv_hints(crate::compat::native_name(name)).unwrap()
    };
    let mut now = Duration::ZERO;
    let mut answers = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        now += Duration::from_millis(step.dt_ms);
        let (events, index) = inputs(step, now);
        let from_wasm = wasm
            .try_on_events(&events, &index, now)
            .map_err(|e| format!("{name} step {i}: guest failed: {e}"))?;
        let from_native = native.on_events(&events, &index, now);
        if from_wasm != from_native {
            return Err(format!(
                "{name} step {i} at {now:?} ({events:?}): wasm {from_wasm:?} native {from_native:?}"
            ));
        }
        answers.push(from_wasm);
    }
    Ok(answers)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn wasm_twins_hint_exactly_like_the_native_strategies(steps in scenario()) {
        // The 1.0 build of demote-on-tool-call too: on a 1.1 host it hints as it always did.
        for name in TWINS.into_iter().chain([crate::compat::V1_0_DEMOTE]) {
            if let Err(diff) = run_both(name, &steps) {
                return Err(TestCaseError::fail(diff));
            }
        }
    }
}

/// The property above is only as good as its inputs: on a fixed sample of scenarios every twin
/// gives every hint it can (demotions, prefetches, shares, evictions, a parent's deferred
/// eviction), and tool results, which a WIT 1.0 guest sees only through the extension
/// columns, change the answers of demote-on-tool-call.
#[test]
fn the_random_scenarios_reach_every_hint_and_tool_results_matter() {
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut decided_by_tool_results = 0;
    let mut decided_by_usage = 0;
    for _ in 0..48 {
        let steps = scenario().new_tree(&mut runner).unwrap().current();
        for name in TWINS {
            let answers = run_both(name, &steps).unwrap();
            for (step, hints) in steps.iter().zip(&answers) {
                for hint in hints {
                    let kind = match &hint.kind {
                        HintKind::Share(_) => "share".to_string(),
                        // An eviction of a session no event of the call names: deferred.
                        HintKind::Evict
                            if !step
                                .events
                                .iter()
                                .any(|(who, ..)| session(*who) == hint.session_id) =>
                        {
                            "deferred evict".to_string()
                        }
                        other => format!("{other:?}"),
                    };
                    *seen.entry((name, kind)).or_default() += 1;
                }
            }
        }
        decided_by_tool_results += answers_changed_without_tool_results(&steps);
        decided_by_usage += answers_changed_by_a_full_device(&steps);
    }
    let expected = [
        ("demote-on-tool-call", "Demote(Host)"),
        ("demote-on-tool-call", "Prefetch(Device)"),
        ("demote-on-tool-call", "Evict"),
        ("subagent-reclaim", "Evict"),
        ("share-to-subagent", "share"),
        ("share-to-subagent", "Evict"),
        ("share-to-subagent", "deferred evict"),
    ];
    for (name, kind) in expected {
        assert!(
            seen.contains_key(&(name, kind.to_string())),
            "{name} never answered {kind}: {seen:?}"
        );
    }
    assert!(
        decided_by_tool_results >= 10,
        "tool results changed only {decided_by_tool_results} answers"
    );
    assert!(
        decided_by_usage >= 10,
        "the device usage changed only {decided_by_usage} answers"
    );
}

/// Calls of `steps` where the native demote-on-tool-call answers differently once every rank
/// is full (its usage gate open on every call).
fn answers_changed_by_a_full_device(steps: &[Step]) -> usize {
    let mut as_is = native_kv_hints("demote-on-tool-call").unwrap();
    let mut full = native_kv_hints("demote-on-tool-call").unwrap();
    let mut now = Duration::ZERO;
    let mut changed = 0;
    for step in steps {
        now += Duration::from_millis(step.dt_ms);
        let (events, index) = inputs(step, now);
        let mut full_index = index.clone();
        for usage in &mut full_index.usage {
            usage.device_used_blocks = usage.device_capacity_blocks;
        }
        let answer = as_is.on_events(&events, &index, now);
        changed += usize::from(answer != full.on_events(&events, &full_index, now));
    }
    changed
}

/// Calls of `steps` where the native demote-on-tool-call answers differently once the tool
/// results are taken out of the events.
fn answers_changed_without_tool_results(steps: &[Step]) -> usize {
    let mut with = native_kv_hints("demote-on-tool-call").unwrap();
    let mut without = native_kv_hints("demote-on-tool-call").unwrap();
    let mut now = Duration::ZERO;
    let mut changed = 0;
    for step in steps {
        now += Duration::from_millis(step.dt_ms);
        let (events, index) = inputs(step, now);
        let mut blind = events.clone();
        blind.retain(|e| !matches!(e.kind, LifecycleKind::ToolResult { .. }));
        let answer = with.on_events(&events, &index, now);
        changed += usize::from(answer != without.on_events(&blind, &index, now));
    }
    changed
}

/// Every KV-hint built-in loads under its own name through the registry's checks (world,
/// metadata, canary, which sends a tool result too).
#[test]
fn every_kv_hints_builtin_loads_and_passes_the_canary() {
    let builtins = switchyard_policy_artifacts::builtin_for("kv-hints");
    assert_eq!(builtins.iter().map(|(n, _)| *n).collect::<Vec<_>>(), TWINS);
    let registry = PolicyRegistry::new(crate::patient_engine(), None, builtins, "m");
    for (name, bytes) in builtins {
        let info = registry.load_named(Role::KvHints, name).unwrap();
        assert_eq!(
            (info.name.as_str(), info.world.as_str()),
            (*name, "kv-hints")
        );
        assert_eq!(info.source, format!("builtin:{name}"));
        let metadata = crate::patient_engine()
            .load_kv_hints(bytes)
            .unwrap()
            .metadata()
            .clone();
        assert_eq!(metadata.wit_version, "1.3.0", "{name}");
    }
}

/// As for the other worlds: a bare name picks the built-in component (answered by the native
/// twin when it cannot), `native:<name>` the native twin, and without built-ins the bare name
/// is the native twin.
#[test]
fn kv_hints_names_resolve_like_admission_names() {
    let registry = PolicyRegistry::new(
        crate::patient_engine(),
        None,
        switchyard_policy_artifacts::builtin(),
        "m",
    );
    assert_eq!(
        registry
            .resolve_for(Role::KvHints, "demote-on-tool-call")
            .unwrap(),
        PolicySource::Builtin("demote-on-tool-call".into())
    );
    assert_eq!(
        registry
            .resolve_for(Role::KvHints, "native:demote-on-tool-call")
            .unwrap(),
        PolicySource::Native("demote-on-tool-call".into())
    );
    let info = registry
        .load_named(Role::KvHints, "share-to-subagent")
        .unwrap();
    assert_eq!(info.source, "builtin:share-to-subagent");
    // The handle the gateway calls answers through the component.
    let mut handle = registry.kv_hints();
    let spawn = [LifecycleEvent {
        session_id: "p".into(),
        at: Duration::from_millis(5),
        kind: LifecycleKind::SubagentSpawn("c".into()),
    }];
    assert_eq!(
        handle.on_events(&spawn, &IndexState::default(), Duration::from_millis(5)),
        [KvHint::new("p", HintKind::Share("c".into()))]
    );
    let stats = registry.info(Role::KvHints).unwrap().stats;
    assert_eq!((stats.calls, stats.fallbacks_total()), (1, 0));
    let info = registry
        .load_named(Role::KvHints, "native:compaction-evict")
        .unwrap();
    assert_eq!(info.source, "native:compaction-evict");

    let bare = PolicyRegistry::new(crate::patient_engine(), None, &[], "m");
    let info = bare.load_named(Role::KvHints, "subagent-reclaim").unwrap();
    assert_eq!(
        (info.source.as_str(), info.version.as_str()),
        ("native:subagent-reclaim", "native")
    );
    // An admission policy's name is not a KV-hint policy, and the other way round.
    assert!(registry.load_named(Role::KvHints, "thunder-agent").is_err());
    assert!(
        registry
            .load_named(Role::Admission, "demote-on-tool-call")
            .is_err()
    );
}
