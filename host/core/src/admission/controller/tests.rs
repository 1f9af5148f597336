use super::*;
use crate::admission::testing::worker;
use crate::admission::{AdmitAll, SessionPhase};
use crate::programs::Usage;
use std::collections::VecDeque;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Answers from a script; records what it saw.
#[derive(Debug, Default)]
struct Scripted {
    ticks: VecDeque<Vec<AdmissionAction>>,
    arrivals: VecDeque<Vec<AdmissionAction>>,
    /// Hold every arrival that has waited less than this.
    hold_for: Option<Duration>,
    place: Option<Rank>,
}

impl AdmissionPolicy for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn tick(&mut self, _view: &AdmissionView, _now: Duration) -> Vec<AdmissionAction> {
        self.ticks.pop_front().unwrap_or_default()
    }

    fn arrival(
        &mut self,
        _view: &AdmissionView,
        arrival: &Arrival<'_>,
        _now: Duration,
    ) -> Vec<AdmissionAction> {
        let session = arrival.request.session_id.unwrap_or_default();
        if self.hold_for.is_some_and(|h| arrival.waited < h) {
            return vec![AdmissionAction::new(
                session,
                ActionKind::Hold("wait".into()),
            )];
        }
        self.arrivals.pop_front().unwrap_or_default()
    }

    fn placement(&mut self, _view: &AdmissionView, _session: &str, _now: Duration) -> Option<Rank> {
        self.place
    }
}

fn controller(policy: impl AdmissionPolicy + 'static) -> AdmissionController {
    AdmissionController::new(AdmissionConfig::default(), Box::new(policy))
}

fn request(id: u64, session: Option<&str>, priority: i32) -> AdmissionRequest<'_> {
    AdmissionRequest {
        id: RequestId(id),
        request: PolicyRequest {
            tokens: 1_000,
            session_id: session,
            priority,
            ..PolicyRequest::default()
        },
        session_final: false,
    }
}

fn tool_end() -> TurnEnd {
    TurnEnd {
        usage: Some(Usage {
            prompt_tokens: 1_000,
            completion_tokens: 20,
        }),
        tool_call: true,
        tool_name: Some("bash".into()),
        thinking: Vec::new(),
    }
}

fn workers() -> Vec<RankUtilization> {
    vec![worker(0, 100_000)]
}

fn ids(releases: &[Release]) -> Vec<u64> {
    releases.iter().map(|r| r.id.0).collect()
}

#[test]
fn admit_all_admits_at_once_with_the_request_priority() {
    let mut c = controller(AdmitAll);
    let out = c.arrival(&request(1, Some("s"), 3), &workers(), secs(0));
    let admitted = out.admitted.expect("admitted");
    assert_eq!((admitted.priority, admitted.rank), (3, None));
    assert_eq!(admitted.waited, Duration::ZERO);
    let lone = c.arrival(&request(2, None, 0), &workers(), secs(0));
    assert_eq!(lone.admitted.map(|r| r.session_id), Some(None));
    assert_eq!(
        c.programs().len(),
        1,
        "a request without session is no program"
    );
    let m = c.metrics(secs(0));
    assert_eq!((m.arrivals, m.holds), (2, 0));
}

#[test]
fn a_pause_never_preempts_and_holds_the_next_request_until_resumed() {
    let mut policy = Scripted::default();
    policy
        .ticks
        .push_back(vec![AdmissionAction::new("s", ActionKind::Pause)]);
    policy.ticks.push_back(Vec::new());
    policy
        .ticks
        .push_back(vec![AdmissionAction::new("s", ActionKind::Resume)]);
    let mut c = controller(policy);
    let w = workers();
    assert!(
        c.arrival(&request(1, Some("s"), 0), &w, secs(0))
            .admitted
            .is_some()
    );
    c.request_started(RequestId(1), Rank::new(0, 0), secs(0));
    // Paused while its request runs: the request goes on.
    assert!(c.tick(&w, secs(0)).is_empty());
    let p = c.programs().get("s").unwrap();
    assert!(p.paused && p.phase() == SessionPhase::Running);
    c.request_finished(RequestId(1), &tool_end(), secs(3));
    assert_eq!(c.programs().get("s").unwrap().phase(), SessionPhase::Paused);
    // The next request is held...
    let out = c.arrival(&request(2, Some("s"), 0), &w, secs(6));
    assert!(out.admitted.is_none());
    assert!(
        c.tick(&w, secs(6)).is_empty(),
        "this tick's answer is empty"
    );
    assert!(c.tick(&w, secs(9)).is_empty(), "no tick due before 10 s");
    // ...until the policy resumes the program.
    let released = c.tick(&w, secs(10));
    assert_eq!(ids(&released), [2]);
    assert_eq!(released[0].waited, secs(4));
    let m = c.metrics(secs(10));
    assert_eq!((m.pauses, m.resumes, m.holds, m.released), (1, 1, 1, 1));
    assert_eq!(m.paused_time, secs(10));
    assert_eq!(m.hold_time, secs(4));
    assert_eq!(m.max_paused, 1);
}

