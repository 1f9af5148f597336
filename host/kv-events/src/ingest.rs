//! One publisher's event stream turned into index changes in our own hash space.
//!
//! The engine names blocks by its own hashes, which depend on its version and settings. We re-hash
//! the tokens of every stored block with [`BlockHasher`] (so the index agrees with the hashes the
//! router computes for requests) and keep `engine hash -> our hash` only to resolve later removals
//! and token-less copies. An engine that names blocks by our hashes (Dynamo's mocker; a pool whose
//! writers key blocks by the router's hash, as Mooncake's do) needs no such table: each store is
//! checked, and its events then name the index's blocks as they are (`HashScheme::Ours`). An
//! engine whose blocks are a whole fraction of ours (SGLang's default page of one token) has its
//! pages gathered into our blocks; one whose blocks are a whole multiple of ours (a vLLM hybrid
//! model's attention blocks) has each hashed into the run of ours it holds (`ingest/resized.rs`).
//! Pure: no I/O, no clock; the subscriber drives it.

mod resized;

use crate::wire::{EngineHash, EventBatch, KvEvent, decode_batch, mooncake};
use resized::{Resized, resized_of};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use switchyard_core::hash::{BlockHasher, LocalBlockHash, SequenceHash};
use switchyard_core::index::IndexOp;
use switchyard_core::index::flat::U64Map;
use switchyard_core::kv_hints::actions::{ActionType, HintAction};
use switchyard_core::worker::{Rank, Tier};

/// How a stream's payloads are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WireFormat {
    /// vLLM's `[ts, events, dp_rank]` (SGLang and TensorRT-LLM publish the same).
    #[default]
    Vllm,
    /// Mooncake Store's master stream (a shared pool): `[ts_ms, [event maps], dp_rank]`. On a
    /// stream that never sent tokens (Mooncake Store's own), a token-less store names blocks by
    /// the router's standard hash (kv-cache.md section 5: Mooncake's hash is ours), taken as is;
    /// once a stream re-hashes from tokens (our `kv-pool`), unknown keys are skipped.
    Mooncake,
}

impl WireFormat {
    fn decode(self, payload: &[u8]) -> Result<EventBatch, crate::wire::DecodeError> {
        match self {
            WireFormat::Vllm => decode_batch(payload),
            WireFormat::Mooncake => mooncake::decode(payload),
        }
    }
}

/// What one message changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ingested {
    /// Index changes to apply, in order.
    pub ops: Vec<IndexOp>,
    /// Messages were lost: the driver replays `expected..` (see [`Ingestor::on_message`]).
    pub gap: Option<Gap>,
    /// The publisher restarted; `ops` starts with a clear of the rank.
    pub restarted: bool,
    /// The payload did not decode and was skipped.
    pub malformed: bool,
    /// Engine time of the applied batch (seconds since the Unix epoch), for lag metrics.
    pub ts: Option<f64>,
}

/// Sequence numbers that never arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The first missing sequence number.
    pub expected: u64,
    /// The sequence number that arrived instead.
    pub received: u64,
}

/// Counters of what an [`Ingestor`] applied and skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestStats {
    /// Batches decoded and applied.
    pub batches: u64,
    /// Events in those batches.
    pub events: u64,
    /// Blocks that became present in a tier.
    pub stored_blocks: u64,
    /// Blocks that left a tier.
    pub removed_blocks: u64,
    /// Payloads that did not decode.
    pub malformed: u64,
    /// Sequence gaps seen on the live stream.
    pub gaps: u64,
    /// Publisher restarts (sequence number went back).
    pub restarts: u64,
    /// Stores whose token count does not match their blocks or our block size.
    pub skipped_unaligned: u64,
    /// Stores whose parent block we do not know, so their prefix is unknown.
    pub skipped_unknown_parent: u64,
    /// Events of KV groups not routed on (hybrid models: see `Ingestor::routes_on`).
    pub skipped_other_group: u64,
    /// Stores computed with a LoRA adapter: requests hash without one, so they would never match.
    pub skipped_lora: u64,
    /// Stores whose engine hashes cover more than their tokens (a cache salt, multimodal inputs):
    /// a request with the same tokens would not reuse them, and the router hashes tokens alone.
    pub skipped_extra_keys: u64,
    /// Token-less stores and removals of engine hashes we do not hold in that tier.
    pub skipped_unknown_hash: u64,
    /// Blocks a reset forgot that a later store under them showed the engine still holds (a
    /// prefix it kept), indexed again (counted in `stored_blocks` too).
    pub relearned_blocks: u64,
}

/// How far ahead of the block being applied the engine-hash table is touched, so that the cache
/// misses of consecutive blocks overlap.
const PREFETCH: usize = 8;

