//! Router world: conversions and the calls `export_router!` forwards to.

use super::common;
use super::router_world::switchyard::policy::types as wit;
use crate::router::{Decision, Outcome, RouterPolicy, Workers};

pub use wit::{Decision as WitDecision, Outcome as WitOutcome, PolicyMetadata as WitMetadata};
pub use wit::{PackedWorkers as WitPackedWorkers, Request as WitRequest, Workers as WitWorkers};

/// `metadata` export.
pub fn metadata<P: RouterPolicy>(policy: &P) -> WitMetadata {
    common::metadata(policy.metadata(), "router")
}

/// `route` export.
pub fn route<P: RouterPolicy>(policy: &mut P, req: WitRequest, workers: WitWorkers) -> WitDecision {
    let request = common::request(req);
    let workers = Workers {
        worker_ids: workers.worker_ids,
        dp_ranks: workers.dp_ranks,
        device_blocks: workers.device_blocks,
        host_blocks: workers.host_blocks,
        disk_blocks: workers.disk_blocks,
        shared_blocks: workers.shared_blocks,
        indexed_blocks: workers.indexed_blocks,
        active_prefill_tokens: workers.active_prefill_tokens,
        active_decode_blocks: workers.active_decode_blocks,
        active_requests: workers.active_requests,
        kv_capacity_blocks: workers.kv_capacity_blocks,
        kv_usage: workers.kv_usage,
        queue_depth: workers.queue_depth,
        healthy: workers.healthy,
        extra_columns: workers.extra_columns,
        extensions: workers.extensions,
    };
    decision(policy.select(&request, &workers))
}

/// `route-packed` export (1.2): the columns unpacked into a `Workers` this instance keeps, so a
/// call allocates nothing for them once the buffers have grown.
pub fn route_packed<P: RouterPolicy>(
    policy: &mut P,
    req: WitRequest,
    packed: WitPackedWorkers,
) -> WitDecision {
    std::thread_local! {
        static COLUMNS: std::cell::RefCell<Workers> = std::cell::RefCell::default();
    }
    let request = common::request(req);
    COLUMNS.with_borrow_mut(|workers| {
        let count = packed.count as usize;
        workers.unpack(count, &packed.counts, &packed.sizes, &packed.kv_usage);
        match packed.trials {
            Some(trials) => {
                workers.extra_columns = trials.extra_columns;
                workers.extensions = trials.extensions;
            }
            None => {
                workers.extra_columns.clear();
                workers.extensions.clear();
            }
        }
        decision(policy.select(&request, workers))
    })
}

fn decision(decision: Decision) -> WitDecision {
    match decision {
        // An index past u32 is out of range for the host too: it rejects it and falls back.
        Decision::Chosen(i) => WitDecision::Chosen(u32::try_from(i).unwrap_or(u32::MAX)),
        Decision::Costs(costs) => WitDecision::Costs(costs),
        Decision::Queue(why) => WitDecision::Queue(why),
        Decision::Reject(why) => WitDecision::Reject(why),
    }
}

/// `observe` export.
pub fn observe<P: RouterPolicy>(policy: &mut P, o: WitOutcome) {
    policy.observe(&Outcome {
        worker_index: o.worker_index as usize,
        worker_id: o.worker_id,
        dp_rank: o.dp_rank,
        session_id: o.session_id,
        ttft_ms: o.ttft_ms,
        itl_ms: o.itl_ms,
        cached_tokens: o.cached_tokens,
        prompt_tokens: o.prompt_tokens,
        output_tokens: o.output_tokens,
        error: o.error,
    });
}

/// `queue-key` export.
pub fn queue_key<P: RouterPolicy>(policy: &mut P, req: WitRequest) -> f64 {
    policy.queue_key(&common::request(req))
}

/// `queue-key-at` export (1.1).
pub fn queue_key_at<P: RouterPolicy>(
    policy: &mut P,
    req: WitRequest,
    arrival_ms: u64,
) -> Option<f64> {
    policy.queue_key_at(&common::request(req), arrival_ms)
}

/// `configure` export (1.1).
pub fn configure<P: RouterPolicy>(
    policy: &mut P,
    params: Vec<(String, String)>,
) -> Result<(), String> {
    policy.configure(&params)
}
