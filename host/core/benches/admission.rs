//! The admission controller's side of an arrival with a policy that reads the view (native
//! ThunderAgent), over 16 to 256 known programs: building the view of every program, fresh
//! (`view/fresh`, `ProgramTracker::sessions`, one `String` per id) against refilled in the
//! controller's kept buffer (`view/refill`, `ProgramTracker::sessions_into`, what the controller
//! does), and a whole `AdmissionController::arrival` of a known program's next request, started
//! and finished (`arrive`), to see what share of an arrival the view is.
//!
//! `cargo bench -p switchyard-core --bench admission`

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use switchyard_core::admission::{
    AdmissionConfig, AdmissionController, AdmissionRequest, RankUtilization, ThunderAgent,
};
use switchyard_core::programs::{ProgramConfig, ProgramTracker, TurnEnd};
use switchyard_core::router::{PolicyRequest, RequestId};
use switchyard_core::worker::Rank;

const PROGRAMS: [u32; 3] = [16, 64, 256];

fn id(i: u32) -> String {
    format!("session-{i:04}")
}

fn end(tool: Option<&str>) -> TurnEnd {
    TurnEnd {
        tool_call: tool.is_some(),
        tool_name: tool.map(str::to_owned),
        ..TurnEnd::default()
    }
}

/// `n` programs with parents and tools, as an agent fleet leaves them between turns.
fn tracker(n: u32) -> ProgramTracker {
    let mut t = ProgramTracker::new(ProgramConfig::default());
    for i in 0..n {
        let parent = (i % 5 == 4).then(|| id(i - 1));
        t.arrive(&id(i), parent.as_deref(), 20_000, Duration::ZERO);
        t.admit(&id(i));
        t.start(&id(i), Rank::new(i % 4, 0));
        let tool = (i % 4 == 1).then_some("Bash");
        t.finish(
            &id(i),
            &end(tool),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
    }
    t
}

fn view(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission/view");
    let now = Duration::from_secs(60);
    for n in PROGRAMS {
        let t = tracker(n);
        group.bench_with_input(BenchmarkId::new("fresh", n), &t, |b, t| {
            b.iter(|| black_box(t.sessions(now)));
        });
        let mut rows = Vec::new();
        group.bench_with_input(BenchmarkId::new("refill", n), &t, |b, t| {
            b.iter(|| {
                t.sessions_into(&mut rows, now);
                black_box(rows.len())
            });
        });
    }
    group.finish();
}

fn arrive(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission/arrive");
    let workers: Vec<RankUtilization> = (0..4)
        .map(|w| RankUtilization {
            rank: Rank::new(w, 0),
            kv_usage: 0.5,
            active_requests: 4,
            queue_depth: 0,
            healthy: true,
            kv_capacity_tokens: 1 << 30,
        })
        .collect();
    for n in PROGRAMS {
        let mut controller = AdmissionController::new(
            AdmissionConfig::default(),
            Box::new(ThunderAgent::default()),
        );
        let now = Duration::from_secs(1);
        for i in 0..n {
            let session = id(i);
            let _ = controller.arrival(&arrival(u64::from(i), &session), &workers, now);
            controller.request_started(RequestId(u64::from(i)), Rank::new(i % 4, 0), now);
            controller.request_finished(RequestId(u64::from(i)), &end(None), now);
        }
        let (mut next, mut now) = (u64::from(n), now);
        let session = id(1);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                // A known program's next turn: admitted at once, then done.
                now += Duration::from_millis(1);
                next += 1;
                let outcome = controller.arrival(&arrival(next, &session), &workers, now);
                controller.request_started(RequestId(next), Rank::new(1, 0), now);
                controller.request_finished(RequestId(next), &end(None), now);
                black_box(outcome)
            });
        });
    }
    group.finish();
}

fn arrival(id: u64, session: &str) -> AdmissionRequest<'_> {
    AdmissionRequest {
        id: RequestId(id),
        request: PolicyRequest {
            tokens: 20_000,
            session_id: Some(session),
            ..PolicyRequest::default()
        },
        session_final: false,
    }
}

criterion_group!(benches, view, arrive);
criterion_main!(benches);
