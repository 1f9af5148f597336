//! The global KV block index: which rank holds which block, in which tier.
//!
//! One node per sequence hash. A sequence hash already names a block *with* its whole prefix, so
//! the radix tree's path is implicit in the hash chain: a lookup walks the request's chain from
//! the root and intersects owners as it goes. A node's value is a bit mask of its owners per tier,
//! so each rank's depth is where its bit drops out, whatever the number of ranks.
//!
//! Nodes live in a log in the order they were first stored, beside a [`flat::U64Map`] from hash to
//! log position. Engines store a request's blocks as one chain, so a chain sits contiguously in
//! the log: a lookup that follows it compares the next hash with the next log entry and reads the
//! owners from there, and probes the map only where the stored chain ended (a turn boundary, a
//! branch). A deep prefix of thousands of blocks is then a sequential read with a few dozen
//! probes instead of one cache-missing probe per block. Removing a block's last owner deletes
//! its node from the map and leaves a dead entry in the log, which is compacted once dead entries
//! outnumber live ones, so memory stays bounded by the blocks the engines hold.
//!
//! A caller that holds a prompt's local hashes only (Dynamo's `find_matches` protocol) would
//! have to chain every sequence hash to walk. Stores that come with their local hashes link each
//! log entry to the one before it when that is its parent, so [`KvIndex::find_matches_locals_into`]
//! compares local hashes along those links and chains only where it leaves them.
//!
//! The log is stored column by column (hashes, device owners, host and disk owners, links), so a
//! walk reads only what it compares: where the prompt follows a stored chain and no rank still
//! matching drops out, it passes the entries a chunk at a time, comparing the prompt's hashes (or
//! local hashes) with one column and the owners with another ([`KvIndex::find_matches_into`],
//! the router's lookup).
//! `docs/benchmarks.md` section (a2) has the measurements behind this layout.
//!
//! The index is a plain value: `apply` takes `&mut self`. Concurrency (readers that never wait behind
//! event application) is the driver's business; the gateway keeps two copies with `left-right`.

use crate::hash::{BlockHasher, LocalBlockHash, SequenceHash};
use crate::worker::{Rank, Tier, WorkerId};
use flat::U64Map;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

pub mod flat;

/// A change to the index, already translated into our own hash space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexOp {
    /// `rank` now holds `blocks` (a chain, or any set of sequence hashes) in `tier`.
    Store {
        /// Owner.
        rank: Rank,
        /// Where.
        tier: Tier,
        /// Sequence hashes of the stored blocks.
        blocks: Vec<SequenceHash>,
        /// The blocks' local hashes when they are one chain (each block's parent is the one
        /// before it), so that lookups by local hash can follow them
        /// ([`KvIndex::find_matches_locals_into`]); empty when not known.
        locals: Vec<LocalBlockHash>,
    },
    /// `rank` dropped `blocks` from `tier`.
    Remove {
        /// Owner.
        rank: Rank,
        /// Where.
        tier: Tier,
        /// Sequence hashes of the removed blocks.
        blocks: Vec<SequenceHash>,
    },
    /// `rank` dropped everything (engine restart, `AllBlocksCleared`, lost events, worker removed).
    Clear {
        /// Owner.
        rank: Rank,
    },
}

impl IndexOp {
    /// Blocks this op touches (1 for a clear), the unit of the index benchmark.
    pub fn block_count(&self) -> usize {
        match self {
            IndexOp::Store { blocks, .. } | IndexOp::Remove { blocks, .. } => blocks.len(),
            IndexOp::Clear { .. } => 1,
        }
    }

    /// The blocks this op stores on a device, with their rank: what ends prefill loads
    /// ([`Router::blocks_stored`](crate::router::Router::blocks_stored)).
    pub fn device_stores(&self) -> impl Iterator<Item = (Rank, SequenceHash)> + '_ {
        let stored = match self {
            IndexOp::Store {
                rank,
                tier: Tier::Device,
                blocks,
                ..
            } => Some((*rank, blocks)),
            _ => None,
        };
        (stored.into_iter()).flat_map(|(rank, blocks)| blocks.iter().map(move |&b| (rank, b)))
    }
}

