//! The engine's paged KV cache with prefix reuse, shaped like vLLM's block pool.
//!
//! A fixed number of physical blocks of `block_size` tokens. A block that holds a full block of
//! computed tokens is *cached* under its engine sequence hash and can be reused by any request whose
//! prompt starts with the same tokens. Blocks referenced by running sequences are refcounted; a
//! block nobody references sits on the free list, in LRU order, keeping its contents until a new
//! block is needed and it is the least recently used one.
//!
//! Hashes are the engine's own: by default [`ENGINE_SEED`], which differs from the router's seed
//! exactly as a real engine's hashes differ from the gateway's, so consumers of the events must
//! re-hash `token_ids`. [`KvCache::with_seed`] takes another (the simulator's engines hash as the
//! router does, as Dynamo's mocker hashes as Dynamo's router).

use crate::hash::{BlockHasher, SequenceHash};
use crate::index::flat::U64Map;
use crate::worker::Tier;
use std::collections::HashSet;

/// Seed of the engine's block hashes: anything but the router's 1337.
pub const ENGINE_SEED: u64 = 0x6d6f_636b_5f6b_7663;

/// A change of the cache's content, in the order it happened (vLLM's KV events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Full blocks were computed (or copied) and are now cached in `tier`.
    Stored {
        /// Where the blocks are (vLLM's `medium`); the device cache always says
        /// [`Tier::Device`], the engine's lower tiers say theirs.
        tier: Tier,
        /// Engine sequence hashes of the blocks, in prefix order.
        hashes: Vec<u64>,
        /// Hash of the block before the first one; `None` at the start of a sequence.
        parent: Option<u64>,
        /// The blocks' tokens, `block_size` per block.
        token_ids: Vec<u32>,
    },
    /// Cached blocks were evicted from `tier`.
    Removed {
        /// The tier they left.
        tier: Tier,
        /// Engine sequence hashes of the evicted blocks.
        hashes: Vec<u64>,
    },
    /// Every cached block was dropped.
    Cleared,
}

/// Marks the end of the free list.
const NIL: u32 = u32::MAX;

/// Victims whose table slots a write prefetches at once before evicting them.
const VICTIM_BATCH: usize = 16;

/// How many blocks ahead of a write the table slots of a prompt's known hashes are prefetched.
const SLOTS_AHEAD: usize = 8;

#[derive(Debug, Clone)]
struct Block {
    /// Set while the block is cached (full, computed, and the only block with this hash).
    hash: Option<u64>,
    refs: u32,
    prev: u32,
    next: u32,
    /// What a hint said about the cached block (cleared when it leaves the cache).
    mark: Mark,
}

/// A hint's eviction bias on a cached block: where it goes when nobody references it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Mark {
    /// The back of the free list (least recently used goes first).
    #[default]
    Plain,
    /// The front of the free list: evicted before anything else (ephemeral, evict).
    EvictFirst,
    /// The retained list: evicted only once the free list has nothing else (retain).
    Retained,
}

/// Unreferenced blocks, evicted from the front. It is threaded through the blocks themselves so
/// that a prefix hit can take a block out of the middle in O(1).
#[derive(Debug, Clone)]
struct FreeList {
    head: u32,
    tail: u32,
    len: usize,
}

// === impl FreeList ===

