use super::*;
use crate::wire::{Encoding, EventBatch, encode_batch};
use switchyard_core::kv_hints::actions::BlockPayload;

mod ours;

const BS: u32 = 2;

fn rank() -> Rank {
    Rank::new(3, 0)
}

fn payload(events: Vec<KvEvent>) -> Vec<u8> {
    let batch = EventBatch {
        ts: 10.0,
        events,
        dp_rank: None,
    };
    encode_batch(&batch, Encoding::Array)
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: tokens.to_vec(),
        block_size: BS,
        lora_id: None,
        lora_name: None,
        extra_keys: false,
        kv_cache_spec_kind: None,
        medium: None,
        group_idx: None,
    }
}

fn offloaded(hashes: &[u64], medium: &str) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        parent_block_hash: None,
        token_ids: vec![],
        block_size: 0,
        lora_id: None,
        lora_name: None,
        extra_keys: false,
        kv_cache_spec_kind: None,
        medium: Some(medium.into()),
        group_idx: None,
    }
}

fn removed(hashes: &[u64], medium: Option<&str>) -> KvEvent {
    KvEvent::BlockRemoved {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        medium: medium.map(str::to_owned),
        group_idx: None,
    }
}

fn ours(tokens: &[u32]) -> Vec<SequenceHash> {
    BlockHasher::new(BS as usize).sequence(tokens)
}

fn store(tier: Tier, blocks: Vec<SequenceHash>) -> IndexOp {
    IndexOp::Store {
        rank: rank(),
        tier,
        blocks,
        locals: Vec::new(),
    }
}

/// `ops` with stores' local hashes left out: most tests check which blocks are stored, and
/// `a_chain_is_stored_with_its_local_hashes` checks the local hashes.
fn sans_locals(ops: &[IndexOp]) -> Vec<IndexOp> {
    ops.iter()
        .cloned()
        .map(|mut op| {
            if let IndexOp::Store { locals, .. } = &mut op {
                locals.clear();
            }
            op
        })
        .collect()
}

fn remove(tier: Tier, blocks: Vec<SequenceHash>) -> IndexOp {
    IndexOp::Remove {
        rank: rank(),
        tier,
        blocks,
    }
}

/// Blocks some tier holds (a reset leaves the others as bare names).
fn held(ingestor: &Ingestor) -> usize {
    let blocks = &ingestor.blocks;
    blocks
        .keys()
        .filter(|&k| !blocks.get(k).unwrap().bare())
        .count()
}

/// An ingestor that has applied seq 0 holding blocks 10, 11 for tokens 1..=4.
fn primed() -> Ingestor {
    let mut ingestor = Ingestor::new(rank(), BS);
    ingestor.on_message(0, &payload(vec![stored(&[10, 11], None, &[1, 2, 3, 4])]));
    ingestor
}

#[test]
fn a_chain_is_stored_with_its_local_hashes() {
    let hasher = BlockHasher::new(BS as usize);
    let locals_of = |op: &IndexOp| match op {
        IndexOp::Store { locals, .. } => locals.clone(),
        other => panic!("not a store: {other:?}"),
    };
    // Off by default.
    let out = Ingestor::new(rank(), BS).on_message(0, &payload(vec![stored(&[10], None, &[1, 2])]));
    assert!(locals_of(&out.ops[0]).is_empty());
    let mut ingestor = Ingestor::new(rank(), BS).local_hashes();
    let out = ingestor.on_message(0, &payload(vec![stored(&[10, 11], None, &[1, 2, 3, 4])]));
    assert_eq!(locals_of(&out.ops[0]), hasher.locals(&[1, 2, 3, 4]));
    // Blocks 10 and 11 are already held: the op stores block 12 alone, and only whole chains
    // carry local hashes (the index then links block 12 by its hash).
    let out = ingestor.on_message(
        1,
        &payload(vec![stored(&[10, 11, 12], None, &[1, 2, 3, 4, 5, 6])]),
    );
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, ours(&[1, 2, 3, 4, 5, 6])[2..].to_vec())]
    );
    assert!(locals_of(&out.ops[0]).is_empty());
    // Dynamo's transport: local hashes given.
    let given = hasher.locals(&[3, 3, 4, 4]);
    let op = ingestor
        .store_locals(
            None,
            &[(EngineHash(30), given[0]), (EngineHash(31), given[1])],
            Tier::Device,
        )
        .expect("new blocks");
    assert_eq!(locals_of(&op), given);
}

