//! WIT 1.3's packed admission view: every session and rank in a few lists and two strings, the
//! trial signals typed. Each list or string crossing into a guest is one call of its `realloc`,
//! so the 1.0 records' string per session id and CSV row per signal made an `arrival` over 256
//! programs cost ~120 µs (docs/benchmarks.md, section (d)); these columns are rewritten in place
//! on every call and cross in eight (the sessions' five, the ranks' three). The layout's
//! constants are the SDK's (`switchyard_policy_sdk::packed`), which reads it.

use crate::bindings::admission::{PackedSessions, PackedUtilization};
use crate::convert;
use switchyard_core::admission::{AdmissionView, SessionPhase};
use switchyard_policy_sdk::packed::{
    ACTIVE, AGE_MS, CONTEXT_TOKENS, FLAGS, HAS_PARENT, HAS_RANK, HAS_TOOL, ID_ENDS, IDLE_MS,
    PARENT_ENDS, PAUSED, PAUSED_FOR_MS, PHASES, QUEUED, RANK_COUNTS, RANK_DP, RANK_WORKERS,
    SERVICE_MS, SESSION_COUNTS, SESSION_SIZES, TOOL_ENDS,
};

/// The packed view, kept between calls so its buffers are reused.
#[derive(Debug)]
pub(crate) struct PackedView {
    pub(crate) sessions: PackedSessions,
    pub(crate) workers: PackedUtilization,
}

impl Default for PackedView {
    fn default() -> Self {
        Self {
            sessions: PackedSessions {
                count: 0,
                ids: String::new(),
                tools: String::new(),
                counts: Vec::new(),
                priorities: Vec::new(),
                sizes: Vec::new(),
                extensions: None,
            },
            workers: PackedUtilization {
                count: 0,
                counts: Vec::new(),
                kv_usage: Vec::new(),
                kv_capacity_tokens: Vec::new(),
                extensions: None,
            },
        }
    }
}

impl PackedView {
    /// Rewrite the columns from `view`.
    pub(crate) fn fill(&mut self, view: &AdmissionView) {
        self.fill_sessions(view);
        self.fill_workers(view);
    }

    fn fill_sessions(&mut self, view: &AdmissionView) {
        let (rows, s) = (&view.sessions, &mut self.sessions);
        let n = rows.len();
        s.count = count(n);
        s.ids.clear();
        s.tools.clear();
        s.counts.clear();
        s.counts.resize(SESSION_COUNTS * n, 0);
        s.sizes.clear();
        s.sizes.resize(SESSION_SIZES * n, 0);
        s.priorities.clear();
        s.priorities.extend(rows.iter().map(|r| r.priority));
        let counts = &mut s.counts;
        let sizes = &mut s.sizes;
        for (i, r) in rows.iter().enumerate() {
            let mut flags = if r.paused { PAUSED } else { 0 };
            s.ids.push_str(&r.session_id);
            counts[ID_ENDS * n + i] = count(s.ids.len());
            if let Some(parent) = &r.parent_session_id {
                s.ids.push_str(parent);
                flags |= HAS_PARENT;
            }
            counts[PARENT_ENDS * n + i] = count(s.ids.len());
            counts[PHASES * n + i] = phase(r.phase);
            counts[ACTIVE * n + i] = r.active_requests;
            counts[QUEUED * n + i] = r.queued_requests;
            if let Some(rank) = r.rank {
                flags |= HAS_RANK;
                counts[RANK_WORKERS * n + i] = rank.worker.0;
                counts[RANK_DP * n + i] = rank.dp_rank;
            }
            if let Some(tool) = &r.tool {
                s.tools.push_str(tool);
                flags |= HAS_TOOL;
            }
            counts[TOOL_ENDS * n + i] = count(s.tools.len());
            counts[FLAGS * n + i] = flags;
            let values = [
                (CONTEXT_TOKENS, r.context_tokens),
                (AGE_MS, convert::millis(r.age)),
                (IDLE_MS, convert::millis(r.idle)),
                (PAUSED_FOR_MS, convert::millis(r.paused_for)),
                (SERVICE_MS, convert::millis(r.service)),
            ];
            for (column, value) in values {
                sizes[column * n + i] = value;
            }
        }
    }

    fn fill_workers(&mut self, view: &AdmissionView) {
        let (rows, w) = (&view.workers, &mut self.workers);
        let n = rows.len();
        w.count = count(n);
        w.counts.clear();
        w.counts.reserve(RANK_COUNTS * n);
        w.counts.extend(rows.iter().map(|r| r.rank.worker.0));
        w.counts.extend(rows.iter().map(|r| r.rank.dp_rank));
        w.counts.extend(rows.iter().map(|r| r.active_requests));
        w.counts.extend(rows.iter().map(|r| r.queue_depth));
        w.counts.extend(rows.iter().map(|r| u32::from(r.healthy)));
        w.kv_usage.clear();
        w.kv_usage.extend(rows.iter().map(|r| r.kv_usage));
        w.kv_capacity_tokens.clear();
        w.kv_capacity_tokens
            .extend(rows.iter().map(|r| r.kv_capacity_tokens));
    }
}

/// A length or byte offset as a column value. A view past `u32::MAX` entries or bytes is
/// impossible in practice (the gateway caps session ids and sessions); saturating keeps the
/// guest's slicing in bounds anyway.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The case index of `session-phase`.
fn phase(phase: SessionPhase) -> u32 {
    match phase {
        SessionPhase::Queued => 0,
        SessionPhase::Running => 1,
        SessionPhase::ToolCall => 2,
        SessionPhase::Paused => 3,
        SessionPhase::Idle => 4,
    }
}

