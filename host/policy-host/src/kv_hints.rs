//! [`WasmKvHints`]: a `kv-hints` component behind the core's [`KvHintPolicy`] trait, with the
//! native policy of the same name answering whenever the guest cannot.

use crate::admission::column;
use crate::bindings::kv_hints::{
    Compaction, EventKind, Hint, HintAction, HintKind as WitHintKind,
    HintOutcome as HintOutcomeKind, HintOutcomes, IndexState as WitIndexState,
    LifecycleEvent as WitEvent, Residency, Tier, TierUsage, ToolCall,
};
use crate::component::{KvHintsComponent, Metadata};
use crate::convert;
use crate::engine::PolicyEngine;
use crate::error::PolicyError;
use crate::guest::Guest;
use crate::registry::join_params;
use crate::slot::Kind;
use crate::stats::PolicyStats;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::kv_hints::actions::{ActionType, Outcome};
use switchyard_core::kv_hints::{
    HintKind, HintOutcome, HintTier, IndexState, KvHint, KvHintPolicy, LifecycleEvent,
    LifecycleKind, NoHints, RankUsage, SessionResidency, check_hints, native_kv_hints,
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

    /// Give the guest's 1.1 `on-outcomes` `outcomes`, with no fallback; nothing happens for a
    /// component without it (1.0) or for no outcomes.
    pub fn try_on_outcomes(
        &mut self,
        outcomes: &[HintOutcome],
        now: Duration,
    ) -> Result<(), PolicyError> {
        if outcomes.is_empty() || !self.guest.component().has_on_outcomes() {
            return Ok(());
        }
        let columns = hint_outcomes(outcomes);
        self.guest.call(|instance, store| match &instance.outcomes {
            Some(o) => o.call_on_outcomes(store, convert::millis(now), &columns),
            None => Ok(()),
        })
    }

    /// Configure the policy with `params` (its 1.1 `configure`; every later instance gets them
    /// too) and start its instance. Refused with the policy's reason, or at once when it takes
    /// no parameters (a 1.0 component) and `params` is not empty.
    /// The native fallback gets the same parameters when its spec takes them.
    pub fn configure(&mut self, params: Vec<(String, String)>) -> Result<(), PolicyError> {
        self.guest.set_params(params.clone())?;
        self.guest.warm_up()?;
        if !params.is_empty()
            && let Ok(fallback) = <KvHintsKind as Kind>::native_with(self.guest.name(), &params)
        {
            self.fallback = fallback;
        }
        Ok(())
    }
}