/// The shared KV pool (G4), indexed as one more owner: its event stream goes through the same
/// ingestion as an engine's, and a lookup reports its prefix run like a rank's. The router never
/// routes to it (no worker has this id: the gateway numbers workers from 0 and never reuses one).
pub const SHARED_POOL: Rank = Rank {
    worker: WorkerId(u32::MAX),
    dp_rank: u32::MAX,
};

/// How much of a request's prefix one rank holds, split by tier.
///
/// `device` counts the prefix blocks resident on the device; `host` the blocks *beyond* that which
/// are reachable in host memory; `disk` those beyond both. The three never double-count a block, so
/// `total()` is the prefix reachable without recompute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Prefix blocks on the device.
    pub device: u32,
    /// Further prefix blocks in host memory.
    pub host: u32,
    /// Further prefix blocks on disk.
    pub disk: u32,
}

impl Overlap {
    /// Prefix blocks reachable in any tier.
    pub fn total(&self) -> u32 {
        self.device + self.host + self.disk
    }

    /// Combine two views of one rank (e.g. indexed and predicted blocks): the longer prefix wins
    /// in each cumulative tier.
    pub fn max(self, other: Overlap) -> Overlap {
        let device = self.device.max(other.device);
        let hot = (self.device + self.host)
            .max(other.device + other.host)
            .max(device);
        let any = self.total().max(other.total()).max(hot);
        Overlap {
            device,
            host: hot - device,
            disk: any - hot,
        }
    }
}

/// Per-rank result of a lookup: only ranks that hold at least the first block appear.
pub type Matches = Vec<(Rank, Overlap)>;

/// Ranks per group: one bit each in a node's owner mask.
const GROUP: usize = 64;

/// Blocks whose map slots, then log entries, an event touches before working on any of them
/// (their cache misses overlap).
const PROBE_BATCH: usize = 8;

/// Dead log entries a group tolerates before it compacts (when they also outnumber live ones);
/// small under test so that the property tests compact.
const COMPACT_MIN: usize = if cfg!(test) { 4 } else { 4_096 };

/// How far ahead of its compares a walk along a long run asks for the log's entries and the
/// prompt's (16 cache lines of each column): deep prefixes are read cold from memory, and the
/// CPU's own prefetchers start too late on each page to keep up. Measured on Dynamo's stream
/// (docs/benchmarks.md (a2)); 8 and 32 lines did worse.
const AHEAD: usize = 128;

/// A `links` entry that links nothing. A chain's real local hash 0 is stored as not linked too:
/// the walk then chains that block's hash and asks the map, which gives the same answer.
const NO_LINK: u64 = 0;

/// Owners of log entry `at` (`device`, with `lower` beside it or empty) as cumulative masks: on
/// device, on device or host, anywhere.
#[inline]
fn cumulative(device: &[u64], lower: &[[u64; 2]], at: usize) -> [u64; 3] {
    let device = device[at];
    match lower.get(at) {
        Some(&[host, disk]) => [device, device | host, device | host | disk],
        None => [device; 3],
    }
}

/// The nodes of one group of up to 64 ranks.
#[derive(Debug, Clone, Default)]
struct Group {
    /// Sequence hash -> position of its live node in the log.
    nodes: U64Map<u32>,
    /// The log, nodes in the order they were first stored (see the module docs), one column per
    /// field so that a walk reads only what it compares: each node's sequence hash,
    hashes: Vec<u64>,
    /// the owner bits of the group's ranks (`slot % GROUP`) holding it on the device,
    device: Vec<u64>,
    /// their host and disk owner bits once the group has stored any block in those tiers; empty
    /// until then (an index of device blocks only reads half the bytes),
    lower: Vec<[u64; 2]>,
    /// once any store came with local hashes, its local hash when its parent is the entry before
    /// it (they were stored as one chain), else [`NO_LINK`]; for lookups by local hash.
    links: Vec<u64>,
    /// Entries of the log that are dead: no owner in any tier, no longer in `nodes`.
    dead: usize,
}

impl Group {
    /// Position of `hash`'s live node.
    #[inline]
    fn find(&self, hash: u64) -> Option<usize> {
        self.nodes.get(hash).map(|&at| at as usize)
    }