#[test]
fn stores_rehash_tokens_into_our_hash_space() {
    let mut ingestor = Ingestor::new(rank(), BS);
    let out = ingestor.on_message(5, &payload(vec![stored(&[10, 11], None, &[1, 2, 3, 4])]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, ours(&[1, 2, 3, 4]))]
    );
    assert_eq!(out.gap, None, "the first message sets the baseline");
    assert_eq!(out.ts, Some(10.0));
    // A continuation chains from the parent's own hash.
    let out = ingestor.on_message(6, &payload(vec![stored(&[12], Some(11), &[5, 6])]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, ours(&[1, 2, 3, 4, 5, 6])[2..].to_vec())]
    );
    assert_eq!(ingestor.stats().stored_blocks, 3);
}

#[test]
fn unknown_parent_and_unaligned_stores_are_skipped() {
    let mut ingestor = primed();
    let events = vec![
        stored(&[20], Some(99), &[5, 6]),
        stored(&[21], None, &[5, 6, 7]),
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(22)],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 4,
            lora_id: None,
            lora_name: None,
            extra_keys: false,
            kv_cache_spec_kind: None,
            medium: None,
            group_idx: None,
        },
    ];
    let out = ingestor.on_message(1, &payload(events));
    assert!(out.ops.is_empty());
    assert_eq!(ingestor.stats().skipped_unknown_parent, 1);
    assert_eq!(ingestor.stats().skipped_unaligned, 2);
}

#[test]
fn other_groups_lora_and_keyed_hashes_are_skipped() {
    let mut ingestor = Ingestor::new(rank(), BS);
    let mut sliding = stored(&[10], None, &[1, 2]);
    if let KvEvent::BlockStored { group_idx, .. } = &mut sliding {
        *group_idx = Some(1);
    }
    let mut adapter = stored(&[11], None, &[1, 2]);
    if let KvEvent::BlockStored { lora_id, .. } = &mut adapter {
        *lora_id = Some(7);
    }
    let mut named_adapter = stored(&[12], None, &[1, 2]);
    if let KvEvent::BlockStored { lora_name, .. } = &mut named_adapter {
        *lora_name = Some("tenant-a".into());
    }
    let mut salted = stored(&[13], None, &[1, 2]);
    if let KvEvent::BlockStored { extra_keys, .. } = &mut salted {
        *extra_keys = true;
    }
    // A salted block's child and its removal name a block the ingestor never took.
    let child = stored(&[14], Some(13), &[3, 4]);
    let events = vec![
        sliding,
        adapter,
        named_adapter,
        salted,
        child,
        removed(&[13], None),
    ];
    let out = ingestor.on_message(0, &payload(events));
    assert!(out.ops.is_empty());
    let stats = ingestor.stats();
    assert_eq!(stats.skipped_other_group, 1);
    assert_eq!(stats.skipped_lora, 2);
    assert_eq!(stats.skipped_extra_keys, 1);
    assert_eq!(stats.skipped_unknown_parent, 1);
    assert_eq!(stats.skipped_unknown_hash, 1);
    // The same tokens stored without keys are indexed.
    let out = ingestor.on_message(1, &payload(vec![stored(&[15], None, &[1, 2])]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, ours(&[1, 2]))]
    );
}

#[test]
fn a_hybrid_model_is_routed_on_its_full_attention_group() {
    // Gemma 3 and gpt-oss: group 0 is the sliding window, group 1 full attention.
    let in_group = |mut event: KvEvent, group: u32, kind: Option<&str>| {
        match &mut event {
            KvEvent::BlockStored {
                group_idx,
                kv_cache_spec_kind,
                ..
            } => {
                *group_idx = Some(group);
                *kv_cache_spec_kind = kind.map(str::to_owned);
            }
            KvEvent::BlockRemoved { group_idx, .. } => *group_idx = Some(group),
            KvEvent::AllBlocksCleared => {}
        }
        event
    };
    let mut ingestor = Ingestor::new(rank(), BS);
    let events = vec![
        in_group(stored(&[20], None, &[5, 6]), 0, Some("sliding_window")),
        in_group(stored(&[21], None, &[1, 2]), 1, Some("full_attention")),
    ];
    let out = ingestor.on_message(0, &payload(events));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, ours(&[1, 2]))]
    );
    // Removals name their group only: group 0's is not routed on, group 1's is.
    let events = vec![
        in_group(removed(&[20], None), 0, None),
        in_group(removed(&[21], None), 1, None),
    ];
    let out = ingestor.on_message(1, &payload(events));
    assert_eq!(out.ops.len(), 1);
    assert!(
        matches!(&out.ops[0], IndexOp::Remove { .. }),
        "{:?}",
        out.ops
    );
    assert_eq!(ingestor.stats().skipped_other_group, 2);
}