/// Outcomes as the WIT 1.1 columns.
fn hint_outcomes(outcomes: &[HintOutcome]) -> HintOutcomes {
    HintOutcomes {
        session_ids: outcomes.iter().map(|o| o.session_id.clone()).collect(),
        worker_ids: outcomes.iter().map(|o| o.rank.worker.0).collect(),
        dp_ranks: outcomes.iter().map(|o| o.rank.dp_rank).collect(),
        actions: outcomes
            .iter()
            .map(|o| match o.action {
                ActionType::Demote => HintAction::Demote,
                ActionType::Prefetch => HintAction::Prefetch,
                ActionType::Pin => HintAction::Pin,
                ActionType::Retain => HintAction::Retain,
                ActionType::Evict => HintAction::Evict,
                ActionType::Ephemeral => HintAction::Ephemeral,
            })
            .collect(),
        outcomes: outcomes
            .iter()
            .map(|o| match o.outcome {
                Outcome::Accepted => HintOutcomeKind::Accepted,
                Outcome::Clipped => HintOutcomeKind::Clipped,
                Outcome::Deferred => HintOutcomeKind::Deferred,
                Outcome::Rejected => HintOutcomeKind::Rejected,
                Outcome::Missing => HintOutcomeKind::Missing,
            })
            .collect(),
        blocks: outcomes.iter().map(|o| o.blocks).collect(),
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

    /// The fallback hears the outcomes too (it answers whenever the guest cannot, so it keeps
    /// the same picture); a failed guest call is counted, never retried.
    fn on_outcomes(&mut self, outcomes: &[HintOutcome], now: Duration) {
        self.fallback.on_outcomes(outcomes, now);
        if let Err(err) = self.try_on_outcomes(outcomes, now) {
            let detail = format!("{}: on-outcomes: {err}", self.guest.name());
            self.guest
                .stats()
                .record_fallback(err.reason(), Some(detail));
        }
    }
}

fn ask(
    guest: &mut Guest<KvHintsComponent>,
    events: &[LifecycleEvent],
    index: &IndexState,
    now: Duration,
) -> Result<Vec<KvHint>, PolicyError> {
    let (wit_events, tool_results) = wit_events(events);
    let wit_index = index_state(index, tool_results);
    let raw = guest.call(|instance, store| {
        instance
            .core
            .call_on_events(store, convert::millis(now), &wit_events, &wit_index)
    })?;
    let hints: Vec<KvHint> = raw.into_iter().map(hint).collect();
    // A hint about a session or rank the host never reported cannot be applied; refuse them all.
    check_hints(&hints, events, index).map_err(|e| PolicyError::BadOutput(e.to_string()))?;
    Ok(hints)
}

/// A thinking event's extension: where its span starts in the session's tokens, in decimal
/// (WIT 1.0's `thinking-start` and `thinking-end(u32)` carry no position; wit/README.md, "Trial
/// signals in use"). The SDK reads it (`LifecycleEvent::thinking_at_token`).
const THINKING_AT_TOKEN: &str = "switchyard.thinking.at-token";

// WIT 1.0 has no event case for a tool result, so tool results travel as extension columns of
// `index-state` (wit/README.md, "Trial signals in use"): one CSV field per tool result, in
// order. The SDK decodes them (`IndexState::tool_results`).

/// Tool results: the session.
const TOOL_RESULT_SESSION: &str = "switchyard.tool-result.session-id";
/// Tool results: the tool's name, empty when the call named none.
const TOOL_RESULT_TOOL: &str = "switchyard.tool-result.tool-name";
/// Tool results: milliseconds since the turn that called the tool ended.
const TOOL_RESULT_WAITED: &str = "switchyard.tool-result.waited-ms";
/// Tool results: when it happened, like an event's `at-ms`.
const TOOL_RESULT_AT: &str = "switchyard.tool-result.at-ms";
/// Tool results: how many of the call's `events` came before it, so a guest can put it back
/// in order.
const TOOL_RESULT_POSITION: &str = "switchyard.tool-result.position";

/// The events WIT 1.0 can carry, and the tool results among `events` as extension columns.
fn wit_events(events: &[LifecycleEvent]) -> (Vec<WitEvent>, Vec<(String, String)>) {
    let mut wit = Vec::with_capacity(events.len());
    let mut results = Vec::new();
    for e in events {
        match &e.kind {
            LifecycleKind::ToolResult { tool_name, waited } => {
                results.push((e, tool_name, *waited, wit.len()));
            }
            _ => wit.extend(event(e)),
        }
    }
    let columns = [
        column(
            TOOL_RESULT_SESSION,
            results.iter().map(|(e, ..)| Some(&e.session_id)),
        ),
        column(
            TOOL_RESULT_TOOL,
            results.iter().map(|(_, tool, ..)| tool.as_deref()),
        ),
        column(
            TOOL_RESULT_WAITED,
            results
                .iter()
                .map(|(_, _, waited, _)| Some(convert::millis(*waited))),
        ),
        column(
            TOOL_RESULT_AT,
            results.iter().map(|(e, ..)| Some(convert::millis(e.at))),
        ),
        column(
            TOOL_RESULT_POSITION,
            results.iter().map(|(.., position)| Some(*position)),
        ),
    ];
    (wit, columns.into_iter().flatten().collect())
}

/// The WIT 1.0 form of `e`; `None` for kinds 1.0 has no case for (a tool result, sent as
/// columns by [`wit_events`]). A thinking span's start in the session's tokens goes in
/// `extensions` ([`THINKING_AT_TOKEN`]).
fn event(e: &LifecycleEvent) -> Option<WitEvent> {
    let extensions = match e.kind {
        LifecycleKind::ThinkingStart { at_token } | LifecycleKind::ThinkingEnd { at_token, .. } => {
            vec![(THINKING_AT_TOKEN.to_owned(), at_token.to_string())]
        }
        _ => Vec::new(),
    };
    Some(WitEvent {
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
            LifecycleKind::ThinkingStart { .. } => EventKind::ThinkingStart,
            LifecycleKind::ThinkingEnd { tokens, .. } => EventKind::ThinkingEnd(*tokens),
            LifecycleKind::SessionEnd => EventKind::SessionEnd,
            LifecycleKind::ToolResult { .. } => return None,
        },
        extensions,
    })
}

