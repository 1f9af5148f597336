//! The msgpack payload of engine KV events (engine-protocols.md section 1).
//!
//! vLLM encodes with msgspec: a batch is `[ts, events, data_parallel_rank]` and an event is
//! `[type, field...]` (`array_like`), or, in newer versions, maps with the same field names and the
//! event type under `"type"`. Older engines omit trailing fields. SGLang and TRT-LLM use the same
//! shape. Decoding is lenient about what may be absent and strict about what is present.

pub mod mooncake;

use rmpv::Value;
use switchyard_core::engine::CacheEvent;
use switchyard_core::worker::Tier;
use xxhash_rust::xxh3::xxh3_64;

/// An engine's name for a block: an opaque key, only compared for equality.
///
/// vLLM sends an unsigned u64 (kept as is), SGLang a signed i64 (reinterpreted bitwise), and some
/// settings send raw `bytes`, folded to a u64 with xxh3 (a collision is as unlikely as one between
/// the engine's own 64-bit hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// One published message: the events of one engine step.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Engine wall-clock time of the batch, seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank of the publisher, when the engine says.
    pub dp_rank: Option<u32>,
}

/// A change to an engine's KV cache.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks were stored (computed, or copied to another medium).
    BlockStored {
        /// One hash per stored block.
        block_hashes: Vec<EngineHash>,
        /// The block before the first stored one; `None` at the start of a sequence.
        parent_block_hash: Option<EngineHash>,
        /// Tokens of all stored blocks, `block_size` per block; empty for an offload copy.
        token_ids: Vec<u32>,
        /// Tokens per block; 0 for an offload copy.
        block_size: u32,
        /// LoRA adapter the blocks were computed with, by id (vLLM before `lora_name`).
        lora_id: Option<i64>,
        /// LoRA adapter the blocks were computed with, by name (vLLM, SGLang).
        lora_name: Option<String>,
        /// Whether the engine's hashes also cover keys other than the tokens and the adapter: a
        /// cache salt or multimodal inputs (vLLM's `extra_keys`, SGLang's `cache_salt`).
        extra_keys: bool,
        /// The attention of the blocks' KV group (vLLM: `"full_attention"`, `"sliding_window"`,
        /// `"mamba"`, ...); `None` where the engine does not say.
        kv_cache_spec_kind: Option<String>,
        /// Where the blocks live (`"GPU"`, `"CPU"`, ...); `None` means the device.
        medium: Option<String>,
        /// KV cache group of hybrid models; `None` for single-group models.
        group_idx: Option<u32>,
    },
    /// Blocks were evicted from one medium.
    BlockRemoved {
        /// Hashes of the evicted blocks.
        block_hashes: Vec<EngineHash>,
        /// Where they were evicted from; `None` means the device.
        medium: Option<String>,
        /// KV cache group of hybrid models.
        group_idx: Option<u32>,
    },
    /// The engine dropped its whole cache.
    AllBlocksCleared,
}

impl KvEvent {
    /// The event vLLM would publish for a change in the core engine model's cache (the mock
    /// engine and the simulator both speak through this).
    pub fn from_cache_event(event: CacheEvent, block_size: u32) -> KvEvent {
        let hashes = |hashes: Vec<u64>| hashes.into_iter().map(EngineHash).collect();
        match event {
            CacheEvent::Stored {
                tier,
                hashes: stored,
                parent,
                token_ids,
            } => KvEvent::BlockStored {
                block_hashes: hashes(stored),
                parent_block_hash: parent.map(EngineHash),
                token_ids,
                block_size,
                lora_id: None,
                lora_name: None,
                extra_keys: false,
                kv_cache_spec_kind: None,
                medium: Some(medium(tier).to_owned()),
                group_idx: None,
            },
            CacheEvent::Removed {
                tier,
                hashes: removed,
            } => KvEvent::BlockRemoved {
                block_hashes: hashes(removed),
                medium: Some(medium(tier).to_owned()),
                group_idx: None,
            },
            CacheEvent::Cleared => KvEvent::AllBlocksCleared,
        }
    }
}