    /// Position of `hash`'s node, which is appended to the log if it has none: with `local`,
    /// its local hash, and with `parent`, where its parent is (it follows if that is the entry
    /// before it).
    #[inline]
    fn find_or_append(&mut self, hash: u64, local: Option<u64>, parent: Option<usize>) -> usize {
        let end = self.hashes.len();
        let at = *self.nodes.get_or_insert(hash, end as u32) as usize;
        if at == end {
            self.hashes.push(hash);
            self.device.push(0);
            if !self.lower.is_empty() {
                self.lower.push([0; 2]);
            }
            if local.is_some() && self.links.is_empty() {
                self.links = vec![NO_LINK; end];
            }
            if !self.links.is_empty() {
                let follows = end > 0 && parent == Some(end - 1);
                self.links
                    .push(local.filter(|_| follows).unwrap_or(NO_LINK));
            }
        }
        at
    }

    /// Start bringing node `at`'s owners into cache (see [`flat::prefetch`]).
    #[inline]
    fn prefetch(&self, at: usize) {
        flat::prefetch(&self.device[at]);
    }

    /// The owner bits of node `at` in `tier`.
    #[inline]
    fn owners_mut(&mut self, at: usize, tier: usize) -> &mut u64 {
        if tier == 0 {
            return &mut self.device[at];
        }
        if self.lower.is_empty() {
            self.lower = vec![[0; 2]; self.device.len()];
        }
        &mut self.lower[at][tier - 1]
    }

    /// Owners of node `at` as cumulative masks: on device, on device or host, anywhere.
    #[inline]
    fn cumulative(&self, at: usize) -> [u64; 3] {
        cumulative(&self.device, &self.lower, at)
    }

    /// Owners of node `at` as the first `TIERS` cumulative masks (1: the device only, for a group
    /// without host or disk blocks).
    #[inline]
    fn owners<const TIERS: usize>(&self, at: usize) -> [u64; TIERS] {
        let all = match TIERS {
            1 => [self.device[at]; 3],
            _ => self.cumulative(at),
        };
        std::array::from_fn(|tier| all[tier])
    }

    /// Whether node `at` has an owner.
    #[inline]
    fn alive(&self, at: usize) -> bool {
        self.device[at] != 0
            || self
                .lower
                .get(at)
                .is_some_and(|&[host, disk]| host | disk != 0)
    }

    /// Where a lookup at log position `at` goes for `hash`, the next block of its chain: the next
    /// entry if that is the block's live node (a dead entry's block may have been stored again
    /// further on), else wherever the map says.
    #[inline]
    fn next(&self, at: usize, hash: u64) -> Option<usize> {
        self.next_entry(at, hash).or_else(|| self.find(hash))
    }

    /// `at + 1` if the log's next entry is `hash`'s live node.
    #[inline]
    fn next_entry(&self, at: usize, hash: u64) -> Option<usize> {
        let next = self.hashes.get(at + 1)?;
        (*next == hash && self.alive(at + 1)).then_some(at + 1)
    }

    /// Set `bit` in `tier` of each of `hashes`' nodes, appending those it lacks. How many bits
    /// were clear.
    ///
    /// Blocks the log already holds in the op's order (another rank's copy of a chain, a lower
    /// tier's copy of this one) are found by following the log from the previous block, without
    /// a probe; the rest go in batches whose map slots, then log entries, are touched before any
    /// is used.
    fn store(
        &mut self,
        hashes: &[SequenceHash],
        locals: &[LocalBlockHash],
        tier: usize,
        bit: u64,
    ) -> u64 {
        // Only a chain's local hashes say where a block hangs (see `IndexOp::Store`).
        let local = |i: usize| (locals.len() == hashes.len()).then(|| locals[i].0);
        let mut added = 0;
        let mut rest = hashes;
        let mut last = None;
        let mut prefetched = 0;
        while !rest.is_empty() {
            if let Some(mut at) = last {
                let mut followed = 0;
                for hash in rest {
                    match self.next_entry(at, hash.0) {
                        Some(next) => at = next,
                        None => break,
                    }
                    added += u64::from(self.set(at, tier, bit));
                    followed += 1;
                }
                last = Some(at);
                rest = &rest[followed..];
                if rest.is_empty() {
                    break;
                }
            }
            let batch = &rest[..rest.len().min(PROBE_BATCH)];
            let first = hashes.len() - rest.len();
            let mut at = [0; PROBE_BATCH];
            // This batch's slots and the next one's: each batch's misses overlap the previous
            // batch's work.
            let ahead = hashes.len().min(first + 2 * PROBE_BATCH);
            for hash in &hashes[prefetched.max(first)..ahead] {
                self.nodes.prefetch(hash.0);
            }
            prefetched = ahead;
            for (j, hash) in batch.iter().enumerate() {
                let parent = if j == 0 { last } else { Some(at[j - 1]) };
                at[j] = self.find_or_append(hash.0, local(first + j), parent);
                self.prefetch(at[j]);
            }
            for &at in &at[..batch.len()] {
                added += u64::from(self.set(at, tier, bit));
            }
            last = Some(at[batch.len() - 1]);
            rest = &rest[batch.len()..];
        }
        added
    }