#[test]
fn offload_copies_resolve_through_the_map() {
    let mut ingestor = primed();
    let out = ingestor.on_message(1, &payload(vec![offloaded(&[11, 99], "CPU")]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Host, ours(&[1, 2, 3, 4])[1..].to_vec())]
    );
    assert_eq!(ingestor.stats().skipped_unknown_hash, 1);
    // Dropping the device copy leaves the host copy and its map entry.
    let out = ingestor.on_message(2, &payload(vec![removed(&[11], None)]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![remove(Tier::Device, ours(&[1, 2, 3, 4])[1..].to_vec())]
    );
    let out = ingestor.on_message(3, &payload(vec![removed(&[11], Some("CPU_PINNED"))]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![remove(Tier::Host, ours(&[1, 2, 3, 4])[1..].to_vec())]
    );
    assert!(
        !ingestor.blocks.contains_key(EngineHash(11).0),
        "entry dropped with its last copy"
    );
}

#[test]
fn double_copies_are_removed_with_the_last_one() {
    let mut ingestor = primed();
    let again = ingestor.on_message(1, &payload(vec![stored(&[10], None, &[1, 2])]));
    assert!(again.ops.is_empty(), "already held in this tier");
    let first = ingestor.on_message(2, &payload(vec![removed(&[10], None)]));
    assert!(first.ops.is_empty());
    let last = ingestor.on_message(3, &payload(vec![removed(&[10], None)]));
    assert_eq!(
        sans_locals(&last.ops),
        vec![remove(Tier::Device, ours(&[1, 2])[..1].to_vec())]
    );
    let extra = ingestor.on_message(4, &payload(vec![removed(&[10], None)]));
    assert!(extra.ops.is_empty());
    assert_eq!(ingestor.stats().removed_blocks, 1);
    assert_eq!(ingestor.stats().skipped_unknown_hash, 1);
}

#[test]
fn all_blocks_cleared_clears_the_rank_and_the_map() {
    let mut ingestor = primed();
    let out = ingestor.on_message(1, &payload(vec![KvEvent::AllBlocksCleared]));
    assert_eq!(sans_locals(&out.ops), vec![IndexOp::Clear { rank: rank() }]);
    assert!(ingestor.blocks.is_empty());
}

#[test]
fn gaps_are_reported_and_filled_by_replay_in_order() {
    let mut ingestor = primed();
    let lost = payload(vec![stored(&[12], Some(11), &[5, 6])]);
    let arrived = payload(vec![removed(&[12], None)]);
    let out = ingestor.on_message(2, &arrived);
    assert_eq!(
        out.gap,
        Some(Gap {
            expected: 1,
            received: 2
        })
    );
    assert!(
        out.ops.is_empty(),
        "applied after the lost message, through replay"
    );
    assert_eq!(ingestor.missing(), Some(1..3));

    assert!(
        ingestor.on_replayed(0, &payload(vec![])).ops.is_empty(),
        "already applied"
    );
    let block = ours(&[1, 2, 3, 4, 5, 6])[2..].to_vec();
    assert_eq!(
        sans_locals(&ingestor.on_replayed(1, &lost).ops),
        vec![store(Tier::Device, block.clone())]
    );
    assert_eq!(
        sans_locals(&ingestor.on_replayed(2, &arrived).ops),
        vec![remove(Tier::Device, block)]
    );
    assert_eq!(ingestor.missing(), None);
    assert!(
        ingestor.on_replayed(3, &lost).ops.is_empty(),
        "beyond the live stream"
    );
    assert!(ingestor.on_message(3, &payload(vec![])).gap.is_none());
    assert_eq!(ingestor.stats().gaps, 1);
}

#[test]
fn a_replay_with_a_hole_leaves_messages_missing() {
    let mut ingestor = primed();
    ingestor.on_message(3, &payload(vec![]));
    assert!(ingestor.on_replayed(2, &payload(vec![])).ops.is_empty());
    assert_eq!(ingestor.missing(), Some(1..4));
    assert_eq!(ingestor.reset(), IndexOp::Clear { rank: rank() });
    assert_eq!(ingestor.missing(), None);
    assert_eq!(held(&ingestor), 0);
}

#[test]
fn duplicates_are_ignored() {
    let mut ingestor = primed();
    let out = ingestor.on_message(0, &payload(vec![stored(&[30], None, &[9, 9])]));
    assert_eq!(out, Ingested::default());
}

#[test]
fn sequence_reset_is_a_restart() {
    let mut ingestor = primed();
    ingestor.on_message(1, &payload(vec![]));
    let out = ingestor.on_message(0, &payload(vec![stored(&[40], None, &[7, 8])]));
    assert!(out.restarted);
    assert_eq!(
        sans_locals(&out.ops),
        vec![
            IndexOp::Clear { rank: rank() },
            store(Tier::Device, ours(&[7, 8]))
        ]
    );
    assert_eq!(ingestor.stats().restarts, 1);
    assert_eq!(held(&ingestor), 1, "only the new engine's block");
}

#[test]
fn restart_seen_late_is_also_a_gap_from_zero() {
    let mut ingestor = primed();
    ingestor.on_message(9, &payload(vec![]));
    ingestor.reset();
    let out = ingestor.on_message(4, &payload(vec![]));
    assert!(out.restarted);
    assert_eq!(
        out.gap,
        Some(Gap {
            expected: 0,
            received: 4
        })
    );
    assert_eq!(ingestor.missing(), Some(0..5));
}

#[test]
fn malformed_payloads_are_counted_and_advance_the_sequence() {
    let mut ingestor = primed();
    let out = ingestor.on_message(1, b"\xc1 not msgpack");
    assert!(out.malformed && out.ops.is_empty());
    assert!(ingestor.on_message(2, &payload(vec![])).gap.is_none());
    assert_eq!(ingestor.stats().malformed, 1);
    assert_eq!(ingestor.stats().batches, 2);
}

fn mooncake_payload(events: Vec<mooncake::MooncakeEvent>) -> Vec<u8> {
    mooncake::encode(&mooncake::MooncakeBatch {
        ts_ms: 10_000,
        events,
        dp_rank: None,
    })
}

fn mooncake_event(
    event_type: mooncake::MooncakeEventType,
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    medium: &str,
) -> mooncake::MooncakeEvent {
    mooncake::MooncakeEvent {
        event_type,
        object_key: String::new(),
        seq_hashes: hashes.iter().copied().map(EngineHash).collect(),
        backend_id: "pool-0".into(),
        medium: medium.into(),
        parent_hash: parent.map(EngineHash),
        token_ids: tokens.to_vec(),
        block_size: None,
    }
}

#[test]
fn a_pool_stream_is_rehashed_from_its_tokens_and_standard_hashes_are_taken_as_is() {
    use mooncake::MooncakeEventType::{Removed, Stored};
    let mut ingestor = Ingestor::with_format(rank(), BS, WireFormat::Mooncake);
    let tokens = [1, 2, 3, 4, 5, 6];
    let expected = ours(&tokens);

    // Our pool: engine keys with tokens and parent, re-hashed into the router's hashes.
    let out = ingestor.on_message(
        0,
        &mooncake_payload(vec![
            mooncake_event(Stored, &[11, 12], None, &tokens[..4], "CPU"),
            mooncake_event(Stored, &[13], Some(12), &tokens[4..], "CPU"),
        ]),
    );
    assert_eq!(
        sans_locals(&out.ops),
        vec![
            store(Tier::Host, expected[..2].to_vec()),
            store(Tier::Host, expected[2..].to_vec()),
        ]
    );
    // Spilled to its disk: a token-less copy of a known key, then the memory copy leaves.
    let out = ingestor.on_message(
        1,
        &mooncake_payload(vec![
            mooncake_event(Stored, &[13], None, &[], "DISK"),
            mooncake_event(Removed, &[13], None, &[], "CPU"),
        ]),
    );
    assert_eq!(
        sans_locals(&out.ops),
        vec![
            store(Tier::Disk, expected[2..].to_vec()),
            IndexOp::Remove {
                rank: rank(),
                tier: Tier::Host,
                blocks: expected[2..].to_vec(),
            },
        ]
    );
    // A stream that names blocks by tokens never has a token-less block taken as a standard
    // hash: an unknown key is skipped, as on a vLLM stream.
    let out = ingestor.on_message(
        2,
        &mooncake_payload(vec![mooncake_event(Stored, &[99], None, &[], "DISK")]),
    );
    assert!(out.ops.is_empty());
    assert_eq!(ingestor.stats().skipped_unknown_hash, 1);

    // Mooncake Store's own master stream: token-less, keyed by the standard hash itself.
    let mut master = Ingestor::with_format(rank(), BS, WireFormat::Mooncake);
    let out = master.on_message(
        0,
        &mooncake_payload(vec![mooncake_event(Stored, &[777], None, &[], "CPU")]),
    );
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Host, vec![SequenceHash(777)])]
    );
    assert_eq!(ingestor.stats().malformed + master.stats().malformed, 0);

    // A vLLM ingestor does not read Mooncake payloads.
    let mut vllm = Ingestor::new(rank(), BS);
    let out = vllm.on_message(
        0,
        &mooncake_payload(vec![mooncake_event(Stored, &[777], None, &[], "CPU")]),
    );
    assert!(out.malformed || out.ops.is_empty());
}

