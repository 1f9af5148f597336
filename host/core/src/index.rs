//! The global KV block index: which rank holds which block, in which tier.
//!
//! One node per sequence hash (and tier in use). A sequence hash already names a block *with* its
//! whole prefix, so the radix tree's path is implicit in the hash chain: a lookup walks the
//! request's chain from the root and intersects owners as it goes. A node's value is a bit mask of
//! its owners, so that walk is one table probe per block whatever the number of ranks, and each
//! rank's depth is where its bit drops out. Removing a block's last owner deletes its node, so
//! memory is bounded by the blocks the engines hold. The tables are [`flat::U64Map`]s: see there
//! and `docs/benchmarks.md` section (a2) for why.
//!
//! The index is a plain value: `apply` takes `&mut self`. Concurrency (readers that never wait behind
//! event application) is the driver's business; the gateway keeps two copies with `left-right`.

use crate::hash::SequenceHash;
use crate::worker::{Rank, Tier, WorkerId};
use flat::U64Map;
use std::collections::HashMap;

pub mod flat;

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

/// The shared KV pool (G4), indexed as one more owner: its event stream goes through the same
/// ingestion as an engine's, and a lookup reports its prefix run like a rank's. The router never
/// routes to it (no worker has this id: the gateway numbers workers from 0 and never reuses one).
pub const SHARED_POOL: Rank = Rank {
    worker: WorkerId(u32::MAX),
    dp_rank: u32::MAX,
};

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

/// Ranks per group: one bit each in a node's owner mask.
const GROUP: usize = 64;

/// Blocks whose table slots a lookup or an event touches before working on any of them.
const PROBE_BATCH: usize = 8;

/// Per tier, sequence hash -> owner bits of the group's ranks (`slot % GROUP`) holding it there.
/// A node disappears with its last owner, so memory follows what the engines hold.
type TierMaps = [U64Map<u64>; 3];

/// Owners of `hash` in a group, as cumulative masks: on device, on device or host, anywhere.
/// Empty tiers (the common case for host and disk) cost no probe.
#[inline]
fn owners(maps: &TierMaps, hash: &SequenceHash) -> [u64; 3] {
    let probe = |map: &U64Map<u64>| {
        if map.is_empty() {
            0
        } else {
            map.get(hash.0).copied().unwrap_or(0)
        }
    };
    let device = probe(&maps[0]);
    let hot = device | probe(&maps[1]);
    [device, hot, hot | probe(&maps[2])]
}

#[derive(Debug, Clone)]
struct RankEntry {
    rank: Rank,
    /// Blocks held per tier, indexed by `Tier as usize`.
    blocks: [u64; 3],
}

