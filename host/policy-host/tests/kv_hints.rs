//! The `kv-hints` world through the host: loading, a fixed answer, containment with fallback,
//! tool results as extension columns; the built-in strategies in [`builtins`].

mod builtins;

use crate::{assert_wrong_world, engine, ms};
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::kv_hints::{
    HintKind, IndexState, KvHint, KvHintPolicy, LifecycleEvent, LifecycleKind, RankUsage,
    SessionResidency,
};
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::worlds::{
    Admission, KV_HINTS_META, KvHints, POISON_NOW_MS, fixed_hints, when_late,
};
use switchyard_policy_host::test_util::{Meta, Router, SPIN, TRAP};
use switchyard_policy_host::{PolicyError, PolicyStats, WasmKvHints};

/// A native fallback whose answer cannot be mistaken for the guest's.
#[derive(Debug)]
struct RetainEveryone;

impl KvHintPolicy for RetainEveryone {
    fn name(&self) -> &str {
        "retain-everyone"
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        _index: &IndexState,
        _now: Duration,
    ) -> Vec<KvHint> {
        events
            .iter()
            .map(|e| KvHint::new(e.session_id.clone(), HintKind::Retain))
            .collect()
    }
}

pub(crate) fn events() -> Vec<LifecycleEvent> {
    vec![
        LifecycleEvent {
            session_id: "s1".into(),
            at: Duration::from_millis(3),
            kind: LifecycleKind::TurnEndWithToolCall {
                tool_name: Some("bash".into()),
                context_tokens: 30_000,
            },
        },
        LifecycleEvent {
            session_id: "s1".into(),
            at: Duration::from_millis(4),
            kind: LifecycleKind::SubagentSpawn("s2".into()),
        },
    ]
}

pub(crate) fn index(rank: Rank) -> IndexState {
    IndexState {
        residency: vec![SessionResidency {
            session_id: "s1".into(),
            rank,
            device_blocks: 1800,
            host_blocks: 100,
            disk_blocks: 0,
        }],
        usage: vec![RankUsage {
            rank,
            device_used_blocks: 9_000,
            device_capacity_blocks: 10_000,
            host_used_blocks: 100,
            host_capacity_blocks: 50_000,
        }],
    }
}

fn retained() -> Vec<KvHint> {
    vec![
        KvHint::new("s1", HintKind::Retain),
        KvHint::new("s1", HintKind::Retain),
    ]
}

fn wasm_kv_hints(component: &KvHints<'_>) -> WasmKvHints {
    let loaded = engine().load_kv_hints(&component.bytes()).unwrap();
    WasmKvHints::with_fallback(
        loaded,
        Arc::new(PolicyStats::default()),
        Box::new(RetainEveryone),
    )
}

#[test]
fn a_good_component_answers_its_fixed_hints() {
    let mut policy = wasm_kv_hints(&KvHints::default());
    assert_eq!(policy.name(), "test-kv-hints");
    let here = index(Rank::new(0, 0));
    assert_eq!(policy.on_events(&events(), &here, ms(5)), fixed_hints());
    assert_eq!(policy.stats().snapshot().fallbacks_total(), 0);
}

#[test]
fn hints_for_unknown_ranks_or_sessions_are_bad_output() {
    let mut policy = wasm_kv_hints(&KvHints::default());
    // The fixture targets rank 0.0, which this index does not list.
    let elsewhere = index(Rank::new(3, 1));
    assert_eq!(policy.on_events(&events(), &elsewhere, ms(5)), retained());
    // Without the spawn event, `s2` (shared with) is unknown.
    let here = index(Rank::new(0, 0));
    let err = policy
        .try_on_events(&events()[..1], &here, ms(6))
        .unwrap_err();
    assert!(
        matches!(&err, PolicyError::BadOutput(m) if m.contains("s2")),
        "{err}"
    );
    assert_eq!(
        policy.stats().snapshot().fallbacks.get("bad_output"),
        Some(&1)
    );
}

fn contained(body: &str, reason: &str) {
    let mut policy = wasm_kv_hints(&KvHints {
        on_events: when_late(body),
        ..KvHints::default()
    });
    let here = index(Rank::new(0, 0));
    assert_eq!(policy.on_events(&events(), &here, ms(1)), fixed_hints());
    assert_eq!(
        policy.on_events(&events(), &here, ms(POISON_NOW_MS)),
        retained()
    );
    assert_eq!(policy.on_events(&events(), &here, ms(20)), fixed_hints());
    let stats = policy.stats().snapshot();
    assert_eq!(stats.calls, 3);
    assert_eq!(stats.fallbacks.get(reason), Some(&1), "{stats:?}");
}

#[test]
fn a_trap_falls_back_and_the_guest_recovers() {
    contained(TRAP, "trap");
}

#[test]
fn an_infinite_loop_hits_the_deadline() {
    contained(SPIN, "deadline");
}

#[test]
fn another_world_is_rejected_at_load() {
    let engine = engine();
    assert_wrong_world(engine.load_kv_hints(&Router::default().bytes()), "router");
    assert_wrong_world(
        engine.load_kv_hints(&Admission::default().bytes()),
        "admission",
    );
    assert_wrong_world(engine.load_router(&KvHints::default().bytes()), "kv-hints");
    let claims_admission = KvHints {
        meta: Meta {
            world: "admission",
            ..KV_HINTS_META
        },
        ..KvHints::default()
    };
    assert_wrong_world(engine.load_kv_hints(&claims_admission.bytes()), "metadata");
}
