//! Between the core's policy types and the WIT types: candidates become columns, a decision
//! becomes a checked [`Selection`].

use crate::bindings::{
    CostOverrides, CostWeights, Decision, Outcome, PackedWorkers, Request, Workers,
};
use crate::error::PolicyError;
use switchyard_core::router::{self, Candidate, PolicyRequest, Selection};

/// The request extension carrying the shared-pool credit (the SDK's `SHARED_CREDIT_EXTENSION`).
const SHARED_CREDIT_EXTENSION: &str = "switchyard.shared-credit";

pub(crate) fn request(r: &PolicyRequest<'_>, model: &str) -> Request {
    let w = &r.weights;
    let o = r.overrides.as_ref();
    Request {
        model: model.to_string(),
        tokens: r.tokens,
        blocks: r.blocks,
        block_size: r.block_size,
        weights: CostWeights {
            device_credit: w.device_credit,
            host_credit: w.host_credit,
            disk_credit: w.disk_credit,
            prefill_load_scale: w.prefill_load_scale,
        },
        overrides: CostOverrides {
            device_credit: o.map(|o| o.device_credit),
            host_credit: o.map(|o| o.host_credit),
            disk_credit: o.map(|o| o.disk_credit),
            prefill_load_scale: o.map(|o| o.prefill_load_scale),
        },
        session_id: r.session_id.map(Into::into),
        parent_session_id: r.parent_session_id.map(Into::into),
        priority: r.priority,
        osl: r.osl,
        extensions: Vec::new(),
    }
}

/// [`request`] for a `route` call over `candidates`. WIT 1.0's weights record has no
/// shared-pool credit, so it travels as a trial signal (rule 3), and only when a candidate has
/// shared blocks for it to weigh: otherwise it cannot change a cost, and the call allocates
/// nothing more for it.
pub(crate) fn route_request(
    r: &PolicyRequest<'_>,
    model: &str,
    candidates: &[Candidate],
) -> Request {
    let mut req = request(r, model);
    if candidates.iter().any(|c| c.shared_blocks > 0) {
        req.extensions.push((
            SHARED_CREDIT_EXTENSION.to_string(),
            r.weights.shared_credit.to_string(),
        ));
    }
    req
}

/// Empty columns, to be filled by [`fill_workers`] (kept between calls to reuse the buffers).
pub(crate) fn empty_workers() -> Workers {
    Workers {
        worker_ids: Vec::new(),
        dp_ranks: Vec::new(),
        device_blocks: Vec::new(),
        host_blocks: Vec::new(),
        disk_blocks: Vec::new(),
        shared_blocks: Vec::new(),
        indexed_blocks: Vec::new(),
        active_prefill_tokens: Vec::new(),
        active_decode_blocks: Vec::new(),
        active_requests: Vec::new(),
        kv_capacity_blocks: Vec::new(),
        kv_usage: Vec::new(),
        queue_depth: Vec::new(),
        healthy: Vec::new(),
        extra_columns: Vec::new(),
        extensions: Vec::new(),
    }
}

/// The `u32` columns, in the order of 1.2's `packed-workers.counts`: `worker-ids`, `dp-ranks`,
/// `device-blocks`, `host-blocks`, `disk-blocks`, `shared-blocks`, `active-requests`,
/// `queue-depth`. The core does not know queue depth yet: its documented "unknown", 0.
const COUNTS: [fn(&Candidate) -> u32; 8] = [
    |c| c.rank.worker.0,
    |c| c.rank.dp_rank,
    |c| c.overlap.device,
    |c| c.overlap.host,
    |c| c.overlap.disk,
    |c| c.shared_blocks,
    |c| c.active_requests,
    |_| 0,
];

/// The `u64` columns, in the order of `packed-workers.sizes`: `indexed-blocks`,
/// `active-prefill-tokens`, `active-decode-blocks`, `kv-capacity-blocks` (unknown to the core:
/// 0).
const SIZES: [fn(&Candidate) -> u64; 4] = [
    |c| c.indexed_blocks,
    |c| c.active_prefill_tokens,
    |c| c.active_decode_blocks,
    |_| 0,
];

