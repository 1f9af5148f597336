//! The KV events of Mooncake Store's master (kv-cache.md section 5), as a shared pool publishes
//! them: the same three-frame ZMQ stream as vLLM (`[topic, seq u64 BE, payload]`), with a
//! msgpack payload `[ts_ms, [event maps], dp_rank]`. Each map has `event_type` (`stored` or
//! `removed`), `object_key`, `seq_hashes`, `backend_id` and `medium` (`CPU`, `DISK`).
//!
//! A pool whose keys are not the router's standard sequence hashes (ours are the engines' own)
//! also sends, on stores, `token_ids` (every stored block's tokens) and `parent_hash` (the key
//! before the first stored block), so consumers re-hash: the rule vLLM's self-describing events
//! follow. [`decode`] turns a payload into the crate's [`KvEvent`]s, with `medium` set.
//!
//! Decoding is lenient as the vLLM decoder is: absent optional fields are fine, the older names
//! (`type`, `block_hashes`, `parent_block_hash`) are read too, and events of an unknown type are
//! skipped.

use rmpv::Value;

use super::{
    DecodeError, EngineHash, EventBatch, Fields, KvEvent, MAX_DEPTH, as_hash, as_string, as_u32,
    field_error, optional,
};

/// One payload of a Mooncake-format stream.
#[derive(Debug, Clone, PartialEq)]
pub struct MooncakeBatch {
    /// Publisher wall-clock time, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The events, in order.
    pub events: Vec<MooncakeEvent>,
    /// Data-parallel rank of the publisher, if any.
    pub dp_rank: Option<u32>,
}

/// Whether objects arrived or left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MooncakeEventType {
    /// Objects were stored.
    Stored,
    /// Objects were removed.
    Removed,
}

impl MooncakeEventType {
    fn name(self) -> &'static str {
        match self {
            MooncakeEventType::Stored => "stored",
            MooncakeEventType::Removed => "removed",
        }
    }

    /// `stored` / `removed`, in any case, with or without a `block` prefix (`BlockStored`).
    fn parse(name: &str) -> Option<MooncakeEventType> {
        let name = name.to_ascii_lowercase().replace('_', "");
        match name.strip_prefix("block").unwrap_or(&name) {
            "stored" | "store" => Some(MooncakeEventType::Stored),
            "removed" | "remove" => Some(MooncakeEventType::Removed),
            _ => None,
        }
    }
}

/// One event map.
#[derive(Debug, Clone, PartialEq)]
pub struct MooncakeEvent {
    /// Stored or removed.
    pub event_type: MooncakeEventType,
    /// The store's name for the object (informational).
    pub object_key: String,
    /// The blocks' sequence hashes, in order.
    pub seq_hashes: Vec<EngineHash>,
    /// Which store holds them.
    pub backend_id: String,
    /// Where in that store: `CPU`, `DISK`, ...
    pub medium: String,
    /// Stores only: the key before the first block, when known.
    pub parent_hash: Option<EngineHash>,
    /// Stores only: every block's tokens, when the writer gave them (empty otherwise).
    pub token_ids: Vec<u32>,
    /// Tokens per block, when known.
    pub block_size: Option<u32>,
}

