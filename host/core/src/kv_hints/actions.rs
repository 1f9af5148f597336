//! Hints as engines receive them: concrete block ranges in the `kv_hints` envelope that vLLM
//! merged (PR 53423; proposed identically for SGLang and TensorRT-LLM), and what became of each.
//!
//! A [`KvHint`](super::KvHint) names a session; an engine knows only blocks. The gateway (or the
//! simulator) resolves each hint against the session-prefix index into one [`HintAction`] per
//! rank, naming the blocks by their sequence hashes, root-aligned (the first is the prefix's
//! first block), the way vLLM's only published payload, `kv.fetch@1.0`, names them. The envelope
//! defines no action semantics, so ours are namespaced: `switchyard.kv.demote@1` and so on.
//!
//! Every action ends as one [`Outcome`]; an ignored hint never changes correctness.

use super::HintTier;
use serde::{Deserialize, Serialize};

/// The envelope's protocol version (vLLM's `KvHintsEnvelope`).
pub const PROTOCOL_VERSION: &str = "0.1";

/// The version of every action type below.
pub const ACTION_VERSION: &str = "1";

/// The request field (and control-endpoint body) carrying hints: vLLM's `KvHintsEnvelope`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvHintsEnvelope {
    /// [`PROTOCOL_VERSION`].
    pub protocol_version: String,
    /// Unique per envelope; the reply echoes it.
    pub message_id: String,
    /// In order: an engine applies them one after the other.
    pub actions: Vec<HintAction>,
}

/// One action on one rank's blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintAction {
    /// Unique within the envelope; the outcome echoes it.
    pub action_id: String,
    /// A namespaced type: [`ActionType::name`].
    pub action_type: String,
    /// [`ACTION_VERSION`].
    pub action_version: String,
    /// The blocks and the action's arguments.
    pub payload: BlockPayload,
}

/// The payload of every `switchyard.kv.*` action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockPayload {
    /// Sequence hashes of the blocks acted on, in prefix order. Root-aligned (a session's whole
    /// prefix) except for evict, which may name a suffix (a subagent's private blocks): a
    /// sequence hash names its whole prefix, so either is unambiguous.
    pub block_hashes: Vec<u64>,
    /// The tier to move to (demote, prefetch); absent for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<HintTier>,
    /// How long a pin lasts, in milliseconds (pin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The session the blocks belong to, for the engine's logs and metrics only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// What an action asks of the engine holding the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionType {
    /// Move the blocks down to `tier` (host or disk) and free their device copies.
    Demote,
    /// Bring the blocks up to `tier` (device) from wherever the engine holds them.
    Prefetch,
    /// Keep the blocks on the device for `ttl_ms` (a lease, under the engine's pin budget).
    Pin,
    /// Evict the blocks last (a bias, no guarantee).
    Retain,
    /// Free the blocks first, in every tier.
    Evict,
    /// The blocks will not be reused once their request ends: never write them to a lower
    /// tier and evict them first (closed thinking spans).
    Ephemeral,
}

impl ActionType {
    /// Every action type.
    pub const ALL: [ActionType; 6] = [
        ActionType::Demote,
        ActionType::Prefetch,
        ActionType::Pin,
        ActionType::Retain,
        ActionType::Evict,
        ActionType::Ephemeral,
    ];

    /// The namespaced wire name (`switchyard.kv.demote`; with [`ACTION_VERSION`],
    /// `switchyard.kv.demote@1`).
    pub fn name(self) -> &'static str {
        match self {
            ActionType::Demote => "switchyard.kv.demote",
            ActionType::Prefetch => "switchyard.kv.prefetch",
            ActionType::Pin => "switchyard.kv.pin",
            ActionType::Retain => "switchyard.kv.retain",
            ActionType::Evict => "switchyard.kv.evict",
            ActionType::Ephemeral => "switchyard.kv.ephemeral",
        }
    }

    /// A short label for metrics (`demote`).
    pub fn label(self) -> &'static str {
        &self.name()["switchyard.kv.".len()..]
    }

    /// The type a wire name denotes.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl HintAction {
    /// An action of `kind` with `action_id` and `payload`.
    pub fn new(action_id: impl Into<String>, kind: ActionType, payload: BlockPayload) -> Self {
        Self {
            action_id: action_id.into(),
            action_type: kind.name().to_owned(),
            action_version: ACTION_VERSION.to_owned(),
            payload,
        }
    }

    /// Its type, if it is one of ours at [`ACTION_VERSION`]; anything else is answered
    /// [`Outcome::Rejected`].
    pub fn kind(&self) -> Option<ActionType> {
        ActionType::from_name(&self.action_type).filter(|_| self.action_version == ACTION_VERSION)
    }
}

/// What became of an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Done for every block.
    Accepted,
    /// Done for some blocks only (a budget, a full tier, blocks in use).
    Clipped,
    /// Queued: it happens later (or the engine cannot say, e.g. a hint that rode on a request).
    Deferred,
    /// Refused: an unknown type or version, or a tier the engine does not have.
    Rejected,
    /// None of the blocks is where the action needs them.
    Missing,
}

impl Outcome {
    /// Every outcome.
    pub const ALL: [Outcome; 5] = [
        Outcome::Accepted,
        Outcome::Clipped,
        Outcome::Deferred,
        Outcome::Rejected,
        Outcome::Missing,
    ];

    /// Its wire name (`accepted`), also the metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Clipped => "clipped",
            Outcome::Deferred => "deferred",
            Outcome::Rejected => "rejected",
            Outcome::Missing => "missing",
        }
    }
}

/// What became of one action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionOutcome {
    /// The action's id.
    pub action_id: String,
    /// What became of it.
    pub outcome: Outcome,
    /// Blocks it acted on (moved, loaded, pinned, freed).
    pub blocks: u32,
    /// Why it was clipped, deferred, rejected or missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An engine's answer to an envelope: one outcome per action, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvHintsReply {
    /// The envelope's id.
    pub message_id: String,
    /// One per action, in the envelope's order.
    pub outcomes: Vec<ActionOutcome>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_names_round_trip_and_versions_are_checked() {
        for kind in ActionType::ALL {
            assert_eq!(ActionType::from_name(kind.name()), Some(kind));
            assert!(kind.name().ends_with(kind.label()));
        }
        let payload = BlockPayload {
            block_hashes: vec![1, 2],
            tier: Some(HintTier::Host),
            ttl_ms: None,
            session_id: None,
        };
        let mut action = HintAction::new("a1", ActionType::Demote, payload);
        assert_eq!(action.kind(), Some(ActionType::Demote));
        action.action_version = "2".into();
        assert_eq!(action.kind(), None);
    }
}