impl FreeList {
    const EMPTY: FreeList = FreeList {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    fn push_back(&mut self, blocks: &mut [Block], id: u32) {
        blocks[id as usize].prev = self.tail;
        blocks[id as usize].next = NIL;
        match self.tail {
            NIL => self.head = id,
            tail => blocks[tail as usize].next = id,
        }
        self.tail = id;
        self.len += 1;
    }

    fn push_front(&mut self, blocks: &mut [Block], id: u32) {
        blocks[id as usize].prev = NIL;
        blocks[id as usize].next = self.head;
        match self.head {
            NIL => self.tail = id,
            head => blocks[head as usize].prev = id,
        }
        self.head = id;
        self.len += 1;
    }

    fn unlink(&mut self, blocks: &mut [Block], id: u32) {
        let Block { prev, next, .. } = blocks[id as usize];
        match prev {
            NIL => self.head = next,
            prev => blocks[prev as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            next => blocks[next as usize].prev = prev,
        }
        self.len -= 1;
    }
}

/// The blocks one sequence holds, in token order, with the hashes of its full blocks.
///
/// Not `Clone`: each table owns one reference on each of its blocks until
/// [`KvCache::release`] takes it back.
#[derive(Debug, Default)]
pub struct BlockTable {
    blocks: Vec<u32>,
    hashes: Vec<u64>,
    /// Blocks promised at admission and not taken yet.
    reserved: usize,
    /// Hashes of the sequence's leading full blocks known before they are written (its prompt's,
    /// hashed on arrival): [`KvCache::write`] takes them instead of hashing those blocks again.
    known: Vec<u64>,
}

impl BlockTable {
    /// Engine hashes of the sequence's full blocks, reused or computed.
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// Physical blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Physical block of the table's `index`-th block, if taken.
    pub fn slot(&self, index: usize) -> Option<u32> {
        self.blocks.get(index).copied()
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Hashes given to [`BlockTable::know`].
    pub fn known(&self) -> &[u64] {
        &self.known
    }

    /// The engine hashes of the sequence's first full blocks, as [`KvCache::hash_blocks`] gave
    /// them for its tokens (the prompt's), so that writing them hashes nothing again.
    ///
    /// # Panics
    /// If they contradict the blocks the table already holds (a caller's bug).
    pub fn know(&mut self, hashes: Vec<u64>) {
        let held = self.hashes.len().min(hashes.len());
        assert_eq!(
            self.hashes[..held],
            hashes[..held],
            "other tokens than the table's"
        );
        self.known = hashes;
    }
}

/// A paged KV cache with prefix reuse and LRU eviction.
///
/// Admission reserves every block a sequence will ever need ([`KvCache::allocate`]); the blocks are
/// taken from the free list only as tokens are written, so cached blocks survive as long as
/// possible, yet a running sequence never runs out of blocks and nothing needs preempting.
#[derive(Debug, Clone)]
pub struct KvCache {
    hasher: BlockHasher,
    blocks: Vec<Block>,
    free: FreeList,
    /// Unreferenced blocks a retain hint marked: evicted only when `free` is empty.
    retained: FreeList,
    /// Engine hash -> slot of every cached block (the index's open-addressing table: the
    /// keys are hashes already).
    cached: U64Map<u32>,
    /// Blocks promised to admitted sequences, not yet taken; never more than the free list holds.
    reserved: usize,
    events: Vec<CacheEvent>,
    /// Whether changes are recorded in `events` ([`KvCache::publish_events`]).
    publish: bool,
    /// Blocks cached since the last [`KvCache::take_stored`], kept only once
    /// [`KvCache::log_stored`] turned it on (the engine's lower tiers write them through).
    stored: Option<Vec<StoredBlock>>,
    /// With the log on: each slot's parent and tokens, so that a hint can write a cached block
    /// to a lower tier long after it was computed.
    contents: Option<SlotContents>,
}

/// What each device slot holds, for the blocks cached in it.
#[derive(Debug, Clone)]
struct SlotContents {
    parents: Vec<Option<u64>>,
    /// `block_size` tokens per slot.
    tokens: Vec<u32>,
}

/// Where a cached block stands, for a hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Residency {
    /// Not cached on the device.
    Absent,
    /// Cached and referenced by nobody: evictable.
    Free,
    /// Cached and referenced (by a running request or a pin).
    InUse,
}

/// A block the device cache just cached: what write-through to a lower tier needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    /// Engine sequence hash.
    pub hash: u64,
    /// The block before it; `None` at the start of a sequence.
    pub parent: Option<u64>,
    /// Physical device block.
    pub slot: u32,
    /// Its `block_size` tokens.
    pub token_ids: Vec<u32>,
}

// === impl KvCache ===

impl KvCache {
    /// An empty cache of `num_blocks` blocks of `block_size` tokens.
    ///
    /// # Panics
    /// If `block_size` is 0 or `num_blocks` does not fit a `u32` (configuration errors that
    /// `EngineConfig::validate` rejects earlier).
    pub fn new(block_size: usize, num_blocks: usize) -> Self {
        Self::with_seed(block_size, num_blocks, ENGINE_SEED)
    }