#[test]
fn engine_names_follow_every_tier_and_clear_with_the_rank() {
    let names = Arc::new(EngineNames::default());
    let mut ingestor = Ingestor::new(rank(), BS).naming(names.clone());
    let tokens = [1, 2, 3, 4];
    let own: Vec<u64> = ours(&tokens).iter().map(|h| h.0).collect();
    ingestor.on_message(0, &payload(vec![stored(&[10, 11], None, &tokens)]));
    assert_eq!(names.engine_hashes(&own), [Some(10), Some(11)]);
    // Offloaded to host memory, then dropped from the device: still named (the host holds it).
    ingestor.on_message(1, &payload(vec![offloaded(&[11], "cpu")]));
    ingestor.on_message(2, &payload(vec![removed(&[10, 11], None)]));
    assert_eq!(names.engine_hashes(&own), [None, Some(11)]);
    ingestor.on_message(3, &payload(vec![removed(&[11], Some("cpu"))]));
    assert_eq!(names.engine_hashes(&own), [None, None]);
    assert!(names.is_empty());
    ingestor.on_message(4, &payload(vec![stored(&[10], None, &tokens[..2])]));
    assert_eq!(names.len(), 1);
    ingestor.on_message(5, &payload(vec![KvEvent::AllBlocksCleared]));
    assert!(names.is_empty());
    // A restart (sequence numbers start again) clears them too.
    ingestor.on_message(6, &payload(vec![stored(&[10], None, &tokens[..2])]));
    ingestor.on_message(0, &payload(vec![]));
    assert!(names.is_empty());
}

