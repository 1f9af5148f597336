//! Write Switchyard policies in plain Rust; ship them as WebAssembly components.
//!
//! A policy is a type implementing [`RouterPolicy`], [`AdmissionPolicy`] or [`KvHintPolicy`]
//! over plain Rust types, exported with one macro line:
//!
//! ```
//! use switchyard_policy_sdk::{Decision, PolicyMetadata, Request, RouterPolicy, Workers};
//!
//! #[derive(Default)]
//! struct FewestRequests;
//!
//! impl RouterPolicy for FewestRequests {
//!     fn metadata(&self) -> PolicyMetadata {
//!         PolicyMetadata::new("fewest-requests", "0.1.0", "the idlest worker")
//!     }
//!     fn select(&mut self, _req: &Request, workers: &Workers) -> Decision {
//!         let best = workers.iter().min_by_key(|(_, w)| w.active_requests);
//!         Decision::Chosen(best.map_or(0, |(i, _)| i))
//!     }
//! }
//!
//! switchyard_policy_sdk::export_router!(FewestRequests);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release` to get the component; test the
//! logic natively with [`testing`]. The bindings come from the repository's `wit/`
//! (package `switchyard:policy@1.3.0`: it needs a 1.3 host; 1.0 to 1.2 components keep
//! loading on a 1.3 host) and exist only on `wasm32`.

mod admission;
pub mod columns;
mod kv_hints;
mod macros;
pub mod packed;
mod router;
mod types;

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

#[cfg(target_arch = "wasm32")]
mod glue;

pub use admission::{
    Action, ActionKind, AdmissionPolicy, Incoming, KV_CAPACITY_COLUMN, PAUSED_COLUMN,
    PAUSED_FOR_COLUMN, RANK_COLUMN, Rank, RankUtilization, SERVICE_COLUMN, SessionPhase,
    SessionRef, SessionSignals, SessionView, Sessions, TOOL_COLUMN, Utilization,
};
pub use kv_hints::{
    Compaction, EventKind, Hint, HintAction, HintKind, HintOutcome, HintOutcomeRow, HintOutcomes,
    IndexState, KvHintPolicy, LifecycleEvent, Residency, THINKING_AT_TOKEN_EXTENSION,
    TOOL_RESULT_AT_COLUMN, TOOL_RESULT_POSITION_COLUMN, TOOL_RESULT_SESSION_COLUMN,
    TOOL_RESULT_TOOL_COLUMN, TOOL_RESULT_WAITED_COLUMN, Tier, TierUsage, ToolCall, ToolResult,
};
pub use router::{Decision, Outcome, RouterPolicy, Worker, Workers, cheapest, kv_cost, kv_costs};
pub use types::{
    CostOverrides, CostWeights, Extensions, LogLevel, Params, PolicyMetadata, Request,
    SHARED_CREDIT_EXTENSION, find_extension, no_params,
};

/// The version of the `switchyard:policy` WIT package this SDK binds; the host accepts policies
/// of the same major version.
pub const WIT_VERSION: &str = "1.3.0";

/// Writes `message` to the gateway's log, tagged with the policy's name (rate-limited by the
/// host). In native tests it is captured instead: see [`testing::take_logs`].
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    glue::common::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    testing::capture_log(level, message);
}

/// What the export macros expand to; not part of the API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __private {
    pub use crate::glue::{
        admission, admission_world, kv_hints, kv_hints_world, router, router_world,
    };
}
