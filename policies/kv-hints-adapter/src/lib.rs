//! Runs a native `switchyard_core` KV-hint strategy as an SDK [`KvHintPolicy`], so the built-in
//! `kv-hints` components are the core's code compiled to Wasm, not ports of it (the twin of
//! `admission-adapter`).
//!
//! A component names its strategy with a [`Builtin`] and exports [`Native`] of it. Each call
//! converts the SDK's events and index into the core's [`LifecycleEvent`]s and [`IndexState`],
//! putting the tool results the host sent as `index-state` extension columns
//! ([`sdk::IndexState::tool_results`]) back among the events where they happened, calls the
//! core strategy, which keeps its state across calls, and converts its hints back. Times cross
//! the WIT boundary in whole milliseconds, which is the resolution the core strategies read
//! them at, so the component's hints are exactly the native strategy's.

use std::fmt;
use std::time::Duration;
use switchyard_core::kv_hints::{
    self as core, HintKind, HintTier, IndexState, KvHint, LifecycleEvent, LifecycleKind, RankUsage,
    SessionResidency,
};
use switchyard_core::worker::Rank;
use switchyard_policy_sdk::{self as sdk, KvHintPolicy, PolicyMetadata};

/// A native KV-hint strategy a component ships: how to build it and how to describe it.
pub trait Builtin {
    /// The core strategy.
    type Policy: core::KvHintPolicy;

    /// The strategy the component runs (a component cannot read files: its defaults).
    fn policy() -> Self::Policy;

    /// The component's metadata; `policy` is the running strategy, for its parameters.
    fn metadata(policy: &Self::Policy) -> PolicyMetadata;

    /// The policy configured with `params` (WIT 1.1 `configure`, the same `key=value` pairs as
    /// the native spec `name:key=value`), or why not. Default: no parameters taken.
    fn configure(params: &sdk::Params) -> Result<Self::Policy, String> {
        let policy = Self::policy();
        sdk::no_params(&Self::metadata(&policy).name, params)?;
        Ok(policy)
    }
}

/// The core strategy of `B` behind the SDK's [`KvHintPolicy`]; export it with
/// `switchyard_policy_sdk::export_kv_hints!(Native<B>)`.
pub struct Native<B: Builtin> {
    policy: B::Policy,
}

impl<B: Builtin> Native<B> {
    /// The core strategy, to inspect its state.
    pub fn policy(&self) -> &B::Policy {
        &self.policy
    }
}

impl<B: Builtin> Default for Native<B> {
    fn default() -> Self {
        Self {
            policy: B::policy(),
        }
    }
}

impl<B: Builtin> fmt::Debug for Native<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Native")
            .field("policy", &self.policy)
            .finish()
    }
}

impl<B: Builtin> KvHintPolicy for Native<B> {
    fn metadata(&self) -> PolicyMetadata {
        B::metadata(&self.policy)
    }

    fn on_events(
        &mut self,
        now_ms: u64,
        events: &[sdk::LifecycleEvent],
        index: &sdk::IndexState,
    ) -> Vec<sdk::Hint> {
        let hints = core::KvHintPolicy::on_events(
            &mut self.policy,
            &lifecycle_events(events, index),
            &index_state(index),
            millis(now_ms),
        );
        sdk_hints(hints)
    }

    fn on_outcomes(&mut self, now_ms: u64, outcomes: &sdk::HintOutcomes) {
        core::KvHintPolicy::on_outcomes(&mut self.policy, &hint_outcomes(outcomes), millis(now_ms));
    }

    fn configure(&mut self, params: &sdk::Params) -> Result<(), String> {
        self.policy = B::configure(params)?;
        Ok(())
    }
}

/// The SDK's outcome columns as the core's rows.
pub fn hint_outcomes(outcomes: &sdk::HintOutcomes) -> Vec<core::HintOutcome> {
    use switchyard_core::kv_hints::actions::{ActionType, Outcome};
    outcomes
        .iter()
        .map(|o| core::HintOutcome {
            session_id: o.session_id.map(str::to_owned),
            rank: Rank::new(o.rank.0, o.rank.1),
            action: match o.action {
                sdk::HintAction::Demote => ActionType::Demote,
                sdk::HintAction::Prefetch => ActionType::Prefetch,
                sdk::HintAction::Pin => ActionType::Pin,
                sdk::HintAction::Retain => ActionType::Retain,
                sdk::HintAction::Evict => ActionType::Evict,
                sdk::HintAction::Ephemeral => ActionType::Ephemeral,
            },
            outcome: match o.outcome {
                sdk::HintOutcome::Accepted => Outcome::Accepted,
                sdk::HintOutcome::Clipped => Outcome::Clipped,
                sdk::HintOutcome::Deferred => Outcome::Deferred,
                sdk::HintOutcome::Rejected => Outcome::Rejected,
                sdk::HintOutcome::Missing => Outcome::Missing,
            },
            blocks: o.blocks,
        })
        .collect()
}

