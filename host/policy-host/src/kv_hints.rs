//! [`WasmKvHints`]: a `kv-hints` component behind the core's [`KvHintPolicy`] trait, with the
//! native policy of the same name answering whenever the guest cannot.

use crate::bindings::kv_hints::{
    Compaction, EventKind, Hint, HintKind as WitHintKind, IndexState as WitIndexState,
    LifecycleEvent as WitEvent, Residency, Tier, TierUsage, ToolCall,
};
use crate::component::{KvHintsComponent, Metadata};
use crate::convert;
use crate::engine::PolicyEngine;
use crate::error::PolicyError;
use crate::guest::Guest;
use crate::slot::Kind;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::kv_hints::{
    HintKind, HintTier, IndexState, KvHint, KvHintPolicy, LifecycleEvent, LifecycleKind, NoHints,
    RankUsage, SessionResidency, check_hints, native_kv_hints,
};
use switchyard_core::worker::Rank;

/// A KV-hint policy running in a Wasm component.
///
/// One instance sees every batch of events in order, so a policy may track sessions across
/// calls; a failed call rebuilds the store (losing that state) and the native fallback answers.
#[derive(Debug)]
pub struct WasmKvHints {
    guest: Guest<KvHintsComponent>,
    fallback: Box<dyn KvHintPolicy>,
}

impl WasmKvHints {
    /// Hints from `component`; the guest is instantiated on the first call. The fallback is the
    /// native policy named like the component, else [`NoHints`].
    pub fn new(component: KvHintsComponent, stats: Arc<PolicyStats>) -> Self {
        let fallback =
            native_kv_hints(&component.metadata().name).unwrap_or_else(|| Box::new(NoHints));
        Self::with_fallback(component, stats, fallback)
    }

    /// Hints with an explicit native fallback.
    pub fn with_fallback(
        component: KvHintsComponent,
        stats: Arc<PolicyStats>,
        fallback: Box<dyn KvHintPolicy>,
    ) -> Self {
        Self {
            guest: Guest::new(component, stats),
            fallback,
        }
    }

    /// The component this policy runs.
    pub fn component(&self) -> &KvHintsComponent {
        self.guest.component()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<PolicyStats> {
        self.guest.stats()
    }

    /// Ask the guest, with no fallback: the hints, checked, or why there are none.
    pub fn try_on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Result<Vec<KvHint>, PolicyError> {
        ask(&mut self.guest, events, index, now)
    }
}

impl KvHintPolicy for WasmKvHints {
    fn name(&self) -> &str {
        self.guest.name()
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint> {
        match self.guest.decide(|guest| ask(guest, events, index, now)) {
            Some(hints) => hints,
            None => self.fallback.on_events(events, index, now),
        }
    }
}

fn ask(
    guest: &mut Guest<KvHintsComponent>,
    events: &[LifecycleEvent],
    index: &IndexState,
    now: Duration,
) -> Result<Vec<KvHint>, PolicyError> {
    let wit_events: Vec<WitEvent> = events.iter().map(event).collect();
    let wit_index = index_state(index);
    let raw = guest.call(|instance, store| {
        instance.call_on_events(store, convert::millis(now), &wit_events, &wit_index)
    })?;
    let hints: Vec<KvHint> = raw.into_iter().map(hint).collect();
    // A hint about a session or rank the host never reported cannot be applied; refuse them all.
    check_hints(&hints, events, index).map_err(|e| PolicyError::BadOutput(e.to_string()))?;
    Ok(hints)
}

fn event(e: &LifecycleEvent) -> WitEvent {
    WitEvent {
        session_id: e.session_id.clone(),
        at_ms: convert::millis(e.at),
        kind: match &e.kind {
            LifecycleKind::TurnEndWithToolCall {
                tool_name,
                context_tokens,
            } => EventKind::TurnEndWithToolCall(ToolCall {
                tool_name: tool_name.clone(),
                context_tokens: *context_tokens,
            }),
            LifecycleKind::SubagentSpawn(child) => EventKind::SubagentSpawn(child.clone()),
            LifecycleKind::SubagentEnd(child) => EventKind::SubagentEnd(child.clone()),
            LifecycleKind::Compaction {
                tokens_before,
                tokens_after,
            } => EventKind::Compaction(Compaction {
                tokens_before: *tokens_before,
                tokens_after: *tokens_after,
            }),
            LifecycleKind::ThinkingStart => EventKind::ThinkingStart,
            LifecycleKind::ThinkingEnd(tokens) => EventKind::ThinkingEnd(*tokens),
            LifecycleKind::SessionEnd => EventKind::SessionEnd,
        },
        extensions: Vec::new(),
    }
}

fn index_state(index: &IndexState) -> WitIndexState {
    let r = &index.residency;
    let u = &index.usage;
    WitIndexState {
        residency: Residency {
            session_ids: r.iter().map(|r| r.session_id.clone()).collect(),
            worker_ids: r.iter().map(|r| r.rank.worker.0).collect(),
            dp_ranks: r.iter().map(|r| r.rank.dp_rank).collect(),
            device_blocks: r.iter().map(|r| r.device_blocks).collect(),
            host_blocks: r.iter().map(|r| r.host_blocks).collect(),
            disk_blocks: r.iter().map(|r| r.disk_blocks).collect(),
        },
        usage: TierUsage {
            worker_ids: u.iter().map(|u| u.rank.worker.0).collect(),
            dp_ranks: u.iter().map(|u| u.rank.dp_rank).collect(),
            device_used_blocks: u.iter().map(|u| u.device_used_blocks).collect(),
            device_capacity_blocks: u.iter().map(|u| u.device_capacity_blocks).collect(),
            host_used_blocks: u.iter().map(|u| u.host_used_blocks).collect(),
            host_capacity_blocks: u.iter().map(|u| u.host_capacity_blocks).collect(),
        },
        extensions: Vec::new(),
    }
}

fn hint(h: Hint) -> KvHint {
    KvHint {
        session_id: h.session_id,
        target: h.target.map(|(worker, dp_rank)| Rank::new(worker, dp_rank)),
        kind: match h.kind {
            WitHintKind::Share(other) => HintKind::Share(other),
            WitHintKind::Prefetch(t) => HintKind::Prefetch(tier(t)),
            WitHintKind::Demote(t) => HintKind::Demote(tier(t)),
            WitHintKind::Pin(ttl_ms) => HintKind::Pin(Duration::from_millis(ttl_ms)),
            WitHintKind::Retain => HintKind::Retain,
            WitHintKind::Evict => HintKind::Evict,
        },
    }
}

fn tier(t: Tier) -> HintTier {
    match t {
        Tier::Device => HintTier::Device,
        Tier::Host => HintTier::Host,
        Tier::Disk => HintTier::Disk,
        Tier::Shared => HintTier::Shared,
    }
}

/// The `kv-hints` world, for the registry.
#[derive(Debug)]
pub(crate) struct KvHintsKind;

impl Kind for KvHintsKind {
    const WORLD: &'static str = "kv-hints";
    const DEFAULT_NATIVE: &'static str = "no-hints";
    type Policy = dyn KvHintPolicy;