#[test]
fn hint_actions_are_named_as_the_engine_names_their_blocks() {
    let names = Arc::new(EngineNames::default());
    let mut ingestor = Ingestor::new(rank(), BS).naming(names.clone());
    let tokens = [1, 2, 3, 4, 5, 6];
    let own: Vec<u64> = ours(&tokens).iter().map(|h| h.0).collect();
    ingestor.on_message(0, &payload(vec![stored(&[10, 11, 12], None, &tokens)]));
    ingestor.on_message(1, &payload(vec![removed(&[11], None)]));
    let action = |id: &str, kind, hashes: &[u64]| {
        let payload = BlockPayload {
            block_hashes: hashes.to_vec(),
            tier: None,
            ttl_ms: None,
            session_id: None,
        };
        HintAction::new(id, kind, payload)
    };
    let mut actions = vec![
        action("demote", ActionType::Demote, &own),
        action("prefetch", ActionType::Prefetch, &own),
        action("evict", ActionType::Evict, &own[1..2]),
    ];
    let unnamed = names.name_actions(&mut actions);
    let named: Vec<(&str, &[u64])> = actions
        .iter()
        .map(|a| (a.action_id.as_str(), a.payload.block_hashes.as_slice()))
        .collect();
    // A gap is skipped, except by a prefetch, whose run must stay root-aligned.
    assert_eq!(named, [("demote", &[10, 12][..]), ("prefetch", &[10][..])]);
    assert_eq!(unnamed.len(), 1);
    assert_eq!(unnamed[0].action_id, "evict");
}

#[test]
fn starting_over_applies_the_replay_from_zero_and_skips_the_live_messages_it_covered() {
    let mut ingestor = primed();
    ingestor.on_message(9, &payload(vec![]));
    // The publisher reconnected (a restart, say): everything is forgotten first.
    assert_eq!(ingestor.start_over(), IndexOp::Clear { rank: rank() });
    let first = ingestor.on_replayed(0, &payload(vec![stored(&[50], None, &[1, 2])]));
    assert_eq!(
        sans_locals(&first.ops),
        vec![store(Tier::Device, ours(&[1, 2]))]
    );
    let second = ingestor.on_replayed(1, &payload(vec![stored(&[51], Some(50), &[3, 4])]));
    assert_eq!(second.ops.len(), 1);
    ingestor.replay_done();
    assert_eq!(ingestor.missing(), None);
    // Live messages queued during the replay repeat it: skipped, not read as a restart.
    let repeat = ingestor.on_message(0, &payload(vec![stored(&[50], None, &[1, 2])]));
    assert!(!repeat.restarted && repeat.ops.is_empty() && repeat.gap.is_none());
    assert!(ingestor.on_message(1, &payload(vec![])).ops.is_empty());
    // The next one follows on.
    let next = ingestor.on_message(2, &payload(vec![removed(&[51], None)]));
    assert!(next.gap.is_none() && !next.restarted);
    assert_eq!(next.ops.len(), 1);
}

