//! The conversion, through the columns the host sends (extension columns included).

use super::*;
use switchyard_core::admission::AdmissionPolicy as _;
use switchyard_policy_sdk::testing::AdmissionHarness;
use switchyard_policy_sdk::{CostOverrides, Request, SessionSignals, SessionView};

fn row(id: &str) -> SessionView {
    SessionView {
        session_id: id.into(),
        parent_session_id: Some("root".into()),
        phase: SessionPhase::ToolCall,
        priority: -3,
        active_requests: 1,
        queued_requests: 2,
        context_tokens: 4_096,
        age_ms: 61_250,
        idle_ms: 1_500,
        rank: Some(Rank::new(2, 1)),
        paused: true,
        paused_for_ms: 750,
        service_ms: 9_001,
        tool: Some("grep".into()),
    }
}

#[test]
fn sessions_keep_every_field_and_signal() {
    let sessions: Sessions = [row("a"), SessionView::default()].into_iter().collect();
    let view = view(&sessions, &Utilization::default());
    let a = &view.sessions[0];
    assert_eq!(
        a,
        &core::SessionView {
            session_id: "a".into(),
            parent_session_id: Some("root".into()),
            phase: core::SessionPhase::ToolCall,
            priority: -3,
            active_requests: 1,
            queued_requests: 2,
            context_tokens: 4_096,
            age: Duration::from_millis(61_250),
            idle: Duration::from_millis(1_500),
            rank: Some(worker::Rank::new(2, 1)),
            paused: true,
            paused_for: Duration::from_millis(750),
            service: Duration::from_millis(9_001),
            tool: Some("grep".into()),
        }
    );
    // A row without signals: no rank, not paused, idle phase.
    let b = &view.sessions[1];
    assert_eq!(
        (b.rank, b.paused, b.phase, b.tool.as_deref()),
        (None, false, core::SessionPhase::Idle, None)
    );
}

#[test]
fn a_refilled_view_is_the_fresh_one_and_typed_signals_read_as_extension_columns() {
    let bare = |id: &str| SessionView {
        session_id: id.into(),
        ..SessionView::default()
    };
    let mut kept = AdmissionView::default();
    let calls: [Vec<SessionView>; 3] = [
        vec![row("a"), bare("b"), row("c")],
        vec![bare("longer-than-before"), row("e")],
        vec![row("f"), row("g"), bare("h"), row("i")],
    ];
    for rows in calls {
        let sessions: Sessions = rows.iter().cloned().collect();
        refill_view(&mut kept, &sessions, &Utilization::default());
        assert_eq!(kept, view(&sessions, &Utilization::default()));
        // The same signals as a 1.3 host sends them: typed, no extension columns.
        let typed = Sessions {
            extensions: Vec::new(),
            signals: Some(SessionSignals {
                ranks: rows.iter().map(|r| r.rank).collect(),
                paused: rows.iter().map(|r| r.paused).collect(),
                paused_for_ms: rows.iter().map(|r| r.paused_for_ms).collect(),
                service_ms: rows.iter().map(|r| r.service_ms).collect(),
                tools: rows.iter().map(|r| r.tool.clone()).collect(),
            }),
            ..sessions
        };
        assert_eq!(view(&typed, &Utilization::default()), kept);
    }
}

#[test]
fn workers_keep_their_rank_and_capacity() {
    let workers: Utilization = [
        RankUtilization {
            rank: Rank::new(3, 1),
            kv_usage: 0.5,
            active_requests: 4,
            queue_depth: 2,
            healthy: true,
            kv_capacity_tokens: 123_456,
        },
        RankUtilization::default(),
    ]
    .into_iter()
    .collect();
    let view = view(&Sessions::default(), &workers);
    assert_eq!(
        view.workers,
        [
            core::RankUtilization {
                rank: worker::Rank::new(3, 1),
                kv_usage: 0.5,
                active_requests: 4,
                queue_depth: 2,
                healthy: true,
                kv_capacity_tokens: 123_456,
            },
            core::RankUtilization {
                rank: worker::Rank::new(0, 0),
                kv_usage: 0.0,
                active_requests: 0,
                queue_depth: 0,
                healthy: false,
                kv_capacity_tokens: 0,
            },
        ]
    );
}

