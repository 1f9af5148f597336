//! Engines that name blocks by our hashes (`HashScheme::Ours`): no engine-hash table, and the
//! same index as an engine that names the same blocks its own way.

use super::*;
use proptest::prelude::*;
use switchyard_core::index::KvIndex;

fn raw(hashes: &[SequenceHash]) -> Vec<u64> {
    hashes.iter().map(|h| h.0).collect()
}

#[test]
fn an_engine_that_names_blocks_by_our_hashes_needs_no_table() {
    let tokens = [1, 2, 3, 4, 5, 6];
    let chain = ours(&tokens);
    let mut ingestor = Ingestor::new(rank(), BS);
    let mut seq = 0;
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![
            stored(&raw(&chain[..2]), None, &tokens[..4]),
            stored(&raw(&chain[2..]), Some(chain[1].0), &tokens[4..]),
        ],
    );
    assert_eq!(
        ops,
        vec![
            store(Tier::Device, chain[..2].to_vec()),
            store(Tier::Device, chain[2..].to_vec())
        ]
    );
    assert!(ingestor.blocks.is_empty(), "no engine-hash table");
    // Token-less copies and removals name the index's blocks as they are.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![
            offloaded(&raw(&chain[2..]), "CPU"),
            removed(&raw(&chain[1..]), None),
        ],
    );
    assert_eq!(
        ops,
        vec![
            store(Tier::Host, chain[2..].to_vec()),
            remove(Tier::Device, chain[1..].to_vec())
        ]
    );
    // A store under a parent the rank never held is hashed from the parent's name and indexed
    // (lookups, which walk from the first block, never reach it).
    let other = ours(&[7, 7, 8, 8]);
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![stored(&raw(&other[1..]), Some(other[0].0), &[8, 8])],
    );
    assert_eq!(ops, vec![store(Tier::Device, other[1..].to_vec())]);
    assert_eq!(ingestor.stats().stored_blocks, 5);
    assert_eq!(ingestor.stats().removed_blocks, 2);
    assert_eq!(ingestor.stats().skipped_unknown_parent, 0);
    assert!(ingestor.blocks.is_empty());
    // A reset clears the rank; nothing is kept to relearn from.
    assert_eq!(ingestor.reset(), IndexOp::Clear { rank: rank() });
    assert!(ingestor.blocks.is_empty());

    // Dynamo's transport (local hashes given) takes the same way.
    let hasher = BlockHasher::new(BS as usize);
    let locals = hasher.locals(&tokens);
    let named: Vec<_> = chain
        .iter()
        .map(|h| EngineHash(h.0))
        .zip(locals.clone())
        .collect();
    let mut dynamo = Ingestor::new(rank(), BS).local_hashes();
    let op = dynamo.store_locals(None, &named, Tier::Device);
    assert_eq!(
        op,
        Some(IndexOp::Store {
            rank: rank(),
            tier: Tier::Device,
            blocks: chain.clone(),
            locals,
        })
    );
    let op = dynamo.remove_blocks(&[EngineHash(chain[2].0)], Tier::Device);
    assert_eq!(op, Some(remove(Tier::Device, chain[2..].to_vec())));
    assert!(dynamo.blocks.is_empty());
}

#[test]
fn a_store_that_breaks_the_scheme_clears_the_rank_and_the_table_translates_from_then_on() {
    let tokens = [1, 2, 3, 4];
    let chain = ours(&tokens);
    let mut ingestor = Ingestor::new(rank(), BS);
    let mut seq = 0;
    apply(
        &mut ingestor,
        &mut seq,
        vec![stored(&raw(&chain), None, &tokens)],
    );
    // The same tokens under the engine's own names: the blocks taken on its word go.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![
            stored(&[10, 11], None, &tokens),
            stored(&[20], None, &[5, 6]),
        ],
    );
    assert_eq!(
        ops,
        vec![
            IndexOp::Clear { rank: rank() },
            store(Tier::Device, ours(&[5, 6]))
        ]
    );
    assert_eq!(ingestor.blocks.len(), 1, "the table translates");
    // Even a store named by our hashes goes through it now.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![stored(&raw(&chain), None, &tokens)],
    );
    assert_eq!(ops, vec![store(Tier::Device, chain.clone())]);
    assert_eq!(ingestor.blocks.len(), 3);
}

#[test]
fn the_first_store_decides_and_a_rank_that_takes_hints_keeps_the_table() {
    let tokens = [1, 2, 3, 4];
    let chain = ours(&tokens);
    // The engine's own names first: a later store named by ours is translated like any other.
    let mut ingestor = Ingestor::new(rank(), BS);
    let mut seq = 0;
    apply(&mut ingestor, &mut seq, vec![stored(&[10], None, &[9, 9])]);
    apply(
        &mut ingestor,
        &mut seq,
        vec![stored(&raw(&chain), None, &tokens)],
    );
    assert_eq!(ingestor.blocks.len(), 3);
    // A rank that takes KV hints names blocks by the tiers that hold them: it keeps the table.
    let names = Arc::new(EngineNames::default());
    let mut hinted = Ingestor::new(rank(), BS).naming(names.clone());
    let mut seq = 0;
    apply(
        &mut hinted,
        &mut seq,
        vec![stored(&raw(&chain), None, &tokens)],
    );
    assert_eq!(hinted.blocks.len(), 2);
    assert_eq!(
        names.engine_hashes(&raw(&chain)),
        chain.iter().map(|h| Some(h.0)).collect::<Vec<_>>()
    );
}