/// All ranks' blocks.
///
/// One node per sequence hash and tier, whose value is a bit mask of the ranks holding it (ranks
/// come in groups of 64, one map set per group). A store or a removal is one probe per block; a
/// lookup is one probe per prefix block and tier in use, whatever the number of ranks, and tracks
/// every rank's depth with mask operations.
#[derive(Debug, Clone, Default)]
pub struct KvIndex {
    groups: Vec<TierMaps>,
    ranks: Vec<RankEntry>,
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
                let slot = self.slot(*rank) as usize;
                let bit = 1u64 << (slot % GROUP);
                let map = &mut self.groups[slot / GROUP][*tier as usize];
                let mut added = 0;
                for chunk in blocks.chunks(PROBE_BATCH) {
                    for hash in chunk {
                        map.prefetch(hash.0);
                    }
                    for hash in chunk {
                        let owners = map.get_or_insert(hash.0, 0);
                        added += u64::from(*owners & bit == 0);
                        *owners |= bit;
                    }
                }
                self.ranks[slot].blocks[*tier as usize] += added;
            }
            IndexOp::Remove { rank, tier, blocks } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                let slot = slot as usize;
                let bit = 1u64 << (slot % GROUP);
                let map = &mut self.groups[slot / GROUP][*tier as usize];
                let mut removed = 0;
                for chunk in blocks.chunks(PROBE_BATCH) {
                    for hash in chunk {
                        map.prefetch(hash.0);
                    }
                    for hash in chunk {
                        map.update_or_remove(hash.0, |owners| {
                            removed += u64::from(*owners & bit != 0);
                            *owners &= !bit;
                            *owners != 0
                        });
                    }
                }
                self.ranks[slot].blocks[*tier as usize] -= removed;
            }
            IndexOp::Clear { rank } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                let slot = slot as usize;
                if self.ranks[slot].blocks == [0; 3] {
                    return;
                }
                let bit = 1u64 << (slot % GROUP);
                for map in &mut self.groups[slot / GROUP] {
                    map.retain(|_, owners| {
                        *owners &= !bit;
                        *owners != 0
                    });
                }
                self.ranks[slot].blocks = [0; 3];
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
        let mut matches = Matches::new();
        self.find_matches_into(hashes, &mut matches);
        matches
    }

    /// [`find_matches_iter`](Self::find_matches_iter) into a caller's buffer (cleared first), so a
    /// decision path that keeps one buffer allocates nothing here (with up to 64 ranks; more share
    /// one lazily grown copy of the chain).
    pub fn find_matches_into(
        &self,
        hashes: impl IntoIterator<Item = SequenceHash>,
        matches: &mut Matches,
    ) {
        matches.clear();
        match self.groups.as_slice() {
            [] => {}
            [group] => self.match_group(0, group, hashes, matches),
            groups => {
                // Several groups walk the same chain: compute it once, as far as the deepest walk.
                let mut chain = hashes.into_iter();
                let mut seen: Vec<SequenceHash> = Vec::new();
                for (g, group) in groups.iter().enumerate() {
                    let replay = Replay {
                        seen: &mut seen,
                        at: 0,
                        rest: &mut chain,
                    };
                    self.match_group(g, group, replay, matches);
                }
            }
        }
    }

    /// The walk of one group: per depth, one probe per tier in use, and masks of the ranks still
    /// matching on device / device or host / anywhere; a rank's depth is where it drops out.
    fn match_group(
        &self,
        g: usize,
        maps: &TierMaps,
        hashes: impl IntoIterator<Item = SequenceHash>,
        out: &mut Matches,
    ) {
        let mut hashes = hashes.into_iter();
        let Some(first) = hashes.next() else {
            return;
        };
        let mut live = owners(maps, &first);
        let holders = live[2];
        if holders == 0 {
            return;
        }
        let mut depth = [[0u32; GROUP]; 3];
        let mut walked = 1u32;
        // Probe a batch of hashes before using any answer: the probes are independent, so their
        // cache misses overlap instead of queueing one behind the other (a deep prefix walks
        // thousands of blocks). At most a batch's worth of hashes is produced past the end.
        let mut batch = [SequenceHash(0); PROBE_BATCH];
        let mut found = [[0u64; 3]; PROBE_BATCH];
        'walk: loop {
            let mut n = 0;
            for (slot, hash) in batch.iter_mut().zip(&mut hashes) {
                *slot = hash;
                n += 1;
            }
            for (here, hash) in found.iter_mut().zip(&batch[..n]) {
                *here = owners(maps, hash);
            }
            for here in &found[..n] {
                for tier in 0..3 {
                    let mut dropped = live[tier] & !here[tier];
                    while dropped != 0 {
                        depth[tier][dropped.trailing_zeros() as usize] = walked;
                        dropped &= dropped - 1;
                    }
                    live[tier] &= here[tier];
                }
                if live[2] == 0 {
                    break 'walk;
                }
                walked += 1;
            }
            if n < PROBE_BATCH {
                break;
            }
        }
        for (tier, mut rest) in live.into_iter().enumerate() {
            while rest != 0 {
                depth[tier][rest.trailing_zeros() as usize] = walked;
                rest &= rest - 1;
            }
        }
        let mut bits = holders;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let (device, hot, any) = (depth[0][b], depth[1][b], depth[2][b]);
            let overlap = Overlap {
                device,
                host: hot - device,
                disk: any - hot,
            };
            out.push((self.ranks[g * GROUP + b].rank, overlap));
        }
    }

    /// Blocks `rank` holds in `tier`.
    pub fn blocks(&self, rank: Rank, tier: Tier) -> u64 {
        self.slots
            .get(&rank)
            .map_or(0, |&slot| self.ranks[slot as usize].blocks[tier as usize])
    }

    /// Blocks `rank` holds in any tier (counting a block once per tier).
    pub fn total_blocks(&self, rank: Rank) -> u64 {
        Tier::ALL.iter().map(|&t| self.blocks(rank, t)).sum()
    }

    /// Distinct blocks (nodes) in the index. With one group and one tier in use this is a map's
    /// length; otherwise it counts a union, for tests and reports rather than the request path.
    pub fn node_count(&self) -> usize {
        let used: Vec<&U64Map<u64>> = self
            .groups
            .iter()
            .flatten()
            .filter(|m| !m.is_empty())
            .collect();
        match used.as_slice() {
            [] => 0,
            [only] => only.len(),
            maps => {
                let mut distinct = U64Map::<()>::new();
                for map in maps {
                    for key in map.keys() {
                        distinct.get_or_insert(key, ());
                    }
                }
                distinct.len()
            }
        }
    }

    /// Heap bytes of the index's tables (both tiers' maps of every group), for reports.
    pub fn heap_bytes(&self) -> usize {
        self.groups.iter().flatten().map(U64Map::heap_bytes).sum()
    }

    /// Whether `rank` holds `hash` in `tier`.
    pub fn contains(&self, rank: Rank, tier: Tier, hash: SequenceHash) -> bool {
        let Some(&slot) = self.slots.get(&rank) else {
            return false;
        };
        let slot = slot as usize;
        self.groups[slot / GROUP][tier as usize]
            .get(hash.0)
            .is_some_and(|owners| owners & (1u64 << (slot % GROUP)) != 0)
    }

    fn slot(&mut self, rank: Rank) -> u32 {
        if let Some(&slot) = self.slots.get(&rank) {
            return slot;
        }
        let slot = self.ranks.len();
        self.ranks.push(RankEntry {
            rank,
            blocks: [0; 3],
        });
        if slot / GROUP == self.groups.len() {
            self.groups.push(TierMaps::default());
        }
        self.slots.insert(rank, slot as u32);
        slot as u32
    }
}

/// A chain shared by several walks: hashes already produced are replayed, then the source continues.
struct Replay<'a, I> {
    seen: &'a mut Vec<SequenceHash>,
    at: usize,
    rest: &'a mut I,
}

impl<I: Iterator<Item = SequenceHash>> Iterator for Replay<'_, I> {
    type Item = SequenceHash;

    fn next(&mut self) -> Option<SequenceHash> {
        let hash = match self.seen.get(self.at) {
            Some(&hash) => hash,
            None => {
                let hash = self.rest.next()?;
                self.seen.push(hash);
                hash
            }
        };
        self.at += 1;
        Some(hash)
    }
}

#[cfg(test)]
mod tests;
