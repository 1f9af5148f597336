//! Trace loading and discrete-event simulation of Switchyard's router core.
//!
//! [`workload`] loads recorded agent traffic (Mooncake, Claude Code, our own request traces) into
//! one schema. [`Simulation`] replays a workload on a virtual clock against simulated engines
//! ([`switchyard_core::engine::EngineModel`]), with every routing decision made by the gateway's
//! own [`switchyard_core::router::Router`] and the engines' KV events reaching the index through
//! the gateway's own ingestion code. [`Outcome::report`] summarises a run; [`plot`] and
//! [`timeline`] draw it.
//!
//! Layout: `workload/` (schema, loaders, writers) -> `tokens` (synthetic prompts) -> `sim`
//! (sessions and the event loop, over `queue`) driving `worker`s (engine + KV event stream), the
//! shared `pool` and each replica's KV-hint path (`sim/hints`) ->
//! `metrics` (records -> statistics) -> `report`, `plot`, `timeline`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod metrics;
pub mod plot;
mod pool;
mod queue;
mod report;
mod sim;
pub mod timeline;
pub mod tokens;
mod worker;
pub mod workload;

pub use metrics::{Outcome, RequestRecord};
pub use pool::PoolStats;
pub use report::{
    AdmissionStats, HintCount, KvHintsReport, KvUtilization, LatencyStats, REPORT_SCHEMA, Report,
    RunReport, TierReport,
};
pub use sim::{IndexMode, ReplicaAffinity, SimConfig, SimError, Simulation};
