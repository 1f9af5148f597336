use super::*;
use proptest::prelude::*;

fn sample() -> EventBatch {
    EventBatch {
        ts: 1_700_000_000.25,
        events: vec![
            KvEvent::BlockStored {
                block_hashes: vec![EngineHash(u64::MAX - 7), EngineHash(42)],
                parent_block_hash: Some(EngineHash(1 << 63)),
                token_ids: (0..8).collect(),
                block_size: 4,
                lora_id: Some(-3),
                lora_name: None,
                extra_keys: true,
                kv_cache_spec_kind: Some("full_attention".into()),
                medium: Some("GPU".into()),
                group_idx: Some(0),
            },
            KvEvent::BlockStored {
                block_hashes: vec![EngineHash(42)],
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 0,
                lora_id: None,
                lora_name: Some("tenant-a".into()),
                extra_keys: false,
                kv_cache_spec_kind: None,
                medium: Some("CPU".into()),
                group_idx: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![EngineHash(42)],
                medium: None,
                group_idx: Some(1),
            },
            KvEvent::AllBlocksCleared,
        ],
        dp_rank: Some(2),
    }
}

fn msgpack(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encode");
    out
}

fn array(items: Vec<Value>) -> Value {
    Value::Array(items)
}

#[test]
fn round_trips_both_encodings() {
    for encoding in [Encoding::Array, Encoding::Map] {
        let bytes = encode_batch(&sample(), encoding);
        assert_eq!(
            decode_batch(&bytes).expect("decodes"),
            sample(),
            "{encoding:?}"
        );
    }
}

#[test]
fn array_form_is_vllms_positional_layout() {
    let value = rmpv::decode::read_value(&mut &encode_batch(&sample(), Encoding::Array)[..])
        .expect("msgpack");
    let batch = value.as_array().expect("batch array");
    assert_eq!(batch.len(), 3);
    assert_eq!(batch[2].as_u64(), Some(2));
    let stored = batch[1][0].as_array().expect("event array");
    assert_eq!(stored.len(), 12);
    assert_eq!(stored[0].as_str(), Some("BlockStored"));
    assert_eq!(stored[4].as_u64(), Some(4), "block_size");
    assert_eq!(stored[6].as_str(), Some("GPU"), "medium");
    assert_eq!(
        stored[8],
        array(vec![array(vec![]), array(vec![])]),
        "extra_keys"
    );
    assert_eq!(batch[1][1][7].as_str(), Some("tenant-a"), "lora_name");
    assert_eq!(stored[9].as_u64(), Some(0), "group_idx");
    let removed = batch[1][2].as_array().expect("event array");
    assert_eq!(removed.len(), 4);
    assert_eq!(batch[1][3], array(vec!["AllBlocksCleared".into()]));
}

#[test]
fn map_form_names_fields_and_leaves_out_nil_defaults() {
    let value = rmpv::decode::read_value(&mut &encode_batch(&sample(), Encoding::Map)[..])
        .expect("msgpack");
    let batch = value.as_array().expect("the batch stays an array");
    assert_eq!(batch[2].as_u64(), Some(2), "data_parallel_rank");
    let keys = |event: &Value| -> Vec<String> {
        let entries = event.as_map().expect("event map");
        entries
            .iter()
            .map(|(key, _)| key.as_str().expect("named").to_owned())
            .collect()
    };
    let stored = &batch[1][0];
    assert_eq!(stored["type"].as_str(), Some("BlockStored"));
    assert_eq!(stored["block_size"].as_u64(), Some(4));
    assert_eq!(
        keys(stored),
        [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind"
        ]
    );
    // Nil fields without a default stay: `lora_id` of the offload copy, `medium` of the removal.
    assert!(keys(&batch[1][1]).contains(&"lora_id".to_owned()));
    assert_eq!(
        keys(&batch[1][2]),
        ["type", "block_hashes", "medium", "group_idx"]
    );
    assert_eq!(keys(&batch[1][3]), ["type"]);
}

