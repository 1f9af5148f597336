//! The KV-hint decision as a policy: session lifecycle events in, cache-placement hints out
//! (agentic-serving.md section 5, "KvHints").
//!
//! Mirrors the `kv-hints` world of `switchyard:policy` (wit/kv-hints.wit); the policy host puts
//! the same trait behind a Wasm component. Hints are advice: engines may clip, defer or reject
//! each, so returning none is always safe.

pub mod actions;
pub mod params;
pub mod sessions;
pub mod strategies;

use crate::worker::Rank;
use std::collections::HashSet;
use std::time::Duration;

/// A storage tier a hint may name. Unlike [`crate::worker::Tier`] it includes storage shared
/// between workers, which hints may target but the per-rank index does not track.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HintTier {
    /// GPU memory.
    Device,
    /// Host (CPU) memory.
    Host,
    /// Local disk.
    Disk,
    /// Storage shared between workers.
    Shared,
}

/// What happened in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleKind {
    /// A turn ended with a tool call: the session comes back when the tool returns.
    TurnEndWithToolCall {
        /// Tool name, if known.
        tool_name: Option<String>,
        /// Prompt tokens the next turn is expected to reuse.
        context_tokens: u64,
    },
    /// The tool result arrived: the session's next turn came in after a turn that ended in a
    /// tool call.
    ToolResult {
        /// The tool's name, if the call named one.
        tool_name: Option<String>,
        /// Time since that turn ended: the tool's run time plus the harness's overhead.
        waited: Duration,
    },
    /// The session spawned a subagent with this session id.
    SubagentSpawn(String),
    /// The subagent with this session id ended.
    SubagentEnd(String),
    /// The context was compacted (summarised): the old prefix will not be reused.
    Compaction {
        /// Context tokens before.
        tokens_before: u64,
        /// Context tokens after.
        tokens_after: u64,
    },
    /// The model started a thinking span at token `at_token` of the session: the turn's prompt
    /// tokens plus the answer's tokens before the span (none when the answer starts with it, as
    /// reasoning models' answers do).
    ThinkingStart {
        /// Where the span starts in the session's tokens.
        at_token: u64,
    },
    /// The thinking span that started at `at_token` ended after `tokens` tokens.
    ThinkingEnd {
        /// Where the span started in the session's tokens.
        at_token: u64,
        /// Its length.
        tokens: u32,
    },
    /// The session ended; its KV may go.
    SessionEnd,
}

impl LifecycleKind {
    /// Its name in metrics and reports (the gateway's `switchyard_kv_lifecycle_events_total`,
    /// the simulator's `kv_hints.events`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::TurnEndWithToolCall { .. } => "turn_end_with_tool_call",
            Self::ToolResult { .. } => "tool_result",
            Self::SubagentSpawn(_) => "subagent_spawn",
            Self::SubagentEnd(_) => "subagent_end",
            Self::Compaction { .. } => "compaction",
            Self::ThinkingStart { .. } => "thinking_start",
            Self::ThinkingEnd { .. } => "thinking_end",
            Self::SessionEnd => "session_end",
        }
    }
}

/// A lifecycle event, tagged with its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// The session.
    pub session_id: String,
    /// When it happened, since the driver's epoch.
    pub at: Duration,
    /// What happened.
    pub kind: LifecycleKind,
}

/// Blocks of one session's prefix cached on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionResidency {
    /// The session.
    pub session_id: String,
    /// The rank holding them.
    pub rank: Rank,
    /// Prefix blocks on the device.
    pub device_blocks: u32,
    /// Further prefix blocks in host memory.
    pub host_blocks: u32,
    /// Further prefix blocks on disk.
    pub disk_blocks: u32,
}

/// KV capacity and usage of one rank, in blocks (capacity 0 when unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankUsage {
    /// The rank.
    pub rank: Rank,
    /// Device blocks in use.
    pub device_used_blocks: u64,
    /// Device capacity.
    pub device_capacity_blocks: u64,
    /// Host-memory blocks in use.
    pub host_used_blocks: u64,
    /// Host-memory capacity (0 also when there is no host tier).
    pub host_capacity_blocks: u64,
}

