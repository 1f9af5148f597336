//! Session-aware admission in the gateway: the core's [`AdmissionController`] driven by tokio.
//!
//! A request offers itself on arrival; when its program is paused it waits here, before routing,
//! so a streaming client sees nothing until the program resumes (and the engine is free to evict
//! the program's KV meanwhile). A ticker runs the policy's periodic review and releases held
//! requests. The same controller drives the simulator (`host/sim`); only the clock differs.

use crate::metrics::worker_label;
use crate::server::Shared;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use switchyard_core::admission::{
    AdmissionConfig, AdmissionController, AdmissionMetrics, AdmissionPolicy, AdmissionRequest,
    Release,
};
use switchyard_core::programs::TurnEnd;
use switchyard_core::router::RequestId;
use switchyard_core::worker::Rank;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// The controller and the requests waiting on it.
#[derive(Debug)]
pub(crate) struct Admission {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    controller: AdmissionController,
    /// Held requests, woken by their release.
    waiting: HashMap<RequestId, oneshot::Sender<Release>>,
}

impl Admission {
    pub(crate) fn new(config: AdmissionConfig, policy: Box<dyn AdmissionPolicy>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                controller: AdmissionController::new(config, policy),
                waiting: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere cannot leave it inconsistent in a way that matters more
        // than refusing all traffic would.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offer `request`; resolves when admission lets it go to the router. The returned ticket
    /// reports the request's end; dropping the future or the ticket withdraws it.
    pub(crate) async fn admit(
        shared: &Arc<Shared>,
        request: AdmissionRequest<'_>,
    ) -> (Release, Ticket) {
        let id = request.id;
        let ticket = Ticket {
            shared: shared.clone(),
            id,
            ended: false,
        };
        // A request without a session is no program: admitted at once, no view needed.
        let workers = match request.request.session_id {
            Some(_) => shared.utilization(),
            None => Vec::new(),
        };
        let (tx, rx) = oneshot::channel();
        let admitted = {
            let mut inner = shared.admission.lock();
            let outcome = inner.controller.arrival(&request, &workers, shared.now());
            inner.deliver(outcome.released);
            if outcome.admitted.is_none() {
                inner.waiting.insert(id, tx);
            }
            outcome.admitted
        };
        let release = match admitted {
            Some(release) => release,
            None => match rx.await {
                Ok(release) => release,
                // The gateway is going away: let the request through rather than lose it.
                Err(_) => Release {
                    id,
                    session_id: request.request.session_id.map(str::to_owned),
                    priority: request.request.priority,
                    rank: None,
                    waited: Duration::ZERO,
                    forced: true,
                },
            },
        };
        if release.waited > Duration::ZERO {
            tracing::debug!(request = id.0, waited = ?release.waited, forced = release.forced, "released");
        }
        (release, ticket)
    }

    /// Counters and gauges as of `now`, and the requests held now.
    fn snapshot(&self, now: Duration) -> (AdmissionMetrics, usize) {
        let inner = self.lock();
        (inner.controller.metrics(now), inner.controller.held())
    }

    /// Run the policy's review when due and release what it (or `max_hold`) lets go. Returns when
    /// to run next.
    fn tick(shared: &Shared) -> Duration {
        let workers = shared.utilization();
        let now = shared.now();
        let mut inner = shared.admission.lock();
        let released = inner.controller.tick(&workers, now);
        inner.deliver(released);
        inner.controller.next_wakeup().saturating_sub(now)
    }
}

impl Inner {
    fn deliver(&mut self, releases: Vec<Release>) {
        for release in releases {
            if let Some(waiter) = self.waiting.remove(&release.id) {
                // A waiter that left was withdrawn by its ticket already.
                let _ = waiter.send(release);
            }
        }
    }
}

/// An admitted (or waiting) request's place in admission: tells the controller where it runs
/// and how it ended; dropped unfinished, it withdraws the request.
#[derive(Debug)]
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    id: RequestId,
    ended: bool,
}