#[cfg(test)]
mod tests {
    //! The layout is written here and read by the SDK (`Sessions::unpack`,
    //! `Utilization::unpack`): the two must agree on every field, or a 1.3 guest decides on
    //! other inputs than the host's.

    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;
    use switchyard_core::admission::{RankUtilization, SessionView};
    use switchyard_core::worker::Rank;
    use switchyard_policy_sdk as sdk;

    fn text() -> impl Strategy<Value = String> {
        // Empty, ASCII and multi-byte ids: offsets are in bytes.
        prop::string::string_regex("[a-zé,\"-]{0,12}").expect("valid")
    }

    fn session() -> impl Strategy<Value = SessionView> {
        let phases = prop::sample::select(vec![
            SessionPhase::Queued,
            SessionPhase::Running,
            SessionPhase::ToolCall,
            SessionPhase::Paused,
            SessionPhase::Idle,
        ]);
        (
            (text(), prop::option::of(text()), phases, any::<i32>()),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                0..u64::from(u32::MAX),
            ),
            (
                0..u64::from(u32::MAX),
                prop::option::of((0..64u32, 0..8u32)),
            ),
            (
                any::<bool>(),
                0..1_000_000u64,
                0..1_000_000u64,
                prop::option::of(text()),
            ),
        )
            .prop_map(|(a, b, c, d)| SessionView {
                session_id: a.0,
                parent_session_id: a.1,
                phase: a.2,
                priority: a.3,
                active_requests: b.0,
                queued_requests: b.1,
                context_tokens: b.2,
                age: Duration::from_millis(b.3),
                idle: Duration::from_millis(c.0),
                rank: c.1.map(|(w, dp)| Rank::new(w, dp)),
                paused: d.0,
                paused_for: Duration::from_millis(d.1),
                service: Duration::from_millis(d.2),
                tool: d.3,
            })
    }

    fn rank() -> impl Strategy<Value = RankUtilization> {
        (0..64u32, 0..8u32, 0.0f32..1.0, any::<u32>(), any::<u32>()).prop_flat_map(
            |(w, dp, kv_usage, active, queue)| {
                (any::<bool>(), any::<u64>()).prop_map(move |(healthy, capacity)| RankUtilization {
                    rank: Rank::new(w, dp),
                    kv_usage,
                    active_requests: active,
                    queue_depth: queue,
                    healthy,
                    kv_capacity_tokens: capacity,
                })
            },
        )
    }

    fn sdk_phase(phase: SessionPhase) -> sdk::SessionPhase {
        match phase {
            SessionPhase::Queued => sdk::SessionPhase::Queued,
            SessionPhase::Running => sdk::SessionPhase::Running,
            SessionPhase::ToolCall => sdk::SessionPhase::ToolCall,
            SessionPhase::Paused => sdk::SessionPhase::Paused,
            SessionPhase::Idle => sdk::SessionPhase::Idle,
        }
    }

    /// What a guest must read for `s`.
    fn expected(s: &SessionView) -> sdk::SessionView {
        sdk::SessionView {
            session_id: s.session_id.clone(),
            parent_session_id: s.parent_session_id.clone(),
            phase: sdk_phase(s.phase),
            priority: s.priority,
            active_requests: s.active_requests,
            queued_requests: s.queued_requests,
            context_tokens: s.context_tokens,
            age_ms: convert::millis(s.age),
            idle_ms: convert::millis(s.idle),
            rank: s.rank.map(|r| sdk::Rank::new(r.worker.0, r.dp_rank)),
            paused: s.paused,
            paused_for_ms: convert::millis(s.paused_for),
            service_ms: convert::millis(s.service),
            tool: s.tool.clone(),
        }
    }

    proptest! {
        #[test]
        fn the_sdk_unpacks_what_the_host_packs(
            first in prop::collection::vec(session(), 0..24),
            second in prop::collection::vec(session(), 0..24),
            ranks in prop::collection::vec(rank(), 0..8),
        ) {
            // One packed view and one guest's columns, both reused across calls, as in a
            // live instance: a second view must not read anything the first left behind.
            let (mut packed, mut sessions, mut workers) =
                (PackedView::default(), sdk::Sessions::default(), sdk::Utilization::default());
            for rows in [first, second] {
                let view = AdmissionView { sessions: rows, workers: ranks.clone() };
                packed.fill(&view);
                let s = &packed.sessions;
                sessions.unpack(
                    s.count as usize, &s.ids, &s.tools, &s.counts, &s.priorities, &s.sizes,
                );
                let want: Vec<_> = view.sessions.iter().map(expected).collect();
                prop_assert_eq!(sessions.rows(), want);
                let w = &packed.workers;
                workers.unpack(w.count as usize, &w.counts, &w.kv_usage, &w.kv_capacity_tokens);
                let want: Vec<_> = view
                    .workers
                    .iter()
                    .map(|r| sdk::RankUtilization {
                        rank: sdk::Rank::new(r.rank.worker.0, r.rank.dp_rank),
                        kv_usage: r.kv_usage,
                        active_requests: r.active_requests,
                        queue_depth: r.queue_depth,
                        healthy: r.healthy,
                        kv_capacity_tokens: r.kv_capacity_tokens,
                    })
                    .collect();
                prop_assert_eq!(workers.rows(), want);
            }
        }
    }
}