#[test]
fn a_replay_that_does_not_start_at_zero_leaves_the_rank_cleared() {
    let mut ingestor = primed();
    ingestor.on_message(9, &payload(vec![]));
    ingestor.start_over();
    // The publisher's buffer begins later (it did not restart; old messages fell out).
    assert!(ingestor.on_replayed(7, &payload(vec![])).ops.is_empty());
    ingestor.replay_done();
    // The next live message is the new baseline.
    let live = ingestor.on_message(12, &payload(vec![stored(&[60], None, &[5, 6])]));
    assert!(live.gap.is_none() && !live.restarted);
    assert_eq!(
        sans_locals(&live.ops),
        vec![store(Tier::Device, ours(&[5, 6]))]
    );
}

#[test]
fn after_a_reset_a_store_under_a_block_the_engine_kept_indexes_its_prefix_again() {
    // Blocks 10, 11 (tokens 1..=4) held; messages are lost and cannot be replayed.
    let mut ingestor = primed();
    ingestor.on_message(3, &payload(vec![]));
    assert_eq!(ingestor.reset(), IndexOp::Clear { rank: rank() });
    assert_eq!(held(&ingestor), 0);
    // The engine kept 10 and 11 (a hot prefix) and computes a block after them: it never
    // stores them again, so only this store says they are held.
    let out = ingestor.on_message(4, &payload(vec![stored(&[12], Some(11), &[5, 6])]));
    let chain = ours(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Device, vec![chain[1], chain[0], chain[2]])]
    );
    assert_eq!(ingestor.stats().relearned_blocks, 2);
    assert_eq!(ingestor.stats().skipped_unknown_parent, 0);
    // They follow their events again: a removal drops the block.
    let out = ingestor.on_message(5, &payload(vec![removed(&[12, 11], None)]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![remove(Tier::Device, vec![chain[2], chain[1]])]
    );
}

#[test]
fn a_reset_keeps_names_not_holdings_and_drops_them_when_they_go() {
    let mut ingestor = primed();
    ingestor.on_message(1, &payload(vec![offloaded(&[10], "cpu")]));
    ingestor.reset();
    // A bare name is no block: removing it changes nothing and forgets it.
    let out = ingestor.on_message(2, &payload(vec![removed(&[11], None)]));
    assert!(out.ops.is_empty());
    assert!(!ingestor.blocks.contains_key(11));
    // A host-tier store says nothing of the device: the name stays bare.
    let host = KvEvent::BlockStored {
        block_hashes: vec![EngineHash(13)],
        parent_block_hash: Some(EngineHash(10)),
        token_ids: vec![7, 8],
        block_size: BS,
        lora_id: None,
        lora_name: None,
        extra_keys: false,
        kv_cache_spec_kind: None,
        medium: Some("cpu".into()),
        group_idx: None,
    };
    let out = ingestor.on_message(3, &payload(vec![host]));
    assert_eq!(
        sans_locals(&out.ops),
        vec![store(Tier::Host, vec![ours(&[1, 2, 7, 8])[1]])]
    );
    assert!(ingestor.blocks.get(10).unwrap().bare());
    // The next reset drops names still bare since the last one; held blocks become names.
    ingestor.reset();
    assert!(!ingestor.blocks.contains_key(10));
    assert!(ingestor.blocks.get(13).unwrap().bare());
    // A parent a reset dropped is unknown again: its children are skipped, never guessed.
    let out = ingestor.on_message(4, &payload(vec![stored(&[14], Some(10), &[9, 9])]));
    assert!(out.ops.is_empty());
    assert_eq!(ingestor.stats().skipped_unknown_parent, 1);
}

