//! The `admission` world through the host: loading, a fixed answer, containment with fallback.

use crate::{assert_wrong_world, engine, ms};
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{
    ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, Arrival, RankUtilization,
    SessionPhase, SessionView,
};
use switchyard_core::router::PolicyRequest;
use switchyard_core::worker::Rank;
use switchyard_policy_host::test_util::worlds::{
    ADMISSION_META, Admission, KvHints, POISON_NOW_MS, fixed_actions, when_late,
};
use switchyard_policy_host::test_util::{Meta, Router, SPIN, TRAP};
use switchyard_policy_host::{PolicyError, PolicyStats, WasmAdmission};

/// A native fallback whose answer cannot be mistaken for the guest's.
#[derive(Debug)]
struct ResumeAll;

impl AdmissionPolicy for ResumeAll {
    fn name(&self) -> &str {
        "resume-all"
    }

    fn tick(&mut self, view: &AdmissionView, _now: Duration) -> Vec<AdmissionAction> {
        view.sessions
            .iter()
            .map(|s| AdmissionAction::new(s.session_id.clone(), ActionKind::Resume))
            .collect()
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        _arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction> {
        self.tick(view, now)
    }
}

fn session(id: &str) -> SessionView {
    SessionView {
        session_id: id.into(),
        parent_session_id: None,
        phase: SessionPhase::ToolCall,
        priority: 0,
        active_requests: 0,
        queued_requests: 1,
        context_tokens: 30_000,
        age: Duration::from_secs(60),
        idle: Duration::from_secs(2),
        rank: None,
        paused: false,
        paused_for: Duration::ZERO,
        service: Duration::ZERO,
        tool: None,
    }
}

pub(crate) fn view(ids: &[&str]) -> AdmissionView {
    AdmissionView {
        sessions: ids.iter().map(|id| session(id)).collect(),
        workers: vec![RankUtilization {
            rank: Rank::new(0, 0),
            kv_usage: 0.96,
            active_requests: 12,
            queue_depth: 3,
            healthy: true,
            kv_capacity_tokens: 0,
        }],
    }
}

fn resumed(ids: &[&str]) -> Vec<AdmissionAction> {
    ids.iter()
        .map(|id| AdmissionAction::new(*id, ActionKind::Resume))
        .collect()
}

fn wasm_admission(component: &Admission<'_>) -> WasmAdmission {
    let loaded = engine().load_admission(&component.bytes()).unwrap();
    WasmAdmission::with_fallback(
        loaded,
        Arc::new(PolicyStats::default()),
        Box::new(ResumeAll),
    )
}

#[test]
fn a_good_component_answers_its_fixed_actions() {
    let mut policy = wasm_admission(&Admission::default());
    assert_eq!(policy.name(), "test-admission");
    assert_eq!(policy.component().metadata().world, "admission");
    let state = view(&["s1", "s2"]);
    assert_eq!(policy.tick(&state, ms(5_000)), fixed_actions());
    let arrival = Arrival {
        request: PolicyRequest {
            tokens: 100,
            session_id: Some("s3"),
            ..PolicyRequest::default()
        },
        waited: ms(20),
    };
    assert_eq!(policy.arrival(&state, &arrival, ms(5_001)), fixed_actions());
    let stats = policy.stats().snapshot();
    assert_eq!((stats.calls, stats.fallbacks_total()), (2, 0));
}

#[test]
fn the_default_fallback_is_request_level_admission() {
    let loaded = engine()
        .load_admission(
            &Admission {
                tick: TRAP.into(),
                ..Admission::default()
            }
            .bytes(),
        )
        .unwrap();
    let mut policy = WasmAdmission::new(loaded, Arc::new(PolicyStats::default()));
    assert!(policy.tick(&view(&["s1", "s2"]), ms(1)).is_empty());
    assert_eq!(policy.stats().snapshot().fallbacks.get("trap"), Some(&1));
}

#[test]
fn actions_for_unknown_sessions_are_bad_output() {
    let mut policy = wasm_admission(&Admission::default());
    // The guest names `s2`, which this view does not have.
    assert_eq!(policy.tick(&view(&["s1"]), ms(1)), resumed(&["s1"]));
    assert!(matches!(
        policy.try_tick(&view(&["s1"]), ms(2)),
        Err(PolicyError::BadOutput(m)) if m.contains("s2")
    ));
    assert_eq!(
        policy.stats().snapshot().fallbacks.get("bad_output"),
        Some(&1)
    );
    // The arriving session counts as known.
    let arrival = Arrival {
        request: PolicyRequest {
            session_id: Some("s2"),
            ..PolicyRequest::default()
        },
        waited: Duration::ZERO,
    };
    assert_eq!(
        policy.arrival(&view(&["s1"]), &arrival, ms(3)),
        fixed_actions()
    );
}

/// A failing call falls back to the native policy, counts its reason, and the next call reaches
/// a rebuilt guest again.
fn contained(body: &str, reason: &str) {
    let mut policy = wasm_admission(&Admission {
        tick: when_late(body),
        arrival: when_late(body),
        ..Admission::default()
    });
    let state = view(&["s1", "s2"]);
    assert_eq!(policy.tick(&state, ms(1)), fixed_actions());
    assert_eq!(
        policy.tick(&state, ms(POISON_NOW_MS)),
        resumed(&["s1", "s2"])
    );
    assert_eq!(policy.tick(&state, ms(20)), fixed_actions());
    let arrival = Arrival::default();
    assert_eq!(
        policy.arrival(&state, &arrival, ms(POISON_NOW_MS)),
        resumed(&["s1", "s2"])
    );
    assert_eq!(policy.arrival(&state, &arrival, ms(30)), fixed_actions());
    let stats = policy.stats().snapshot();
    assert_eq!(stats.calls, 5);
    assert_eq!(stats.fallbacks.get(reason), Some(&2), "{stats:?}");
    assert!(stats.last_error.unwrap().contains("test-admission"));
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
    assert_wrong_world(engine.load_admission(&Router::default().bytes()), "router");
    assert_wrong_world(
        engine.load_admission(&KvHints::default().bytes()),
        "kv-hints",
    );
    assert_wrong_world(
        engine.load_router(&Admission::default().bytes()),
        "admission",
    );
    let claims_router = Admission {
        meta: Meta {
            world: "router",
            ..ADMISSION_META
        },
        ..Admission::default()
    };
    assert_wrong_world(engine.load_admission(&claims_router.bytes()), "metadata");
    let newer = Admission {
        meta: Meta {
            wit_version: "2.0.0",
            ..ADMISSION_META
        },
        ..Admission::default()
    };
    let err = engine.load_admission(&newer.bytes()).unwrap_err();
    assert!(matches!(err, PolicyError::IncompatibleVersion(_)), "{err}");
}
