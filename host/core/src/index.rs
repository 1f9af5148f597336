//! The global KV block index: which rank holds which block, in which tier.
//!
//! One node per sequence hash. A sequence hash already names a block *with* its whole prefix, so
//! the radix tree's path is implicit in the hash chain: a lookup walks the request's chain from the
//! root and intersects owners as it goes, and there are no edges to compress or merge. Removing a
//! block's last owner deletes its node, so memory is bounded by the blocks the engines hold.
//!
//! The index is a plain value: `apply` takes `&mut self`. Concurrency (readers that never wait behind
//! event application) is the driver's business; the gateway keeps two copies with `left-right`.

use crate::hash::{HashSetByHash, SequenceHash};
use crate::worker::{Rank, Tier};
use smallvec::SmallVec;
use std::collections::HashMap;

/// A change to the index, already translated into our own hash space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexOp {
    /// `rank` now holds `blocks` (a chain, or any set of sequence hashes) in `tier`.
    Store {
        /// Owner.
        rank: Rank,
        /// Where.
        tier: Tier,
        /// Sequence hashes of the stored blocks.
        blocks: Vec<SequenceHash>,
    },
    /// `rank` dropped `blocks` from `tier`.
    Remove {
        /// Owner.
        rank: Rank,
        /// Where.
        tier: Tier,
        /// Sequence hashes of the removed blocks.
        blocks: Vec<SequenceHash>,
    },
    /// `rank` dropped everything (engine restart, `AllBlocksCleared`, lost events, worker removed).
    Clear {
        /// Owner.
        rank: Rank,
    },
}

impl IndexOp {
    /// Blocks this op touches (1 for a clear), the unit of the index benchmark.
    pub fn block_count(&self) -> usize {
        match self {
            IndexOp::Store { blocks, .. } | IndexOp::Remove { blocks, .. } => blocks.len(),
            IndexOp::Clear { .. } => 1,
        }
    }
}

/// How much of a request's prefix one rank holds, split by tier.
///
/// `device` counts the prefix blocks resident on the device; `host` the blocks *beyond* that which
/// are reachable in host memory; `disk` those beyond both. The three never double-count a block, so
/// `total()` is the prefix reachable without recompute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Prefix blocks on the device.
    pub device: u32,
    /// Further prefix blocks in host memory.
    pub host: u32,
    /// Further prefix blocks on disk.
    pub disk: u32,
}

impl Overlap {
    /// Prefix blocks reachable in any tier.
    pub fn total(&self) -> u32 {
        self.device + self.host + self.disk
    }

    /// Combine two views of one rank (e.g. indexed and predicted blocks): the longer prefix wins
    /// in each cumulative tier.
    pub fn max(self, other: Overlap) -> Overlap {
        let device = self.device.max(other.device);
        let hot = (self.device + self.host)
            .max(other.device + other.host)
            .max(device);
        let any = self.total().max(other.total()).max(hot);
        Overlap {
            device,
            host: hot - device,
            disk: any - hot,
        }
    }
}

/// Per-rank result of a lookup: only ranks that hold at least the first block appear.
pub type Matches = Vec<(Rank, Overlap)>;

/// One rank's blocks: a set of sequence hashes per tier, indexed by `Tier as usize`.
#[derive(Debug, Clone)]
struct RankBlocks {
    rank: Rank,
    tiers: [HashSetByHash; 3],
}

// === impl RankBlocks ===

impl RankBlocks {
    /// Tiers holding `hash`, as cumulative flags: (on device, on device or host, anywhere).
    /// Probes only non-empty tiers, and stops at the first tier that holds it.
    #[inline]
    fn present(&self, hash: &SequenceHash) -> [bool; 3] {
        let [device, host, disk] = &self.tiers;
        if !device.is_empty() && device.contains(hash) {
            return [true; 3];
        }
        if !host.is_empty() && host.contains(hash) {
            return [false, true, true];
        }
        [false, false, !disk.is_empty() && disk.contains(hash)]
    }

    fn is_empty(&self) -> bool {
        self.tiers.iter().all(|t| t.is_empty())
    }
}

/// All ranks' blocks.
///
/// Each rank keeps one hash set of sequence hashes per tier. A store or a removal is one probe
/// of that rank's set per block (no owner lists to scan or shrink), a clear drops the rank's sets,
/// and a lookup walks the request's chain once, probing only the ranks still matching.
#[derive(Debug, Clone, Default)]
pub struct KvIndex {
    ranks: Vec<RankBlocks>,
    slots: HashMap<Rank, u32>,
}