/// Encode a batch: fixed key order, absent fields as nil.
pub fn encode(batch: &MooncakeBatch) -> Vec<u8> {
    let events = batch.events.iter().map(encode_event).collect();
    let value = Value::Array(vec![
        Value::from(batch.ts_ms),
        Value::Array(events),
        batch.dp_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

fn encode_event(event: &MooncakeEvent) -> Value {
    let hash = |h: &EngineHash| Value::from(h.0);
    let mut map = vec![
        ("event_type", Value::from(event.event_type.name())),
        ("object_key", Value::from(event.object_key.as_str())),
        (
            "seq_hashes",
            Value::Array(event.seq_hashes.iter().map(hash).collect()),
        ),
        ("backend_id", Value::from(event.backend_id.as_str())),
        ("medium", Value::from(event.medium.as_str())),
    ];
    if event.event_type == MooncakeEventType::Stored {
        let tokens = if event.token_ids.is_empty() {
            Value::Nil
        } else {
            Value::Array(event.token_ids.iter().map(|&t| t.into()).collect())
        };
        map.extend([
            (
                "parent_hash",
                event.parent_hash.as_ref().map_or(Value::Nil, hash),
            ),
            ("token_ids", tokens),
            (
                "block_size",
                event.block_size.map_or(Value::Nil, Value::from),
            ),
        ]);
    }
    Value::Map(
        map.into_iter()
            .map(|(key, value)| (Value::from(key), value))
            .collect(),
    )
}

/// Decode one payload into its Mooncake form.
pub fn decode_batch(payload: &[u8]) -> Result<MooncakeBatch, DecodeError> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut reader, MAX_DEPTH)?;
    if !reader.is_empty() {
        return Err(DecodeError::TrailingBytes(reader.len()));
    }
    let batch = value
        .as_array()
        .ok_or(field_error("(batch)", "an array [ts_ms, events, dp_rank]"))?;
    let ts_ms = match batch.first() {
        Some(Value::Integer(n)) => n.as_u64().ok_or(field_error("ts_ms", "a time"))?,
        // Some publishers send seconds as a float.
        Some(Value::F64(seconds)) if *seconds >= 0.0 => (seconds * 1000.0) as u64,
        _ => return Err(field_error("ts_ms", "a time")),
    };
    let events = batch
        .get(1)
        .and_then(Value::as_array)
        .ok_or(field_error("events", "an array"))?;
    let dp_rank = match batch.get(2) {
        None | Some(Value::Nil) => None,
        Some(value) => Some(as_u32(value).ok_or(field_error("dp_rank", "an unsigned integer"))?),
    };
    Ok(MooncakeBatch {
        ts_ms,
        events: events
            .iter()
            .filter_map(|event| decode_event(event).transpose())
            .collect::<Result<_, _>>()?,
        dp_rank,
    })
}

fn decode_event(value: &Value) -> Result<Option<MooncakeEvent>, DecodeError> {
    if !matches!(value, Value::Map(_)) {
        return Err(field_error("(event)", "a map"));
    }
    let fields = Fields::new(value, None)?;
    // Either name, first the current one.
    let get = |names: &[&'static str]| names.iter().find_map(|&name| fields.get(0, name));
    let name = get(&["event_type", "type"])
        .and_then(Value::as_str)
        .ok_or(field_error("event_type", "a string"))?;
    let Some(event_type) = MooncakeEventType::parse(name) else {
        return Ok(None);
    };
    let seq_hashes = get(&["seq_hashes", "block_hashes"])
        .and_then(Value::as_array)
        .and_then(|hashes| hashes.iter().map(as_hash).collect::<Option<Vec<_>>>())
        .ok_or(field_error("seq_hashes", "an array of hashes"))?;
    let text = |name: &'static str| optional(&fields, 0, name, as_string, "a string");
    let parent_name = if fields.get(0, "parent_hash").is_some() {
        "parent_hash"
    } else {
        "parent_block_hash"
    };
    let token_ids = match fields.get(0, "token_ids") {
        None | Some(Value::Nil) => Vec::new(),
        Some(value) => value
            .as_array()
            .and_then(|tokens| tokens.iter().map(as_u32).collect())
            .ok_or(field_error("token_ids", "an array of u32"))?,
    };
    Ok(Some(MooncakeEvent {
        event_type,
        object_key: text("object_key")?.unwrap_or_default(),
        seq_hashes,
        backend_id: text("backend_id")?.unwrap_or_default(),
        medium: text("medium")?.unwrap_or_default(),
        parent_hash: optional(&fields, 0, parent_name, as_hash, "a hash")?,
        token_ids,
        block_size: optional(&fields, 0, "block_size", as_u32, "an unsigned integer")?,
    }))
}

/// Decode one payload into the crate's events: stores become [`KvEvent::BlockStored`] (tokens
/// and parent when present, `block_size` from the field or from the tokens per block),
/// removals [`KvEvent::BlockRemoved`]; `medium` is always set.
pub fn decode(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    Ok(to_event_batch(decode_batch(payload)?))
}

/// The crate's events for a decoded Mooncake batch.
pub fn to_event_batch(batch: MooncakeBatch) -> EventBatch {
    EventBatch {
        ts: batch.ts_ms as f64 / 1000.0,
        events: batch.events.into_iter().map(to_kv_event).collect(),
        dp_rank: batch.dp_rank,
    }
}

fn to_kv_event(event: MooncakeEvent) -> KvEvent {
    let medium = Some(event.medium).filter(|m| !m.is_empty());
    match event.event_type {
        MooncakeEventType::Stored => {
            let blocks = event.seq_hashes.len();
            let per_block = (blocks > 0 && event.token_ids.len().is_multiple_of(blocks))
                .then(|| u32::try_from(event.token_ids.len() / blocks).ok())
                .flatten();
            let block_size = if event.token_ids.is_empty() {
                event.block_size.unwrap_or(0)
            } else {
                event.block_size.or(per_block).unwrap_or(0)
            };
            KvEvent::BlockStored {
                block_hashes: event.seq_hashes,
                parent_block_hash: event.parent_hash,
                token_ids: event.token_ids,
                block_size,
                lora_id: None,
                lora_name: None,
                extra_keys: false,
                kv_cache_spec_kind: None,
                medium,
                group_idx: None,
            }
        }
        MooncakeEventType::Removed => KvEvent::BlockRemoved {
            block_hashes: event.seq_hashes,
            medium,
            group_idx: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> MooncakeEvent {
        MooncakeEvent {
            event_type: MooncakeEventType::Stored,
            object_key: format!("{:016x}", hashes.first().copied().unwrap_or(0)),
            seq_hashes: hashes.iter().copied().map(EngineHash).collect(),
            backend_id: "kv-pool".into(),
            medium: "CPU".into(),
            parent_hash: parent.map(EngineHash),
            block_size: (!tokens.is_empty()).then_some(4),
            token_ids: tokens,
        }
    }

    fn msgpack(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).expect("encode");
        out
    }

    #[test]
    fn the_payload_is_masters_three_part_array_of_maps() {
        let batch = MooncakeBatch {
            ts_ms: 1_700_000_000_123,
            events: vec![stored(&[u64::MAX, 2], Some(9), (0..8).collect())],
            dp_rank: None,
        };
        let value = rmpv::decode::read_value(&mut &encode(&batch)[..]).expect("msgpack");
        let parts = value.as_array().expect("array");
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].as_u64(), Some(1_700_000_000_123));
        assert!(parts[2].is_nil());
        let event = &parts[1][0];
        let field = |name: &str| {
            event
                .as_map()
                .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(name)))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(field("event_type"), Some(Value::from("stored")));
        assert_eq!(field("medium"), Some(Value::from("CPU")));
        assert_eq!(field("backend_id"), Some(Value::from("kv-pool")));
        assert_eq!(field("parent_hash"), Some(Value::from(9u64)));
        assert_eq!(
            field("seq_hashes"),
            Some(Value::Array(vec![u64::MAX.into(), 2u64.into()]))
        );
        assert_eq!(decode_batch(&encode(&batch)).expect("decodes"), batch);
    }

    #[test]
    fn decode_gives_kv_events_with_medium_tokens_and_parent() {
        let mut removed = stored(&[5], None, Vec::new());
        removed.event_type = MooncakeEventType::Removed;
        removed.medium = "DISK".into();
        let batch = MooncakeBatch {
            ts_ms: 2_500,
            events: vec![stored(&[1, 2], Some(7), (0..8).collect()), removed],
            dp_rank: Some(1),
        };
        let events = decode(&encode(&batch)).expect("decodes");
        assert_eq!(events.ts, 2.5);
        assert_eq!(events.dp_rank, Some(1));
        assert_eq!(
            events.events,
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![EngineHash(1), EngineHash(2)],
                    parent_block_hash: Some(EngineHash(7)),
                    token_ids: (0..8).collect(),
                    block_size: 4,
                    lora_id: None,
                    lora_name: None,
                    extra_keys: false,
                    kv_cache_spec_kind: None,
                    medium: Some("CPU".into()),
                    group_idx: None,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![EngineHash(5)],
                    medium: Some("DISK".into()),
                    group_idx: None,
                },
            ]
        );
    }

    #[test]
    fn older_names_are_read_and_unknown_types_skipped() {
        let map = |entries: Vec<(&str, Value)>| {
            Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
        };
        let payload = msgpack(&Value::Array(vec![
            Value::from(10u64),
            Value::Array(vec![
                map(vec![
                    ("type", "BlockStored".into()),
                    ("block_hashes", Value::Array(vec![Value::from(-1i64)])),
                    ("parent_block_hash", Value::from(3u64)),
                    ("token_ids", Value::Array(vec![1u32.into(), 2u32.into()])),
                    ("medium", "cpu".into()),
                ]),
                map(vec![
                    ("event_type", "updated".into()),
                    ("seq_hashes", Value::Array(vec![])),
                ]),
            ]),
        ]));
        let batch = decode(&payload).expect("decodes");
        assert_eq!(
            batch.events,
            vec![KvEvent::BlockStored {
                block_hashes: vec![EngineHash(u64::MAX)],
                parent_block_hash: Some(EngineHash(3)),
                token_ids: vec![1, 2],
                block_size: 2,
                lora_id: None,
                lora_name: None,
                extra_keys: false,
                kv_cache_spec_kind: None,
                medium: Some("cpu".into()),
                group_idx: None,
            }]
        );
    }

    #[test]
    fn bad_payloads_are_errors_not_panics() {
        let cases = [
            msgpack(&Value::from(1)),
            msgpack(&Value::Array(vec![Value::from("x"), Value::Array(vec![])])),
            msgpack(&Value::Array(vec![Value::from(1), Value::from(2)])),
            msgpack(&Value::Array(vec![
                Value::from(1),
                Value::Array(vec![Value::Array(vec![])]),
            ])),
            msgpack(&Value::Array(vec![
                Value::from(1),
                Value::Array(vec![Value::Map(vec![(
                    "event_type".into(),
                    "stored".into(),
                )])]),
            ])),
            vec![0xc1],
        ];
        for payload in cases {
            assert!(decode(&payload).is_err(), "{payload:?}");
        }
        let mut trailing = encode(&MooncakeBatch {
            ts_ms: 0,
            events: Vec::new(),
            dp_rank: None,
        });
        trailing.push(0);
        assert!(matches!(
            decode(&trailing),
            Err(DecodeError::TrailingBytes(1))
        ));
    }

    fn event() -> impl Strategy<Value = MooncakeEvent> {
        (
            any::<bool>(),
            "[a-z0-9]{0,12}",
            prop::collection::vec(any::<u64>(), 0..6),
            prop::sample::select(vec!["CPU", "DISK"]),
            prop::option::of(any::<u64>()),
            prop::collection::vec(any::<u32>(), 0..12),
            prop::option::of(1u32..64),
        )
            .prop_map(|(store, key, hashes, medium, parent, tokens, size)| {
                let event_type = if store {
                    MooncakeEventType::Stored
                } else {
                    MooncakeEventType::Removed
                };
                // Removals carry no store-only fields.
                let (parent, tokens, size) = if store {
                    (parent, tokens, size)
                } else {
                    (None, Vec::new(), None)
                };
                MooncakeEvent {
                    event_type,
                    object_key: key,
                    seq_hashes: hashes.into_iter().map(EngineHash).collect(),
                    backend_id: "pool-0".into(),
                    medium: medium.into(),
                    parent_hash: parent.map(EngineHash),
                    token_ids: tokens,
                    block_size: size,
                }
            })
    }

    proptest! {
        #[test]
        fn round_trips(
            ts_ms in any::<u64>(),
            events in prop::collection::vec(event(), 0..6),
            dp_rank in prop::option::of(any::<u32>()),
        ) {
            let batch = MooncakeBatch { ts_ms, events, dp_rank };
            let decoded = decode_batch(&encode(&batch)).expect("decodes");
            prop_assert_eq!(&decoded, &batch);
            // And as the crate's events: one per map, hashes and media kept.
            let events = to_event_batch(decoded).events;
            prop_assert_eq!(events.len(), batch.events.len());
            for (kv, mooncake) in events.iter().zip(&batch.events) {
                let (hashes, medium) = match kv {
                    KvEvent::BlockStored { block_hashes, medium, .. }
                    | KvEvent::BlockRemoved { block_hashes, medium, .. } => (block_hashes, medium),
                    KvEvent::AllBlocksCleared => unreachable!("never decoded from Mooncake"),
                };
                prop_assert_eq!(hashes, &mooncake.seq_hashes);
                prop_assert_eq!(medium.as_deref(), Some(mooncake.medium.as_str()));
            }
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }
    }
}