/// vLLM's `medium` of a tier: `GPU`, `CPU` (its CPU offloading connector) or `DISK`.
/// [`Tier::from_medium`] reads each back.
pub fn medium(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "GPU",
        Tier::Host => "CPU",
        Tier::Disk => "DISK",
    }
}

/// How to encode events, as msgspec does. The batch is a positional array either way, as both
/// engines' `EventBatch` is `array_like` (the decoder also reads batches written as maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Events as positional arrays (`array_like=True`), the tag first: older vLLM releases.
    Array,
    /// Events as maps keyed by field name and tagged by `"type"`, optional fields left out when
    /// nil (`omit_defaults`): vLLM 0.34 and SGLang 0.5.23.
    Map,
}

/// A payload that is not a KV event batch.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not one msgpack value.
    #[error("payload is not msgpack: {0}")]
    Msgpack(#[from] rmpv::decode::Error),
    /// Bytes follow the msgpack value.
    #[error("{0} bytes after the msgpack value")]
    TrailingBytes(usize),
    /// A field is absent or has the wrong type.
    #[error("field `{field}` is missing or not {expected}")]
    Field {
        /// Field name.
        field: &'static str,
        /// What it should have been.
        expected: &'static str,
    },
}

/// Nesting budget for one payload. A batch is at most five levels deep (batch, events, event,
/// hashes, extra keys); rmpv's default of 1,024 (two per array level) recurses deep enough to
/// overflow a 2 MiB thread stack on a few hundred bytes of nested arrays.
const MAX_DEPTH: usize = 64;

const STORED_FIELDS: [&str; 11] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];
const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];
/// Fields of vLLM's events without a default: written even when nil.
const STORED_REQUIRED: usize = 7;
const REMOVED_REQUIRED: usize = 2;

/// Decode one payload, in either encoding, at either level.
///
/// Events of a type this decoder does not know are skipped: newer engines add types, and the
/// batch's other events are still worth applying.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut reader = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut reader, MAX_DEPTH)?;
    if !reader.is_empty() {
        return Err(DecodeError::TrailingBytes(reader.len()));
    }
    let batch = Fields::new(&value, None)?;
    let ts = batch
        .get(0, "ts")
        .and_then(Value::as_f64)
        .ok_or(field_error("ts", "a number"))?;
    let events = batch
        .get(1, "events")
        .and_then(Value::as_array)
        .ok_or(field_error("events", "an array"))?;
    Ok(EventBatch {
        ts,
        events: events
            .iter()
            .filter_map(|event| decode_event(event).transpose())
            .collect::<Result<_, _>>()?,
        dp_rank: optional(
            &batch,
            2,
            "data_parallel_rank",
            as_u32,
            "an unsigned integer",
        )?,
    })
}