/// Write `candidates` into `w` as columns. The core does not know capacity, usage or queue depth
/// yet: those columns carry their documented "unknown" value. One column at a time, each a
/// tight loop over the candidates into a buffer kept from the last call.
pub(crate) fn fill_workers(w: &mut Workers, candidates: &[Candidate]) {
    let counts = [
        &mut w.worker_ids,
        &mut w.dp_ranks,
        &mut w.device_blocks,
        &mut w.host_blocks,
        &mut w.disk_blocks,
        &mut w.shared_blocks,
        &mut w.active_requests,
        &mut w.queue_depth,
    ];
    for (column, field) in counts.into_iter().zip(COUNTS) {
        column.clear();
        column.extend(candidates.iter().map(field));
    }
    let sizes = [
        &mut w.indexed_blocks,
        &mut w.active_prefill_tokens,
        &mut w.active_decode_blocks,
        &mut w.kv_capacity_blocks,
    ];
    for (column, field) in sizes.into_iter().zip(SIZES) {
        column.clear();
        column.extend(candidates.iter().map(field));
    }
    w.kv_usage.clear();
    w.kv_usage.resize(candidates.len(), 0.0);
    w.healthy.clear();
    w.healthy.resize(candidates.len(), true);
}

/// Empty packed columns, to be filled by [`fill_packed`] (kept between calls).
pub(crate) fn empty_packed() -> PackedWorkers {
    PackedWorkers {
        count: 0,
        counts: Vec::new(),
        sizes: Vec::new(),
        kv_usage: Vec::new(),
        trials: None,
    }
}

/// Write `candidates` into `w` as 1.2's packed columns: the values [`fill_workers`] writes, each
/// column after the one before in its list.
pub(crate) fn fill_packed(w: &mut PackedWorkers, candidates: &[Candidate]) {
    w.count = u32::try_from(candidates.len()).unwrap_or(u32::MAX);
    w.counts.clear();
    for field in COUNTS {
        w.counts.extend(candidates.iter().map(field));
    }
    w.sizes.clear();
    for field in SIZES {
        w.sizes.extend(candidates.iter().map(field));
    }
    w.kv_usage.clear();
    w.kv_usage.resize(candidates.len(), 0.0);
}

pub(crate) fn outcome(o: &router::Outcome) -> Outcome {
    Outcome {
        worker_index: u32::try_from(o.candidate_index).unwrap_or(u32::MAX),
        worker_id: o.rank.worker.0,
        dp_rank: o.rank.dp_rank,
        session_id: o.session_id.clone(),
        ttft_ms: o.ttft.map(|d| d.as_secs_f64() * 1e3),
        itl_ms: o.itl.map(|d| d.as_secs_f64() * 1e3),
        cached_tokens: o.cached_tokens,
        prompt_tokens: o.prompt_tokens,
        output_tokens: o.output_tokens,
        error: o.error.clone(),
    }
}

/// Check a guest's decision against `candidates` candidates. `queue` is refused: the gateway has
/// no queue yet, so the native policy places the request instead.
pub(crate) fn selection(decision: Decision, candidates: usize) -> Result<Selection, PolicyError> {
    match decision {
        Decision::Chosen(i) if (i as usize) < candidates => Ok(Selection::Pick(i as usize)),
        Decision::Chosen(i) => Err(PolicyError::BadOutput(format!(
            "chose index {i} of {candidates} candidates"
        ))),
        Decision::Costs(costs) if costs.len() != candidates => Err(PolicyError::BadOutput(
            format!("{} costs for {candidates} candidates", costs.len()),
        )),
        Decision::Costs(costs) => match costs.iter().position(|c| !c.is_finite()) {
            Some(i) => Err(PolicyError::BadOutput(format!(
                "cost {i} is {} (costs must be finite)",
                costs[i]
            ))),
            None => Ok(Selection::Costs(costs)),
        },
        Decision::Queue(reason) => Err(PolicyError::BadOutput(format!(
            "asked to queue ({reason}); the gateway has no queue yet"
        ))),
        Decision::Reject(reason) => Ok(Selection::Reject(reason)),
    }
}

/// `d` in whole milliseconds, as the WIT's `*-ms` fields carry time (saturating: a `u64` of
/// milliseconds outlasts any uptime).
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
