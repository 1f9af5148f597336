//! The engine's paged KV cache with prefix reuse, shaped like vLLM's block pool.
//!
//! A fixed number of physical blocks of `block_size` tokens. A block that holds a full block of
//! computed tokens is *cached* under its engine sequence hash and can be reused by any request whose
//! prompt starts with the same tokens. Blocks referenced by running sequences are refcounted; a
//! block nobody references sits on the free list, in LRU order, keeping its contents until a new
//! block is needed and it is the least recently used one.
//!
//! Hashes are the engine's own: [`ENGINE_SEED`] differs from the router's seed, exactly as a real
//! engine's hashes differ from the gateway's, so consumers of the events must re-hash `token_ids`.

use crate::hash::{BlockHasher, SequenceHash};
use crate::worker::Tier;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

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

#[derive(Debug, Clone)]
struct Block {
    /// Set while the block is cached (full, computed, and the only block with this hash).
    hash: Option<u64>,
    refs: u32,
    prev: u32,
    next: u32,
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

    fn pop_front(&mut self, blocks: &mut [Block]) -> Option<u32> {
        let id = self.head;
        (id != NIL).then(|| {
            self.unlink(blocks, id);
            id
        })
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
    cached: HashMap<u64, u32>,
    /// Blocks promised to admitted sequences, not yet taken; never more than the free list holds.
    reserved: usize,
    events: Vec<CacheEvent>,
    /// Blocks cached since the last [`KvCache::take_stored`], kept only once
    /// [`KvCache::log_stored`] turned it on (the engine's lower tiers write them through).
    stored: Option<Vec<StoredBlock>>,
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
        assert!(num_blocks < NIL as usize, "too many KV blocks");
        let mut cache = Self {
            hasher: BlockHasher::with_seed(block_size, ENGINE_SEED),
            blocks: Vec::with_capacity(num_blocks),
            free: FreeList {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            cached: HashMap::new(),
            reserved: 0,
            events: Vec::new(),
            stored: None,
        };
        for id in 0..num_blocks as u32 {
            cache.blocks.push(Block {
                hash: None,
                refs: 0,
                prev: NIL,
                next: NIL,
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
        self.blocks.len() - self.free.len
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
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Hashes of every cached block, in no particular order.
    pub fn cached_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.cached.keys().copied()
    }

    /// Admit a sequence that needs `total_blocks` blocks over its life: reuse the cached leading
    /// blocks of `prefix` and reserve the rest. `None` (and no change) if they do not fit.
    pub fn allocate(&mut self, prefix: &[u64], total_blocks: usize) -> Option<BlockTable> {
        let hits: Vec<u32> = prefix
            .iter()
            .map_while(|h| self.cached.get(h).copied())
            .take(total_blocks)
            .collect();
        let fresh = total_blocks - hits.len();
        // A hit on an unreferenced block takes it off the free list as well.
        let free_hits = hits
            .iter()
            .filter(|&&id| self.blocks[id as usize].refs == 0)
            .count();
        if self.free.len < self.reserved + free_hits + fresh {
            return None;
        }
        for &id in &hits {
            if self.blocks[id as usize].refs == 0 {
                self.free.unlink(&mut self.blocks, id);
            }
            self.blocks[id as usize].refs += 1;
        }
        self.reserved += fresh;
        Some(BlockTable {
            hashes: prefix[..hits.len()].to_vec(),
            blocks: hits,
            reserved: fresh,
        })
    }

    /// Record that the KV of `tokens` (the sequence's whole computed prefix) is written: take the
    /// blocks it now spans and cache the blocks that became full.
    ///
    /// # Panics
    /// If `tokens` needs more blocks than [`KvCache::allocate`] reserved for the table.
    pub fn write(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let block_size = self.block_size();
        while table.blocks.len() < tokens.len().div_ceil(block_size) {
            assert!(table.reserved > 0, "sequence wrote past its reservation");
            let id = self.take_free();
            table.reserved -= 1;
            table.blocks.push(id);
        }
        let first_new = table.hashes.len();
        let mut run_start = first_new;
        for (i, block) in tokens.chunks_exact(block_size).enumerate().skip(first_new) {
            let parent = table.hashes.last().map(|&h| SequenceHash(h));
            let hash = self.hasher.chain(parent, self.hasher.local(block)).0;
            table.hashes.push(hash);
            match self.cached.entry(hash) {
                Entry::Vacant(slot) => {
                    slot.insert(table.blocks[i]);
                    self.blocks[table.blocks[i] as usize].hash = Some(hash);
                    if let Some(stored) = &mut self.stored {
                        stored.push(StoredBlock {
                            hash,
                            parent: parent.map(|p| p.0),
                            slot: table.blocks[i],
                            token_ids: block.to_vec(),
                        });
                    }
                }
                // Another block already caches these tokens (two identical prompts prefilled at
                // once): this copy stays anonymous and is freed without an event.
                Entry::Occupied(_) => {
                    self.store_run(table, tokens, run_start..i);
                    run_start = i + 1;
                }
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
                if block.hash.is_some() {
                    self.free.push_back(&mut self.blocks, id);
                } else {
                    self.free.push_front(&mut self.blocks, id);
                }
            }
        }
    }

    /// Drop every cached block (vLLM's `reset_prefix_cache`). Refused (`false`) while any
    /// sequence holds blocks, as in vLLM.
    pub fn reset(&mut self) -> bool {
        if self.used_blocks() > 0 || self.reserved > 0 {
            return false;
        }
        for block in &mut self.blocks {
            block.hash = None;
        }
        self.cached.clear();
        self.events.push(CacheEvent::Cleared);
        true
    }

    /// Keep a log of the blocks cached from now on, for [`KvCache::take_stored`].
    pub fn log_stored(&mut self) {
        self.stored.get_or_insert_with(Vec::new);
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

    /// Take the least recently used free block, evicting what it caches.
    fn take_free(&mut self) -> u32 {
        let id = self
            .free
            .pop_front(&mut self.blocks)
            .expect("reservations never exceed the free list");
        self.reserved -= 1;
        let block = &mut self.blocks[id as usize];
        block.refs = 1;
        if let Some(hash) = block.hash.take() {
            self.cached.remove(&hash);
            match self.events.last_mut() {
                Some(CacheEvent::Removed { hashes, .. }) => hashes.push(hash),
                _ => self.events.push(CacheEvent::Removed {
                    tier: Tier::Device,
                    hashes: vec![hash],
                }),
            }
        }
        id
    }

    /// Emit `Stored` for the table's blocks `range`, if any.
    fn store_run(&mut self, table: &BlockTable, tokens: &[u32], range: std::ops::Range<usize>) {
        if range.is_empty() {
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

#[cfg(test)]
mod tests;
