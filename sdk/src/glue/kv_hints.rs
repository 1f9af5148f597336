//! KV-hints world: conversions and the calls `export_kv_hints!` forwards to.

use super::common;
use super::kv_hints_world::switchyard::policy::kv_hint_types as wit;
pub use super::router_world::switchyard::policy::types::PolicyMetadata as WitMetadata;
use crate::kv_hints::{
    Compaction, EventKind, Hint, HintAction, HintKind, HintOutcome, HintOutcomes, IndexState,
    KvHintPolicy, LifecycleEvent, Residency, Tier, TierUsage, ToolCall,
};

pub use wit::{
    Hint as WitHint, HintOutcomes as WitHintOutcomes, IndexState as WitIndexState,
    LifecycleEvent as WitEvent,
};

/// `metadata` export.
pub fn metadata<P: KvHintPolicy>(policy: &P) -> WitMetadata {
    common::metadata(policy.metadata(), "kv-hints")
}

/// `on-events` export.
pub fn on_events<P: KvHintPolicy>(
    policy: &mut P,
    now_ms: u64,
    events: Vec<WitEvent>,
    index: WitIndexState,
) -> Vec<WitHint> {
    let events: Vec<LifecycleEvent> = events.into_iter().map(event).collect();
    let hints = policy.on_events(now_ms, &events, &index_state(index));
    hints.into_iter().map(hint).collect()
}

/// `on-outcomes` export (1.1).
pub fn on_outcomes<P: KvHintPolicy>(policy: &mut P, now_ms: u64, o: WitHintOutcomes) {
    let outcomes = HintOutcomes {
        session_ids: o.session_ids,
        worker_ids: o.worker_ids,
        dp_ranks: o.dp_ranks,
        actions: o
            .actions
            .into_iter()
            .map(|a| match a {
                wit::HintAction::Demote => HintAction::Demote,
                wit::HintAction::Prefetch => HintAction::Prefetch,
                wit::HintAction::Pin => HintAction::Pin,
                wit::HintAction::Retain => HintAction::Retain,
                wit::HintAction::Evict => HintAction::Evict,
                wit::HintAction::Ephemeral => HintAction::Ephemeral,
            })
            .collect(),
        outcomes: o
            .outcomes
            .into_iter()
            .map(|k| match k {
                wit::HintOutcome::Accepted => HintOutcome::Accepted,
                wit::HintOutcome::Clipped => HintOutcome::Clipped,
                wit::HintOutcome::Deferred => HintOutcome::Deferred,
                wit::HintOutcome::Rejected => HintOutcome::Rejected,
                wit::HintOutcome::Missing => HintOutcome::Missing,
            })
            .collect(),
        blocks: o.blocks,
    };
    policy.on_outcomes(now_ms, &outcomes);
}

/// `configure` export (1.1).
pub fn configure<P: KvHintPolicy>(
    policy: &mut P,
    params: Vec<(String, String)>,
) -> Result<(), String> {
    policy.configure(&params)
}

fn event(e: WitEvent) -> LifecycleEvent {
    let kind = match e.kind {
        wit::EventKind::TurnEndWithToolCall(t) => EventKind::TurnEndWithToolCall(ToolCall {
            tool_name: t.tool_name,
            context_tokens: t.context_tokens,
        }),
        wit::EventKind::SubagentSpawn(id) => EventKind::SubagentSpawn(id),
        wit::EventKind::SubagentEnd(id) => EventKind::SubagentEnd(id),
        wit::EventKind::Compaction(c) => EventKind::Compaction(Compaction {
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
        }),
        wit::EventKind::ThinkingStart => EventKind::ThinkingStart,
        wit::EventKind::ThinkingEnd(tokens) => EventKind::ThinkingEnd(tokens),
        wit::EventKind::SessionEnd => EventKind::SessionEnd,
    };
    LifecycleEvent {
        session_id: e.session_id,
        at_ms: e.at_ms,
        kind,
        extensions: e.extensions,
    }
}

fn index_state(i: WitIndexState) -> IndexState {
    let r = i.residency;
    let u = i.usage;
    IndexState {
        residency: Residency {
            session_ids: r.session_ids,
            worker_ids: r.worker_ids,
            dp_ranks: r.dp_ranks,
            device_blocks: r.device_blocks,
            host_blocks: r.host_blocks,
            disk_blocks: r.disk_blocks,
        },
        usage: TierUsage {
            worker_ids: u.worker_ids,
            dp_ranks: u.dp_ranks,
            device_used_blocks: u.device_used_blocks,
            device_capacity_blocks: u.device_capacity_blocks,
            host_used_blocks: u.host_used_blocks,
            host_capacity_blocks: u.host_capacity_blocks,
        },
        extensions: i.extensions,
    }
}

fn tier(t: Tier) -> wit::Tier {
    match t {
        Tier::Device => wit::Tier::Device,
        Tier::Host => wit::Tier::Host,
        Tier::Disk => wit::Tier::Disk,
        Tier::Shared => wit::Tier::Shared,
    }
}

fn hint(h: Hint) -> WitHint {
    let kind = match h.kind {
        HintKind::Share(with) => wit::HintKind::Share(with),
        HintKind::Prefetch(t) => wit::HintKind::Prefetch(tier(t)),
        HintKind::Demote(t) => wit::HintKind::Demote(tier(t)),
        HintKind::Pin(ms) => wit::HintKind::Pin(ms),
        HintKind::Retain => wit::HintKind::Retain,
        HintKind::Evict => wit::HintKind::Evict,
    };
    WitHint {
        session_id: h.session_id,
        target: h.target,
        kind,
    }
}