/// How an engine's block hashes relate to ours, learnt from its first store whose blocks are
/// hashed here and checked on every later one (the check costs nothing: every block is hashed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HashScheme {
    /// No such store yet.
    Unknown,
    /// Each block's engine hash is our hash of it, chained from its parent's (Dynamo's mocker;
    /// a pool whose writers key blocks by the router's hash). Events name the index's blocks as
    /// they are and the engine-hash table stays empty: a block costs one memory access instead
    /// of two. What the table gave is lost: copies are not counted (a tier holds a block or not), a removal of a block never
    /// stored goes to the index, which holds nothing to remove, a store under a parent the rank
    /// does not hold is indexed (lookups never reach it), and a reset keeps no names to relearn
    /// a prefix the engine kept. Not for a rank that takes KV hints ([`Ingestor::naming`]):
    /// hints name the blocks each tier holds, which the table counts.
    Ours,
    /// The engine hashes its own way (vLLM, SGLang, TensorRT-LLM, the mock engine): the table
    /// translates.
    Engines,
}

/// Our name for an engine block and how many copies the engine holds in each tier.
///
/// A block no tier holds is a bare name, left by [`Ingestor::reset`]: kept so that a later
/// store under it (the engine kept the block, so it never stores it again) can be hashed and
/// can say the block is held again, with its prefix (see `Ingestor::parent`).
#[derive(Debug, Clone, Copy)]
struct Block {
    hash: SequenceHash,
    /// Indexed by `Tier as usize`; 16 bits keep a table slot at 32 bytes, two per cache line.
    copies: [u16; 3],
    /// The engine's hash of the block before this one, when `has_parent`.
    parent: u64,
    has_parent: bool,
}

// Two table slots per cache line (see `copies`).
const _: () = assert!(std::mem::size_of::<(u64, Block)>() == 32);

impl Block {
    fn new(hash: SequenceHash, parent: Option<EngineHash>) -> Block {
        Block {
            hash,
            copies: [0; 3],
            parent: parent.map_or(0, |p| p.0),
            has_parent: parent.is_some(),
        }
    }

    fn parent(&self) -> Option<u64> {
        self.has_parent.then_some(self.parent)
    }

    /// No tier holds it: a name a reset left.
    fn bare(&self) -> bool {
        self.copies == [0; 3]
    }
}

impl Default for Block {
    fn default() -> Self {
        Block::new(SequenceHash(0), None)
    }
}

/// Our hash -> the engine's, for one rank: how the gateway names blocks to the engine that holds
/// them (KV hints), when the engine hashes blocks its own way (vLLM, the mock engine's seed).
/// Kept by an [`Ingestor`] given one ([`Ingestor::naming`]), for every block some tier holds.
#[derive(Debug, Default)]
pub struct EngineNames {
    map: Mutex<U64Map<u64>>,
}

impl EngineNames {
    /// The engine's hash of each of `ours`, in order (`None`: no tier of the rank holds it).
    #[cfg(test)]
    fn engine_hashes(&self, ours: &[u64]) -> Vec<Option<u64>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        ours.iter().map(|h| map.get(*h).copied()).collect()
    }

    /// Name `actions`' blocks the way the engine does. A block the rank holds in no tier has no
    /// engine name and is left out (a prefetch stops there: its run is root-aligned); actions
    /// left with no block are taken out and returned, to be counted missing without asking the
    /// engine.
    pub fn name_actions(&self, actions: &mut Vec<HintAction>) -> Vec<HintAction> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut unnamed = Vec::new();
        let mut kept = Vec::with_capacity(actions.len());
        for mut action in actions.drain(..) {
            let stop_at_gap = action.kind() == Some(ActionType::Prefetch);
            let ours = std::mem::take(&mut action.payload.block_hashes);
            for hash in ours {
                match map.get(hash) {
                    Some(&engine) => action.payload.block_hashes.push(engine),
                    None if stop_at_gap => break,
                    None => {}
                }
            }
            if action.payload.block_hashes.is_empty() {
                unnamed.push(action);
            } else {
                kept.push(action);
            }
        }
        *actions = kept;
        unnamed
    }

    /// Blocks named.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no block is named.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An ingestor's changes to its [`EngineNames`], applied under one lock per message.
#[derive(Debug)]
struct Naming {
    names: Arc<EngineNames>,
    /// Ours -> the engine's (`None`: the rank dropped the block), in order.
    pending: Vec<(u64, Option<u64>)>,
    cleared: bool,
}

