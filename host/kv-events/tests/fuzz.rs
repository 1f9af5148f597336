//! Hostile KV event frames: arbitrary bytes and mutated valid batches (both encodings) into the
//! msgpack decoder and the ingestor, with arbitrary sequence numbers. Property: no panic; a
//! frame that does not decode is counted as malformed, never applied.
//!
//! 256 cases per target; `PROPTEST_CASES=100000 cargo test -p switchyard-kv-events --test fuzz`
//! for a longer run.

use proptest::prelude::*;
use switchyard_core::index::IndexOp;
use switchyard_core::worker::Rank;
use switchyard_kv_events::ingest::Ingestor;
use switchyard_kv_events::wire::{
    DecodeError, Encoding, EngineHash, EventBatch, KvEvent, decode_batch, encode_batch,
};

const BLOCK_SIZE: u32 = 2;

fn hashes() -> impl Strategy<Value = Vec<EngineHash>> {
    // Few distinct hashes, so that stores, parents and removals refer to each other.
    prop::collection::vec(
        prop_oneof![0u64..8, Just(u64::MAX), Just(1 << 63)].prop_map(EngineHash),
        0..5,
    )
}

fn event() -> impl Strategy<Value = KvEvent> {
    let medium = prop::option::of(prop::sample::select(vec!["GPU", "CPU", "DISK", "", "gpu?"]))
        .prop_map(|m| m.map(str::to_owned));
    let group = prop::option::of(prop_oneof![Just(0u32), Just(1), Just(u32::MAX)]);
    prop_oneof![
        (
            hashes(),
            prop::option::of(prop_oneof![0u64..8, Just(u64::MAX)].prop_map(EngineHash)),
            prop::collection::vec(any::<u32>(), 0..12),
            // Ours, a page of it, a multiple, neither, and nonsense (pages.rs, bundles.rs).
            prop_oneof![
                Just(0u32),
                Just(BLOCK_SIZE),
                Just(BLOCK_SIZE / 2),
                Just(BLOCK_SIZE * 2),
                Just(BLOCK_SIZE + 1),
                Just(u32::MAX)
            ],
            (
                prop::option::of(any::<i64>()),
                prop::option::of(Just("adapter".to_owned())),
                any::<bool>(),
                prop::option::of(prop_oneof![
                    Just("full_attention".to_owned()),
                    Just("sliding_window".to_owned())
                ]),
            ),
            medium.clone(),
            group.clone(),
        )
            .prop_map(
                |(
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    (lora_id, lora_name, extra_keys, kv_cache_spec_kind),
                    medium,
                    group_idx,
                )| {
                    KvEvent::BlockStored {
                        block_hashes,
                        parent_block_hash,
                        token_ids,
                        block_size,
                        lora_id,
                        lora_name,
                        extra_keys,
                        kv_cache_spec_kind,
                        medium,
                        group_idx,
                    }
                }
            ),
        (hashes(), medium, group).prop_map(|(block_hashes, medium, group_idx)| {
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            }
        }),
        Just(KvEvent::AllBlocksCleared),
    ]
}

/// A well-formed frame, encoded as vLLM (arrays) or newer engines (maps) do.
fn valid_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(event(), 0..6),
        prop::option::of(any::<u32>()),
        any::<f64>(),
        any::<bool>(),
    )
        .prop_map(|(events, dp_rank, ts, map)| {
            let batch = EventBatch {
                ts,
                events,
                dp_rank,
            };
            encode_batch(&batch, if map { Encoding::Map } else { Encoding::Array })
        })
}

/// One edit of a frame.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Remove(prop::sample::Index, usize),
    Truncate(prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..6)
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<prop::sample::Index>(), 1usize..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
        any::<prop::sample::Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::Flip(i, x) if len > 0 => bytes[i.index(len)] ^= x,
            Mutation::Insert(i, b) => {
                let at = i.index(len + 1);
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Remove(i, n) if len > 0 => {
                let at = i.index(len);
                bytes.drain(at..(at + n).min(len));
            }
            Mutation::Truncate(i) => bytes.truncate(i.index(len + 1)),
            _ => {}
        }
    }
    bytes
}

/// Any frame: garbage, a valid one, or a valid one mutated.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        1 => valid_frame(),
        3 => (valid_frame(), prop::collection::vec(mutation(), 1..5))
            .prop_map(|(bytes, ms)| mutate(bytes, &ms)),
    ]
}

proptest! {
    // 256 cases (proptest's default) unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_decode_never_panics(bytes in frame()) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn fuzz_ingestor_never_panics(
        messages in prop::collection::vec(
            (
                prop_oneof![0u64..6, Just(u64::MAX - 1), Just(u64::MAX)],
                any::<bool>(),
                frame(),
            ),
            1..12,
        ),
    ) {
        let mut ingestor = Ingestor::new(Rank::new(0, 0), BLOCK_SIZE);
        let mut malformed = 0;
        for (seq, replayed, payload) in &messages {
            let out = if *replayed {
                ingestor.on_replayed(*seq, payload)
            } else {
                ingestor.on_message(*seq, payload)
            };
            malformed += u64::from(out.malformed);
            // A frame that does not decode changes nothing but the counters.
            if out.malformed {
                prop_assert!(decode_batch(payload).is_err());
                let only_clears = out.ops.iter().all(|op| matches!(op, IndexOp::Clear { .. }));
                prop_assert!(only_clears, "{:?}", out.ops);
            }
        }
        prop_assert_eq!(ingestor.stats().malformed, malformed);
    }
}

/// 1,000 nested arrays: rmpv's depth limit answers an error, not a stack overflow.
#[test]
fn deeply_nested_frame_is_an_error() {
    let mut bytes = vec![0x91u8; 1000];
    bytes.push(0xc0);
    assert!(matches!(decode_batch(&bytes), Err(DecodeError::Msgpack(_))));
}

/// An array header claiming 4 billion items: rmpv does not preallocate, so this fails fast
/// instead of aborting on allocation.
#[test]
fn huge_length_header_is_an_error() {
    assert!(decode_batch(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    assert!(decode_batch(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'x']).is_err());
}

/// Regression: a live message numbered `u64::MAX` after a gap overflowed `seq + 1` (the end of
/// the missing range) and panicked in debug builds.
#[test]
fn sequence_number_u64_max_after_a_gap() {
    let mut ingestor = Ingestor::new(Rank::new(0, 0), BLOCK_SIZE);
    let empty = encode_batch(
        &EventBatch {
            ts: 0.0,
            events: vec![],
            dp_rank: None,
        },
        Encoding::Array,
    );
    ingestor.on_message(0, &empty);
    let out = ingestor.on_message(u64::MAX, &empty);
    assert!(out.gap.is_some());
}
