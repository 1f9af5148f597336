//! The engine task: owns the [`EngineModel`], steps it in (scaled) real time, hands tokens to the
//! requests and publishes the cache's events.

use futures::Stream;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_core::engine::{
    BlockTable, EngineModel, EngineRequest, EngineStats, RequestError, Step,
};
use switchyard_core::kv_hints::actions::{ActionOutcome, HintAction};
use switchyard_kv_events::publisher::Publisher;
use switchyard_kv_events::wire::{EventBatch, KvEvent};

use crate::hints::HintCounters;
use crate::pool::PoolLink;
use crate::tiers::{PoolSide, TierSlabs};
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

/// What a request hears from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Admitted with this many prompt tokens found in the prefix cache.
    Admitted { cached_tokens: usize },
    /// A generated token; `finished` on the last one.
    Token { token: u32, finished: bool },
}

#[derive(Debug)]
enum Command {
    Submit {
        request: EngineRequest,
        /// Keep the prompt's KV for this long after the request ends (`cache_control`).
        pin: Option<Duration>,
        progress: mpsc::UnboundedSender<Progress>,
        accepted: oneshot::Sender<Result<(), RequestError>>,
        /// The leading prompt blocks fetched from the shared pool, by hash, in order.
        staged: Vec<(u64, Bytes)>,
        /// KV hints that rode on the request (its `kv_hints` field), applied before it is
        /// queued.
        hints: Vec<HintAction>,
    },
    /// Apply KV hints now; the outcomes, one per action, in order.
    Hints {
        actions: Vec<HintAction>,
        reply: oneshot::Sender<Vec<ActionOutcome>>,
    },
    /// How many leading blocks of these engine hashes the engine holds now (device, then host
    /// and disk), handing the hashes back.
    Held {
        hashes: Vec<u64>,
        reply: oneshot::Sender<(usize, Vec<u64>)>,
    },
    Cancel(u64),
    ResetPrefixCache(oneshot::Sender<bool>),
}

/// Where KV events go, and how batches are labelled.
#[derive(Debug)]
pub(crate) struct EventSink {
    pub(crate) publisher: Publisher,
    pub(crate) block_size: u32,
    pub(crate) dp_rank: Option<u32>,
}

/// The HTTP side's handle to the engine task.
#[derive(Debug)]
pub(crate) struct EngineClient {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    stats: watch::Receiver<EngineStats>,
    pool: Option<Arc<PoolLink>>,
}

/// Why a request did not reach the engine.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The engine refused it.
    #[error(transparent)]
    Rejected(#[from] RequestError),
    /// The engine task has stopped.
    #[error("the engine is shutting down")]
    Stopped,
}

// === impl EngineClient ===