fn index_state(index: &IndexState, extensions: Vec<(String, String)>) -> WitIndexState {
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
        extensions,
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

    fn native_with(name: &str, params: &[(String, String)]) -> Result<Box<Self::Policy>, String> {
        switchyard_core::kv_hints::params::native_kv_hints_spec(&join_params(name, params))
            .map_err(|e| e.to_string())
    }

    fn policy_name(policy: &Self::Policy) -> &str {
        policy.name()
    }

    fn load(
        engine: &PolicyEngine,
        bytes: &[u8],
        stats: Arc<PolicyStats>,
        _model: &str,
        params: &[(String, String)],
    ) -> Result<(Metadata, Box<Self::Policy>), PolicyError> {
        let component = engine.load_kv_hints(bytes)?;
        canary(&component, params)?;
        let metadata = component.metadata().clone();
        let mut hints = WasmKvHints::new(component, stats);
        // The instance that will answer starts now, off the request path.
        hints.configure(params.to_vec())?;
        Ok((metadata, Box::new(hints)))
    }
}

/// Run a fresh instance on sample inputs (8 resident sessions `s0`.. on 4 ranks, first with no
/// event, then with one of every kind, a tool result included); any failure or impossible hint
/// rejects the load.
fn canary(component: &KvHintsComponent, params: &[(String, String)]) -> Result<(), PolicyError> {
    let mut trial = WasmKvHints::new(component.clone(), Arc::new(PolicyStats::default()));
    trial.guest.set_params(params.to_vec())?;
    // The policy's refusal of its parameters is the load's error, as the policy gave it.
    trial.guest.warm_up()?;
    let at = Duration::from_secs(60);
    let kinds = [
        LifecycleKind::TurnEndWithToolCall {
            tool_name: Some("bash".into()),
            context_tokens: 30_000,
        },
        LifecycleKind::ToolResult {
            tool_name: Some("bash".into()),
            waited: Duration::from_secs(12),
        },
        LifecycleKind::SubagentSpawn("s8".into()),
        LifecycleKind::SubagentEnd("s8".into()),
        LifecycleKind::Compaction {
            tokens_before: 90_000,
            tokens_after: 20_000,
        },
        LifecycleKind::ThinkingStart { at_token: 30_000 },
        LifecycleKind::ThinkingEnd {
            at_token: 30_000,
            tokens: 512,
        },
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
    let outcomes: Vec<HintOutcome> = ActionType::ALL
        .into_iter()
        .zip(Outcome::ALL.into_iter().cycle())
        .enumerate()
        .map(|(i, (action, outcome))| HintOutcome {
            session_id: (i % 3 != 2).then(|| format!("s{i}")),
            rank: Rank::new(i as u32 % 4, 0),
            action,
            outcome,
            blocks: i as u32 * 8,
        })
        .collect();
    trial
        .try_on_outcomes(&outcomes, at)
        .map_err(|e| PolicyError::Canary(format!("on-outcomes: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(session: &str, ms: u64, kind: LifecycleKind) -> LifecycleEvent {
        LifecycleEvent {
            session_id: session.into(),
            at: Duration::from_millis(ms),
            kind,
        }
    }

    fn returned(tool_name: Option<&str>, waited_ms: u64) -> LifecycleKind {
        LifecycleKind::ToolResult {
            tool_name: tool_name.map(str::to_owned),
            waited: Duration::from_millis(waited_ms),
        }
    }

    #[test]
    fn tool_results_become_columns_with_their_place_among_the_events() {
        let events = [
            at("a,b", 10, returned(Some("mcp, \"x\""), 12_000)),
            at("c", 11, LifecycleKind::ThinkingStart { at_token: 7_000 }),
            at("c", 12, returned(None, 999)),
            at("d", 13, returned(Some(""), 1)),
            at("c", 14, LifecycleKind::SessionEnd),
        ];
        let (wit, columns) = wit_events(&events);
        assert_eq!(wit.len(), 2);
        assert!(matches!(wit[0].kind, EventKind::ThinkingStart));
        // Where the span starts rides in the event's extensions.
        assert_eq!(
            wit[0].extensions,
            [("switchyard.thinking.at-token".to_owned(), "7000".to_owned())]
        );
        assert!(matches!(wit[1].kind, EventKind::SessionEnd));
        assert!(wit[1].extensions.is_empty());
        let column = |key| {
            columns
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(column(TOOL_RESULT_SESSION), Some(r#""a,b",c,d"#));
        assert_eq!(column(TOOL_RESULT_TOOL), Some(r#""mcp, ""x""",,"""#));
        assert_eq!(column(TOOL_RESULT_WAITED), Some("12000,999,1"));
        assert_eq!(column(TOOL_RESULT_AT), Some("10,12,13"));
        // Before the thinking span, then twice between it and the session end.
        assert_eq!(column(TOOL_RESULT_POSITION), Some("0,1,1"));
        // Without tool results there are no columns.
        assert!(wit_events(&events[1..2]).1.is_empty());
    }
}