#[test]
fn arrivals_keep_the_request_and_fill_partial_overrides() {
    let mut request = Request::new(100, 16).with_session("a");
    request.parent_session_id = Some("root".into());
    request.priority = 2;
    request.osl = Some(64);
    let incoming = Incoming {
        request,
        waited_ms: 2_500,
    };
    let a = arrival(&incoming);
    assert_eq!(
        (a.request.tokens, a.request.blocks, a.request.block_size),
        (100, 7, 16)
    );
    assert_eq!(
        (a.request.session_id, a.request.parent_session_id),
        (Some("a"), Some("root"))
    );
    assert_eq!((a.request.priority, a.request.osl), (2, Some(64)));
    assert_eq!(a.waited, Duration::from_millis(2_500));
    assert_eq!(a.request.weights, CostWeights::default());
    assert!(a.request.overrides.is_none());

    let mut overridden = incoming.clone();
    overridden.request.overrides = CostOverrides {
        host_credit: Some(0.5),
        ..CostOverrides::default()
    };
    let o = arrival(&overridden).request.overrides;
    assert_eq!(
        o,
        Some(CostWeights {
            host_credit: 0.5,
            ..CostWeights::default()
        })
    );
}

#[test]
fn every_action_kind_comes_back() {
    let kinds = [
        (core::ActionKind::Admit, ActionKind::Admit),
        (
            core::ActionKind::Hold("full".into()),
            ActionKind::Hold("full".into()),
        ),
        (core::ActionKind::Pause, ActionKind::Pause),
        (core::ActionKind::Resume, ActionKind::Resume),
        (
            core::ActionKind::AdjustPriority(-7),
            ActionKind::AdjustPriority(-7),
        ),
    ];
    let native = kinds
        .iter()
        .map(|(k, _)| AdmissionAction::new("s", k.clone()))
        .collect();
    let expected: Vec<Action> = kinds
        .into_iter()
        .map(|(_, k)| Action::new("s", k))
        .collect();
    assert_eq!(actions(native), expected);
}

/// A core policy that answers with what it saw, to check what [`Native`] hands it.
#[derive(Debug, Default)]
struct Echo {
    seen: Vec<(Duration, usize, Option<String>)>,
}

impl core::AdmissionPolicy for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction> {
        self.seen.push((now, view.workers.len(), None));
        view.sessions
            .iter()
            .map(|s| AdmissionAction::new(&s.session_id, core::ActionKind::Pause))
            .collect()
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction> {
        let id = arrival.request.session_id.map(str::to_owned);
        self.seen.push((now, view.workers.len(), id.clone()));
        id.map(|id| AdmissionAction::new(id, core::ActionKind::Hold("echo".into())))
            .into_iter()
            .collect()
    }
}

#[derive(Debug)]
enum EchoSpec {}

impl Builtin for EchoSpec {
    type Policy = Echo;

    fn policy() -> Echo {
        Echo::default()
    }

    fn metadata(_: &Echo) -> PolicyMetadata {
        metadata(
            "echo",
            "1.0.0",
            "answers with what it saw",
            [("window", param_ms(Duration::from_millis(1_500)))],
        )
    }
}

#[test]
fn native_calls_the_core_policy_and_keeps_its_state() {
    let mut h = AdmissionHarness::new(Native::<EchoSpec>::default());
    let sessions: Sessions = [row("a"), row("b")].into_iter().collect();
    let workers: Utilization = [RankUtilization::default()].into_iter().collect();
    assert_eq!(
        h.tick(5_000, &sessions, &workers),
        [
            Action::new("a", ActionKind::Pause),
            Action::new("b", ActionKind::Pause)
        ]
    );
    let incoming = Incoming {
        request: Request::new(16, 16).with_session("c"),
        waited_ms: 0,
    };
    assert_eq!(
        h.arrival(7_250, &incoming, &sessions, &workers),
        [Action::new("c", ActionKind::Hold("echo".into()))]
    );
    assert_eq!(
        h.policy().policy().seen,
        [
            (Duration::from_secs(5), 1, None),
            (Duration::from_millis(7_250), 1, Some("c".into())),
        ]
    );
    let m = h.policy().metadata();
    assert_eq!(m.name, "echo");
    assert_eq!(m.extensions, [("window".to_owned(), "1500ms".to_owned())]);
    // The trait is the core's: a direct call answers the same as through the adapter.
    let mut direct = Echo::default();
    assert_eq!(
        actions(direct.tick(&view(&sessions, &workers), Duration::from_secs(5))),
        h.tick(5_000, &sessions, &workers)
    );
}
