use super::*;
use crate::hash::BlockHasher;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

mod old;

fn chain(tokens: &[u32]) -> Vec<SequenceHash> {
    BlockHasher::new(1).sequence(tokens)
}

fn locals(tokens: &[u32]) -> Vec<LocalBlockHash> {
    BlockHasher::new(1).locals(tokens)
}

/// A prefix of one of a few branching token chains, so lookups share paths.
fn branch_tokens(branch: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| if i < 2 { i } else { i + branch * 100 })
        .collect()
}

fn store(rank: Rank, tier: Tier, blocks: &[SequenceHash]) -> IndexOp {
    IndexOp::Store {
        rank,
        tier,
        blocks: blocks.to_vec(),
        locals: Vec::new(),
    }
}

fn remove(rank: Rank, tier: Tier, blocks: &[SequenceHash]) -> IndexOp {
    IndexOp::Remove {
        rank,
        tier,
        blocks: blocks.to_vec(),
    }
}

fn overlap_of(m: &Matches, rank: Rank) -> Overlap {
    m.iter()
        .find(|(r, _)| *r == rank)
        .map_or(Overlap::default(), |(_, o)| *o)
}

#[test]
fn depth_per_rank_and_tier() {
    let (a, b) = (Rank::new(0, 0), Rank::new(1, 0));
    let seq = chain(&[1, 2, 3, 4, 5]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &seq[..3]));
    index.apply(&store(a, Tier::Host, &seq[..5]));
    index.apply(&store(b, Tier::Disk, &seq[..2]));
    let m = index.find_matches(&seq);
    assert_eq!(
        overlap_of(&m, a),
        Overlap {
            device: 3,
            host: 2,
            disk: 0
        }
    );
    assert_eq!(
        overlap_of(&m, b),
        Overlap {
            device: 0,
            host: 0,
            disk: 2
        }
    );
}

#[test]
fn a_hole_ends_the_prefix() {
    let a = Rank::new(0, 0);
    let seq = chain(&[1, 2, 3, 4]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &seq));
    index.apply(&remove(a, Tier::Device, &seq[1..2]));
    assert_eq!(overlap_of(&index.find_matches(&seq), a).device, 1);
    // Missing first block: no match at all, even though later blocks are held.
    index.apply(&remove(a, Tier::Device, &seq[..1]));
    assert!(index.find_matches(&seq).is_empty());
}

#[test]
fn removing_last_owner_frees_the_node() {
    let (a, b) = (Rank::new(0, 0), Rank::new(0, 1));
    let seq = chain(&[7, 8, 9]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &seq));
    index.apply(&store(b, Tier::Device, &seq[..1]));
    index.apply(&store(a, Tier::Host, &seq));
    assert_eq!(index.node_count(), 3);
    index.apply(&remove(a, Tier::Device, &seq));
    assert_eq!(index.node_count(), 3, "host copies keep the nodes");
    index.apply(&remove(a, Tier::Host, &seq));
    assert_eq!(index.node_count(), 1, "rank b still holds the first block");
    index.apply(&IndexOp::Clear { rank: b });
    assert_eq!(index.node_count(), 0);
    assert_eq!(index.total_blocks(a) + index.total_blocks(b), 0);
}

#[test]
fn a_block_stored_again_is_found_past_its_dead_entry() {
    let (a, b) = (Rank::new(0, 0), Rank::new(1, 0));
    let seq = chain(&[1, 2, 3, 4]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &seq));
    // The tail dies and comes back at the end of the log: the entry after block 1 in the log is
    // dead, and the walk must take the map's word for block 2 rather than the dead entry's.
    index.apply(&remove(a, Tier::Device, &seq[1..]));
    index.apply(&store(b, Tier::Device, &chain(&[9])));
    index.apply(&store(a, Tier::Device, &seq[1..]));
    index.apply(&store(b, Tier::Device, &seq));
    let matches = index.find_matches(&seq);
    assert_eq!(overlap_of(&matches, a).device, 4);
    assert_eq!(overlap_of(&matches, b).device, 4);
    assert_eq!(index.node_count(), 5);
}