    /// [`KvCache::new`], hashing blocks with `seed`.
    ///
    /// # Panics
    /// As [`KvCache::new`].
    pub fn with_seed(block_size: usize, num_blocks: usize, seed: u64) -> Self {
        assert!(num_blocks < NIL as usize, "too many KV blocks");
        let mut cache = Self {
            hasher: BlockHasher::with_seed(block_size, seed),
            blocks: Vec::with_capacity(num_blocks),
            free: FreeList::EMPTY,
            retained: FreeList::EMPTY,
            cached: U64Map::new(),
            reserved: 0,
            events: Vec::new(),
            publish: true,
            stored: None,
            contents: None,
        };
        for id in 0..num_blocks as u32 {
            cache.blocks.push(Block {
                hash: None,
                refs: 0,
                prev: NIL,
                next: NIL,
                mark: Mark::Plain,
            });
            cache.free.push_back(&mut cache.blocks, id);
        }
        cache
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.hasher.block_size()
    }

    /// Physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks referenced by sequences.
    pub fn used_blocks(&self) -> usize {
        self.blocks.len() - self.free_len()
    }

    /// Unreferenced blocks, cached or not.
    fn free_len(&self) -> usize {
        self.free.len + self.retained.len
    }

    /// Fraction of blocks referenced by sequences (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        self.used_blocks() as f64 / self.blocks.len() as f64
    }

    /// Engine hashes of the full blocks of `tokens`.
    pub fn hash_blocks(&self, tokens: &[u32]) -> Vec<u64> {
        self.hasher
            .sequence(tokens)
            .into_iter()
            .map(|h| h.0)
            .collect()
    }