/// Metadata naming the strategy and listing its parameters as extensions (`demote_threshold =
/// 2000ms`).
pub fn metadata(
    name: &str,
    version: &str,
    description: &str,
    params: impl IntoIterator<Item = (&'static str, String)>,
) -> PolicyMetadata {
    params.into_iter().fold(
        PolicyMetadata::new(name, version, description),
        |m, (key, value)| m.with_extension(key, value),
    )
}

/// `d` as the component's metadata lists durations (`1500ms`).
pub fn param_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The events as the core sees them: `events` in order, with the tool results of `index`
/// (its extension columns) put back where they happened.
pub fn lifecycle_events(
    events: &[sdk::LifecycleEvent],
    index: &sdk::IndexState,
) -> Vec<LifecycleEvent> {
    let mut results = index.tool_results();
    // Stable: tool results at the same position keep the host's order.
    results.sort_by_key(|r| r.position);
    let mut results = results.into_iter().peekable();
    let mut merged = Vec::with_capacity(events.len() + results.len());
    for (position, e) in events.iter().enumerate() {
        while let Some(r) = results.next_if(|r| r.position <= position) {
            merged.push(tool_result(r));
        }
        merged.push(lifecycle_event(e));
    }
    merged.extend(results.map(tool_result));
    merged
}

fn tool_result(r: sdk::ToolResult) -> LifecycleEvent {
    LifecycleEvent {
        session_id: r.session_id,
        at: millis(r.at_ms),
        kind: LifecycleKind::ToolResult {
            tool_name: r.tool_name,
            waited: millis(r.waited_ms),
        },
    }
}

fn lifecycle_event(e: &sdk::LifecycleEvent) -> LifecycleEvent {
    let kind = match &e.kind {
        sdk::EventKind::TurnEndWithToolCall(call) => LifecycleKind::TurnEndWithToolCall {
            tool_name: call.tool_name.clone(),
            context_tokens: call.context_tokens,
        },
        sdk::EventKind::SubagentSpawn(child) => LifecycleKind::SubagentSpawn(child.clone()),
        sdk::EventKind::SubagentEnd(child) => LifecycleKind::SubagentEnd(child.clone()),
        sdk::EventKind::Compaction(c) => LifecycleKind::Compaction {
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
        },
        // 0 from a host that does not say where the span starts.
        sdk::EventKind::ThinkingStart => LifecycleKind::ThinkingStart {
            at_token: e.thinking_at_token().unwrap_or(0),
        },
        sdk::EventKind::ThinkingEnd(tokens) => LifecycleKind::ThinkingEnd {
            at_token: e.thinking_at_token().unwrap_or(0),
            tokens: *tokens,
        },
        sdk::EventKind::SessionEnd => LifecycleKind::SessionEnd,
    };
    LifecycleEvent {
        session_id: e.session_id.clone(),
        at: millis(e.at_ms),
        kind,
    }
}

/// The index's columns as the core's rows (ragged columns are cut to the shortest).
pub fn index_state(index: &sdk::IndexState) -> IndexState {
    let r = &index.residency;
    let residency = (0..[
        r.session_ids.len(),
        r.worker_ids.len(),
        r.dp_ranks.len(),
        r.device_blocks.len(),
        r.host_blocks.len(),
        r.disk_blocks.len(),
    ]
    .into_iter()
    .min()
    .unwrap_or(0))
        .map(|i| SessionResidency {
            session_id: r.session_ids[i].clone(),
            rank: Rank::new(r.worker_ids[i], r.dp_ranks[i]),
            device_blocks: r.device_blocks[i],
            host_blocks: r.host_blocks[i],
            disk_blocks: r.disk_blocks[i],
        })
        .collect();
    let u = &index.usage;
    let usage = (0..[
        u.worker_ids.len(),
        u.dp_ranks.len(),
        u.device_used_blocks.len(),
        u.device_capacity_blocks.len(),
        u.host_used_blocks.len(),
        u.host_capacity_blocks.len(),
    ]
    .into_iter()
    .min()
    .unwrap_or(0))
        .map(|i| RankUsage {
            rank: Rank::new(u.worker_ids[i], u.dp_ranks[i]),
            device_used_blocks: u.device_used_blocks[i],
            device_capacity_blocks: u.device_capacity_blocks[i],
            host_used_blocks: u.host_used_blocks[i],
            host_capacity_blocks: u.host_capacity_blocks[i],
        })
        .collect();
    IndexState { residency, usage }
}

/// The core's hints as the SDK's.
pub fn sdk_hints(hints: Vec<KvHint>) -> Vec<sdk::Hint> {
    hints
        .into_iter()
        .map(|h| sdk::Hint {
            session_id: h.session_id,
            target: h.target.map(|r| (r.worker.0, r.dp_rank)),
            kind: match h.kind {
                HintKind::Share(other) => sdk::HintKind::Share(other),
                HintKind::Prefetch(t) => sdk::HintKind::Prefetch(tier(t)),
                HintKind::Demote(t) => sdk::HintKind::Demote(tier(t)),
                HintKind::Pin(ttl) => {
                    sdk::HintKind::Pin(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                }
                HintKind::Retain => sdk::HintKind::Retain,
                HintKind::Evict => sdk::HintKind::Evict,
            },
        })
        .collect()
}

fn tier(t: HintTier) -> sdk::Tier {
    match t {
        HintTier::Device => sdk::Tier::Device,
        HintTier::Host => sdk::Tier::Host,
        HintTier::Disk => sdk::Tier::Disk,
        HintTier::Shared => sdk::Tier::Shared,
    }
}

#[cfg(test)]
mod tests;