impl Naming {
    fn flush(&mut self) {
        if self.pending.is_empty() && !self.cleared {
            return;
        }
        let mut map = self.names.map.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::take(&mut self.cleared) {
            map.clear();
        }
        for (ours, engine) in self.pending.drain(..) {
            match engine {
                Some(engine) => {
                    map.get_or_insert(ours, engine);
                }
                None => {
                    map.remove(ours);
                }
            }
        }
    }
}

/// Per-publisher state: sequence tracking and the engine-to-own hash map.
///
/// A publisher serves exactly one rank. The batch's `data_parallel_rank` is not consulted: with
/// data parallelism every rank has its own publisher (and so its own `Ingestor`), and the rank it
/// was configured for is the one whose cache the events describe.
#[derive(Debug)]
pub struct Ingestor {
    rank: Rank,
    format: WireFormat,
    /// A store carried tokens: this stream's keys are not standard hashes.
    self_describing: bool,
    hasher: BlockHasher,
    /// Highest sequence number received on the live stream.
    last_seq: Option<u64>,
    /// Sequence numbers lost on the live stream and not yet replayed.
    missing: Option<Range<u64>>,
    /// After [`start_over`](Self::start_over): the last sequence number the replay applied.
    /// Live messages up to it were queued during the replay and are skipped, not read as a
    /// restart.
    replayed_through: Option<u64>,
    /// Engine hash -> block, in an open-addressing table (see [`U64Map`]).
    blocks: U64Map<Block>,
    /// The reverse names, when the rank takes KV hints.
    naming: Option<Naming>,
    /// Stores that are one chain carry their local hashes ([`local_hashes`](Self::local_hashes)).
    local_hashes: bool,
    /// The KV group routed on (see [`routes_on`](Self::routes_on)), once a store named its kind.
    routed_group: Option<u32>,
    /// Whether a store of the wrong block size was logged
    /// ([`warn_block_size`](Self::warn_block_size)).
    warned_block_size: bool,
    /// The engine's blocks, when they are a whole fraction or multiple of ours.
    resized: Option<Resized>,
    /// Whether the engine names blocks by our hashes.
    scheme: HashScheme,
    stats: IngestStats,
}

// === impl Ingestor ===

impl Ingestor {
    /// An ingestor for `rank`, whose engine uses `block_size`-token blocks.
    ///
    /// # Panics
    /// If `block_size` is 0.
    pub fn new(rank: Rank, block_size: u32) -> Self {
        Self::with_format(rank, block_size, WireFormat::Vllm)
    }

    /// An ingestor for a stream in `format` (see [`new`](Self::new)).
    ///
    /// # Panics
    /// If `block_size` is 0.
    pub fn with_format(rank: Rank, block_size: u32, format: WireFormat) -> Self {
        Self {
            rank,
            format,
            self_describing: false,
            hasher: BlockHasher::new(block_size as usize),
            last_seq: None,
            missing: None,
            replayed_through: None,
            blocks: U64Map::new(),
            naming: None,
            local_hashes: false,
            routed_group: None,
            warned_block_size: false,
            resized: None,
            scheme: HashScheme::Unknown,
            stats: IngestStats::default(),
        }
    }

    /// Stores that are one chain carry their blocks' local hashes (`IndexOp::Store::locals`), for
    /// an index that answers lookups by local hash (`KvIndex::find_matches_locals_into`). Off by
    /// default: the gateway and the simulator look up sequence hashes, and would pay for them on
    /// every event.
    pub fn local_hashes(mut self) -> Self {
        self.local_hashes = true;
        self
    }

    /// Also keep `names`: our hash -> the engine's for every block the rank holds.
    pub fn naming(mut self, names: Arc<EngineNames>) -> Self {
        self.naming = Some(Naming {
            names,
            pending: Vec::new(),
            cleared: false,
        });
        self
    }

    fn flush_names(&mut self) {
        if let Some(naming) = &mut self.naming {
            naming.flush();
        }
    }

    /// A message from the live stream.
    ///
    /// - The first message sets the baseline; `last + 1` is applied.
    /// - A jump reports a [`Gap`] and is *not* applied: the message is in the engine's replay
    ///   buffer, and applying it before the lost ones would let removals and child blocks overtake
    ///   the stores they refer to. The driver then replays `expected..` through
    ///   [`on_replayed`](Self::on_replayed), or calls [`reset`](Self::reset) if it cannot, before
    ///   feeding the next live message.
    /// - A number that goes back means the publisher restarted with an empty cache: the rank is
    ///   cleared first. If that number is not 0, the new process's first messages were missed too
    ///   and are reported as a gap from 0.
    /// - A repeat of the last number is ignored.
    pub fn on_message(&mut self, seq: u64, payload: &[u8]) -> Ingested {
        self.on_live(seq, |this, out| this.apply(payload, out))
    }

