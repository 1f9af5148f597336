//! Small value types shared by the logic and the storage: hashes, slots, ticks, tiers.

use std::fmt;
use std::time::Duration;

/// A block's sequence hash: the chained XXH3-64 of its tokens and every block before it
/// (the same value as `switchyard_core::hash::SequenceHash`, kept as a plain `u64` here so the
/// block manager does not depend on the router core).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceHash(pub u64);

impl fmt::Display for SequenceHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A slot in one tier's pool: the index of a block-sized region of that tier's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// A point in time, in nanoseconds since the caller's epoch. The logic never reads a clock: the
/// gateway passes real time, the simulator a virtual one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Tick(pub u64);

impl Tick {
    /// The tick `duration` after this one (saturating).
    pub fn after(self, duration: Duration) -> Tick {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Tick(self.0.saturating_add(nanos))
    }
}

/// A storage tier, hottest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// G1: device (GPU) memory, or the host slab that stands in for it.
    Device,
    /// G2: host DRAM.
    Host,
    /// G3: local disk.
    Disk,
    /// G4: the shared pool that any worker can read.
    Pool,
}

impl Tier {
    /// The local tiers in write-through order.
    pub const LOCAL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

    /// Dynamo's short name (`g1`..`g4`), used as a metric label.
    pub fn label(self) -> &'static str {
        match self {
            Tier::Device => "g1",
            Tier::Host => "g2",
            Tier::Disk => "g3",
            Tier::Pool => "g4",
        }
    }

    /// The medium name vLLM's KV events use for this tier.
    pub fn medium(self) -> &'static str {
        match self {
            Tier::Device => "GPU",
            Tier::Host => "CPU",
            Tier::Disk | Tier::Pool => "STORAGE",
        }
    }

    pub(crate) fn local_index(self) -> Option<usize> {
        match self {
            Tier::Device => Some(0),
            Tier::Host => Some(1),
            Tier::Disk => Some(2),
            Tier::Pool => None,
        }
    }

    /// The tier a block is written through to from this one.
    pub fn below(self) -> Option<Tier> {
        match self {
            Tier::Device => Some(Tier::Host),
            Tier::Host => Some(Tier::Disk),
            Tier::Disk | Tier::Pool => None,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}