// === impl KvIndex ===

impl KvIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one change.
    pub fn apply(&mut self, op: &IndexOp) {
        match op {
            IndexOp::Store { rank, tier, blocks } => {
                let slot = self.slot(*rank);
                let set = &mut self.ranks[slot as usize].tiers[*tier as usize];
                // One insert at a time: `extend` reserves for the whole batch up front, and most of
                // an event's blocks are often held already.
                for &hash in blocks {
                    set.insert(hash);
                }
            }
            IndexOp::Remove { rank, tier, blocks } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                let set = &mut self.ranks[slot as usize].tiers[*tier as usize];
                for hash in blocks {
                    set.remove(hash);
                }
            }
            IndexOp::Clear { rank } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                for set in &mut self.ranks[slot as usize].tiers {
                    *set = HashSetByHash::default();
                }
            }
        }
    }

    /// How far each rank holds the prefix named by `hashes` (a request's sequence hashes).
    pub fn find_matches(&self, hashes: &[SequenceHash]) -> Matches {
        self.find_matches_iter(hashes.iter().copied())
    }

    /// [`find_matches`](Self::find_matches) over hashes produced on demand: the walk stops at the
    /// first block no rank holds, so a caller that chains hashes lazily computes only those.
    pub fn find_matches_iter(&self, hashes: impl IntoIterator<Item = SequenceHash>) -> Matches {
        // Per matching rank: still on device / on device or host / anywhere, and those depths.
        struct Run {
            slot: u32,
            live: [bool; 3],
            depth: [u32; 3],
        }
        let mut hashes = hashes.into_iter();
        let Some(first) = hashes.next() else {
            return Matches::new();
        };
        let mut runs: SmallVec<[Run; 16]> = SmallVec::new();
        for (slot, blocks) in self.ranks.iter().enumerate() {
            let present = blocks.present(&first);
            if present[2] {
                runs.push(Run {
                    slot: slot as u32,
                    live: present,
                    depth: present.map(u32::from),
                });
            }
        }
        if !runs.is_empty() {
            for hash in hashes {
                let mut any_live = false;
                for run in runs.iter_mut().filter(|r| r.live[2]) {
                    let present = self.ranks[run.slot as usize].present(&hash);
                    for ((live, depth), here) in
                        run.live.iter_mut().zip(&mut run.depth).zip(present)
                    {
                        *live &= here;
                        *depth += u32::from(*live);
                    }
                    any_live |= run.live[2];
                }
                if !any_live {
                    break;
                }
            }
        }
        runs.iter()
            .map(|run| {
                let [device, hot, any] = run.depth;
                let overlap = Overlap {
                    device,
                    host: hot - device,
                    disk: any - hot,
                };
                (self.ranks[run.slot as usize].rank, overlap)
            })
            .collect()
    }

    /// Blocks `rank` holds in `tier`.
    pub fn blocks(&self, rank: Rank, tier: Tier) -> u64 {
        self.slots.get(&rank).map_or(0, |&slot| {
            self.ranks[slot as usize].tiers[tier as usize].len() as u64
        })
    }

    /// Blocks `rank` holds in any tier (counting a block once per tier).
    pub fn total_blocks(&self, rank: Rank) -> u64 {
        Tier::ALL.iter().map(|&t| self.blocks(rank, t)).sum()
    }

    /// Distinct blocks (nodes) in the index. Counts the union of every rank's sets: for tests and
    /// reports, not the request path.
    pub fn node_count(&self) -> usize {
        let mut blocks = self.ranks.iter().filter(|r| !r.is_empty());
        let Some(first) = blocks.next() else {
            return 0;
        };
        let mut distinct: HashSetByHash = first.tiers.iter().flatten().copied().collect();
        for rank in blocks {
            distinct.extend(rank.tiers.iter().flatten().copied());
        }
        distinct.len()
    }

    /// Whether `rank` holds `hash` in `tier`.
    pub fn contains(&self, rank: Rank, tier: Tier, hash: SequenceHash) -> bool {
        self.slots
            .get(&rank)
            .is_some_and(|&slot| self.ranks[slot as usize].tiers[tier as usize].contains(&hash))
    }

    fn slot(&mut self, rank: Rank) -> u32 {
        if let Some(&slot) = self.slots.get(&rank) {
            return slot;
        }
        let slot = self.ranks.len() as u32;
        self.ranks.push(RankBlocks {
            rank,
            tiers: Default::default(),
        });
        self.slots.insert(rank, slot);
        slot
    }
}

#[cfg(test)]
mod tests;