/// Encode a batch as vLLM does: in array form every field present (absent ones as nil), in map
/// form the fields without a default always and the others when set.
///
/// Hashes are written as unsigned integers, so those above `i64::MAX` become msgpack `uint64`.
pub fn encode_batch(batch: &EventBatch, encoding: Encoding) -> Vec<u8> {
    let events = batch
        .events
        .iter()
        .map(|event| encode_event(event, encoding))
        .collect();
    let fields = vec![
        Value::from(batch.ts),
        Value::Array(events),
        batch.dp_rank.map_or(Value::Nil, Value::from),
    ];
    let value = Value::Array(fields);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

fn decode_event(value: &Value) -> Result<Option<KvEvent>, DecodeError> {
    let fields = Fields::new(value, Some("type"))?;
    let kind = fields.tag.ok_or(field_error("type", "a string"))?;
    let event = match kind {
        "BlockStored" => KvEvent::BlockStored {
            block_hashes: hashes(&fields, 0, "block_hashes")?,
            parent_block_hash: optional(&fields, 1, "parent_block_hash", as_hash, "a hash")?,
            token_ids: fields
                .get(2, "token_ids")
                .and_then(Value::as_array)
                .and_then(|tokens| tokens.iter().map(as_token).collect())
                .ok_or(field_error("token_ids", "an array of u32"))?,
            block_size: fields
                .get(3, "block_size")
                .and_then(as_u32)
                .ok_or(field_error("block_size", "an unsigned integer"))?,
            lora_id: optional(&fields, 4, "lora_id", Value::as_i64, "an integer")?,
            lora_name: optional(&fields, 6, "lora_name", as_string, "a string")?,
            extra_keys: optional(&fields, 7, "extra_keys", any_present, "an array")?
                .unwrap_or(false)
                || fields
                    .named("cache_salt")
                    .is_some_and(|salt| !salt.is_nil()),
            kv_cache_spec_kind: optional(&fields, 9, "kv_cache_spec_kind", as_string, "a string")?,
            medium: optional(&fields, 5, "medium", as_string, "a string")?,
            group_idx: optional(&fields, 8, "group_idx", as_u32, "an unsigned integer")?,
        },
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(&fields, 0, "block_hashes")?,
            medium: optional(&fields, 1, "medium", as_string, "a string")?,
            group_idx: optional(&fields, 2, "group_idx", as_u32, "an unsigned integer")?,
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    };
    Ok(Some(event))
}

fn encode_event(event: &KvEvent, encoding: Encoding) -> Value {
    let hashes = |hashes: &[EngineHash]| Value::Array(hashes.iter().map(|h| h.0.into()).collect());
    let text = |s: &Option<String>| s.as_deref().map_or(Value::Nil, Value::from);
    let number = |n: Option<u32>| n.map_or(Value::Nil, Value::from);
    match event {
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
        } => {
            // vLLM's extra keys are one entry per block (at least one, so that a keyed store of
            // no blocks reads back keyed); what an entry holds only matters to the engine's hash.
            let extra_keys = if *extra_keys {
                Value::Array(vec![Value::Array(Vec::new()); block_hashes.len().max(1)])
            } else {
                Value::Nil
            };
            let fields = vec![
                hashes(block_hashes),
                parent_block_hash.map_or(Value::Nil, |h| h.0.into()),
                Value::Array(token_ids.iter().map(|&t| t.into()).collect()),
                (*block_size).into(),
                lora_id.map_or(Value::Nil, Value::from),
                text(medium),
                text(lora_name),
                extra_keys,
                number(*group_idx),
                text(kv_cache_spec_kind),
                Value::Nil, // kv_cache_spec_sliding_window
            ];
            shape(
                "BlockStored",
                &STORED_FIELDS,
                STORED_REQUIRED,
                fields,
                encoding,
            )
        }
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        } => {
            let fields = vec![hashes(block_hashes), text(medium), number(*group_idx)];
            shape(
                "BlockRemoved",
                &REMOVED_FIELDS,
                REMOVED_REQUIRED,
                fields,
                encoding,
            )
        }
        KvEvent::AllBlocksCleared => shape("AllBlocksCleared", &[], 0, Vec::new(), encoding),
    }
}

/// Lay out `values` (one per name in `names`) as an array or map tagged `tag`; in a map, the
/// fields after the first `required` are left out when nil (msgspec's `omit_defaults`).
fn shape(
    tag: &str,
    names: &[&str],
    required: usize,
    values: Vec<Value>,
    encoding: Encoding,
) -> Value {
    match encoding {
        Encoding::Array => Value::Array(std::iter::once(tag.into()).chain(values).collect()),
        Encoding::Map => Value::Map(
            std::iter::once(("type".into(), tag.into()))
                .chain(
                    names
                        .iter()
                        .zip(values)
                        .enumerate()
                        .filter(|(i, (_, value))| *i < required || !value.is_nil())
                        .map(|(_, (&name, value))| (name.into(), value)),
                )
                .collect(),
        ),
    }
}

/// The fields of a struct encoded either way, looked up by position or by name.
struct Fields<'a> {
    tag: Option<&'a str>,
    layout: Layout<'a>,
}