#[test]
fn keys_beyond_the_tokens_are_read_from_either_engine() {
    let stored = |fields: Vec<(&str, Value)>| {
        let event = [
            ("type", "BlockStored".into()),
            ("block_hashes", array(vec![7u64.into()])),
        ]
        .into_iter()
        .chain([
            ("token_ids", array(vec![1u32.into()])),
            ("block_size", 1u32.into()),
        ])
        .chain(fields)
        .map(|(key, value)| (Value::from(key), value))
        .collect();
        let batch = array(vec![1.5.into(), array(vec![Value::Map(event)]), Value::Nil]);
        decode_batch(&msgpack(&batch))
            .expect("decodes")
            .events
            .remove(0)
    };
    let keyed = |event: &KvEvent| {
        matches!(
            event,
            KvEvent::BlockStored {
                extra_keys: true,
                ..
            }
        )
    };
    // vLLM: one entry per block, nil where a block has none.
    assert!(!keyed(&stored(vec![("extra_keys", Value::Nil)])));
    assert!(!keyed(&stored(vec![(
        "extra_keys",
        array(vec![Value::Nil])
    )])));
    let salted = array(vec![array(vec!["salt".into()])]);
    assert!(keyed(&stored(vec![("extra_keys", salted)])));
    // SGLang: the salt by name; absent or nil, no keys.
    assert!(keyed(&stored(vec![("cache_salt", "salt".into())])));
    assert!(!keyed(&stored(vec![("cache_salt", Value::Nil)])));
    // A positional store of block 7, with `rest` after `block_size`.
    let positional = |rest: Vec<Value>| {
        let head = ["BlockStored".into(), array(vec![7u64.into()]), Value::Nil];
        let event = head
            .into_iter()
            .chain([array(vec![1u32.into()]), 1u32.into()])
            .chain(rest)
            .collect();
        msgpack(&array(vec![1.5.into(), array(vec![Value::Array(event)])]))
    };
    // In array form the slot SGLang's maps call `cache_salt` is vLLM's `lora_name`.
    let lora = positional(vec![Value::Nil, Value::Nil, "tenant-a".into()]);
    let event = decode_batch(&lora).expect("decodes").events.remove(0);
    assert!(matches!(
        event,
        KvEvent::BlockStored { extra_keys: false, lora_name: Some(name), .. } if name == "tenant-a"
    ));
    let wrong = positional(vec![
        Value::Nil,
        Value::Nil,
        Value::Nil,
        "not a list".into(),
    ]);
    assert!(matches!(
        decode_batch(&wrong),
        Err(DecodeError::Field {
            field: "extra_keys",
            ..
        })
    ));
}

#[test]
fn hashes_above_i64_max_are_written_as_uint64() {
    let bytes = encode_batch(&sample(), Encoding::Array);
    let mut marked = (u64::MAX - 7).to_be_bytes().to_vec();
    marked.insert(0, 0xcf); // msgpack uint64 marker
    assert!(bytes.windows(9).any(|w| w == marked.as_slice()));
}

#[test]
fn accepts_old_short_forms() {
    // `[ts, events]` and a BlockStored from before `medium` existed.
    let old = array(vec![
        1.5.into(),
        array(vec![array(vec![
            "BlockStored".into(),
            array(vec![7u64.into()]),
            Value::Nil,
            array(vec![1u32.into(), 2u32.into()]),
            2u32.into(),
            Value::Nil,
        ])]),
    ]);
    let batch = decode_batch(&msgpack(&old)).expect("decodes");
    assert_eq!(batch.dp_rank, None);
    assert_eq!(
        batch.events,
        vec![KvEvent::BlockStored {
            block_hashes: vec![EngineHash(7)],
            parent_block_hash: None,
            token_ids: vec![1, 2],
            block_size: 2,
            lora_id: None,
            lora_name: None,
            extra_keys: false,
            kv_cache_spec_kind: None,
            medium: None,
            group_idx: None,
        }]
    );
    let removed = array(vec![
        1.5.into(),
        array(vec![array(vec![
            "BlockRemoved".into(),
            array(vec![7u64.into()]),
        ])]),
    ]);
    let batch = decode_batch(&msgpack(&removed)).expect("decodes");
    assert!(matches!(
        &batch.events[0],
        KvEvent::BlockRemoved { medium: None, .. }
    ));
}