    /// Set `bit` in `tier` of node `at`; whether it was clear.
    #[inline]
    fn set(&mut self, at: usize, tier: usize, bit: u64) -> bool {
        let owners = self.owners_mut(at, tier);
        let added = *owners & bit == 0;
        *owners |= bit;
        added
    }

    /// Clear `bit` in `tier` of each of `hashes`' nodes (in batches, as [`store`](Self::store));
    /// a node leaves the map with its last owner. How many bits were set.
    fn remove(&mut self, hashes: &[SequenceHash], tier: usize, bit: u64) -> u64 {
        if tier > 0 && self.lower.is_empty() {
            return 0; // no block is held in that tier
        }
        let mut batches = hashes.chunks(PROBE_BATCH).peekable();
        for hash in batches.peek().copied().unwrap_or_default() {
            self.nodes.prefetch(hash.0);
        }
        let mut removed = 0;
        while let Some(batch) = batches.next() {
            // The next batch's misses overlap this one's work.
            for hash in batches.peek().copied().unwrap_or_default() {
                self.nodes.prefetch(hash.0);
            }
            removed += self.remove_batch(batch, tier, bit);
        }
        removed
    }

    /// [`remove`](Self::remove) of one batch whose map slots are on their way.
    fn remove_batch(&mut self, hashes: &[SequenceHash], tier: usize, bit: u64) -> u64 {
        let mut at = [None; PROBE_BATCH];
        for (at, hash) in at.iter_mut().zip(hashes) {
            *at = self.find(hash.0);
            at.inspect(|&at| self.prefetch(at));
        }
        let mut removed = 0;
        for (at, hash) in at.into_iter().zip(hashes) {
            let Some(at) = at else {
                continue;
            };
            let owners = self.owners_mut(at, tier);
            removed += u64::from(*owners & bit != 0);
            *owners &= !bit;
            if !self.alive(at) {
                self.nodes.remove(hash.0);
                self.dead += 1;
            }
        }
        removed
    }

    /// Clear `bit` everywhere; nodes left without owners leave the map.
    fn clear(&mut self, bit: u64) {
        for owners in self.lower.iter_mut().flatten() {
            *owners &= !bit;
        }
        for owners in &mut self.device {
            *owners &= !bit;
        }
        let live = self.nodes.len();
        let (device, lower) = (&self.device, &self.lower);
        self.nodes
            .retain(|_, &mut at| cumulative(device, lower, at as usize)[2] != 0);
        self.dead += live - self.nodes.len();
    }

    /// Drop the dead entries once they outnumber the live ones, keeping the log's order (and so
    /// its chains).
    fn compact_if_sparse(&mut self) {
        if self.dead < COMPACT_MIN || self.dead < self.nodes.len() {
            return;
        }
        // Move the live entries down, then renumber the map in one pass over its table (no
        // probes): `moved[i]` is where entry `i` went.
        let mut moved = vec![0u32; self.hashes.len()];
        let mut kept = 0;
        let mut previous_kept = false;
        for (i, moved) in moved.iter_mut().enumerate() {
            if !self.alive(i) {
                previous_kept = false;
                continue;
            }
            *moved = kept as u32;
            self.hashes[kept] = self.hashes[i];
            self.device[kept] = self.device[i];
            if !self.lower.is_empty() {
                self.lower[kept] = self.lower[i];
            }
            if !self.links.is_empty() {
                // A block still follows the entry before it only if that entry was its parent.
                self.links[kept] = if previous_kept {
                    self.links[i]
                } else {
                    NO_LINK
                };
            }
            previous_kept = true;
            kept += 1;
        }
        for at in self.nodes.values_mut() {
            *at = moved[*at as usize];
        }
        for column in [&mut self.hashes, &mut self.device] {
            column.truncate(kept);
            column.shrink_to(kept * 2);
        }
        if !self.lower.is_empty() {
            self.lower.truncate(kept);
            self.lower.shrink_to(kept * 2);
        }
        if !self.links.is_empty() {
            self.links.truncate(kept);
            self.links.shrink_to(kept * 2);
        }
        self.dead = 0;
    }