impl EngineClient {
    /// Queue a generation; dropping the returned stream cancels it.
    /// `pin` keeps the prompt's KV cached for that long (simulated time) after it ends;
    /// `hints` are applied just before it is queued; `max_offload_tokens` is the request's
    /// [`EngineRequest::max_offload_tokens`].
    pub(crate) async fn submit(
        &self,
        prompt: Vec<u32>,
        max_tokens: u32,
        pin: Option<Duration>,
        hints: Vec<HintAction>,
        max_offload_tokens: Option<u64>,
    ) -> Result<Generation, SubmitError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (progress, events) = mpsc::unbounded_channel();
        let (accepted, answer) = oneshot::channel();
        // Ask the pool before the engine sees the request, as a KV connector does: what it
        // holds past what the engine holds itself is loaded instead of computed.
        let (staged, pool_prefix_start) = match &self.pool {
            Some(pool) => {
                let (held, hashes) = self.held(pool.prompt_hashes(&prompt)).await?;
                (pool.fetch_run(&hashes, held).await, held)
            }
            None => (Vec::new(), 0),
        };
        let request = EngineRequest {
            id,
            prompt,
            max_tokens,
            pool_prefix_blocks: pool_prefix_start + staged.len(),
            pool_prefix_start,
            max_offload_tokens,
        };
        self.commands
            .send(Command::Submit {
                request,
                pin,
                progress,
                accepted,
                staged,
                hints,
            })
            .map_err(|_| SubmitError::Stopped)?;
        answer.await.map_err(|_| SubmitError::Stopped)??;
        Ok(Generation {
            id,
            events,
            finished: false,
            commands: self.commands.clone(),
        })
    }

    /// How many leading blocks of `hashes` the engine holds now, and the hashes.
    async fn held(&self, hashes: Vec<u64>) -> Result<(usize, Vec<u64>), SubmitError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Held { hashes, reply })
            .map_err(|_| SubmitError::Stopped)?;
        answer.await.map_err(|_| SubmitError::Stopped)
    }

    /// Apply KV hints now: one outcome per action, in order.
    pub(crate) async fn apply_hints(
        &self,
        actions: Vec<HintAction>,
    ) -> Result<Vec<ActionOutcome>, SubmitError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Hints { actions, reply })
            .map_err(|_| SubmitError::Stopped)?;
        answer.await.map_err(|_| SubmitError::Stopped)
    }

    /// Drop every cached block; `false` while requests run or once the engine stopped.
    pub(crate) async fn reset_prefix_cache(&self) -> bool {
        let (reply, answer) = oneshot::channel();
        if self
            .commands
            .send(Command::ResetPrefixCache(reply))
            .is_err()
        {
            return false;
        }
        answer.await.unwrap_or(false)
    }

    /// The engine's gauges and counters, updated after each step.
    pub(crate) fn stats(&self) -> watch::Receiver<EngineStats> {
        self.stats.clone()
    }
}

/// One request's progress. Dropping it before the last token cancels the request in the engine,
/// which is how a client that disconnects frees its KV blocks.
#[derive(Debug)]
pub(crate) struct Generation {
    id: u64,
    events: mpsc::UnboundedReceiver<Progress>,
    finished: bool,
    commands: mpsc::UnboundedSender<Command>,
}

impl Stream for Generation {
    type Item = Progress;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Progress>> {
        let polled = self.events.poll_recv(cx);
        if let Poll::Ready(Some(Progress::Token { finished: true, .. })) = polled {
            self.finished = true;
        }
        polled
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            // The engine may be gone already; then there is nothing left to cancel.
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }
}

/// What the engine task drives besides the model.
#[derive(Debug)]
pub(crate) struct Attachments {
    /// The bytes of the KV tiers (with a host tier or a pool).
    pub(crate) slabs: Option<TierSlabs>,
    /// Where KV events go.
    pub(crate) sink: Option<EventSink>,
    /// The shared KV pool.
    pub(crate) pool: Option<Arc<PoolLink>>,
    /// What became of the KV hints applied.
    pub(crate) hints: Arc<HintCounters>,
}

/// Start the engine task. It stops on `shutdown`.
pub(crate) fn start(
    model: EngineModel,
    attached: Attachments,
    speedup: f64,
    shutdown: CancellationToken,
) -> (EngineClient, tokio::task::JoinHandle<()>) {
    let (commands, inbox) = mpsc::unbounded_channel();
    let (stats_tx, stats) = watch::channel(model.stats());
    let driver = Driver {
        model,
        inbox,
        deferred: Vec::new(),
        requests: HashMap::new(),
        pins: Vec::new(),
        slabs: attached.slabs,
        sink: attached.sink,
        pool: attached.pool.clone(),
        staged: Staged::default(),
        hints: attached.hints,
        started: Instant::now(),
        speedup,
        stats: stats_tx,
    };
    let task = tokio::spawn(driver.run(shutdown));
    let client = EngineClient {
        commands,
        next_id: AtomicU64::new(0),
        stats,
        pool: attached.pool,
    };
    (client, task)
}

#[derive(Debug)]
struct Driver {
    model: EngineModel,
    inbox: mpsc::UnboundedReceiver<Command>,
    /// Commands that arrived while a step ran, applied (in order) once it ends.
    deferred: Vec<Command>,
    requests: HashMap<u64, Running>,
    /// Pinned prompt prefixes and when their pins expire.
    pins: Vec<(Instant, BlockTable)>,
    /// The bytes of the KV tiers, with a host tier or a pool.
    slabs: Option<TierSlabs>,
    sink: Option<EventSink>,
    pool: Option<Arc<PoolLink>>,
    /// Pool blocks fetched for requests not admitted yet.
    staged: Staged,
    hints: Arc<HintCounters>,
    /// When the engine started: simulated time follows real time (times `speedup`) while
    /// idle, so that hint pins expire on time.
    started: Instant,
    speedup: f64,
    stats: watch::Sender<EngineStats>,
}