impl Ticket {
    /// The request was placed on `rank`.
    pub(crate) fn started(&self, rank: Rank) {
        let now = self.shared.now();
        self.shared
            .admission
            .lock()
            .controller
            .request_started(self.id, rank, now);
    }

    /// The request ended: its usage and whether its answer ended in a tool call.
    pub(crate) fn finished(mut self, end: &TurnEnd) {
        self.ended = true;
        let now = self.shared.now();
        let mut inner = self.shared.admission.lock();
        inner.controller.request_finished(self.id, end, now);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let now = self.shared.now();
        let mut inner = self.shared.admission.lock();
        inner.waiting.remove(&self.id);
        inner.controller.cancel(self.id, now);
    }
}

/// The admission ticker: reviews programs at the policy's interval and releases held requests
/// whose time has come.
pub(crate) async fn run_ticker(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        // Never sleep long: a release can also become due because a request ended.
        let next = Admission::tick(&shared).clamp(Duration::from_millis(5), Duration::from_secs(1));
        // Bookings also lapse and workers recover with time, not only when requests end.
        crate::queue::Queue::drain(&shared);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// Admission's and the router queue's state as `switchyard_programs`, `switchyard_admission_*`
/// and `switchyard_router_queue_*` metrics, read at scrape time.
#[derive(Debug)]
pub(crate) struct AdmissionCollector(pub(crate) Weak<Shared>);

impl Collector for AdmissionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(shared) = self.0.upgrade() else {
            return Ok(());
        };
        let (m, held) = shared.admission.snapshot(shared.now());
        let (queued, q) = shared.queue.snapshot();
        let p = &m.programs;
        let mut programs = encoder.encode_descriptor(
            "programs",
            "Agent programs (sessions) by state",
            None,
            MetricType::Gauge,
        )?;
        for (state, n) in [
            ("reasoning", p.reasoning),
            ("acting", p.acting),
            ("idle", p.idle),
            ("paused", p.paused),
        ] {
            ConstGauge::new(n as i64).encode(programs.encode_family(&[("state", state)])?)?;
        }
        let gauges = [
            (
                "admission_held",
                "Requests held by admission now",
                held as f64,
            ),
            (
                "router_queue_depth",
                "Requests waiting in the router queue now",
                queued as f64,
            ),
            (
                "admission_paused_seconds",
                "Summed time programs spent paused",
                m.paused_time.as_secs_f64(),
            ),
            (
                "admission_hold_seconds",
                "Summed time released requests were held",
                m.hold_time.as_secs_f64(),
            ),
        ];
        for (name, help, value) in gauges {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        let counters = [
            (
                "admission_arrivals",
                "Requests offered to admission",
                m.arrivals,
            ),
            (
                "admission_holds",
                "Requests held rather than admitted at once",
                m.holds,
            ),
            ("admission_pauses", "Programs paused", m.pauses),
            ("admission_resumes", "Programs resumed", m.resumes),
            (
                "admission_forced_resumes",
                "Programs resumed because a request reached max_hold",
                m.forced_resumes,
            ),
            (
                "admission_priority_adjustments",
                "Priority adjustments applied",
                m.priority_adjustments,
            ),
            (
                "router_queue_enqueued",
                "Requests that waited in the router queue",
                q.enqueued,
            ),
            (
                "router_queue_would_queue",
                "do-not-queue requests answered 429 because every worker was saturated",
                q.would_queue,
            ),
            (
                "router_queue_full",
                "Requests refused because the queue was full",
                q.rejected_full,
            ),
        ];
        for (name, help, value) in counters {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        let mut utilization = encoder.encode_descriptor(
            "worker_kv_utilization",
            "KV blocks of running requests over the worker's configured capacity",
            None,
            MetricType::Gauge,
        )?;
        for u in shared.utilization() {
            ConstGauge::new(f64::from(u.kv_usage))
                .encode(utilization.encode_family(&worker_label(u.rank))?)?;
        }
        Ok(())
    }
}