    fn native(name: &str) -> Option<Box<Self::Policy>> {
        native_kv_hints(name)
    }

    fn policy_name(policy: &Self::Policy) -> &str {
        policy.name()
    }

    fn load(
        engine: &PolicyEngine,
        bytes: &[u8],
        stats: Arc<PolicyStats>,
        _model: &str,
    ) -> Result<(Metadata, Box<Self::Policy>), PolicyError> {
        let component = engine.load_kv_hints(bytes)?;
        canary(&component)?;
        let metadata = component.metadata().clone();
        let mut hints = WasmKvHints::new(component, stats);
        // The instance that will answer starts now, off the request path.
        hints.guest.warm_up()?;
        Ok((metadata, Box::new(hints)))
    }
}

/// Run a fresh instance on sample inputs (8 resident sessions `s0`.. on 4 ranks, first with no
/// event, then with one of every kind); any failure or impossible hint rejects the load.
fn canary(component: &KvHintsComponent) -> Result<(), PolicyError> {
    let mut trial = WasmKvHints::new(component.clone(), Arc::new(PolicyStats::default()));
    let at = Duration::from_secs(60);
    let kinds = [
        LifecycleKind::TurnEndWithToolCall {
            tool_name: Some("bash".into()),
            context_tokens: 30_000,
        },
        LifecycleKind::SubagentSpawn("s8".into()),
        LifecycleKind::SubagentEnd("s8".into()),
        LifecycleKind::Compaction {
            tokens_before: 90_000,
            tokens_after: 20_000,
        },
        LifecycleKind::ThinkingStart,
        LifecycleKind::ThinkingEnd(512),
        LifecycleKind::SessionEnd,
    ];
    let events: Vec<LifecycleEvent> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| LifecycleEvent {
            session_id: format!("s{}", i % 8),
            at,
            kind,
        })
        .collect();
    let index = IndexState {
        residency: (0..8_u32)
            .map(|s| SessionResidency {
                session_id: format!("s{s}"),
                rank: Rank::new(s % 4, 0),
                device_blocks: s * 64,
                host_blocks: s * 16,
                disk_blocks: s,
            })
            .collect(),
        usage: (0..4_u32)
            .map(|w| RankUsage {
                rank: Rank::new(w, 0),
                device_used_blocks: u64::from(w) * 1000,
                device_capacity_blocks: 4096,
                host_used_blocks: u64::from(w) * 100,
                host_capacity_blocks: 16_384,
            })
            .collect(),
    };
    for events in [&[][..], &events[..]] {
        trial.try_on_events(events, &index, at).map_err(|e| {
            PolicyError::Canary(format!("on-events with {} events: {e}", events.len()))
        })?;
    }
    Ok(())
}