#[test]
fn a_lookup_by_local_hashes_follows_only_the_stored_chain() {
    let a = Rank::new(0, 0);
    let hasher = BlockHasher::new(1);
    let mut index = KvIndex::new();
    let stored = IndexOp::Store {
        rank: a,
        tier: Tier::Device,
        blocks: chain(&[0, 1, 2]),
        locals: locals(&[0, 1, 2]),
    };
    index.apply(&stored);
    let mut found = Vec::new();
    index.find_matches_locals_into(&locals(&[0, 1, 2]), &hasher, &mut found);
    assert_eq!(overlap_of(&found, a).device, 3);
    // Block 1 goes, then enough churn to compact the log: block 2 ends up right after block 0.
    // It hangs off block 1, so a prompt [0, 2] (block 2's local hash after block 0) must not
    // follow it.
    index.apply(&remove(a, Tier::Device, &chain(&[0, 1])[1..]));
    for i in 0..2 * COMPACT_MIN as u32 {
        let churn = chain(&[500 + i]);
        index.apply(&store(a, Tier::Host, &churn));
        index.apply(&remove(a, Tier::Host, &churn));
    }
    let hashes = &index.groups[0].hashes;
    assert_eq!(
        hashes[1],
        chain(&[0, 1, 2])[2].0,
        "compacted: block 2 after block 0"
    );
    index.find_matches_locals_into(&locals(&[0, 2]), &hasher, &mut found);
    assert_eq!(overlap_of(&found, a).device, 1);
    index.find_matches_locals_into(&locals(&[0, 1, 2]), &hasher, &mut found);
    assert_eq!(overlap_of(&found, a).device, 1);
}

#[test]
fn compaction_keeps_every_answer() {
    let a = Rank::new(0, 0);
    let keep = chain(&[1, 2, 3]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &keep));
    // Many short-lived chains: their dead entries outnumber the live ones and get compacted.
    for i in 0..50u32 {
        let churn = chain(&[100 + i, 200, 300]);
        index.apply(&store(a, Tier::Host, &churn));
        index.apply(&remove(a, Tier::Host, &churn));
    }
    let group = &index.groups[0];
    assert!(
        group.hashes.len() < 3 + 2 * COMPACT_MIN + 3,
        "log of {} entries",
        group.hashes.len()
    );
    assert_eq!(overlap_of(&index.find_matches(&keep), a).device, 3);
    assert_eq!(index.node_count(), 3);
    assert_eq!(index.blocks(a, Tier::Host), 0);
}

#[test]
fn stores_are_idempotent_and_removes_of_unknown_blocks_ignored() {
    let a = Rank::new(3, 0);
    let seq = chain(&[1, 2]);
    let mut index = KvIndex::new();
    index.apply(&store(a, Tier::Device, &seq));
    index.apply(&store(a, Tier::Device, &seq));
    assert_eq!(index.blocks(a, Tier::Device), 2);
    index.apply(&remove(a, Tier::Device, &chain(&[5, 6])));
    index.apply(&remove(Rank::new(9, 9), Tier::Device, &seq));
    index.apply(&IndexOp::Clear {
        rank: Rank::new(9, 9),
    });
    assert_eq!(index.blocks(a, Tier::Device), 2);
}

#[test]
fn overlap_max_combines_cumulative_tiers() {
    let indexed = Overlap {
        device: 2,
        host: 3,
        disk: 1,
    };
    let predicted = Overlap {
        device: 4,
        host: 0,
        disk: 0,
    };
    assert_eq!(
        indexed.max(predicted),
        Overlap {
            device: 4,
            host: 1,
            disk: 1
        }
    );
}

/// Naive model: per rank, the set of (hash, tier) it holds.
#[derive(Default)]
struct Model(HashMap<Rank, HashSet<(SequenceHash, Tier)>>);

impl Model {
    fn apply(&mut self, op: &IndexOp) {
        match op {
            IndexOp::Store {
                rank, tier, blocks, ..
            } => {
                let set = self.0.entry(*rank).or_default();
                set.extend(blocks.iter().map(|b| (*b, *tier)));
            }
            IndexOp::Remove { rank, tier, blocks } => {
                if let Some(set) = self.0.get_mut(rank) {
                    for b in blocks {
                        set.remove(&(*b, *tier));
                    }
                }
            }
            IndexOp::Clear { rank } => {
                self.0.remove(rank);
            }
        }
    }

