//! One simulated worker: an engine model and the KV event stream it publishes.
//!
//! The engine is the mock engine's [`EngineModel`]; its cache events become the batches vLLM
//! publishes and go through the gateway's own [`Ingestor`], so the index the router reads in the
//! simulation is built by the same code as in production. Only the msgpack bytes are skipped:
//! encoding and decoding them was half of a simulation's time, and the wire format has its own
//! tests in the kv-events crate.

use std::sync::Arc;
use std::time::Duration;
use switchyard_core::engine::{CacheEvent, EngineModel, QuietPlan, Step};
use switchyard_core::index::IndexOp;
use switchyard_core::worker::Rank;
use switchyard_kv_events::ingest::{EngineNames, Ingestor};
use switchyard_kv_events::wire::{EventBatch, KvEvent};

/// A message on the worker's KV event stream.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) seq: u64,
    pub(crate) batch: EventBatch,
}

#[derive(Debug)]
pub(crate) struct SimWorker {
    pub(crate) rank: Rank,
    pub(crate) engine: EngineModel,
    /// The gateway's subscriber state for this rank.
    ingestor: Ingestor,
    /// How the engine names the blocks the rank holds, kept by the ingestor from the events
    /// while a KV-hint path needs them ([`SimWorker::keep_names`]).
    pub(crate) names: Option<Arc<EngineNames>>,
    next_seq: u64,
    /// The step in progress and when it started; `None` while idle or in a quiet run.
    pub(crate) step: Option<(Duration, Step)>,
    /// Quiet steps in progress ([`EngineModel::quiet_steps`]), not run yet: only the last
    /// one's end is queued.
    pub(crate) quiet: Option<QuietRun>,
    /// Step ends queued so far: the one queued last carries this number, earlier ones (a quiet
    /// run's end after the run was cut short) are stale.
    pub(crate) step_ends: u64,
}

/// Quiet steps of an engine from `start`, `steps` of them, run once they end or once the
/// engine has to change (a request arrives), whichever comes first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuietRun {
    pub(crate) start: Duration,
    pub(crate) plan: QuietPlan,
}

impl SimWorker {
    pub(crate) fn new(rank: Rank, engine: EngineModel) -> Self {
        let block_size = engine.config().block_size as u32;
        Self {
            rank,
            engine,
            ingestor: Ingestor::new(rank, block_size),
            names: None,
            next_seq: 0,
            step: None,
            quiet: None,
            step_ends: 0,
        }
    }

    /// Keep the engine's names of the rank's blocks, as the gateway's subscriber does for its
    /// hint path. Before the first event only: the names are learnt from the stores.
    pub(crate) fn keep_names(&mut self) {
        debug_assert_eq!(self.next_seq, 0, "names are kept from the first event");
        if self.names.is_none() {
            let names = Arc::new(EngineNames::default());
            let block_size = self.engine.config().block_size as u32;
            self.ingestor = Ingestor::new(self.rank, block_size).naming(names.clone());
            self.names = Some(names);
        }
    }

    /// Whether a step (or a quiet run) is in progress.
    pub(crate) fn busy(&self) -> bool {
        self.step.is_some() || self.quiet.is_some()
    }

    /// The message vLLM would publish for one step's cache events.
    pub(crate) fn publish(&mut self, events: Vec<CacheEvent>, now: Duration) -> Published {
        let block_size = self.engine.config().block_size as u32;
        let batch = EventBatch {
            ts: now.as_secs_f64(),
            events: events
                .into_iter()
                .map(|e| KvEvent::from_cache_event(e, block_size))
                .collect(),
            dp_rank: Some(self.rank.dp_rank),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        Published { seq, batch }
    }

    /// What the gateway's subscriber makes of a message.
    pub(crate) fn ingest(&mut self, message: Published) -> Vec<IndexOp> {
        self.ingestor.on_batch(message.seq, message.batch).ops
    }
}