/// What an engine does to its cache, over a few token sequences that share prefixes.
#[derive(Debug, Clone)]
enum Step {
    /// Compute `sequence`'s blocks up to `blocks` on the device (those not held yet, under the
    /// last one held, as an engine does).
    Compute { sequence: usize, blocks: usize },
    /// Drop block `block` of `sequence` from `tier` (0: device, 1: host), if held there.
    Drop {
        sequence: usize,
        block: usize,
        tier: usize,
    },
    /// Copy block `block` of `sequence` from the device to host memory (token-less).
    Offload { sequence: usize, block: usize },
    /// Everything dropped.
    Clear,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0..4usize, 1..=5usize).prop_map(|(sequence, blocks)| Step::Compute { sequence, blocks }),
        3 => (0..4usize, 0..5usize, 0..2usize)
            .prop_map(|(sequence, block, tier)| Step::Drop { sequence, block, tier }),
        2 => (0..4usize, 0..5usize).prop_map(|(sequence, block)| Step::Offload { sequence, block }),
        1 => Just(Step::Clear),
    ];
    proptest::collection::vec(step, 1..60)
}

/// The events of `steps` on `sequences`, each block named by `name` of our hash.
fn events_of(sequences: &[Vec<u32>], steps: &[Step], name: impl Fn(u64) -> u64) -> Vec<KvEvent> {
    let chains: Vec<Vec<SequenceHash>> = sequences.iter().map(|s| ours(s)).collect();
    let mut held: [std::collections::HashSet<u64>; 2] = Default::default();
    let mut events = Vec::new();
    for step in steps {
        match *step {
            Step::Compute { sequence, blocks } => {
                let chain = &chains[sequence][..blocks.min(chains[sequence].len())];
                let first = chain
                    .iter()
                    .position(|h| !held[0].contains(&h.0))
                    .unwrap_or(chain.len());
                if first == chain.len() {
                    continue;
                }
                // The blocks before the first new one are held (the engine computes a request
                // whose prefix is on the device); it stores the new ones up to one it holds.
                let end = chain[first..]
                    .iter()
                    .position(|h| held[0].contains(&h.0))
                    .map_or(chain.len(), |n| first + n);
                let new = &chain[first..end];
                let tokens = &sequences[sequence][first * BS as usize..end * BS as usize];
                let parent = first.checked_sub(1).map(|p| name(chain[p].0));
                let hashes: Vec<u64> = new.iter().map(|h| name(h.0)).collect();
                events.push(stored(&hashes, parent, tokens));
                held[0].extend(new.iter().map(|h| h.0));
            }
            Step::Drop {
                sequence,
                block,
                tier,
            } => {
                let Some(hash) = chains[sequence].get(block) else {
                    continue;
                };
                if held[tier].remove(&hash.0) {
                    let medium = (tier == 1).then_some("CPU");
                    events.push(removed(&[name(hash.0)], medium));
                }
            }
            Step::Offload { sequence, block } => {
                let Some(hash) = chains[sequence].get(block) else {
                    continue;
                };
                if held[0].contains(&hash.0) && held[1].insert(hash.0) {
                    events.push(offloaded(&[name(hash.0)], "CPU"));
                }
            }
            Step::Clear => {
                held = Default::default();
                events.push(KvEvent::AllBlocksCleared);
            }
        }
    }
    events
}

fn index_of(events: Vec<KvEvent>) -> (KvIndex, Ingestor) {
    let mut ingestor = Ingestor::new(rank(), BS);
    let mut index = KvIndex::new();
    for (seq, event) in events.into_iter().enumerate() {
        let out = ingestor.on_message(seq as u64, &payload(vec![event]));
        for op in &out.ops {
            index.apply(op);
        }
    }
    (index, ingestor)
}

proptest! {
    /// An engine whose blocks' names are our hashes and one that names the same blocks its own
    /// way leave the same index: the same blocks in each tier and the same matches.
    #[test]
    fn engines_named_by_our_hashes_or_their_own_leave_the_same_index(
        sequences in proptest::collection::vec(
            proptest::collection::vec(1u32..3, 2..=10).prop_map(|mut t| {
                t.truncate(t.len() / 2 * 2);
                t
            }),
            4,
        ),
        steps in steps(),
    ) {
        let (by_ours, ours_ingestor) = index_of(events_of(&sequences, &steps, |h| h));
        let (by_theirs, _) =
            index_of(events_of(&sequences, &steps, |h| h ^ 0x5bd1_e995_0000_0001));
        prop_assert!(ours_ingestor.blocks.is_empty());
        for tier in [Tier::Device, Tier::Host] {
            prop_assert_eq!(by_ours.blocks(rank(), tier), by_theirs.blocks(rank(), tier));
        }
        for sequence in &sequences {
            let chain = ours(sequence);
            prop_assert_eq!(by_ours.find_matches(&chain), by_theirs.find_matches(&chain));
            for hash in &chain {
                for tier in [Tier::Device, Tier::Host] {
                    prop_assert_eq!(
                        by_ours.contains(rank(), tier, *hash),
                        by_theirs.contains(rank(), tier, *hash)
                    );
                }
            }
        }
    }
}