/// What the KV index knows right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexState {
    /// One entry per (session, rank) pair holding some of the session's blocks.
    pub residency: Vec<SessionResidency>,
    /// One entry per rank.
    pub usage: Vec<RankUsage>,
}

/// What a hint asks the engines to do with a session's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HintKind {
    /// Make the prefix reusable by this other session (e.g. a subagent).
    Share(String),
    /// Bring the prefix up to this tier before the next request.
    Prefetch(HintTier),
    /// Move the prefix down to this tier instead of dropping it (e.g. during a long tool call).
    Demote(HintTier),
    /// Keep the prefix on the device for this long (a lease).
    Pin(Duration),
    /// Keep the prefix cached (any tier) until told otherwise; no guarantee.
    Retain,
    /// The prefix will not be reused: free it first.
    Evict,
}

/// A hint, tagged with the session it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvHint {
    /// The session.
    pub session_id: String,
    /// The rank it targets; `None` means every rank holding the session's blocks.
    pub target: Option<Rank>,
    /// What to do.
    pub kind: HintKind,
}

impl KvHint {
    /// `kind` for `session_id` on every rank holding it.
    pub fn new(session_id: impl Into<String>, kind: HintKind) -> Self {
        Self {
            session_id: session_id.into(),
            target: None,
            kind,
        }
    }
}

/// Why a set of hints cannot be applied: it names a session or rank the inputs never mentioned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    /// A session (tagged or shared with) that no event or residency entry names.
    #[error("hint names unknown session `{0}`")]
    UnknownSession(String),
    /// A target rank the index does not list.
    #[error("hint targets unknown rank {0:?}")]
    UnknownRank(Rank),
}

/// Check `hints` against their inputs: every session they name appears in `events` (as the
/// tagged session or a subagent) or in `index`, and every target rank in `index`. A hint about
/// something the host never reported is a policy bug, so the whole answer is refused.
pub fn check_hints(
    hints: &[KvHint],
    events: &[LifecycleEvent],
    index: &IndexState,
) -> Result<(), HintError> {
    if hints.is_empty() {
        return Ok(());
    }
    let mut sessions: HashSet<&str> = index
        .residency
        .iter()
        .map(|r| r.session_id.as_str())
        .collect();
    for event in events {
        sessions.insert(&event.session_id);
        if let LifecycleKind::SubagentSpawn(child) | LifecycleKind::SubagentEnd(child) = &event.kind
        {
            sessions.insert(child);
        }
    }
    let ranks: HashSet<Rank> = index
        .usage
        .iter()
        .map(|u| u.rank)
        .chain(index.residency.iter().map(|r| r.rank))
        .collect();
    for hint in hints {
        let shared_with = match &hint.kind {
            HintKind::Share(other) => Some(other.as_str()),
            _ => None,
        };
        for session in std::iter::once(hint.session_id.as_str()).chain(shared_with) {
            if !sessions.contains(session) {
                return Err(HintError::UnknownSession(session.to_owned()));
            }
        }
        if let Some(rank) = hint.target.filter(|r| !ranks.contains(r)) {
            return Err(HintError::UnknownRank(rank));
        }
    }
    Ok(())
}

/// A KV-hint decision point. Implementations: [`NoHints`] here, the built-in [`strategies`],
/// and Wasm components.
pub trait KvHintPolicy: Send + std::fmt::Debug {
    /// Name for metrics and logs.
    fn name(&self) -> &str;
    /// Events since the last call (in order) and the index as it stands; returns hints.
    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint>;
    /// What became of the block actions made of earlier hints, as they became known (the
    /// kv-hints world's 1.1 `on-outcomes`). Default: ignore them.
    fn on_outcomes(&mut self, _outcomes: &[HintOutcome], _now: Duration) {}
}

/// What became of one block action the host made of a hint, on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintOutcome {
    /// Session of the hint the action came from (`None`: the host's own action).
    pub session_id: Option<String>,
    /// The rank the action went to.
    pub rank: Rank,
    /// What it asked.
    pub action: actions::ActionType,
    /// What became of it.
    pub outcome: actions::Outcome,
    /// Blocks the outcome covers (as the engine reported, else the blocks sent).
    pub blocks: u32,
}