#[test]
fn a_cycle_of_bare_parents_ends() {
    let mut ingestor = Ingestor::new(rank(), BS);
    // A hostile stream: 21's parent is 20, then 20 goes and comes back under 21.
    ingestor.on_message(0, &payload(vec![stored(&[20], None, &[1, 2])]));
    ingestor.on_message(1, &payload(vec![stored(&[21], Some(20), &[3, 4])]));
    ingestor.on_message(2, &payload(vec![removed(&[20], None)]));
    ingestor.on_message(3, &payload(vec![stored(&[20], Some(21), &[5, 6])]));
    ingestor.reset();
    let out = ingestor.on_message(4, &payload(vec![stored(&[22], Some(20), &[7, 8])]));
    let [IndexOp::Store { blocks, .. }] = out.ops.as_slice() else {
        panic!("{:?}", out.ops);
    };
    assert_eq!(blocks.len(), 3, "20 and 21 held again, once each, and 22");
}

/// A store of `pages` one token each (SGLang's default page), `tokens` theirs, under `parent`.
fn pages(pages: &[u64], parent: Option<u64>, tokens: &[u32], medium: Option<&str>) -> KvEvent {
    sized_pages(1, pages, parent, tokens, medium)
}

/// A store of `pages` of `size` tokens (0: a token-less copy).
fn sized_pages(
    size: u32,
    pages: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    medium: Option<&str>,
) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: pages.iter().copied().map(EngineHash).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: tokens.to_vec(),
        block_size: size,
        lora_id: None,
        lora_name: None,
        extra_keys: false,
        kv_cache_spec_kind: None,
        medium: medium.map(str::to_owned),
        group_idx: None,
    }
}

/// The ops `events` make, one message each from `seq` on.
fn apply(ingestor: &mut Ingestor, seq: &mut u64, events: Vec<KvEvent>) -> Vec<IndexOp> {
    let mut ops = Vec::new();
    for event in events {
        ops.extend(ingestor.on_message(*seq, &payload(vec![event])).ops);
        *seq += 1;
    }
    sans_locals(&ops)
}

#[test]
fn one_token_pages_make_our_blocks_across_stores_and_branches() {
    let four = |tokens: &[u32]| BlockHasher::new(4).sequence(tokens);
    let op = |tier, blocks: &[SequenceHash]| IndexOp::Store {
        rank: rank(),
        tier,
        blocks: blocks.to_vec(),
        locals: Vec::new(),
    };
    let mut ingestor = Ingestor::new(rank(), 4);
    let mut seq = 0;
    // Six pages: the first four end our block 0; two are left over.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![pages(&[1, 2, 3, 4, 5, 6], None, &[0, 1, 2, 3, 4, 5], None)],
    );
    let main = four(&[0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(ops, vec![op(Tier::Device, &main[..1])]);
    // The next store ends block 1 with the two pages before it, and leaves two more.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![pages(&[7, 8, 9, 10], Some(6), &[6, 7, 8, 9], None)],
    );
    assert_eq!(ops, vec![op(Tier::Device, &main[1..])]);
    // A branch from page 5 (a radix node split in the middle of our block 1).
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![pages(&[21, 22, 23], Some(5), &[50, 51, 52], None)],
    );
    let branch = four(&[0, 1, 2, 3, 4, 50, 51, 52]);
    assert_eq!(ops, vec![op(Tier::Device, &branch[1..])]);
    // A copy of block 0's pages in host memory: the block is there with its last page.
    let copy = |hashes: &[u64]| sized_pages(0, hashes, None, &[], Some("CPU"));
    let ops = apply(&mut ingestor, &mut seq, vec![copy(&[1, 2, 3])]);
    assert!(ops.is_empty(), "not yet: {ops:?}");
    let ops = apply(&mut ingestor, &mut seq, vec![copy(&[4])]);
    assert_eq!(ops, vec![op(Tier::Host, &main[..1])]);
    // Evicted leaf first: block 1 goes with its last page; the pages after it hold nothing.
    let ops = apply(&mut ingestor, &mut seq, vec![removed(&[10, 9, 8, 7], None)]);
    assert_eq!(ops, vec![remove(Tier::Device, main[1..].to_vec())]);
    assert_eq!(ingestor.stats().stored_blocks, 4);
    assert_eq!(ingestor.stats().skipped_unaligned, 0);
    // A store under a page we never saw is left out.
    assert!(
        apply(
            &mut ingestor,
            &mut seq,
            vec![pages(&[31], Some(99), &[1], None)]
        )
        .is_empty()
    );
    assert_eq!(ingestor.stats().skipped_unknown_parent, 1);
    // Cleared: every page forgotten, so a store under one is left out too.
    apply(&mut ingestor, &mut seq, vec![KvEvent::AllBlocksCleared]);
    assert!(
        apply(
            &mut ingestor,
            &mut seq,
            vec![pages(&[32], Some(6), &[6], None)]
        )
        .is_empty()
    );
}