    fn heap_bytes(&self) -> usize {
        self.nodes.heap_bytes()
            + (self.hashes.capacity() + self.device.capacity()) * std::mem::size_of::<u64>()
            + self.lower.capacity() * std::mem::size_of::<[u64; 2]>()
            + self.links.capacity() * std::mem::size_of::<u64>()
    }
}

#[derive(Debug, Clone)]
struct RankEntry {
    rank: Rank,
    /// Blocks held per tier, indexed by `Tier as usize`.
    blocks: [u64; 3],
}

/// A name for what a rank holds in one index: the index, and its change that last touched the
/// rank ([`KvIndex::rank_stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankStamp {
    index: u64,
    change: u64,
}

/// An index's own number, drawn once in the process: a new index and every copy get their own,
/// so two indexes' stamps never compare equal.
#[derive(Debug)]
struct IndexId(u64);

static INDEX_IDS: AtomicU64 = AtomicU64::new(0);

impl Default for IndexId {
    fn default() -> Self {
        Self(INDEX_IDS.fetch_add(1, Ordering::Relaxed))
    }
}

impl Clone for IndexId {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// All ranks' blocks.
///
/// One node per sequence hash, whose value is a bit mask per tier of the ranks holding it (ranks
/// come in groups of 64, one log and map per group). A store or a removal is one probe per block;
/// a lookup reads the nodes of a stored chain in order and probes only where it left off, and
/// tracks every rank's depth with mask operations.
#[derive(Debug, Clone, Default)]
pub struct KvIndex {
    groups: Vec<Group>,
    ranks: Vec<RankEntry>,
    /// Per rank (as `ranks`), the number of the last change to what it holds
    /// ([`KvIndex::rank_stamp`]); apart from `ranks`, which lookups read.
    stamps: Vec<u64>,
    /// Changes applied so far.
    changes: u64,
    id: IndexId,
    slots: FxHashMap<Rank, u32>,
}

// === impl KvIndex ===

impl KvIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one change.
    pub fn apply(&mut self, op: &IndexOp) {
        match op {
            IndexOp::Store {
                rank,
                tier,
                blocks,
                locals,
            } => {
                let slot = self.slot(*rank) as usize;
                let bit = 1u64 << (slot % GROUP);
                let (group, tier) = (&mut self.groups[slot / GROUP], *tier as usize);
                self.ranks[slot].blocks[tier] += group.store(blocks, locals, tier, bit);
                self.stamps[slot] = self.next_change();
            }
            IndexOp::Remove { rank, tier, blocks } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                let slot = slot as usize;
                let bit = 1u64 << (slot % GROUP);
                let (group, tier) = (&mut self.groups[slot / GROUP], *tier as usize);
                let removed = group.remove(blocks, tier, bit);
                group.compact_if_sparse();
                self.ranks[slot].blocks[tier] -= removed;
                self.stamps[slot] = self.next_change();
            }
            IndexOp::Clear { rank } => {
                let Some(&slot) = self.slots.get(rank) else {
                    return;
                };
                let slot = slot as usize;
                if self.ranks[slot].blocks == [0; 3] {
                    return;
                }
                let bit = 1u64 << (slot % GROUP);
                let group = &mut self.groups[slot / GROUP];
                group.clear(bit);
                group.compact_if_sparse();
                self.ranks[slot].blocks = [0; 3];
                self.stamps[slot] = self.next_change();
            }
        }
    }

    /// How far each rank holds the prefix named by `hashes` (a request's sequence hashes).
    pub fn find_matches(&self, hashes: &[SequenceHash]) -> Matches {
        let mut matches = Matches::new();
        self.find_matches_into(hashes, &mut matches);
        matches
    }

    /// [`find_matches`](Self::find_matches) into a caller's buffer (cleared first), so a decision
    /// path that keeps one buffer allocates nothing here: the router's lookup. A walk along a
    /// chain stored in order compares the hashes a chunk at a time, reading only the log's hash
    /// and owner columns.
    pub fn find_matches_into(&self, hashes: &[SequenceHash], matches: &mut Matches) {
        matches.clear();
        let Some((first, rest)) = hashes.split_first() else {
            return;
        };
        for (g, group) in self.groups.iter().enumerate() {
            self.match_group(g, group, group.find(first.0), Slice(rest), matches);
        }
    }

    /// How far each rank holds the prefix whose blocks' local hashes are `locals`, as
    /// [`find_matches`](Self::find_matches) answers for their sequence hashes under
    /// `hasher`; but along a chain stored with its local hashes ([`IndexOp::Store`]) the walk
    /// compares those, and chains a sequence hash only where it leaves one. This is the lookup
    /// for callers that hold local hashes only (Dynamo's `find_matches` protocol).
    pub fn find_matches_locals_into(
        &self,
        locals: &[LocalBlockHash],
        hasher: &BlockHasher,
        matches: &mut Matches,
    ) {
        matches.clear();
        let Some(&first) = locals.first() else {
            return;
        };
        let first = hasher.chain(None, first).0;
        for (g, group) in self.groups.iter().enumerate() {
            let rest = Locals {
                rest: &locals[1..],
                hasher,
            };
            self.match_group(g, group, group.find(first), rest, matches);
        }
    }

    /// The walk of one group from node `first` (the prompt's first block) along the rest of
    /// `prompt`.
    fn match_group(
        &self,
        g: usize,
        group: &Group,
        first: Option<usize>,
        prompt: impl Prompt,
        out: &mut Matches,
    ) {
        let Some(first) = first else {
            return;
        };
        // A group without host or disk blocks tracks one mask instead of three.
        if group.lower.is_empty() {
            self.walk::<1>(g, group, first, prompt, out);
        } else {
            self.walk::<3>(g, group, first, prompt, out);
        }
    }

    /// [`match_group`](Self::match_group) over `TIERS` cumulative masks (1: device only) of the
    /// ranks still matching on device / device or host / anywhere; a rank's depth is where it
    /// drops out.
    #[inline]
    fn walk<const TIERS: usize>(
        &self,
        g: usize,
        group: &Group,
        mut at: usize,
        mut prompt: impl Prompt,
        out: &mut Matches,
    ) {
        let owners = |at: usize| group.owners::<TIERS>(at);
        let mut live = owners(at);
        let holders = live[TIERS - 1];
        let mut depth = [[0u32; GROUP]; TIERS];
        let mut walked = 1u32;
        loop {
            let passed = prompt.run(group, at, &live);
            at += passed;
            walked += passed as u32;
            let Some(next) = prompt.step(group, at) else {
                break;
            };
            at = next;
            let here = owners(at);
            for tier in 0..TIERS {
                let mut dropped = live[tier] & !here[tier];
                while dropped != 0 {
                    depth[tier][dropped.trailing_zeros() as usize] = walked;
                    dropped &= dropped - 1;
                }
                live[tier] &= here[tier];
            }
            if live[TIERS - 1] == 0 {
                break;
            }
            walked += 1;
        }
        for (tier, mut rest) in live.into_iter().enumerate() {
            while rest != 0 {
                depth[tier][rest.trailing_zeros() as usize] = walked;
                rest &= rest - 1;
            }
        }
        let mut bits = holders;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let depth = |tier: usize| depth[tier.min(TIERS - 1)][b];
            let (device, hot, any) = (depth(0), depth(1), depth(2));
            let overlap = Overlap {
                device,
                host: hot - device,
                disk: any - hot,
            };
            out.push((self.ranks[g * GROUP + b].rank, overlap));
        }
    }

    /// A name for what `rank` holds now: this index and its last change to the rank. Equal
    /// stamps mean equal holdings, so an answer about this rank alone (its part of
    /// [`find_matches`]) can be kept until the stamp moves. Every index, copies included
    /// (left-right's two), stamps apart from the others.
    ///
    /// [`find_matches`]: Self::find_matches
    pub fn rank_stamp(&self, rank: Rank) -> RankStamp {
        RankStamp {
            index: self.id.0,
            change: self
                .slots
                .get(&rank)
                .map_or(0, |&slot| self.stamps[slot as usize]),
        }
    }

    fn next_change(&mut self) -> u64 {
        self.changes += 1;
        self.changes
    }

    /// Blocks `rank` holds in `tier`.
    pub fn blocks(&self, rank: Rank, tier: Tier) -> u64 {
        self.slots
            .get(&rank)
            .map_or(0, |&slot| self.ranks[slot as usize].blocks[tier as usize])
    }

    /// Blocks `rank` holds in any tier (counting a block once per tier).
    pub fn total_blocks(&self, rank: Rank) -> u64 {
        Tier::ALL.iter().map(|&t| self.blocks(rank, t)).sum()
    }

    /// Distinct blocks (nodes) in the index. With one group this is its map's length; otherwise
    /// it counts a union, for tests and reports rather than the request path.
    pub fn node_count(&self) -> usize {
        match self.groups.as_slice() {
            [] => 0,
            [only] => only.nodes.len(),
            groups => {
                let mut distinct = U64Map::<()>::new();
                for group in groups {
                    for key in group.nodes.keys() {
                        distinct.get_or_insert(key, ());
                    }
                }
                distinct.len()
            }
        }
    }

    /// Heap bytes of the index's tables (every group's map and log), for reports.
    pub fn heap_bytes(&self) -> usize {
        self.groups.iter().map(Group::heap_bytes).sum()
    }

    /// Whether `rank` holds `hash` in `tier`.
    pub fn contains(&self, rank: Rank, tier: Tier, hash: SequenceHash) -> bool {
        let Some(&slot) = self.slots.get(&rank) else {
            return false;
        };
        let group = &self.groups[slot as usize / GROUP];
        let (bit, tier) = (1u64 << (slot as usize % GROUP), tier as usize);
        group.find(hash.0).is_some_and(|at| match tier {
            0 => group.device[at] & bit != 0,
            _ => group.lower.get(at).is_some_and(|l| l[tier - 1] & bit != 0),
        })
    }

    fn slot(&mut self, rank: Rank) -> u32 {
        if let Some(&slot) = self.slots.get(&rank) {
            return slot;
        }
        let slot = self.ranks.len();
        self.ranks.push(RankEntry {
            rank,
            blocks: [0; 3],
        });
        self.stamps.push(0);
        if slot / GROUP == self.groups.len() {
            self.groups.push(Group::default());
        }
        self.slots.insert(rank, slot as u32);
        slot as u32
    }
}

