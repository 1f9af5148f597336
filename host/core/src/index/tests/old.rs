//! The index as it was before the per-rank sets (one node per sequence hash with an owner list),
//! kept as the reference the property test compares the current index against.

use crate::hash::{HashMapByHash, SequenceHash};
use crate::index::{IndexOp, Matches, Overlap};
use crate::worker::{Rank, Tier, TierSet};
use smallvec::SmallVec;
use std::collections::HashMap;

type Owners = SmallVec<[(u32, TierSet); 4]>;

#[derive(Debug, Clone)]
struct RankEntry {
    rank: Rank,
    /// Blocks held per tier, indexed by `Tier as usize`.
    blocks: [u64; 3],
}

/// All ranks' blocks in one structure.
#[derive(Debug, Default)]
pub(super) struct KvIndex {
    nodes: HashMapByHash<Owners>,
    ranks: Vec<RankEntry>,
    slots: HashMap<Rank, u32>,
}

// === impl KvIndex ===

impl KvIndex {
    /// An empty index.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Apply one change.
    pub(super) fn apply(&mut self, op: &IndexOp) {
        match op {
            IndexOp::Store {
                rank, tier, blocks, ..
            } => {
                let slot = self.slot(*rank);
                for &hash in blocks {
                    let owners = self.nodes.entry(hash).or_default();
                    match owners.iter_mut().find(|(s, _)| *s == slot) {
                        Some((_, tiers)) if tiers.contains(*tier) => continue,
                        Some((_, tiers)) => *tiers = tiers.with(*tier),
                        None => owners.push((slot, TierSet::EMPTY.with(*tier))),
                    }
                    self.ranks[slot as usize].blocks[*tier as usize] += 1;
                }
            }
            IndexOp::Remove { rank, tier, blocks } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                for hash in blocks {
                    let Some(owners) = self.nodes.get_mut(hash) else {
                        continue;
                    };
                    let Some(pos) = owners.iter().position(|(s, _)| *s == slot) else {
                        continue;
                    };
                    let tiers = owners[pos].1;
                    if !tiers.contains(*tier) {
                        continue;
                    }
                    self.ranks[slot as usize].blocks[*tier as usize] -= 1;
                    let left = tiers.without(*tier);
                    if left.is_empty() {
                        owners.swap_remove(pos);
                        if owners.is_empty() {
                            self.nodes.remove(hash);
                        }
                    } else {
                        owners[pos].1 = left;
                    }
                }
            }
            IndexOp::Clear { rank } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                if self.ranks[slot as usize].blocks == [0; 3] {
                    return;
                }
                self.nodes.retain(|_, owners| {
                    owners.retain(|(s, _)| *s != slot);
                    !owners.is_empty()
                });
                self.ranks[slot as usize].blocks = [0; 3];
            }
        }
    }

    /// How far each rank holds the prefix named by `hashes` (a request's sequence hashes).
    pub(super) fn find_matches(&self, hashes: &[SequenceHash]) -> Matches {
        self.find_matches_iter(hashes.iter().copied())
    }

    /// [`find_matches`](Self::find_matches) over hashes produced on demand: the walk stops at the
    /// first block no rank holds, so a caller that chains hashes lazily computes only those.
    pub(super) fn find_matches_iter(
        &self,
        hashes: impl IntoIterator<Item = SequenceHash>,
    ) -> Matches {
        // Per matching rank: (slot, still on device, still on device or host, still anywhere, depths).
        struct Run {
            slot: u32,
            live: [bool; 3],
            depth: [u32; 3],
        }
        let mut runs: SmallVec<[Run; 16]> = SmallVec::new();
        for (i, hash) in hashes.into_iter().enumerate() {
            let Some(owners) = self.nodes.get(&hash) else {
                break;
            };
            if i == 0 {
                for &(slot, tiers) in owners {
                    let device = tiers.contains(Tier::Device);
                    let hot = device || tiers.contains(Tier::Host);
                    runs.push(Run {
                        slot,
                        live: [device, hot, true],
                        depth: [device as u32, hot as u32, 1],
                    });
                }
                continue;
            }
            let mut any_live = false;
            for run in runs.iter_mut().filter(|r| r.live[2]) {
                let tiers = owners
                    .iter()
                    .find(|(s, _)| *s == run.slot)
                    .map_or(TierSet::EMPTY, |(_, t)| *t);
                let device = tiers.contains(Tier::Device);
                let hot = device || tiers.contains(Tier::Host);
                let present = [device, hot, !tiers.is_empty()];
                for ((live, depth), here) in run.live.iter_mut().zip(&mut run.depth).zip(present) {
                    *live &= here;
                    *depth += *live as u32;
                }
                any_live |= run.live[2];
            }
            if !any_live {
                break;
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
    pub(super) fn blocks(&self, rank: Rank, tier: Tier) -> u64 {
        self.slots
            .get(&rank)
            .map_or(0, |&slot| self.ranks[slot as usize].blocks[tier as usize])
    }

    /// Blocks `rank` holds in any tier (counting a block once per tier).
    pub(super) fn total_blocks(&self, rank: Rank) -> u64 {
        Tier::ALL.iter().map(|&t| self.blocks(rank, t)).sum()
    }

    /// Distinct blocks (nodes) in the index.
    pub(super) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Whether `rank` holds `hash` in `tier`.
    pub(super) fn contains(&self, rank: Rank, tier: Tier, hash: SequenceHash) -> bool {
        let Some(&slot) = self.slots.get(&rank) else {
            return false;
        };
        self.nodes.get(&hash).is_some_and(|owners| {
            owners
                .iter()
                .any(|(s, tiers)| *s == slot && tiers.contains(tier))
        })
    }

    fn slot(&mut self, rank: Rank) -> u32 {
        if let Some(&slot) = self.slots.get(&rank) {
            return slot;
        }
        let slot = self.ranks.len() as u32;
        self.ranks.push(RankEntry {
            rank,
            blocks: [0; 3],
        });
        self.slots.insert(rank, slot);
        slot
    }
}