    fn overlap(&self, rank: Rank, seq: &[SequenceHash]) -> Overlap {
        let Some(set) = self.0.get(&rank) else {
            return Overlap::default();
        };
        let depth = |tiers: &[Tier]| {
            seq.iter()
                .take_while(|h| tiers.iter().any(|t| set.contains(&(**h, *t))))
                .count() as u32
        };
        let device = depth(&[Tier::Device]);
        let hot = depth(&[Tier::Device, Tier::Host]);
        let any = depth(&Tier::ALL);
        Overlap {
            device,
            host: hot - device,
            disk: any - hot,
        }
    }
}

fn op_strategy() -> impl Strategy<Value = IndexOp> {
    ops_over(
        prop_oneof![Just(Tier::Device), Just(Tier::Host), Just(Tier::Disk)],
        8,
    )
}

/// Ops in `tier`, over chains shorter than `max_len` blocks.
fn ops_over(
    tier: impl Strategy<Value = Tier> + Clone,
    max_len: usize,
) -> impl Strategy<Value = IndexOp> {
    let rank = (0u32..3, 0u32..2).prop_map(|(w, d)| Rank::new(w, d));
    let blocks = (0u32..3, 1..max_len).prop_map(|(branch, len)| chain(&branch_tokens(branch, len)));
    // Stores are a chain's blocks from any point on, with their local hashes or without.
    let stored = (0u32..3, 1..max_len, 0usize..4, any::<bool>()).prop_map(
        |(branch, len, skip, with_locals)| {
            let tokens = branch_tokens(branch, len);
            let skip = skip.min(len - 1);
            let locals = if with_locals {
                locals(&tokens)[skip..].to_vec()
            } else {
                Vec::new()
            };
            (chain(&tokens)[skip..].to_vec(), locals)
        },
    );
    prop_oneof![
        4 => (rank.clone(), tier.clone(), stored).prop_map(|(rank, tier, (blocks, locals))| IndexOp::Store { rank, tier, blocks, locals }),
        3 => (rank.clone(), tier, blocks, 0..max_len).prop_map(|(rank, tier, blocks, skip)| IndexOp::Remove { rank, tier, blocks: blocks.into_iter().skip(skip).collect() }),
        1 => rank.prop_map(|rank| IndexOp::Clear { rank }),
    ]
}

proptest! {
    #[test]
    fn index_agrees_with_naive_model(ops in proptest::collection::vec(op_strategy(), 1..60), branch in 0u32..3) {
        let mut index = KvIndex::new();
        let mut model = Model::default();
        for op in &ops {
            index.apply(op);
            model.apply(op);
        }
        let tokens: Vec<u32> = (0..8u32).map(|i| if i < 2 { i } else { i + branch * 100 }).collect();
        let seq = chain(&tokens);
        let matches = index.find_matches(&seq);
        for w in 0..3 {
            for d in 0..2 {
                let rank = Rank::new(w, d);
                prop_assert_eq!(overlap_of(&matches, rank), model.overlap(rank, &seq));
                let held: u64 = model.0.get(&rank).map_or(0, |s| s.len() as u64);
                prop_assert_eq!(index.total_blocks(rank), held);
            }
        }
        // Memory bound: every node has an owner.
        let distinct: HashSet<SequenceHash> = model.0.values().flatten().map(|(h, _)| *h).collect();
        prop_assert_eq!(index.node_count(), distinct.len());
    }
}

fn sorted(mut m: Matches) -> Matches {
    m.sort_by_key(|(rank, _)| *rank);
    m
}

/// A query's tokens.
fn query_strategy(max_len: usize) -> impl Strategy<Value = Vec<u32>> {
    (0u32..3, 0..max_len).prop_map(|(branch, len)| branch_tokens(branch, len))
}