/// The rest of a prompt, as a walk through one group's log follows it.
trait Prompt {
    /// The node of the prompt's next block, the one after node `at`'s; `None` where the prompt
    /// ends or no rank holds that block.
    fn step(&mut self, group: &Group, at: usize) -> Option<usize>;

    /// How many of the prompt's next blocks are the log entries right after `at`, none of which
    /// any rank still matching (`live`, the walk's cumulative masks) drops out at: the walk
    /// passes them without tracking owners, and they are consumed. 0 where the prompt cannot
    /// tell cheaply.
    fn run<const TIERS: usize>(
        &mut self,
        _group: &Group,
        _at: usize,
        _live: &[u64; TIERS],
    ) -> usize {
        0
    }
}

/// A prompt as local hashes ([`KvIndex::find_matches_locals_into`]).
struct Locals<'a> {
    rest: &'a [LocalBlockHash],
    hasher: &'a BlockHasher,
}

impl Prompt for Locals<'_> {
    #[inline]
    fn step(&mut self, group: &Group, at: usize) -> Option<usize> {
        let (&local, rest) = self.rest.split_first()?;
        self.rest = rest;
        match group.links.get(at + 1) {
            Some(&linked) if linked == local.0 && linked != NO_LINK && group.alive(at + 1) => {
                Some(at + 1)
            }
            _ => {
                let parent = Some(SequenceHash(group.hashes[at]));
                group.next(at, self.hasher.chain(parent, local).0)
            }
        }
    }

    #[inline]
    fn run<const TIERS: usize>(&mut self, group: &Group, at: usize, live: &[u64; TIERS]) -> usize {
        let Some(links) = group.links.get(at + 1..) else {
            return 0;
        };
        let passed = run_length::<TIERS, true, _>(group, at, live, links, self.rest, |h| h.0);
        self.rest = &self.rest[passed..];
        passed
    }
}