    /// A live message already decoded (an in-process publisher: the simulator's engines), with
    /// the same sequence tracking as [`on_message`](Self::on_message).
    pub fn on_batch(&mut self, seq: u64, batch: EventBatch) -> Ingested {
        self.on_live(seq, |this, out| this.apply_batch(batch, out))
    }

    fn on_live(&mut self, seq: u64, apply: impl FnOnce(&mut Self, &mut Ingested)) -> Ingested {
        let mut out = Ingested::default();
        if let Some(through) = self.replayed_through {
            if seq <= through {
                return out;
            }
            self.replayed_through = None;
        }
        let expected = match self.last_seq {
            None => seq,
            Some(last) if seq == last => return out,
            Some(last) if seq < last => {
                self.stats.restarts += 1;
                out.restarted = true;
                out.ops.push(self.reset());
                0
            }
            Some(last) => last + 1,
        };
        self.last_seq = Some(seq);
        if seq > expected {
            self.stats.gaps += 1;
            // `seq` itself is missing too; saturating, since `u64::MAX` is the replay socket's
            // end marker and cannot be replayed anyway (a hostile `seq` overflowed here).
            self.missing = Some(expected..seq.saturating_add(1));
            out.gap = Some(Gap {
                expected,
                received: seq,
            });
        } else {
            apply(self, &mut out);
        }
        self.flush_names();
        out
    }

    /// A message answered by the replay socket: applied only if it is the next missing one, so
    /// messages already applied (or still to come live) are skipped.
    pub fn on_replayed(&mut self, seq: u64, payload: &[u8]) -> Ingested {
        let mut out = Ingested::default();
        let Some(missing) = &mut self.missing else {
            return out;
        };
        if seq != missing.start {
            return out;
        }
        missing.start += 1;
        if missing.is_empty() {
            self.missing = None;
        }
        self.apply(payload, &mut out);
        self.flush_names();
        out
    }

    /// Whether no message was applied or asked for yet (a subscriber that has not joined).
    pub fn is_fresh(&self) -> bool {
        self.last_seq.is_none() && self.missing.is_none() && self.replayed_through.is_none()
    }

    /// Sequence numbers reported lost and not yet replayed.
    pub fn missing(&self) -> Option<Range<u64>> {
        self.missing.clone()
    }

    /// The publisher came back after a disconnection: it may have restarted (numbering from 0
    /// again) or sent messages meanwhile that nothing will announce. Forget every block and
    /// expect the whole stream again from 0 through [`on_replayed`](Self::on_replayed), then
    /// [`replay_done`](Self::replay_done); returns the clear that says so.
    pub fn start_over(&mut self) -> IndexOp {
        let clear = self.reset();
        self.last_seq = None;
        self.replayed_through = None;
        self.missing = Some(0..u64::MAX);
        clear
    }

    /// The replay after [`start_over`](Self::start_over) ended: what it applied is the new
    /// baseline (none: the next live message is). A replay that did not start at 0 applied
    /// nothing, so the rank stays cleared: the index may miss blocks, never claim lost ones.
    pub fn replay_done(&mut self) {
        if let Some(missing) = self.missing.take() {
            self.last_seq = missing.start.checked_sub(1);
            self.replayed_through = self.last_seq;
        }
    }

    /// Give up on lost messages: forget every block the rank held and return the clear that
    /// says so.
    ///
    /// The blocks' names stay (bare, no tier holding them), so that a later store under a block
    /// the engine kept can be hashed and brings that block and its prefix back (see
    /// `Ingestor::parent`): an engine never stores again a block it holds, so a prefix that
    /// stays hot (a shared system prompt) would otherwise never be indexed again, and a lookup
    /// stops at its first block. Names still bare from the previous reset go, so at most the
    /// blocks held at one reset are kept as names.
    pub fn reset(&mut self) -> IndexOp {
        self.missing = None;
        self.blocks.retain(|_, block| {
            let held = !block.bare();
            block.copies = [0; 3];
            held
        });
        let op = self.cleared();
        self.flush_names();
        op
    }