/// Bytes fetched from the pool at arrival, kept until their request is admitted (the step
/// that admits it lists the fetches). Requests staging the same block share one copy.
#[derive(Debug, Default)]
struct Staged {
    bytes: HashMap<u64, Bytes>,
    /// Requests holding each block.
    holders: HashMap<u64, usize>,
    /// Blocks each request holds.
    by_request: HashMap<u64, Vec<u64>>,
}

impl Staged {
    fn hold(&mut self, id: u64, blocks: Vec<(u64, Bytes)>) {
        if blocks.is_empty() {
            return;
        }
        let mut hashes = Vec::with_capacity(blocks.len());
        for (hash, bytes) in blocks {
            self.bytes.entry(hash).or_insert(bytes);
            *self.holders.entry(hash).or_default() += 1;
            hashes.push(hash);
        }
        self.by_request.insert(id, hashes);
    }

    fn release(&mut self, id: u64) {
        for hash in self.by_request.remove(&id).unwrap_or_default() {
            if let Some(holders) = self.holders.get_mut(&hash) {
                *holders -= 1;
                if *holders == 0 {
                    self.holders.remove(&hash);
                    self.bytes.remove(&hash);
                }
            }
        }
    }
}

/// A request in the engine.
#[derive(Debug)]
struct Running {
    progress: mpsc::UnboundedSender<Progress>,
    /// The prompt and how long to pin it once the request ends.
    pin: Option<(Vec<u32>, Duration)>,
}

// === impl Driver ===

impl Driver {
    async fn run(mut self, shutdown: CancellationToken) {
        self.serve(&shutdown).await;
        if let Some(sink) = self.sink {
            sink.publisher.close().await;
        }
    }

    async fn serve(&mut self, shutdown: &CancellationToken) {
        loop {
            self.catch_up_clock();
            for command in std::mem::take(&mut self.deferred) {
                self.apply(command);
            }
            while let Ok(command) = self.inbox.try_recv() {
                self.apply(command);
            }
            self.expire_pins();
            self.stats.send_replace(self.model.stats());
            if !self.model.has_work() {
                // Idle: sleep until a command arrives or a pin expires.
                let next_expiry = self.pins.iter().map(|(at, _)| *at).min();
                tokio::select! {
                    command = self.inbox.recv() => match command {
                        Some(command) => {
                            self.catch_up_clock();
                            self.apply(command);
                        }
                        None => return,
                    },
                    () = sleep_until(next_expiry) => {}
                    () = shutdown.cancelled() => return,
                }
                continue;
            }
            let step = self.model.step();
            let pause = Duration::try_from_secs_f64(step.duration.as_secs_f64() / self.speedup)
                .unwrap_or(Duration::MAX);
            if !pause.is_zero() && !self.sleep_through_step(pause, shutdown).await {
                return;
            }
            if let Some(slabs) = &mut self.slabs {
                let pool = self.pool.as_deref();
                let mut publish = |block| {
                    if let Some(pool) = pool {
                        pool.publish(block);
                    }
                };
                let side = pool.map(|_| PoolSide {
                    staged: &self.staged.bytes,
                    publish: &mut publish,
                });
                slabs.apply(&step.transfers, side);
            }
            for admitted in &step.admitted {
                self.staged.release(admitted.id);
            }
            // Gauges first: a client that reads a token and then the metrics sees this step.
            self.stats.send_replace(self.model.stats());
            self.deliver(step).await;
        }
    }