    /// How many leading blocks of `hashes` are cached.
    pub fn cached_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|&&h| self.cached.contains_key(h))
            .count()
    }

    /// Blocks cached.
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// Hashes of every cached block, in no particular order.
    pub fn cached_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.cached.keys()
    }

    /// Admit a sequence that needs `total_blocks` blocks over its life: reuse the cached leading
    /// blocks of `prefix` and reserve the rest. `None` (and no change) if they do not fit.
    pub fn allocate(&mut self, prefix: &[u64], total_blocks: usize) -> Option<BlockTable> {
        let hits: Vec<u32> = prefix
            .iter()
            .map_while(|&h| self.cached.get(h).copied())
            .take(total_blocks)
            .collect();
        let fresh = total_blocks - hits.len();
        // A hit on an unreferenced block takes it off the free list as well.
        let free_hits = hits
            .iter()
            .filter(|&&id| self.blocks[id as usize].refs == 0)
            .count();
        if self.free_len() < self.reserved + free_hits + fresh {
            return None;
        }
        for &id in &hits {
            if self.blocks[id as usize].refs == 0 {
                self.unlink_free(id);
            }
            self.blocks[id as usize].refs += 1;
        }
        self.reserved += fresh;
        Some(BlockTable {
            hashes: prefix[..hits.len()].to_vec(),
            blocks: hits,
            reserved: fresh,
            known: Vec::new(),
        })
    }

    /// Record that the KV of `tokens` (the sequence's whole computed prefix) is written: take the
    /// blocks it now spans and cache the blocks that became full.
    ///
    /// # Panics
    /// If `tokens` needs more blocks than [`KvCache::allocate`] reserved for the table.
    pub fn write(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let block_size = self.block_size();
        let (had, needed) = (table.blocks.len(), tokens.len().div_ceil(block_size));
        while table.blocks.len() < needed {
            assert!(table.reserved > 0, "sequence wrote past its reservation");
            if (table.blocks.len() - had).is_multiple_of(VICTIM_BATCH) {
                self.prefetch_victims((needed - table.blocks.len()).min(VICTIM_BATCH));
            }
            let id = self.take_free();
            table.reserved -= 1;
            table.blocks.push(id);
        }
        let first_new = table.hashes.len();
        let mut run_start = first_new;
        // A prompt's hashes are known ahead: their table slots are prefetched a few blocks
        // ahead of the inserts, whose misses then overlap.
        let known_ahead = |i: usize| table.known.get(i + SLOTS_AHEAD).copied();
        for hash in table.known.iter().skip(first_new).take(SLOTS_AHEAD) {
            self.cached.prefetch(*hash);
        }
        for (i, block) in tokens.chunks_exact(block_size).enumerate().skip(first_new) {
            if let Some(ahead) = known_ahead(i) {
                self.cached.prefetch(ahead);
            }
            let parent = table.hashes.last().map(|&h| SequenceHash(h));
            let hash = match table.known.get(i) {
                Some(&hash) => hash,
                None => self.hasher.chain(parent, self.hasher.local(block)).0,
            };
            table.hashes.push(hash);
            if !self.cached.insert_if_absent(hash, table.blocks[i]) {
                // Another block already caches these tokens (two identical prompts prefilled at
                // once): this copy stays anonymous and is freed without an event.
                self.store_run(table, tokens, run_start..i);
                run_start = i + 1;
                continue;
            }
            self.blocks[table.blocks[i] as usize].hash = Some(hash);
            if let Some(contents) = &mut self.contents {
                contents.record(table.blocks[i], parent.map(|p| p.0), block);
            }
            if let Some(stored) = &mut self.stored {
                stored.push(StoredBlock {
                    hash,
                    parent: parent.map(|p| p.0),
                    slot: table.blocks[i],
                    token_ids: block.to_vec(),
                });
            }
        }
        self.store_run(table, tokens, run_start..table.hashes.len());
    }

    /// Drop a sequence's references. Its cached blocks stay cached, the sequence's tail ahead of its
    /// head in eviction order (the head is likelier shared); anonymous blocks go first.
    pub fn release(&mut self, table: BlockTable) {
        self.reserved -= table.reserved;
        for &id in table.blocks.iter().rev() {
            let block = &mut self.blocks[id as usize];
            block.refs -= 1;
            if block.refs == 0 {
                self.push_free(id);
            }
        }
    }

    /// Put an unreferenced block where its state says: anonymous and evict-first blocks at the
    /// front, retained ones on their own list, the rest at the back.
    fn push_free(&mut self, id: u32) {
        let block = &self.blocks[id as usize];
        match (block.hash, block.mark) {
            (None, _) | (Some(_), Mark::EvictFirst) => self.free.push_front(&mut self.blocks, id),
            (Some(_), Mark::Plain) => self.free.push_back(&mut self.blocks, id),
            (Some(_), Mark::Retained) => self.retained.push_back(&mut self.blocks, id),
        }
    }

    /// Take an unreferenced block off whichever free list holds it.
    fn unlink_free(&mut self, id: u32) {
        if self.blocks[id as usize].mark == Mark::Retained {
            self.retained.unlink(&mut self.blocks, id);
        } else {
            self.free.unlink(&mut self.blocks, id);
        }
    }

    /// Drop every cached block (vLLM's `reset_prefix_cache`). Refused (`false`) while any
    /// sequence holds blocks, as in vLLM.
    pub fn reset(&mut self) -> bool {
        if self.used_blocks() > 0 || self.reserved > 0 {
            return false;
        }
        self.free = FreeList::EMPTY;
        self.retained = FreeList::EMPTY;
        for id in 0..self.blocks.len() as u32 {
            let block = &mut self.blocks[id as usize];
            block.hash = None;
            block.mark = Mark::Plain;
            self.free.push_back(&mut self.blocks, id);
        }
        self.cached.clear();
        if self.publish {
            self.events.push(CacheEvent::Cleared);
        }
        true
    }

    /// Whether the cache's changes are recorded as events for [`KvCache::take_events`] (on
    /// from the start). A driver with no subscriber turns them off and saves copying every
    /// stored block's tokens.
    pub fn publish_events(&mut self, on: bool) {
        self.publish = on;
        if !on {
            self.events.clear();
        }
    }

    /// Whether changes are recorded as events ([`KvCache::publish_events`]).
    pub(crate) fn publishes_events(&self) -> bool {
        self.publish
    }

    /// Keep a log of the blocks cached from now on, for [`KvCache::take_stored`].
    pub fn log_stored(&mut self) {
        self.stored.get_or_insert_with(Vec::new);
        let (slots, block_size) = (self.blocks.len(), self.block_size());
        self.contents.get_or_insert_with(|| SlotContents {
            parents: vec![None; slots],
            tokens: vec![0; slots * block_size],
        });
    }

    /// Blocks cached since the last call, oldest first (empty unless [`KvCache::log_stored`]).
    pub fn take_stored(&mut self) -> Vec<StoredBlock> {
        self.stored.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether events are waiting for [`KvCache::take_events`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Events since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// Take the least recently used free block for a reservation, evicting what it caches.
    fn take_free(&mut self) -> u32 {
        let id = self
            .evict_lru()
            .expect("reservations never exceed the free list");
        self.reserved -= 1;
        self.blocks[id as usize].refs = 1;
        id
    }

    /// The block eviction takes next: the free list's front, retained blocks only after it.
    fn next_victim(&self) -> Option<u32> {
        [self.free.head, self.retained.head]
            .into_iter()
            .find(|&id| id != NIL)
    }

    /// Start bringing the table slots of the next `count` victims into cache
    /// ([`U64Map::prefetch`]), so that evicting them overlaps their misses.
    fn prefetch_victims(&self, count: usize) {
        let mut left = count;
        for head in [self.free.head, self.retained.head] {
            let mut id = head;
            while id != NIL && left > 0 {
                let block = &self.blocks[id as usize];
                if let Some(hash) = block.hash {
                    self.cached.prefetch(hash);
                }
                id = block.next;
                left -= 1;
            }
        }
    }

    /// Take the next victim off its free list and un-cache it (an event if it was cached).
    fn evict_lru(&mut self) -> Option<u32> {
        let id = self.next_victim()?;
        self.unlink_free(id);
        self.uncache(id);
        Some(id)
    }

    /// Forget what block `id` caches, with a removal event; it keeps its place and refs.
    fn uncache(&mut self, id: u32) {
        let block = &mut self.blocks[id as usize];
        block.mark = Mark::Plain;
        if let Some(hash) = block.hash.take() {
            self.cached.remove(hash);
            if self.publish {
                match self.events.last_mut() {
                    Some(CacheEvent::Removed { hashes, .. }) => hashes.push(hash),
                    _ => self.events.push(CacheEvent::Removed {
                        tier: Tier::Device,
                        hashes: vec![hash],
                    }),
                }
            }
        }
    }

    /// Where the block cached under `hash` stands.
    pub(crate) fn residency(&self, hash: u64) -> Residency {
        match self.cached.get(hash) {
            None => Residency::Absent,
            Some(&id) if self.blocks[id as usize].refs == 0 => Residency::Free,
            Some(_) => Residency::InUse,
        }
    }

    /// The cached block `hash` as write-through needs it: slot, parent and tokens (only with
    /// the stored log on).
    pub(crate) fn cached_block(&self, hash: u64) -> Option<StoredBlock> {
        let &slot = self.cached.get(hash)?;
        let contents = self.contents.as_ref()?;
        let start = slot as usize * self.block_size();
        Some(StoredBlock {
            hash,
            parent: contents.parents[slot as usize],
            slot,
            token_ids: contents.tokens[start..start + self.block_size()].to_vec(),
        })
    }

    /// Drop the device copy of an unreferenced cached block (a removal event): its slot is
    /// the first to be reused. `false` if it is not cached or is in use.
    pub(crate) fn drop_free(&mut self, hash: u64) -> bool {
        if self.residency(hash) != Residency::Free {
            return false;
        }
        let Some(&id) = self.cached.get(hash) else {
            return false;
        };
        self.unlink_free(id);
        self.uncache(id);
        self.free.push_front(&mut self.blocks, id);
        true
    }

    /// Have the cached block `hash` evicted before anything else once unreferenced.
    pub(crate) fn evict_first(&mut self, hash: u64) -> Residency {
        self.remark(hash, |_| Mark::EvictFirst)
    }

    /// Have the cached block `hash` evicted only after every unmarked free block.
    pub(crate) fn retain(&mut self, hash: u64) -> Residency {
        self.remark(hash, |_| Mark::Retained)
    }

    /// Make the cached block `hash` the most recently used of its kind (a prefetch wants it:
    /// that outranks an earlier evict-first mark, not a retain).
    pub(crate) fn touch(&mut self, hash: u64) -> Residency {
        self.remark(hash, |mark| match mark {
            Mark::EvictFirst => Mark::Plain,
            mark => mark,
        })
    }

    fn remark(&mut self, hash: u64, mark: impl FnOnce(Mark) -> Mark) -> Residency {
        let residency = self.residency(hash);
        let Some(&id) = self.cached.get(hash) else {
            return residency;
        };
        if residency == Residency::Free {
            self.unlink_free(id);
        }
        let block = &mut self.blocks[id as usize];
        block.mark = mark(block.mark);
        if residency == Residency::Free {
            self.push_free(id);
        }
        residency
    }

    /// Free blocks not promised to admitted sequences: what a load may take.
    pub(crate) fn spare_blocks(&self) -> usize {
        self.free_len() - self.reserved
    }

    /// Cache a block loaded from a lower tier, unreferenced and most recently used, in the
    /// slot of the eviction victim (a removal event for what it held, a store event for it).
    /// `None` without a spare block, or when the victim is one of `keep`.
    pub(crate) fn load(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        token_ids: &[u32],
        keep: &HashSet<u64>,
    ) -> Option<u32> {
        if self.cached.contains_key(hash) || self.spare_blocks() == 0 {
            return None;
        }
        let victim = self.next_victim()?;
        if self.blocks[victim as usize]
            .hash
            .is_some_and(|h| keep.contains(&h))
        {
            return None;
        }
        let id = self.evict_lru()?;
        self.blocks[id as usize].hash = Some(hash);
        self.cached.get_or_insert(hash, id);
        self.free.push_back(&mut self.blocks, id);
        if let Some(contents) = &mut self.contents {
            contents.record(id, parent, token_ids);
        }
        if let Some(stored) = &mut self.stored {
            stored.push(StoredBlock {
                hash,
                parent,
                slot: id,
                token_ids: token_ids.to_vec(),
            });
        }
        if self.publish {
            // Consecutive blocks of one prefix go out as one event.
            match self.events.last_mut() {
                Some(CacheEvent::Stored {
                    tier: Tier::Device,
                    hashes,
                    token_ids: tokens,
                    ..
                }) if parent.is_some() && hashes.last() == parent.as_ref() => {
                    hashes.push(hash);
                    tokens.extend_from_slice(token_ids);
                }
                _ => self.events.push(CacheEvent::Stored {
                    tier: Tier::Device,
                    hashes: vec![hash],
                    parent,
                    token_ids: token_ids.to_vec(),
                }),
            }
        }
        Some(id)
    }

    /// Hold a reference on the cached block `hash` (a pin): eviction skips it until the table
    /// is released. `None` if it is not cached, or is free and every free block is promised.
    pub(crate) fn hold(&mut self, hash: u64) -> Option<BlockTable> {
        if !self.cached.contains_key(hash) {
            return None;
        }
        self.allocate(&[hash], 1)
    }

    /// Emit `Stored` for the table's blocks `range`, if any.
    fn store_run(&mut self, table: &BlockTable, tokens: &[u32], range: std::ops::Range<usize>) {
        if range.is_empty() || !self.publish {
            return;
        }
        let block_size = self.block_size();
        self.events.push(CacheEvent::Stored {
            tier: Tier::Device,
            parent: range.start.checked_sub(1).map(|i| table.hashes[i]),
            token_ids: tokens[range.start * block_size..range.end * block_size].to_vec(),
            hashes: table.hashes[range].to_vec(),
        });
    }
}

// === impl SlotContents ===

impl SlotContents {
    fn record(&mut self, slot: u32, parent: Option<u64>, tokens: &[u32]) {
        let start = slot as usize * tokens.len();
        self.parents[slot as usize] = parent;
        self.tokens[start..start + tokens.len()].copy_from_slice(tokens);
    }
}

#[cfg(test)]
mod tests;
