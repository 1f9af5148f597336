//! `session-affinity`: keep a session on the worker it last ran on while that worker's KV cost
//! stays within a margin of the best; otherwise place it by KV cost and move the session there.
//!
//! Why: an agent's next turn reuses its whole context, and the index may not yet show (or may
//! under-count, e.g. host-tier blocks) what its worker holds. A bounded map remembers
//! session -> worker; requests without a session are placed by plain KV cost.

mod sessions;

use switchyard_policy_sdk::{
    Decision, Outcome, PolicyMetadata, Request, RouterPolicy, Workers, cheapest, kv_costs,
};

use sessions::SessionMap;

/// Sessions remembered at most; the least recently used are forgotten first.
const MAX_SESSIONS: usize = 4096;
/// The sticky worker may cost this fraction of the best cost more ...
const MARGIN_FRACTION: f64 = 0.25;
/// ... or this many blocks more, whichever is larger (so near-idle pools do not bounce sessions
/// over a block or two of noise).
const MARGIN_BLOCKS: f64 = 8.0;

/// The session-affinity policy.
#[derive(Debug)]
pub struct SessionAffinity {
    sessions: SessionMap,
}

impl Default for SessionAffinity {
    fn default() -> Self {
        Self {
            sessions: SessionMap::new(MAX_SESSIONS),
        }
    }
}

impl SessionAffinity {
    /// The worker `(worker_id, dp_rank)` session `session_id` sticks to, if remembered.
    pub fn sticky_worker(&self, session_id: &str) -> Option<(u32, u32)> {
        self.sessions.peek(session_id)
    }
}

impl RouterPolicy for SessionAffinity {
    fn metadata(&self) -> PolicyMetadata {
        PolicyMetadata::new(
            "session-affinity",
            env!("CARGO_PKG_VERSION"),
            "Keep a session on its worker while its KV cost is within a margin of the best",
        )
        .with_extension("margin-fraction", MARGIN_FRACTION.to_string())
        .with_extension("margin-blocks", MARGIN_BLOCKS.to_string())
        .with_extension("max-sessions", MAX_SESSIONS.to_string())
    }

    fn select(&mut self, request: &Request, workers: &Workers) -> Decision {
        let costs = kv_costs(request, workers);
        let Some(session) = request.session_id.as_deref() else {
            return Decision::Costs(costs);
        };
        let best = cheapest(&costs, workers).unwrap_or(0);
        let best_cost = costs.get(best).copied().unwrap_or(0.0);
        let sticky = self
            .sessions
            .get(session)
            .and_then(|(id, rank)| workers.position(id, rank));
        if let Some(i) = sticky {
            let margin = (best_cost.abs() * MARGIN_FRACTION).max(MARGIN_BLOCKS);
            if costs.get(i).is_some_and(|&c| c <= best_cost + margin) {
                return Decision::Chosen(i);
            }
        }
        // Decide here rather than leave the pick to the host, so that the session's next request
        // (or a sibling fanned out right now) already knows where it lives.
        if let Some(w) = workers.get(best) {
            self.sessions.insert(session, (w.worker_id, w.dp_rank));
        }
        Decision::Chosen(best)
    }

    fn observe(&mut self, outcome: &Outcome) {
        let Some(session) = outcome.session_id.as_deref() else {
            return;
        };
        let worker = (outcome.worker_id, outcome.dp_rank);
        if outcome.error.is_some() {
            // A failed worker is no home: let the next turn be placed afresh.
            if self.sessions.peek(session) == Some(worker) {
                self.sessions.remove(session);
            }
        } else {
            // Where it really ran (the host may have overridden this policy's choice).
            self.sessions.insert(session, worker);
        }
    }
}

switchyard_policy_sdk::export_router!(SessionAffinity);

#[cfg(test)]
mod tests;