#[test]
fn pages_split_anywhere_give_the_blocks_of_the_whole_sequence() {
    let tokens: Vec<u32> = (0..40).map(|t| t * 7 % 11).collect();
    let expected = BlockHasher::new(8).sequence(&tokens);
    // Pages of 2 tokens under 8-token blocks, stored in runs of every length from 1 to 7.
    for run in 1..8usize {
        let mut ingestor = Ingestor::new(rank(), 8);
        let mut stored = Vec::new();
        let page_hashes: Vec<u64> = (100..120).collect();
        for (i, chunk) in page_hashes.chunks(run).enumerate() {
            let start = i * run;
            let parent = start.checked_sub(1).map(|p| page_hashes[p]);
            let chunk_tokens = &tokens[start * 2..(start + chunk.len()) * 2];
            let event = sized_pages(2, chunk, parent, chunk_tokens, None);
            for op in ingestor.on_message(i as u64, &payload(vec![event])).ops {
                if let IndexOp::Store { blocks, .. } = op {
                    stored.extend(blocks);
                }
            }
        }
        assert_eq!(stored, expected, "runs of {run} pages");
    }
}

#[test]
fn a_short_page_from_an_engine_of_our_block_size_is_skipped() {
    let mut ingestor = primed();
    // SGLang's partial last page (one token of a two-token page) under block 11.
    let out = ingestor.on_message(1, &payload(vec![pages(&[12], Some(11), &[5], None)]));
    assert!(out.ops.is_empty());
    assert_eq!(ingestor.stats().skipped_unaligned, 1);
    assert!(ingestor.resized.is_none());
    // Its blocks are still resolved as blocks.
    let out = ingestor.on_message(2, &payload(vec![removed(&[11], None)]));
    assert_eq!(
        out.ops,
        vec![remove(Tier::Device, ours(&[1, 2, 3, 4])[1..].to_vec())]
    );
}

#[test]
fn engine_blocks_a_multiple_of_ours_hold_their_run_of_our_blocks() {
    // Engine blocks of 8 tokens (a vLLM hybrid model's attention blocks) over our 4.
    let four = |tokens: &[u32]| BlockHasher::new(4).sequence(tokens);
    let chain = four(&(0..24).collect::<Vec<u32>>());
    let op = |tier, blocks: &[SequenceHash]| IndexOp::Store {
        rank: rank(),
        tier,
        blocks: blocks.to_vec(),
        locals: Vec::new(),
    };
    let mut ingestor = Ingestor::new(rank(), 4);
    let mut seq = 0;
    let tokens = (0..16).collect::<Vec<u32>>();
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![sized_pages(8, &[1, 2], None, &tokens, None)],
    );
    assert_eq!(ops, vec![op(Tier::Device, &chain[..4])]);
    let tokens = (16..24).collect::<Vec<u32>>();
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![sized_pages(8, &[3], Some(2), &tokens, None)],
    );
    assert_eq!(ops, vec![op(Tier::Device, &chain[4..])]);
    // Offloaded to host memory (no tokens): its whole run.
    let ops = apply(
        &mut ingestor,
        &mut seq,
        vec![sized_pages(0, &[1], None, &[], Some("CPU"))],
    );
    assert_eq!(ops, vec![op(Tier::Host, &chain[..2])]);
    // A second physical copy of block 3 (vLLM caches two blocks under one hash): its run stays
    // until both are gone.
    let tokens = (16..24).collect::<Vec<u32>>();
    assert!(
        apply(
            &mut ingestor,
            &mut seq,
            vec![sized_pages(8, &[3], Some(2), &tokens, None)]
        )
        .is_empty()
    );
    assert!(apply(&mut ingestor, &mut seq, vec![removed(&[3], None)]).is_empty());
    let ops = apply(&mut ingestor, &mut seq, vec![removed(&[3], None)]);
    assert_eq!(ops, vec![remove(Tier::Device, chain[4..].to_vec())]);
    // Under an engine block we do not know, a store is left out.
    assert!(
        apply(
            &mut ingestor,
            &mut seq,
            vec![sized_pages(8, &[4], Some(99), &tokens, None)]
        )
        .is_empty()
    );
    assert_eq!(ingestor.stats().skipped_unknown_parent, 1);
    assert_eq!(ingestor.stats().skipped_unaligned, 0);
    // Another size from this engine is not ours to guess.
    assert!(
        apply(
            &mut ingestor,
            &mut seq,
            vec![sized_pages(12, &[5], None, &[0; 12], None)]
        )
        .is_empty()
    );
    assert_eq!(ingestor.stats().skipped_unaligned, 1);
}