    /// What was applied and skipped so far.
    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// A store whose blocks the transport already hashed one by one (Dynamo's `RouterEvent`
    /// carries each block's local hash as `tokens_hash` instead of its tokens): chain them from
    /// the parent's own hash. No sequence tracking; the caller's transport orders events.
    pub fn store_locals(
        &mut self,
        parent: Option<EngineHash>,
        blocks: &[(EngineHash, LocalBlockHash)],
        tier: Tier,
    ) -> Option<IndexOp> {
        let engine_hashes = || blocks.iter().map(|&(engine, _)| engine);
        let locals = || blocks.iter().map(|&(_, local)| local);
        let (stored, chain) = match self.named_by_ours(engine_hashes(), parent, locals()) {
            Ok(true) => (Self::as_named(engine_hashes()), self.local_hashes),
            Ok(false) => self.translate_locals(parent, blocks, tier)?,
            Err(clear) => return Some(clear),
        };
        self.flush_names();
        self.stats.stored_blocks += stored.len() as u64;
        (!stored.is_empty()).then(|| IndexOp::Store {
            rank: self.rank,
            tier,
            blocks: stored,
            locals: if chain {
                locals().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// [`store_locals`](Self::store_locals) through the engine-hash table: our hashes of the
    /// blocks stored, and whether they are exactly the chain hashed here (`None`: the parent is
    /// unknown).
    fn translate_locals(
        &mut self,
        parent: Option<EngineHash>,
        blocks: &[(EngineHash, LocalBlockHash)],
        tier: Tier,
    ) -> Option<(Vec<SequenceHash>, bool)> {
        let mut stored = Vec::with_capacity(blocks.len());
        let mut prev = self.parent(parent, tier, &mut stored).ok()?;
        let mut prev_engine = parent;
        // Whether `stored` is exactly the chain hashed here (see `IndexOp::Store::locals`).
        let mut chain = self.local_hashes && stored.is_empty();
        for &(engine, _) in blocks.iter().take(PREFETCH) {
            self.blocks.prefetch(engine.0);
        }
        for (i, &(engine, local)) in blocks.iter().enumerate() {
            if let Some(&(ahead, _)) = blocks.get(i + PREFETCH) {
                self.blocks.prefetch(ahead.0);
            }
            let hash = self.hasher.chain(prev, local);
            prev = Some(hash);
            let block = self
                .blocks
                .get_or_insert(engine.0, Block::new(hash, prev_engine));
            prev_engine = Some(engine);
            let added = add_copy(block, tier);
            chain &= added == Some(hash);
            name(&mut self.naming, added, engine);
            stored.extend(added);
        }
        Some((stored, chain))
    }

    /// A removal from a transport without sequence numbers (see [`store_locals`](Self::store_locals)).
    pub fn remove_blocks(&mut self, engine_hashes: &[EngineHash], tier: Tier) -> Option<IndexOp> {
        let blocks = self.remove(engine_hashes, tier);
        self.flush_names();
        self.stats.removed_blocks += blocks.len() as u64;
        (!blocks.is_empty()).then_some(IndexOp::Remove {
            rank: self.rank,
            tier,
            blocks,
        })
    }

    /// Everything of this rank dropped, from a transport without sequence numbers.
    pub fn clear_all(&mut self) -> IndexOp {
        let op = self.clear();
        self.flush_names();
        op
    }

    fn apply(&mut self, payload: &[u8], out: &mut Ingested) {
        let batch = match self.format.decode(payload) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::debug!(rank = %self.rank, %error, "skipping malformed KV event batch");
                self.stats.malformed += 1;
                out.malformed = true;
                return;
            }
        };
        self.apply_batch(batch, out);
    }

    fn apply_batch(&mut self, batch: EventBatch, out: &mut Ingested) {
        self.stats.batches += 1;
        self.stats.events += batch.events.len() as u64;
        out.ts = Some(batch.ts);
        for event in batch.events {
            if let Some(op) = self.apply_event(event) {
                out.ops.push(op);
            }
        }
    }

    /// Whether an event of KV group `group` (of attention `kind`, when a store says) is routed
    /// on. Hybrid models publish one group per attention type, in the order of the model's
    /// layers, so group 0 is a sliding window in Gemma 3 and gpt-oss: its blocks cover only the
    /// window's tail and no prefix can be matched on them. The routed group is the first whose
    /// stores say full attention; until one does (engines that name no kind), group 0.
    fn routes_on(&mut self, group: Option<u32>, kind: Option<&str>) -> bool {
        let group = group.unwrap_or(0);
        match kind {
            Some("full_attention" | "mla_attention" | "sink_full_attention") => {
                group == *self.routed_group.get_or_insert(group)
            }
            Some(_) => false,
            None => group == self.routed_group.unwrap_or(0),
        }
    }

    fn apply_event(&mut self, event: KvEvent) -> Option<IndexOp> {
        let routed = match &event {
            KvEvent::BlockStored {
                group_idx,
                kv_cache_spec_kind,
                ..
            } => self.routes_on(*group_idx, kv_cache_spec_kind.as_deref()),
            KvEvent::BlockRemoved { group_idx, .. } => self.routes_on(*group_idx, None),
            KvEvent::AllBlocksCleared => true,
        };
        if !routed {
            self.stats.skipped_other_group += 1;
            return None;
        }
        match event {
            KvEvent::BlockStored {
                lora_id, lora_name, ..
            } if lora_id.is_some() || lora_name.is_some() => {
                self.stats.skipped_lora += 1;
                None
            }
            KvEvent::BlockStored {
                extra_keys: true, ..
            } => {
                self.stats.skipped_extra_keys += 1;
                None
            }
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                ..
            } => {
                let tier = Tier::from_medium(medium.as_deref());
                let (blocks, locals) = if token_ids.is_empty() && block_size == 0 {
                    (self.store_copies(&block_hashes, tier), Vec::new())
                } else {
                    match self.store_computed(
                        &block_hashes,
                        parent_block_hash,
                        &token_ids,
                        block_size,
                        tier,
                    ) {
                        Ok(stored) => stored,
                        Err(clear) => return Some(clear),
                    }
                };
                self.stats.stored_blocks += blocks.len() as u64;
                (!blocks.is_empty()).then_some(IndexOp::Store {
                    rank: self.rank,
                    tier,
                    blocks,
                    locals,
                })
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
                ..
            } => {
                let tier = Tier::from_medium(medium.as_deref());
                let blocks = self.remove(&block_hashes, tier);
                self.stats.removed_blocks += blocks.len() as u64;
                (!blocks.is_empty()).then_some(IndexOp::Remove {
                    rank: self.rank,
                    tier,
                    blocks,
                })
            }
            KvEvent::AllBlocksCleared => Some(self.clear()),
        }
    }

    /// Blocks computed from tokens: re-hash them, chained from the parent's own hash. Our hashes
    /// of the blocks stored, and their local hashes when those are the whole chain (`Err`: the
    /// clear of a rank whose engine stopped naming blocks by our hashes, see
    /// [`named_by_ours`](Self::named_by_ours)).
    fn store_computed(
        &mut self,
        engine_hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[u32],
        block_size: u32,
        tier: Tier,
    ) -> Result<(Vec<SequenceHash>, Vec<LocalBlockHash>), IndexOp> {
        self.self_describing = true;
        let ours = self.hasher.block_size();
        if block_size as usize != ours || tokens.len() != engine_hashes.len() * ours {
            if let Some(stored) =
                self.store_resized(engine_hashes, parent, tokens, block_size, tier)
            {
                return Ok((stored, Vec::new()));
            }
            if block_size as usize != ours && self.stats.stored_blocks == 0 {
                self.warn_block_size(block_size);
            }
            self.stats.skipped_unaligned += 1;
            return Ok((Vec::new(), Vec::new()));
        }
        if self.scheme != HashScheme::Engines {
            let locals = self.hasher.locals(tokens);
            if self.named_by_ours(
                engine_hashes.iter().copied(),
                parent,
                locals.iter().copied(),
            )? {
                let stored = Self::as_named(engine_hashes.iter().copied());
                return Ok((
                    stored,
                    if self.local_hashes {
                        locals
                    } else {
                        Vec::new()
                    },
                ));
            }
        }
        let mut stored = Vec::new();
        let Ok(parent_hash) = self.parent(parent, tier, &mut stored) else {
            return Ok((stored, Vec::new()));
        };
        let mut chain = self.local_hashes && stored.is_empty();
        // The blocks' slots arrive while their tokens are hashed.
        for engine in engine_hashes {
            self.blocks.prefetch(engine.0);
        }
        let locals = self.hasher.locals(tokens);
        let hashes = self.hasher.sequence_from(parent_hash, &locals);
        let parents = std::iter::once(parent).chain(engine_hashes.iter().copied().map(Some));
        let mut ahead = engine_hashes.iter().skip(PREFETCH);
        stored.extend(engine_hashes.iter().zip(parents).zip(hashes).filter_map(
            |((&engine, parent), hash)| {
                // A long store's first slots may have left the cache while the tokens were
                // hashed: each is brought back a few blocks before its insert.
                if let Some(next) = ahead.next() {
                    self.blocks.prefetch(next.0);
                }
                // A known engine hash names the same tokens and prefix: keep its first own hash.
                let block = self
                    .blocks
                    .get_or_insert(engine.0, Block::new(hash, parent));
                let added = add_copy(block, tier);
                chain &= added == Some(hash);
                name(&mut self.naming, added, engine);
                added
            },
        ));
        Ok((stored, if chain { locals } else { Vec::new() }))
    }

    /// Whether a store's blocks can be taken as the engine names them: each engine hash is our
    /// hash of the block, chained from the one before (the parent's taken as ours). Decided by
    /// the first store hashed here, while no block is held through the table; then every store
    /// must agree. `Err`: one did not, so the blocks taken on the engine's word can no longer be
    /// told apart: the rank is cleared, that store is dropped, and the table translates from now
    /// on.
    fn named_by_ours(
        &mut self,
        engine_hashes: impl Iterator<Item = EngineHash>,
        parent: Option<EngineHash>,
        locals: impl Iterator<Item = LocalBlockHash>,
    ) -> Result<bool, IndexOp> {
        if self.scheme == HashScheme::Engines {
            return Ok(false);
        }
        let mut prev = parent.map(|p| SequenceHash(p.0));
        let agrees = engine_hashes.zip(locals).all(|(engine, local)| {
            let hash = self.hasher.chain(prev, local);
            prev = Some(hash);
            hash.0 == engine.0
        });
        match (self.scheme, agrees) {
            (HashScheme::Ours, true) => Ok(true),
            (HashScheme::Ours, false) => {
                tracing::warn!(
                    rank = %self.rank,
                    "the engine stored a block not named by the router's hash after naming every \
                     earlier one so: the rank's blocks are forgotten and its events translated \
                     from now on"
                );
                self.scheme = HashScheme::Engines;
                Err(self.clear())
            }
            // A rank that takes KV hints keeps the table: hints name the blocks each tier holds.
            (_, true)
                if self.blocks.is_empty() && self.resized.is_none() && self.naming.is_none() =>
            {
                tracing::debug!(
                    rank = %self.rank,
                    "the engine names blocks by the router's hash: its events are applied as \
                     they name blocks"
                );
                self.scheme = HashScheme::Ours;
                Ok(true)
            }
            _ => {
                self.scheme = HashScheme::Engines;
                Ok(false)
            }
        }
    }

    /// Blocks of an engine that names them by our hashes, as it names them.
    fn as_named(engine_hashes: impl Iterator<Item = EngineHash>) -> Vec<SequenceHash> {
        engine_hashes.map(|e| SequenceHash(e.0)).collect()
    }

    /// A store of engine blocks a whole fraction or multiple of ours (see [`Resized`]): `None`
    /// if these are not, or not the size of this engine's. The size is taken only from an engine
    /// that has stored no block of ours: an engine of the right size that stores one short
    /// block (SGLang's last partial page) keeps its blocks.
    fn store_resized(
        &mut self,
        engine_hashes: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[u32],
        engine_block: u32,
        tier: Tier,
    ) -> Option<Vec<SequenceHash>> {
        let engine_block = engine_block as usize;
        if tokens.len() != engine_hashes.len() * engine_block {
            return None;
        }
        if self.resized.is_none() && self.blocks.is_empty() && self.scheme != HashScheme::Ours {
            self.resized = Resized::new(engine_block, self.hasher.block_size());
        }
        let resized = (self.resized.as_mut()).filter(|r| r.engine_block() == engine_block)?;
        Some(resized.store(
            &self.hasher,
            engine_hashes,
            parent,
            tokens,
            tier,
            &mut self.naming,
            &mut self.stats,
        ))
    }

    /// Say once that the engine's blocks are neither the size this rank was configured with nor
    /// a whole fraction or multiple of it: none of its stores can be indexed, and the operator
    /// sees only a count otherwise. Said only while nothing was indexed, so an engine of the
    /// right size that stores one odd block stays quiet.
    fn warn_block_size(&mut self, theirs: u32) {
        if std::mem::replace(&mut self.warned_block_size, true) {
            return;
        }
        tracing::warn!(
            rank = %self.rank,
            engine_block_size = theirs,
            block_size = self.hasher.block_size(),
            "the engine stores blocks that are neither this worker's block_size nor a whole \
             fraction or multiple of it, so none of them is indexed: make the worker's \
             block_size divide the engine's or be a multiple of it (vLLM: --block-size; \
             SGLang: --page-size)"
        );
    }

    /// Our hash of a store's `parent`, the block before its first one (`Err`: unknown, the store
    /// is skipped).
    ///
    /// An engine computes blocks for a request that holds their whole prefix on the device, so
    /// a device store under a bare name (a block a reset forgot but the engine kept) says that
    /// block is held there again, and so is each bare name before it: they are counted and added
    /// to `stored`. Only bare names: a block that some tier holds follows its own events.
    fn parent(
        &mut self,
        parent: Option<EngineHash>,
        tier: Tier,
        stored: &mut Vec<SequenceHash>,
    ) -> Result<Option<SequenceHash>, ()> {
        let Some(parent) = parent else {
            return Ok(None);
        };
        let Some(hash) = self.blocks.get(parent.0).map(|block| block.hash) else {
            self.stats.skipped_unknown_parent += 1;
            return Err(());
        };
        if tier == Tier::Device {
            // Each step makes a bare name held, so a cycle of parents ends.
            let mut next = Some(parent.0);
            while let Some(engine) = next {
                let Some(block) = self.blocks.get_mut(engine).filter(|b| b.bare()) else {
                    break;
                };
                let added = add_copy(block, tier);
                name(&mut self.naming, added, EngineHash(engine));
                stored.extend(added);
                self.stats.relearned_blocks += 1;
                next = block.parent();
            }
        }
        Ok(Some(hash))
    }

    /// Token-less copies of blocks we already know (offload to host memory or disk); on a
    /// Mooncake stream, unknown blocks named by their standard hash.
    fn store_copies(&mut self, engine_hashes: &[EngineHash], tier: Tier) -> Vec<SequenceHash> {
        if let Some(resized) = resized_of(&mut self.resized, engine_hashes) {
            return resized.copy(engine_hashes, tier, &mut self.naming, &mut self.stats);
        }
        if self.scheme == HashScheme::Ours {
            return Self::as_named(engine_hashes.iter().copied());
        }
        let mut stored = Vec::new();
        for engine in engine_hashes {
            if self.format == WireFormat::Mooncake && !self.self_describing {
                let block = self
                    .blocks
                    .get_or_insert(engine.0, Block::new(SequenceHash(engine.0), None));
                let added = add_copy(block, tier);
                name(&mut self.naming, added, *engine);
                stored.extend(added);
                continue;
            }
            match self.blocks.get_mut(engine.0) {
                Some(block) => {
                    let added = add_copy(block, tier);
                    name(&mut self.naming, added, *engine);
                    stored.extend(added);
                }
                None => self.stats.skipped_unknown_hash += 1,
            }
        }
        stored
    }

    /// Drop one copy per hash; a block leaves a tier with its last copy there.
    fn remove(&mut self, engine_hashes: &[EngineHash], tier: Tier) -> Vec<SequenceHash> {
        if let Some(resized) = resized_of(&mut self.resized, engine_hashes) {
            return resized.remove(engine_hashes, tier, &mut self.naming, &mut self.stats);
        }
        if self.scheme == HashScheme::Ours {
            return Self::as_named(engine_hashes.iter().copied());
        }
        let mut removed = Vec::with_capacity(engine_hashes.len());
        for engine in engine_hashes.iter().take(PREFETCH) {
            self.blocks.prefetch(engine.0);
        }
        for (i, engine) in engine_hashes.iter().enumerate() {
            if let Some(ahead) = engine_hashes.get(i + PREFETCH) {
                self.blocks.prefetch(ahead.0);
            }
            let mut known = true;
            let mut gone = None;
            let found = self.blocks.update_or_remove(engine.0, |block| {
                let copies = &mut block.copies[tier as usize];
                if *copies == 0 {
                    known = false;
                    // A bare name the engine dropped is no longer needed.
                    return !block.bare();
                }
                *copies -= 1;
                if *copies == 0 {
                    removed.push(block.hash);
                }
                let kept = block.copies != [0; 3];
                if !kept {
                    gone = Some(block.hash);
                }
                kept
            });
            if found.is_none() || !known {
                self.stats.skipped_unknown_hash += 1;
            }
            if let (Some(naming), Some(ours)) = (&mut self.naming, gone) {
                naming.pending.push((ours.0, None));
            }
        }
        removed
    }

    fn clear(&mut self) -> IndexOp {
        self.blocks.clear();
        self.cleared()
    }

    /// The rank holds nothing now: names waiting to be told go, and the clear that says so.
    /// Resized blocks are forgotten whole (a reset keeps no bare names of them).
    fn cleared(&mut self) -> IndexOp {
        if let Some(resized) = &mut self.resized {
            resized.clear();
        }
        if let Some(naming) = &mut self.naming {
            naming.pending.clear();
            naming.cleared = true;
        }
        IndexOp::Clear { rank: self.rank }
    }
}

/// A tier gained the block named `added` (ours) that the engine calls `engine`.
fn name(naming: &mut Option<Naming>, added: Option<SequenceHash>, engine: EngineHash) {
    if let (Some(naming), Some(ours)) = (naming, added) {
        naming.pending.push((ours.0, Some(engine.0)));
    }
}

/// Count one more copy of `block` in `tier`; our hash if the tier did not hold it yet.
fn add_copy(block: &mut Block, tier: Tier) -> Option<SequenceHash> {
    add_copies(&mut block.copies, tier).then_some(block.hash)
}

/// Count one more copy in `tier` of per-tier `copies`; whether the tier did not hold one yet.
fn add_copies(copies: &mut [u16; 3], tier: Tier) -> bool {
    let copies = &mut copies[tier as usize];
    *copies = copies.saturating_add(1);
    *copies == 1
}

#[cfg(test)]
mod tests;