#[test]
fn held_requests_are_offered_again_with_their_wait() {
    let mut c = controller(Scripted {
        hold_for: Some(secs(8)),
        ..Scripted::default()
    });
    let w = workers();
    assert!(
        c.arrival(&request(1, Some("s"), 0), &w, secs(1))
            .admitted
            .is_none()
    );
    assert_eq!(c.programs().get("s").unwrap().phase(), SessionPhase::Queued);
    assert!(c.tick(&w, secs(5)).is_empty(), "waited 4 s");
    let released = c.tick(&w, secs(10));
    assert_eq!(ids(&released), [1]);
    assert_eq!(released[0].waited, secs(9));
    assert_eq!(c.held(), 0);
}

#[test]
fn max_hold_forces_the_release_and_resumes_the_program() {
    let mut policy = Scripted::default();
    policy
        .arrivals
        .push_back(vec![AdmissionAction::new("s", ActionKind::Pause)]);
    let mut c = AdmissionController::new(
        AdmissionConfig {
            max_hold: secs(60),
            ..AdmissionConfig::default()
        },
        Box::new(policy),
    );
    let w = workers();
    assert!(
        c.arrival(&request(1, Some("s"), 0), &w, secs(0))
            .admitted
            .is_none()
    );
    assert_eq!(c.next_wakeup(), Duration::ZERO, "the first tick is due");
    c.tick(&w, secs(0));
    assert_eq!(c.next_wakeup(), secs(5));
    assert!(c.tick(&w, secs(55)).is_empty());
    let released = c.tick(&w, secs(60));
    assert_eq!(ids(&released), [1]);
    assert!(released[0].forced);
    assert!(!c.programs().get("s").unwrap().paused);
    let m = c.metrics(secs(60));
    assert_eq!((m.forced_releases, m.forced_resumes), (1, 1));
}

#[test]
fn priority_adjustments_and_placement_ride_on_the_release() {
    let mut policy = Scripted {
        place: Some(Rank::new(3, 1)),
        ..Scripted::default()
    };
    policy.arrivals.push_back(vec![
        AdmissionAction::new("s", ActionKind::AdjustPriority(-2)),
        AdmissionAction::new("ghost", ActionKind::Pause),
    ]);
    let mut c = controller(policy);
    let out = c.arrival(&request(1, Some("s"), 5), &workers(), secs(0));
    let admitted = out.admitted.expect("admitted");
    assert_eq!(
        (admitted.priority, admitted.rank),
        (3, Some(Rank::new(3, 1)))
    );
    let m = c.metrics(secs(0));
    assert_eq!((m.priority_adjustments, m.unknown_session_actions), (1, 1));
}

#[test]
fn resuming_another_program_on_arrival_releases_its_request() {
    let mut policy = Scripted::default();
    policy
        .arrivals
        .push_back(vec![AdmissionAction::new("a", ActionKind::Pause)]);
    policy
        .arrivals
        .push_back(vec![AdmissionAction::new("a", ActionKind::Resume)]);
    let mut c = controller(policy);
    let w = workers();
    assert!(
        c.arrival(&request(1, Some("a"), 0), &w, secs(0))
            .admitted
            .is_none()
    );
    let out = c.arrival(&request(2, Some("b"), 0), &w, secs(2));
    assert_eq!(out.admitted.map(|r| r.id), Some(RequestId(2)));
    assert_eq!(ids(&out.released), [1]);
}

#[test]
fn cancel_and_session_end_leave_nothing_behind() {
    let mut c = controller(Scripted {
        hold_for: Some(secs(3_600)),
        ..Scripted::default()
    });
    let w = workers();
    c.arrival(&request(1, Some("a"), 0), &w, secs(0));
    c.arrival(&request(2, Some("b"), 7), &w, secs(0));
    assert!(c.cancel(RequestId(1), secs(1)));
    assert!(!c.cancel(RequestId(1), secs(1)));
    let released = c.end_session("b", secs(2));
    assert_eq!(ids(&released), [2]);
    assert_eq!(released[0].priority, 7);
    assert_eq!(c.held(), 0);
    assert!(c.programs().get("b").is_none());
    // The released request still ends cleanly.
    c.request_finished(RequestId(2), &tool_end(), secs(3));
}

#[test]
fn the_final_request_ends_the_program() {
    let mut c = controller(AdmitAll);
    let w = workers();
    let mut last = request(1, Some("s"), 0);
    last.session_final = true;
    c.arrival(&last, &w, secs(0));
    c.request_started(RequestId(1), Rank::new(0, 0), secs(0));
    assert!(!c.is_idle());
    c.request_finished(RequestId(1), &tool_end(), secs(2));
    assert!(c.is_idle());
}

#[test]
fn the_view_shows_tracked_programs_and_the_given_workers() {
    let mut c = controller(AdmitAll);
    let w = workers();
    c.arrival(&request(1, Some("s"), 0), &w, secs(0));
    c.request_started(RequestId(1), Rank::new(0, 0), secs(1));
    c.request_finished(RequestId(1), &tool_end(), secs(4));
    let view = c.view(&w, secs(6));
    let s = view.session("s").expect("tracked");
    assert_eq!(s.phase, SessionPhase::ToolCall);
    assert_eq!((s.context_tokens, s.rank), (1_020, Some(Rank::new(0, 0))));
    assert_eq!((s.idle, s.service), (secs(2), secs(3)));
    assert_eq!(s.tool.as_deref(), Some("bash"));
    assert_eq!(view.workers, w);
}