/// A prompt as sequence hashes at hand ([`KvIndex::find_matches_into`]): along a chain
/// stored in order, the walk compares them with the log's hashes a chunk at a time.
struct Slice<'a>(&'a [SequenceHash]);

impl Prompt for Slice<'_> {
    #[inline]
    fn step(&mut self, group: &Group, at: usize) -> Option<usize> {
        let (&hash, rest) = self.0.split_first()?;
        self.0 = rest;
        group.next(at, hash.0)
    }

    #[inline]
    fn run<const TIERS: usize>(&mut self, group: &Group, at: usize, live: &[u64; TIERS]) -> usize {
        let Some(hashes) = group.hashes.get(at + 1..) else {
            return 0;
        };
        let passed = run_length::<TIERS, false, _>(group, at, live, hashes, self.0, |h| h.0);
        self.0 = &self.0[passed..];
        passed
    }
}

/// Entries a long run is checked by at once.
const CHUNK: usize = 8;

/// The `CHUNK` entries of `column` from `at` (the caller knows they exist).
#[inline(always)]
fn chunk<T>(column: &[T], at: usize) -> &[T; CHUNK] {
    column[at..at + CHUNK]
        .try_into()
        .expect("a chunk's range is CHUNK long")
}

/// How many of the log entries after `at` are the prompt's next blocks and held, in each
/// cumulative tier, by every rank of `live` (whose widest mask is not empty, so such an entry is
/// alive). A block is the entry's when `log` (a column of the log from `at + 1`: the hashes, or
/// with `LINKS` the links, where [`NO_LINK`] matches nothing) equals its `value` in `prompt`.
///
/// Once a run is a chunk long, it goes on a chunk at a time, each column's chunk read as an
/// array: no branch or bounds check per entry, so the compares run in vector registers (lookups
/// along long runs ~15 % faster at p99 on Dynamo's stream, docs/benchmarks.md (a2)). It then
/// also asks for the entries [`AHEAD`] further on.
#[inline]
fn run_length<const TIERS: usize, const LINKS: bool, H: Copy>(
    group: &Group,
    at: usize,
    live: &[u64; TIERS],
    log: &[u64],
    prompt: &[H],
    value: impl Fn(H) -> u64,
) -> usize {
    let len = prompt
        .len()
        .min(log.len())
        .min(group.device.len() - (at + 1));
    let matches = |log: u64, block: H| (log == value(block)) & (!LINKS | (log != NO_LINK));
    let same = |j: usize| matches(log[j], prompt[j]);
    let same_chunk = |j: usize| {
        let (log, prompt) = (chunk(log, j), chunk(prompt, j));
        (0..CHUNK).fold(true, |all, k| all & matches(log[k], prompt[k]))
    };
    let held = |j: usize| {
        let here = group.owners::<TIERS>(at + 1 + j);
        (0..TIERS).fold(same(j), |all, t| all & (live[t] & !here[t] == 0))
    };
    let chunk_held = |j: usize| {
        let held = match TIERS {
            // A device-only group's owners are one column: its chunk is an array too.
            1 => {
                let device = chunk(&group.device, at + 1 + j);
                (0..CHUNK).fold(true, |all, k| all & (live[0] & !device[k] == 0))
            }
            _ => (0..CHUNK).fold(true, |all, k| {
                let here = group.owners::<TIERS>(at + 1 + j + k);
                (0..TIERS).fold(all, |all, t| all & (live[t] & !here[t] == 0))
            }),
        };
        held & same_chunk(j)
    };
    // A chunk of every column is a cache line or two.
    let fetch = |j: usize| {
        if j < len {
            flat::prefetch(&log[j]);
            flat::prefetch(&prompt[j]);
            flat::prefetch(&group.device[at + 1 + j]);
            // Host and disk owners take two lines a chunk (empty for a device-only group).
            for half in [0, CHUNK / 2] {
                if let Some(lower) = group.lower.get(at + 1 + j + half) {
                    flat::prefetch(lower);
                }
            }
        }
    };
    // Entry by entry first: where ranks drop out every few blocks a chunk would mostly fail.
    let mut passed = 0;
    while passed < len.min(CHUNK) && held(passed) {
        passed += 1;
    }
    if passed == CHUNK {
        // A long run: from here on the walk reads its columns ahead of the compares.
        for j in (passed + CHUNK..passed + AHEAD).step_by(CHUNK) {
            fetch(j);
        }
        while passed + CHUNK <= len && chunk_held(passed) {
            fetch(passed + AHEAD);
            passed += CHUNK;
        }
        while passed < len && held(passed) {
            passed += 1;
        }
    }
    passed
}

#[cfg(test)]
mod tests;
