//! The layout of WIT 1.3's `packed-sessions` and `packed-utilization` (wit/README.md): which
//! column of each list holds what, and the flag bits. The SDK reads it
//! ([`Sessions::unpack`](crate::Sessions::unpack),
//! [`Utilization::unpack`](crate::Utilization::unpack)); the host writes it with these same
//! constants, so the two cannot drift apart.

use crate::admission::SessionPhase;

/// `packed-sessions.counts`, column 0: where each session's id ends in `ids`.
pub const ID_ENDS: usize = 0;
/// Column 1: where each session's parent id ends in `ids`.
pub const PARENT_ENDS: usize = 1;
/// Column 2: the session's phase, as its case index ([`phase`]).
pub const PHASES: usize = 2;
/// Column 3: flag bits ([`HAS_PARENT`], [`PAUSED`], [`HAS_RANK`], [`HAS_TOOL`]).
pub const FLAGS: usize = 3;
/// Column 4: requests running.
pub const ACTIVE: usize = 4;
/// Column 5: requests waiting in the gateway queue.
pub const QUEUED: usize = 5;
/// Column 6: the worker of the session's last rank.
pub const RANK_WORKERS: usize = 6;
/// Column 7: the data-parallel rank of the session's last rank.
pub const RANK_DP: usize = 7;
/// Column 8: where the name of the tool its last turn called ends in `tools`.
pub const TOOL_ENDS: usize = 8;
/// The number of `u32` columns in `packed-sessions.counts`.
pub const SESSION_COUNTS: usize = 9;

/// `packed-sessions.sizes`, column 0: tokens in the session's context.
pub const CONTEXT_TOKENS: usize = 0;
/// Column 1: milliseconds since its first request.
pub const AGE_MS: usize = 1;
/// Column 2: milliseconds since it last had a request running.
pub const IDLE_MS: usize = 2;
/// Column 3: milliseconds paused.
pub const PAUSED_FOR_MS: usize = 3;
/// Column 4: attained service, milliseconds.
pub const SERVICE_MS: usize = 4;
/// The number of `u64` columns in `packed-sessions.sizes`.
pub const SESSION_SIZES: usize = 5;

/// Flag: the session has a parent.
pub const HAS_PARENT: u32 = 1;
/// Flag: paused by an admission action (also while a running request finishes).
pub const PAUSED: u32 = 1 << 1;
/// Flag: the session's last rank is known.
pub const HAS_RANK: u32 = 1 << 2;
/// Flag: its last turn called a tool.
pub const HAS_TOOL: u32 = 1 << 3;

/// The number of `u32` columns in `packed-utilization.counts`: `worker-ids`, `dp-ranks`,
/// `active-requests`, `queue-depth`, `healthy` (1 or 0), in that order.
pub const RANK_COUNTS: usize = 5;

/// Whether a list of `len` entries holds `columns` columns of `count` (a host's lists always
/// do: anything else is malformed, and unpacks as no rows at all rather than misaligned ones).
pub fn holds(len: usize, count: usize, columns: usize) -> bool {
    count.checked_mul(columns).is_some_and(|need| len >= need)
}

/// The phase of a `session-phase` case index; an unknown one reads as idle.
pub fn phase(index: u32) -> SessionPhase {
    match index {
        0 => SessionPhase::Queued,
        1 => SessionPhase::Running,
        2 => SessionPhase::ToolCall,
        3 => SessionPhase::Paused,
        _ => SessionPhase::Idle,
    }
}