proptest! {
    /// The per-rank sets answer exactly what the previous index (one node per hash with an owner
    /// list) answered, after every op: the same matches, counts and membership.
    #[test]
    fn index_agrees_with_the_previous_implementation(
        ops in proptest::collection::vec(op_strategy(), 1..80),
        queries in proptest::collection::vec(query_strategy(9), 1..6),
    ) {
        agrees_with_the_previous_implementation(&ops, &queries)?;
    }

    /// The same on a device-only index with chains long enough for a lookup to pass whole chunks
    /// of entries stored in order at once (`Prompt::run`) and read the log ahead of its compares
    /// (`AHEAD`), removals from any point opening holes in them.
    #[test]
    fn long_device_chains_agree_with_the_previous_implementation(
        ops in proptest::collection::vec(ops_over(Just(Tier::Device), LONG), 1..60),
        queries in proptest::collection::vec(query_strategy(LONG + 1), 1..6),
    ) {
        agrees_with_the_previous_implementation(&ops, &queries)?;
    }

    /// The same with host and disk copies, whose walks pass a run only where no tier drops a rank.
    #[test]
    fn long_chains_in_every_tier_agree_with_the_previous_implementation(
        ops in proptest::collection::vec(
            ops_over(prop_oneof![2 => Just(Tier::Device), 1 => Just(Tier::Host), 1 => Just(Tier::Disk)], LONG),
            1..60,
        ),
        queries in proptest::collection::vec(query_strategy(LONG + 1), 1..6),
    ) {
        agrees_with_the_previous_implementation(&ops, &queries)?;
    }
}

/// Longer than a walk's read-ahead, so that long runs read entries ahead.
const LONG: usize = super::AHEAD + 40;

fn agrees_with_the_previous_implementation(
    ops: &[IndexOp],
    queries: &[Vec<u32>],
) -> Result<(), TestCaseError> {
    let mut index = KvIndex::new();
    let mut reference = old::KvIndex::new();
    for op in ops {
        index.apply(op);
        reference.apply(op);
        for tokens in queries {
            let seq = &chain(tokens);
            prop_assert_eq!(
                sorted(index.find_matches(seq)),
                sorted(reference.find_matches(seq))
            );
            let mut by_locals = Vec::new();
            index.find_matches_locals_into(&locals(tokens), &BlockHasher::new(1), &mut by_locals);
            prop_assert_eq!(sorted(by_locals), sorted(reference.find_matches(seq)));
            let mut reused = vec![(Rank::new(99, 0), Overlap::default())];
            index.find_matches_into(seq, &mut reused);
            prop_assert_eq!(sorted(reused), sorted(reference.find_matches(seq)));
        }
        for w in 0..3 {
            for d in 0..2 {
                let rank = Rank::new(w, d);
                for tier in Tier::ALL {
                    prop_assert_eq!(index.blocks(rank, tier), reference.blocks(rank, tier));
                    for tokens in queries {
                        for h in chain(tokens) {
                            prop_assert_eq!(
                                index.contains(rank, tier, h),
                                reference.contains(rank, tier, h)
                            );
                        }
                    }
                }
                prop_assert_eq!(index.total_blocks(rank), reference.total_blocks(rank));
            }
        }
        prop_assert_eq!(index.node_count(), reference.node_count());
    }
    Ok(())
}

proptest! {
    /// More than 64 ranks: several owner-mask groups walk the same chain.
    #[test]
    fn ranks_beyond_one_mask_group_agree_with_the_previous_implementation(
        ops in proptest::collection::vec(
            (0u32..140, 0usize..3, 0u32..3, 1usize..8, any::<bool>()),
            1..200,
        ),
        branch in 0u32..3,
    ) {
        let mut index = KvIndex::new();
        let mut reference = old::KvIndex::new();
        for (worker, tier, b, len, store_it) in ops {
            let tokens: Vec<u32> = (0..len as u32).map(|i| if i < 2 { i } else { i + b * 100 }).collect();
            let (rank, tier, blocks) = (Rank::new(worker, 0), Tier::ALL[tier], chain(&tokens));
            let op = if store_it {
                IndexOp::Store { rank, tier, blocks, locals: Vec::new() }
            } else {
                IndexOp::Remove { rank, tier, blocks: blocks[len / 2..].to_vec() }
            };
            index.apply(&op);
            reference.apply(&op);
        }
        let tokens: Vec<u32> = (0..8u32).map(|i| if i < 2 { i } else { i + branch * 100 }).collect();
        let seq = chain(&tokens);
        prop_assert_eq!(sorted(index.find_matches(&seq)), sorted(reference.find_matches(&seq)));
        prop_assert_eq!(index.node_count(), reference.node_count());
        for worker in 0..140 {
            let rank = Rank::new(worker, 0);
            prop_assert_eq!(index.total_blocks(rank), reference.total_blocks(rank));
        }
    }
}
