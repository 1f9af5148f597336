//! KV hints at the mock engine's edge: what it advertises (`GET /v1/kv_hints`) and what
//! became of every action it was sent, for `/metrics`.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use switchyard_core::kv_hints::actions::{
    ACTION_VERSION, ActionOutcome, ActionType, HintAction, Outcome, PROTOCOL_VERSION,
};

/// The metric label of an action that is not ours (or not at our version).
const OTHER_ACTION: &str = "other";

/// What `GET /v1/kv_hints` answers: the gateway sends hints only to workers that take them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Capabilities {
    pub(crate) protocol_version: &'static str,
    /// Wire names of the action types this engine executes.
    pub(crate) action_types: Vec<&'static str>,
    /// The version of every one of them.
    pub(crate) action_version: &'static str,
    /// The tiers it holds blocks in: where a demote may go.
    pub(crate) tiers: Vec<&'static str>,
}

impl Capabilities {
    /// Every action type works on the device alone except demote and prefetch, which move
    /// blocks to and from a lower tier.
    pub(crate) fn new(host_tier: bool, disk_tier: bool) -> Self {
        let action_types = ActionType::ALL
            .into_iter()
            .filter(|kind| host_tier || !matches!(kind, ActionType::Demote | ActionType::Prefetch))
            .map(ActionType::name)
            .collect();
        let tiers = [("device", true), ("host", host_tier), ("disk", disk_tier)]
            .into_iter()
            .filter_map(|(name, present)| present.then_some(name))
            .collect();
        Self {
            protocol_version: PROTOCOL_VERSION,
            action_types,
            action_version: ACTION_VERSION,
            tiers,
        }
    }
}

/// Actions and their blocks by action type (ours, then other) and outcome.
#[derive(Debug, Default)]
pub(crate) struct HintCounters {
    actions: [[AtomicU64; Outcome::ALL.len()]; ActionType::ALL.len() + 1],
    blocks: [[AtomicU64; Outcome::ALL.len()]; ActionType::ALL.len() + 1],
}

/// One row of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HintSample {
    /// The action type's label (`demote`), or `other`.
    pub(crate) action: &'static str,
    /// The outcome's label.
    pub(crate) outcome: &'static str,
    /// Actions with that type and outcome.
    pub(crate) actions: u64,
    /// Blocks they acted on.
    pub(crate) blocks: u64,
}

impl HintCounters {
    /// Count what became of `actions` (outcomes in the same order).
    pub(crate) fn record(&self, actions: &[HintAction], outcomes: &[ActionOutcome]) {
        for (action, outcome) in actions.iter().zip(outcomes) {
            let row = action
                .kind()
                .and_then(|kind| ActionType::ALL.iter().position(|k| *k == kind))
                .unwrap_or(ActionType::ALL.len());
            let column = Outcome::ALL
                .iter()
                .position(|o| *o == outcome.outcome)
                .unwrap_or_default();
            self.actions[row][column].fetch_add(1, Ordering::Relaxed);
            self.blocks[row][column].fetch_add(u64::from(outcome.blocks), Ordering::Relaxed);
        }
    }

    /// Every (action, outcome) pair with its counts; an unknown action can only be rejected.
    pub(crate) fn samples(&self) -> Vec<HintSample> {
        let labels = ActionType::ALL
            .iter()
            .map(|kind| kind.label())
            .chain([OTHER_ACTION]);
        let mut samples = Vec::new();
        for (row, action) in labels.enumerate() {
            for (column, outcome) in Outcome::ALL.iter().enumerate() {
                if action == OTHER_ACTION && *outcome != Outcome::Rejected {
                    continue;
                }
                samples.push(HintSample {
                    action,
                    outcome: outcome.label(),
                    actions: self.actions[row][column].load(Ordering::Relaxed),
                    blocks: self.blocks[row][column].load(Ordering::Relaxed),
                });
            }
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::kv_hints::actions::BlockPayload;

    fn outcome(outcome: Outcome, blocks: u32) -> ActionOutcome {
        ActionOutcome {
            action_id: "a".into(),
            outcome,
            blocks,
            reason: None,
        }
    }

    #[test]
    fn counts_actions_and_blocks_per_type_and_outcome() {
        let payload = BlockPayload {
            block_hashes: vec![1, 2, 3],
            tier: None,
            ttl_ms: None,
            session_id: None,
        };
        let evict = HintAction::new("a", ActionType::Evict, payload);
        let mut unknown = evict.clone();
        unknown.action_type = "kv.fetch".into();
        let counters = HintCounters::default();
        counters.record(
            &[evict.clone(), evict, unknown],
            &[
                outcome(Outcome::Clipped, 2),
                outcome(Outcome::Clipped, 1),
                outcome(Outcome::Rejected, 0),
            ],
        );
        let samples: Vec<_> = counters
            .samples()
            .into_iter()
            .map(|s| (s.action, s.outcome, s.actions, s.blocks))
            .collect();
        assert!(samples.contains(&("evict", "clipped", 2, 3)));
        assert!(samples.contains(&("other", "rejected", 1, 0)));
        assert!(samples.contains(&("demote", "accepted", 0, 0)));
        assert_eq!(
            samples.len(),
            ActionType::ALL.len() * Outcome::ALL.len() + 1
        );
    }

    #[test]
    fn demote_and_prefetch_need_a_lower_tier() {
        let bare = Capabilities::new(false, false);
        assert!(!bare.action_types.contains(&"switchyard.kv.demote"));
        assert!(bare.action_types.contains(&"switchyard.kv.pin"));
        assert_eq!(bare.tiers, ["device"]);
        let tiered = Capabilities::new(true, true);
        assert_eq!(tiered.action_types.len(), ActionType::ALL.len());
        assert_eq!(tiered.tiers, ["device", "host", "disk"]);
    }
}