#[test]
fn map_events_may_sit_in_an_array_batch() {
    let mixed = array(vec![
        2.0.into(),
        array(vec![Value::Map(vec![
            ("type".into(), "BlockRemoved".into()),
            ("block_hashes".into(), array(vec![1u64.into()])),
        ])]),
        Value::Nil,
    ]);
    let batch = decode_batch(&msgpack(&mixed)).expect("decodes");
    assert_eq!(batch.events.len(), 1);
}

#[test]
fn signed_and_bytes_hashes() {
    let batch = array(vec![
        0.into(), // an integer timestamp is accepted too
        array(vec![array(vec![
            "BlockRemoved".into(),
            array(vec![(-5i64).into(), Value::Binary(b"abc".to_vec())]),
            "CPU".into(),
        ])]),
    ]);
    let decoded = decode_batch(&msgpack(&batch)).expect("decodes");
    let KvEvent::BlockRemoved { block_hashes, .. } = &decoded.events[0] else {
        panic!("expected BlockRemoved");
    };
    assert_eq!(block_hashes[0], EngineHash(-5i64 as u64));
    assert_eq!(block_hashes[1], EngineHash(xxh3_64(b"abc")));
}

#[test]
fn sglang_eagle_bigram_pages_decode_to_their_own_tokens() {
    // SGLang under EAGLE: one page of 4 bigrams over tokens 10..15, in map form.
    let bigrams = (10u32..14).map(|t| array(vec![t.into(), (t + 1).into()]));
    let store = |token_ids: Value| {
        let event = [
            ("type", "BlockStored".into()),
            ("block_hashes", array(vec![7u64.into()])),
            ("parent_block_hash", Value::Nil),
            ("token_ids", token_ids),
            ("block_size", 4u32.into()),
            ("lora_id", Value::Nil),
        ];
        let event = event
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect();
        msgpack(&array(vec![
            1.5.into(),
            array(vec![Value::Map(event)]),
            Value::Nil,
        ]))
    };
    let decoded = decode_batch(&store(array(bigrams.collect()))).expect("decodes");
    assert!(matches!(
        &decoded.events[0],
        KvEvent::BlockStored { token_ids, .. } if *token_ids == [10, 11, 12, 13]
    ));
    // Anything else in the list is still an error naming the field.
    for bad in [
        array(vec![array(vec![1u32.into()])]),
        array(vec![array(vec![1u32.into(), 2u32.into(), 3u32.into()])]),
        array(vec![array(vec![(-1i64).into(), 2u32.into()])]),
    ] {
        let error = decode_batch(&store(bad)).expect_err("not a token");
        assert!(error.to_string().contains("token_ids"), "{error}");
    }
}

#[test]
fn unknown_event_types_are_skipped() {
    let batch = array(vec![
        1.0.into(),
        array(vec![
            array(vec!["KVCacheCreated".into(), 3u32.into()]),
            array(vec!["AllBlocksCleared".into()]),
        ]),
    ]);
    let decoded = decode_batch(&msgpack(&batch)).expect("decodes");
    assert_eq!(decoded.events, vec![KvEvent::AllBlocksCleared]);
}

#[test]
fn wrong_types_are_errors_naming_the_field() {
    let batch = array(vec![
        1.0.into(),
        array(vec![array(vec![
            "BlockStored".into(),
            array(vec![1u64.into()]),
            Value::Nil,
            array(vec![(-1i64).into()]),
            1u32.into(),
        ])]),
    ]);
    let error = decode_batch(&msgpack(&batch)).expect_err("negative token");
    assert!(error.to_string().contains("token_ids"), "{error}");
    assert!(decode_batch(&msgpack(&"hello".into())).is_err());
    assert!(decode_batch(&[]).is_err());
    let mut trailing = encode_batch(&sample(), Encoding::Array);
    trailing.push(0);
    assert!(matches!(
        decode_batch(&trailing),
        Err(DecodeError::TrailingBytes(1))
    ));
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn truncated_batches_never_panic(cut in 0usize..200) {
        let bytes = encode_batch(&sample(), Encoding::Map);
        let _ = decode_batch(&bytes[..cut.min(bytes.len())]);
    }
}