    /// Wait out a step of `pause`. A request's question of what the engine holds (read-only:
    /// the model is as the step left it) is answered at once, so that its pool fetch overlaps
    /// the step; every other command waits for the step to end. False once the engine stops.
    async fn sleep_through_step(&mut self, pause: Duration, shutdown: &CancellationToken) -> bool {
        let step_end = tokio::time::Instant::now() + pause;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(step_end) => return true,
                command = self.inbox.recv() => match command {
                    Some(Command::Held { hashes, reply }) => {
                        let _ = reply.send((self.model.held_prefix(&hashes), hashes));
                    }
                    Some(command) => self.deferred.push(command),
                    None => return false,
                },
                () = shutdown.cancelled() => return false,
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Submit {
                request,
                pin,
                progress,
                accepted,
                staged,
                hints,
            } => {
                if !hints.is_empty() {
                    self.apply_hints(&hints);
                }
                let id = request.id;
                let pin = pin.map(|ttl| (request.prompt.clone(), ttl));
                let result = self.model.add_request(request);
                if result.is_ok() {
                    self.requests.insert(id, Running { progress, pin });
                    self.staged.hold(id, staged);
                }
                let _ = accepted.send(result);
            }
            Command::Hints { actions, reply } => {
                let _ = reply.send(self.apply_hints(&actions));
            }
            Command::Held { hashes, reply } => {
                let _ = reply.send((self.model.held_prefix(&hashes), hashes));
            }
            Command::Cancel(id) => {
                self.model.cancel(id);
                self.requests.remove(&id);
                self.staged.release(id);
            }
            Command::ResetPrefixCache(reply) => {
                let _ = reply.send(self.model.reset_prefix_cache());
            }
        }
    }

    /// Apply hints to the model and count what became of them.
    fn apply_hints(&mut self, actions: &[HintAction]) -> Vec<ActionOutcome> {
        let outcomes = self.model.apply_hints(actions);
        self.hints.record(actions, &outcomes);
        for outcome in &outcomes {
            tracing::debug!(?outcome, "KV hint applied");
        }
        outcomes
    }

    /// Simulated time runs at `speedup` times real time; an idle engine's clock catches up.
    fn catch_up_clock(&mut self) {
        let scaled = self.started.elapsed().as_secs_f64() * self.speedup;
        if let Ok(now) = Duration::try_from_secs_f64(scaled) {
            self.model.advance_clock_to(now);
        }
    }

    /// Hand out the step's tokens once its time has passed, then publish its events.
    async fn deliver(&mut self, step: Step) {
        for admitted in step.admitted {
            self.send(
                admitted.id,
                Progress::Admitted {
                    cached_tokens: admitted.cached_tokens,
                },
            );
        }
        for out in step.outputs {
            self.send(
                out.id,
                Progress::Token {
                    token: out.token,
                    finished: out.finished,
                },
            );
            if out.finished
                && let Some(Running {
                    pin: Some((prompt, ttl)),
                    ..
                }) = self.requests.remove(&out.id)
            {
                let pin = self.model.pin(&prompt);
                let ttl = Duration::try_from_secs_f64(ttl.as_secs_f64() / self.speedup)
                    .unwrap_or(Duration::MAX);
                let expires = Instant::now().checked_add(ttl).unwrap_or_else(far_future);
                self.pins.push((expires, pin));
            }
        }
        let Some(sink) = &self.sink else {
            return;
        };
        if step.events.is_empty() {
            return;
        }
        let batch = EventBatch {
            ts: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_secs_f64(),
            events: step
                .events
                .into_iter()
                .map(|e| KvEvent::from_cache_event(e, sink.block_size))
                .collect(),
            dp_rank: sink.dp_rank,
        };
        if let Err(error) = sink.publisher.publish(&batch).await {
            tracing::warn!(%error, "cannot publish KV events");
        }
    }

    fn send(&self, id: u64, progress: Progress) {
        // A request whose client left is cancelled by its `Generation`'s drop; ignore the gap.
        if let Some(running) = self.requests.get(&id) {
            let _ = running.progress.send(progress);
        }
    }

    /// Unpin the prefixes whose time is up: their blocks become evictable again.
    fn expire_pins(&mut self) {
        let now = Instant::now();
        let (expired, kept) = std::mem::take(&mut self.pins)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.pins = kept;
        for (_, pin) in expired {
            self.model.unpin(pin);
        }
    }
}

/// Sleep until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 86_400)
}