impl HintOutcome {
    /// What became of `action` on `rank`, as its policy hears it (`None`: not one of our
    /// action types, which no policy asked for).
    pub fn of(
        rank: Rank,
        action: &actions::HintAction,
        outcome: actions::Outcome,
        blocks: u32,
    ) -> Option<Self> {
        Some(Self {
            session_id: action.payload.session_id.clone(),
            rank,
            action: action.kind()?,
            outcome,
            blocks,
        })
    }
}

/// No hints: the engines' own eviction (LRU) decides. The baseline hints are measured against.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHints;

impl KvHintPolicy for NoHints {
    fn name(&self) -> &str {
        "no-hints"
    }

    fn on_events(
        &mut self,
        _events: &[LifecycleEvent],
        _index: &IndexState,
        _now: Duration,
    ) -> Vec<KvHint> {
        Vec::new()
    }
}

/// Names of the native KV-hint policies, [`NoHints`] first, each with its default parameters.
pub const NATIVE_KV_HINTS: [&str; 5] = [
    "no-hints",
    "demote-on-tool-call",
    "subagent-reclaim",
    "share-to-subagent",
    "compaction-evict",
];

/// The native KV-hint policy `spec` names: one of [`NATIVE_KV_HINTS`] (or `none` for
/// `no-hints`), with parameters and joined with others as [`params`] reads them
/// (`demote-on-tool-call:demote_threshold=1s+subagent-reclaim`); `None` if it names none.
pub fn native_kv_hints(spec: &str) -> Option<Box<dyn KvHintPolicy>> {
    params::native_kv_hints_spec(spec).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn_event() -> LifecycleEvent {
        LifecycleEvent {
            session_id: "parent".into(),
            at: Duration::from_millis(5),
            kind: LifecycleKind::SubagentSpawn("child".into()),
        }
    }

    fn index() -> IndexState {
        IndexState {
            residency: vec![SessionResidency {
                session_id: "resident".into(),
                rank: Rank::new(1, 0),
                device_blocks: 10,
                host_blocks: 2,
                disk_blocks: 0,
            }],
            usage: vec![RankUsage {
                rank: Rank::new(0, 0),
                device_used_blocks: 10,
                device_capacity_blocks: 100,
                host_used_blocks: 0,
                host_capacity_blocks: 0,
            }],
        }
    }

    #[test]
    fn no_hints_never_hints() {
        let hints = NoHints.on_events(&[spawn_event()], &index(), Duration::ZERO);
        assert!(hints.is_empty());
        assert_eq!(
            native_kv_hints("none").map(|p| p.name().to_owned()),
            Some("no-hints".into())
        );
        assert!(native_kv_hints("continuum").is_none());
        for name in NATIVE_KV_HINTS {
            assert_eq!(
                native_kv_hints(name).map(|p| p.name().to_owned()),
                Some(name.into())
            );
        }
    }

    #[test]
    fn hints_may_name_event_subagent_and_resident_sessions() {
        let hints = [
            KvHint::new("parent", HintKind::Share("child".into())),
            KvHint::new("resident", HintKind::Demote(HintTier::Host)),
            KvHint {
                target: Some(Rank::new(1, 0)),
                ..KvHint::new("child", HintKind::Pin(Duration::from_secs(45)))
            },
        ];
        assert_eq!(check_hints(&hints, &[spawn_event()], &index()), Ok(()));
    }

    #[test]
    fn unknown_sessions_and_ranks_are_refused() {
        let events = [spawn_event()];
        let stranger = [KvHint::new("stranger", HintKind::Evict)];
        assert_eq!(
            check_hints(&stranger, &events, &index()),
            Err(HintError::UnknownSession("stranger".into()))
        );
        let share = [KvHint::new("parent", HintKind::Share("ghost".into()))];
        assert_eq!(
            check_hints(&share, &events, &index()),
            Err(HintError::UnknownSession("ghost".into()))
        );
        let far = [KvHint {
            target: Some(Rank::new(7, 1)),
            ..KvHint::new("parent", HintKind::Retain)
        }];
        assert_eq!(
            check_hints(&far, &events, &index()),
            Err(HintError::UnknownRank(Rank::new(7, 1)))
        );
    }
}
