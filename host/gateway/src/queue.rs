//! The router queue in the gateway: when every worker a request may go to is saturated, the
//! request waits here, ordered by the active routing policy's queue key (FCFS with priority as a
//! head start by default), and is routed (its overlap checked again) when load drops. The queue
//! itself is the core's [`RouterQueue`], which the simulator drives too.

use crate::error::GatewayError;
use crate::server::Shared;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::router::queue::{
    QueueConfig, QueueError, QueueStats, QueuedRequest, RouterQueue, Submitted,
};
use switchyard_core::router::{Decision, RequestId, RouteError, RouteRequest};
use tokio::sync::oneshot;

/// The queue and the requests waiting in it.
#[derive(Debug)]
pub(crate) struct Queue {
    /// A threshold is configured (fixed at start: read without the lock on every request).
    enabled: bool,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: RouterQueue,
    waiting: HashMap<RequestId, oneshot::Sender<Result<Decision, RouteError>>>,
}

/// A routing answer: now, or once the queue lets the request go.
#[derive(Debug)]
pub(crate) enum Routed {
    Now(Decision),
    Later(Waiting),
}

/// A request waiting in the queue; dropping it (the client left) takes it out.
#[derive(Debug)]
pub(crate) struct Waiting {
    shared: Arc<Shared>,
    id: RequestId,
    answer: Option<oneshot::Receiver<Result<Decision, RouteError>>>,
}

impl Queue {
    pub(crate) fn new(config: QueueConfig) -> Self {
        Self {
            enabled: config.is_enabled(),
            inner: Mutex::new(Inner {
                queue: RouterQueue::new(config),
                waiting: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether requests can wait at all (a threshold is configured).
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Requests waiting now, and the queue's counters.
    pub(crate) fn snapshot(&self) -> (usize, QueueStats) {
        let inner = self.lock();
        (inner.queue.len(), inner.queue.stats())
    }

    /// Route `request` now, or queue it (`do_not_queue`: answer 429 instead of waiting).
    pub(crate) fn submit(
        shared: &Arc<Shared>,
        id: RequestId,
        request: &RouteRequest<'_>,
        do_not_queue: bool,
    ) -> Result<Routed, GatewayError> {
        let queued = QueuedRequest {
            do_not_queue,
            ..QueuedRequest::new(id, request)
        };
        let (tx, rx) = oneshot::channel();
        let submitted = shared.with_router(|router, index, now| {
            let mut inner = shared.queue.lock();
            let submitted = inner.queue.submit(queued, router, index, now);
            if let Ok(Submitted::Queued { .. }) = submitted {
                inner.waiting.insert(id, tx);
            }
            submitted
        });
        match submitted {
            Ok(Submitted::Routed(decision)) => Ok(Routed::Now(decision)),
            Ok(Submitted::Queued { depth }) => {
                tracing::debug!(request = id.0, depth, "queued: every worker is saturated");
                Ok(Routed::Later(Waiting {
                    shared: shared.clone(),
                    id,
                    answer: Some(rx),
                }))
            }
            Err(QueueError::WouldQueue { retry_after }) => Err(GatewayError::Busy { retry_after }),
            Err(e @ QueueError::Full { .. }) => Err(GatewayError::Rejected(e.to_string())),
            Err(QueueError::Route(e)) => Err(e.into()),
        }
    }

    /// A prefill load ends at `due` by the router's prediction (nothing will be heard): drain
    /// then, as when a first token comes.
    pub(crate) fn drain_at(shared: &Arc<Shared>, due: Duration) {
        if !shared.queue.enabled {
            return; // nothing ever waits, and routing ends due loads itself
        }
        let shared = shared.clone();
        let wait = due.saturating_sub(shared.now());
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            Queue::drain(&shared);
        });
    }

    /// Load dropped: route what waits, best first, while workers have room.
    pub(crate) fn drain(shared: &Shared) {
        if !shared.queue.enabled {
            return; // nothing ever waits
        }
        shared.with_router(|router, index, now| {
            let mut inner = shared.queue.lock();
            if inner.queue.is_empty() {
                return;
            }
            for drained in inner.queue.drain(router, index, now) {
                let id = drained.request.id;
                let waiter = inner.waiting.remove(&id);
                let undelivered = match waiter {
                    Some(tx) => tx.send(drained.result).err(),
                    None => Some(drained.result),
                };
                // Its client left meanwhile: give back what routing booked for it.
                if let Some(Ok(_)) = undelivered {
                    router.finish(id, now);
                }
            }
        });
    }
}

impl Waiting {
    /// The routing decision, once the queue lets the request go.
    pub(crate) async fn decision(mut self) -> Result<Decision, GatewayError> {
        let Some(answer) = self.answer.as_mut() else {
            return Err(GatewayError::Internal(
                "queued request awaited twice".into(),
            ));
        };
        let result = answer.await;
        self.answer = None;
        match result {
            Ok(result) => Ok(result?),
            Err(_) => Err(GatewayError::Internal("the router queue went away".into())),
        }
    }
}

impl Drop for Waiting {
    /// The client left while the request waited: take it out of the queue, or, if it was routed
    /// in the meantime, give back what routing booked for it.
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        {
            let mut inner = self.shared.queue.lock();
            inner.waiting.remove(&self.id);
            inner.queue.remove(self.id);
        }
        if let Ok(Ok(_)) = answer.try_recv() {
            self.shared.finish(self.id);
        }
    }
}
