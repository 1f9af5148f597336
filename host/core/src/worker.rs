//! Who owns KV blocks: workers, their data-parallel ranks and the memory tiers of a rank.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One engine server (one HTTP base URL), numbered by the gateway's configuration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

/// One data-parallel rank of a worker: the unit that owns a KV cache and receives requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rank {
    /// The engine server.
    pub worker: WorkerId,
    /// Its data-parallel rank (0 without data parallelism).
    pub dp_rank: u32,
}

impl Rank {
    /// Rank `dp_rank` of `worker`.
    pub fn new(worker: u32, dp_rank: u32) -> Self {
        Self {
            worker: WorkerId(worker),
            dp_rank,
        }
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.worker.0, self.dp_rank)
    }
}

/// Where a rank holds a block, hottest first (G1 device, G2 host, G3 disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Tier {
    /// GPU memory: no transfer needed.
    Device,
    /// Host (CPU, pinned) memory.
    Host,
    /// Local disk; also external stores reached through the engine.
    Disk,
}

impl Tier {
    /// All tiers, hottest first.
    pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

    /// The tier an engine's `medium` string names; `None` (absent) means the device.
    pub fn from_medium(medium: Option<&str>) -> Tier {
        match medium.map(str::to_ascii_uppercase).as_deref() {
            None | Some("GPU") | Some("DEVICE") => Tier::Device,
            Some("CPU") | Some("CPU_PINNED") | Some("HOST") => Tier::Host,
            Some(_) => Tier::Disk,
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of tiers, as a bit mask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TierSet(u8);

impl TierSet {
    /// No tier.
    pub const EMPTY: TierSet = TierSet(0);

    /// Whether `tier` is in the set.
    pub fn contains(self, tier: Tier) -> bool {
        self.0 & tier.bit() != 0
    }

    /// The set with `tier` added.
    pub fn with(self, tier: Tier) -> TierSet {
        TierSet(self.0 | tier.bit())
    }

    /// The set with `tier` removed.
    pub fn without(self, tier: Tier) -> TierSet {
        TierSet(self.0 & !tier.bit())
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}