enum Layout<'a> {
    Array(&'a [Value]),
    Map(&'a [(Value, Value)]),
}

impl<'a> Fields<'a> {
    /// `tag_key`: the map key of a tagged union's type; in array form the tag comes first.
    fn new(value: &'a Value, tag_key: Option<&str>) -> Result<Self, DecodeError> {
        match value {
            Value::Array(items) => match tag_key {
                Some(_) => {
                    let (tag, rest) = items.split_first().ok_or(field_error("type", "a string"))?;
                    Ok(Fields {
                        tag: tag.as_str(),
                        layout: Layout::Array(rest),
                    })
                }
                None => Ok(Fields {
                    tag: None,
                    layout: Layout::Array(items),
                }),
            },
            Value::Map(entries) => {
                let mut fields = Fields {
                    tag: None,
                    layout: Layout::Map(entries),
                };
                fields.tag = tag_key
                    .and_then(|key| fields.get(0, key))
                    .and_then(Value::as_str);
                Ok(fields)
            }
            _ => Err(field_error("(struct)", "an array or a map")),
        }
    }

    /// The field at `index` (array form) or named `name` (map form); `None` when absent.
    fn get(&self, index: usize, name: &str) -> Option<&'a Value> {
        match self.layout {
            Layout::Array(items) => items.get(index),
            Layout::Map(_) => self.named(name),
        }
    }

    /// The field named `name` in map form: for fields whose position differs between engines
    /// (SGLang's `cache_salt` sits where vLLM's `lora_name` does), which SGLang only sends as maps.
    fn named(&self, name: &str) -> Option<&'a Value> {
        match self.layout {
            Layout::Array(_) => None,
            Layout::Map(entries) => entries
                .iter()
                .find(|(key, _)| key.as_str() == Some(name))
                .map(|(_, value)| value),
        }
    }
}

/// A field that may be absent or nil, but must have the right type when present.
fn optional<'a, T>(
    fields: &Fields<'a>,
    index: usize,
    name: &'static str,
    convert: impl Fn(&'a Value) -> Option<T>,
    expected: &'static str,
) -> Result<Option<T>, DecodeError> {
    match fields.get(index, name) {
        None | Some(Value::Nil) => Ok(None),
        Some(value) => convert(value).map(Some).ok_or(field_error(name, expected)),
    }
}

fn hashes(
    fields: &Fields<'_>,
    index: usize,
    name: &'static str,
) -> Result<Vec<EngineHash>, DecodeError> {
    fields
        .get(index, name)
        .and_then(Value::as_array)
        .and_then(|hashes| hashes.iter().map(as_hash).collect())
        .ok_or(field_error(name, "an array of hashes"))
}

fn as_hash(value: &Value) -> Option<EngineHash> {
    match value {
        Value::Integer(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|signed| signed as u64))
            .map(EngineHash),
        Value::Binary(bytes) => Some(EngineHash(xxh3_64(bytes))),
        _ => None,
    }
}

/// vLLM's `extra_keys`, one entry per block: whether any block has one.
fn any_present(value: &Value) -> Option<bool> {
    value
        .as_array()
        .map(|entries| entries.iter().any(|entry| !entry.is_nil()))
}

fn as_u32(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A stored block's token: a u32, or SGLang's bigram `[token, next token]` (its radix cache keys
/// pages by bigrams under EAGLE speculative decoding, and its events publish them as pairs). A
/// bigram page's first tokens are the page's own, which is what the router hashes; the pairs'
/// second tokens only repeat them, shifted by one, up to the next page's first.
fn as_token(value: &Value) -> Option<u32> {
    match value {
        Value::Array(pair) => match pair.as_slice() {
            [token, _next] => as_u32(token),
            _ => None,
        },
        _ => as_u32(value),
    }
}

fn as_string(value: &Value) -> Option<String> {
    value.as_str().map(str::to_owned)
}

fn field_error(field: &'static str, expected: &'static str) -> DecodeError {
    DecodeError::Field { field, expected }
}

#[cfg(test)]
mod tests;
