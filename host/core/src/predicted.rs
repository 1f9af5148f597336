//! Blocks the router *expects* a rank to hold because it just sent it a request.
//!
//! Two uses share this structure: bookings (siblings fanned out in the same millisecond see each
//! other before the engine's events arrive; short TTL) and approximate mode (workers that publish no
//! KV events are indexed from the gateway's own decisions; long TTL and a per-rank size bound).
//!
//! Every booking is a whole prompt prefix from block 0, and a sequence hash names its block *with*
//! its prefix. So a rank's predicted blocks are a set of prefix chains, kept per rank as a
//! compressed trie whose edges hold runs of hashes: booking a prompt walks the trie and stores only
//! the blocks it does not share (one copy, into a recycled buffer), a lookup compares runs by binary
//! search (two chains agree up to their first difference and never after), and neither hashes a
//! block. A booking is a mark at the node where it ends, ordered by (expiry, age); a mark that a
//! newer, longer-lived booking covers is dropped at once, so an agent that resends its growing
//! prompt keeps one mark whose leaf edge grows (the session frontier) instead of one per request.

use crate::hash::{HashMapByHash, SequenceHash};
use crate::worker::Rank;
use smallvec::SmallVec;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Stale expiry-heap entries tolerated beyond twice the live marks before the heap is compacted.
const COMPACT_SLACK: usize = 1024;

/// No node (a sentinel for the intrusive sibling lists).
const NONE: u32 = u32::MAX;

/// The root of every trie: no edge, never freed.
const ROOT: u32 = 0;

/// Freed edge buffers kept per rank for reuse, so a steady stream of bookings that expire (the
/// router's decision path) allocates nothing; larger buffers are freed rather than kept.
const SPARE_EDGES: usize = 8;
const SPARE_EDGE_MAX: usize = 1 << 16;

/// A booking's order: expiry first, then age (a process-wide counter), so ties go oldest first.
type Key = (Duration, u64);

/// Predicted blocks per rank with expiry times and a per-rank size bound.
#[derive(Debug, Clone)]
pub struct PredictedBlocks {
    ranks: Vec<Trie>,
    next_seq: u64,
    /// No booking expires before this (a lower bound: `expire` is free until then).
    next_expiry: Option<Duration>,
    max_blocks_per_rank: usize,
}

// === impl PredictedBlocks ===

impl PredictedBlocks {
    /// An empty set holding at most `max_blocks_per_rank` blocks per rank (older ones are dropped).
    pub fn new(max_blocks_per_rank: usize) -> Self {
        Self {
            ranks: Vec::new(),
            next_seq: 0,
            next_expiry: None,
            max_blocks_per_rank: max_blocks_per_rank.max(1),
        }
    }

    /// Expect `rank` to hold `blocks` until `now + ttl` (refreshing blocks already expected).
    ///
    /// `blocks` is a chain of sequence hashes from the prompt's first block, as the router passes
    /// them: prefixes are matched by comparing chains position by position.
    ///
    /// Over the size bound, the oldest booking (earliest expiry, then oldest) loses its blocks from
    /// the tail: the blocks no other booking shares, deepest first. The previous implementation
    /// dropped them in booking order, shallowest first, which left the rest of that booking counted
    /// but unreachable (a lookup stops at the first missing block). Dropping the tail keeps the
    /// shared, reachable prefix, as an engine's LRU does when it frees a sequence's tail first.
    pub fn insert(&mut self, rank: Rank, blocks: &[SequenceHash], ttl: Duration, now: Duration) {
        if blocks.is_empty() {
            return;
        }
        let key = (now + ttl, self.next_seq);
        self.next_seq += 1;
        let max = self.max_blocks_per_rank;
        let trie = match self.ranks.iter().position(|t| t.rank == rank) {
            Some(i) => &mut self.ranks[i],
            None => {
                self.ranks.push(Trie::new(rank));
                self.ranks.last_mut().expect("just pushed")
            }
        };
        trie.insert(blocks, key);
        trie.bound(max);
        trie.compact();
        self.next_expiry = Some(self.next_expiry.map_or(key.0, |e| e.min(key.0)));
    }

    /// Drop everything expected of `rank` (its worker restarted or became unhealthy).
    pub fn clear(&mut self, rank: Rank) {
        if let Some(trie) = self.ranks.iter_mut().find(|t| t.rank == rank) {
            trie.clear();
        }
    }

    /// Drop expectations that expired at or before `now`.
    pub fn expire(&mut self, now: Duration) {
        if self.next_expiry.is_none_or(|e| e > now) {
            return;
        }
        let mut next = None;
        for trie in &mut self.ranks {
            trie.expire(now);
            if let Some(Reverse((e, _, _))) = trie.heap.peek() {
                next = Some(next.map_or(*e, |n: Duration| n.min(*e)));
            }
        }
        self.next_expiry = next;
    }

    /// Prefix depth, in blocks, that each rank is expected to hold for `hashes`.
    pub fn find_matches(&self, hashes: &[SequenceHash], now: Duration) -> Vec<(Rank, u32)> {
        let mut matches = Vec::new();
        self.find_matches_into(hashes, now, &mut matches);
        matches
    }

    /// [`find_matches`](Self::find_matches) into a caller's buffer (cleared first), so a decision
    /// path that keeps one allocates nothing here. Ranks expected to hold nothing are left out.
    pub fn find_matches_into(
        &self,
        hashes: &[SequenceHash],
        now: Duration,
        matches: &mut Vec<(Rank, u32)>,
    ) {
        matches.clear();
        if hashes.is_empty() {
            return;
        }
        for trie in &self.ranks {
            let depth = trie.depth(hashes, now);
            if depth > 0 {
                matches.push((trie.rank, depth));
            }
        }
    }

    /// Blocks currently expected of `rank`.
    pub fn len(&self, rank: Rank) -> usize {
        self.ranks
            .iter()
            .find(|t| t.rank == rank)
            .map_or(0, |t| t.blocks)
    }

    /// Whether nothing is expected of any rank.
    pub fn is_empty(&self) -> bool {
        self.ranks.iter().all(|t| t.blocks == 0)
    }
}

/// One node of a rank's trie: a run of blocks after its parent's end.
#[derive(Debug, Clone)]
struct Node {
    parent: u32,
    first_child: u32,
    prev_sibling: u32,
    next_sibling: u32,
    children: u32,
    /// Blocks from the parent's end to this node's end (empty only at the root).
    edge: Vec<SequenceHash>,
    /// The booking that ends here, if any. Invariant: a mark orders after every mark below it
    /// (a booking that a later one extends is dropped), so the oldest mark is always on a leaf.
    mark: Option<Key>,
    /// Latest expiry of the marks here and below: the edge's blocks are expected until then.
    until: Duration,
}

impl Node {
    fn new(parent: u32, edge: Vec<SequenceHash>, mark: Option<Key>, until: Duration) -> Self {
        Self {
            parent,
            first_child: NONE,
            prev_sibling: NONE,
            next_sibling: NONE,
            children: 0,
            edge,
            mark,
            until,
        }
    }
}

/// One rank's predicted blocks. Every leaf carries a mark, and no unmarked node other than the
/// root has a single child (it is merged into it), so the trie stays as small as its bookings.
#[derive(Debug, Clone)]
struct Trie {
    rank: Rank,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// A node by the first hash of its edge. That hash names the node's whole path, so one map
    /// serves the whole trie.
    by_start: HashMapByHash<u32>,
    /// Marks by key, earliest first; entries whose mark changed since are skipped.
    heap: BinaryHeap<Reverse<(Duration, u64, u32)>>,
    /// Distinct blocks: the sum of the edges.
    blocks: usize,
    marks: usize,
    spare: Vec<Vec<SequenceHash>>,
}

impl Trie {
    fn new(rank: Rank) -> Self {
        Self {
            rank,
            nodes: vec![Node::new(NONE, Vec::new(), None, Duration::ZERO)],
            free: Vec::new(),
            by_start: HashMapByHash::default(),
            heap: BinaryHeap::new(),
            blocks: 0,
            marks: 0,
            spare: Vec::new(),
        }
    }

    /// Deepest prefix of `hashes` whose blocks are expected after `now`.
    fn depth(&self, hashes: &[SequenceHash], now: Duration) -> u32 {
        let mut pos = 0;
        while let Some(&id) = hashes.get(pos).and_then(|h| self.by_start.get(h)) {
            let node = &self.nodes[id as usize];
            if node.until <= now {
                break;
            }
            let common = common_prefix(&node.edge, &hashes[pos..]);
            pos += common;
            if common < node.edge.len() {
                break;
            }
        }
        pos as u32
    }

    fn insert(&mut self, blocks: &[SequenceHash], key: Key) {
        let expires = key.0;
        // Marks of earlier bookings this one extends: dropped, then their nodes tidied.
        let mut covered: SmallVec<[u32; 8]> = SmallVec::new();
        let mut node = ROOT;
        let mut pos = 0;
        loop {
            let Some(&child) = self.by_start.get(&blocks[pos]) else {
                self.add_leaf(node, &blocks[pos..], key);
                break;
            };
            let edge_len = self.nodes[child as usize].edge.len();
            let common = common_prefix(&self.nodes[child as usize].edge, &blocks[pos..]);
            let end = pos + common == blocks.len();
            if common == edge_len && !end {
                // Passes through `child` and goes on.
                let n = &mut self.nodes[child as usize];
                n.until = n.until.max(expires);
                if n.mark.is_some_and(|m| m < key) {
                    if n.children == 0 {
                        // The session frontier: the booking this one extends grows in place.
                        n.edge.extend_from_slice(&blocks[pos + common..]);
                        n.mark = Some(key);
                        self.blocks += blocks.len() - pos - common;
                        self.heap.push(Reverse((expires, key.1, child)));
                        break;
                    }
                    n.mark = None;
                    self.marks -= 1;
                    covered.push(child);
                }
                node = child;
                pos += common;
                continue;
            }
            // Ends or diverges at `child`. A booking ending inside a longer-lived one adds nothing
            // (and then, by the invariant, nothing above was covered).
            if end && self.nodes[child as usize].until > expires {
                break;
            }
            let at = if common == edge_len {
                child
            } else {
                self.split(child, common)
            };
            let n = &mut self.nodes[at as usize];
            n.until = n.until.max(expires);
            if end {
                if n.mark.is_none() {
                    self.marks += 1;
                }
                n.mark = Some(key);
                self.heap.push(Reverse((expires, key.1, at)));
            } else {
                self.add_leaf(at, &blocks[pos + common..], key);
            }
            break;
        }
        for &id in covered.iter().rev() {
            self.tidy(id);
        }
    }

    /// A new marked leaf under `parent` holding `edge`.
    fn add_leaf(&mut self, parent: u32, edge: &[SequenceHash], key: Key) {
        let buf = self.edge_buf(edge);
        let id = self.alloc(Node::new(parent, buf, Some(key), key.0));
        self.link(parent, id);
        self.by_start.insert(edge[0], id);
        self.blocks += edge.len();
        self.marks += 1;
        self.heap.push(Reverse((key.0, key.1, id)));
    }

    /// Split `id`'s edge after `at` blocks: a new unmarked node takes the first part and `id`'s
    /// place, with `id` (keeping its mark, children and heap entries) as its only child.
    fn split(&mut self, id: u32, at: usize) -> u32 {
        let mut head = self.edge_buf(&[]);
        let node = &mut self.nodes[id as usize];
        head.extend_from_slice(&node.edge[..at]);
        node.edge.drain(..at);
        let (parent, until, rest) = (node.parent, node.until, node.edge[0]);
        let first = head[0];
        let s = self.alloc(Node::new(parent, head, None, until));
        self.replace(id, s);
        self.link(s, id);
        self.by_start.insert(first, s);
        self.by_start.insert(rest, id);
        s
    }

    /// Evict until the rank holds at most `max` blocks: the oldest mark's tail first.
    fn bound(&mut self, max: usize) {
        while self.blocks > max {
            let Some(&Reverse((expires, seq, id))) = self.heap.peek() else {
                break;
            };
            if !self.valid(expires, seq, id) {
                self.heap.pop();
                continue;
            }
            let node = &mut self.nodes[id as usize];
            let need = self.blocks - max;
            if node.children == 0 && need < node.edge.len() {
                node.edge.truncate(node.edge.len() - need);
                self.blocks -= need;
                break;
            }
            self.heap.pop();
            self.unmark(id);
        }
    }

    fn expire(&mut self, now: Duration) {
        while let Some(&Reverse((expires, seq, id))) = self.heap.peek() {
            if expires > now {
                break;
            }
            self.heap.pop();
            if self.valid(expires, seq, id) {
                self.unmark(id);
            }
        }
    }

    /// Drop `id`'s mark (the oldest: on a leaf, so its edge goes with it).
    fn unmark(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        node.mark = None;
        self.marks -= 1;
        debug_assert_eq!(node.children, 0, "the oldest mark is on a leaf");
        if node.children > 0 {
            // Unreachable while the invariant holds; keep `until` exact all the same.
            let mut until = Duration::ZERO;
            let mut c = self.nodes[id as usize].first_child;
            while c != NONE {
                until = until.max(self.nodes[c as usize].until);
                c = self.nodes[c as usize].next_sibling;
            }
            self.nodes[id as usize].until = until;
        }
        self.tidy(id);
    }

    /// Remove `id` if nothing is booked there or below, merge it into its child if it has only
    /// one and no mark, and go on up.
    fn tidy(&mut self, mut id: u32) {
        while id != ROOT && self.nodes[id as usize].mark.is_none() {
            match self.nodes[id as usize].children {
                0 => {
                    let parent = self.nodes[id as usize].parent;
                    self.unlink(id);
                    let edge = std::mem::take(&mut self.nodes[id as usize].edge);
                    self.by_start.remove(&edge[0]);
                    self.blocks -= edge.len();
                    self.recycle(edge);
                    self.free.push(id);
                    id = parent;
                }
                1 => {
                    self.merge(id);
                    break;
                }
                _ => break,
            }
        }
    }

    /// Fold unmarked `id` into its only child, which keeps its id (and so its heap entries).
    fn merge(&mut self, id: u32) {
        let child = self.nodes[id as usize].first_child;
        let mut edge = std::mem::take(&mut self.nodes[id as usize].edge);
        edge.extend_from_slice(&self.nodes[child as usize].edge);
        let old = std::mem::replace(&mut self.nodes[child as usize].edge, edge);
        self.by_start.remove(&old[0]);
        self.recycle(old);
        let first = self.nodes[child as usize].edge[0];
        self.unlink(child);
        self.replace(id, child);
        self.by_start.insert(first, child);
        self.free.push(id);
    }

    fn clear(&mut self) {
        for node in self.nodes.drain(1..) {
            Self::keep_spare(&mut self.spare, node.edge);
        }
        self.nodes[ROOT as usize] = Node::new(NONE, Vec::new(), None, Duration::ZERO);
        self.free.clear();
        self.by_start.clear();
        self.heap.clear();
        self.blocks = 0;
        self.marks = 0;
    }

    /// Drop stale heap entries once they outnumber the marks: an agent refreshing the same prompt
    /// pushes one per request, and they would otherwise wait for their expiry (`approx_ttl`).
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.marks + COMPACT_SLACK {
            let nodes = &self.nodes;
            self.heap
                .retain(|Reverse((e, s, id))| nodes[*id as usize].mark == Some((*e, *s)));
        }
    }

    fn valid(&self, expires: Duration, seq: u64, id: u32) -> bool {
        self.nodes[id as usize].mark == Some((expires, seq))
    }

    fn alloc(&mut self, node: Node) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 nodes per rank")
            }
        }
    }

    fn edge_buf(&mut self, blocks: &[SequenceHash]) -> Vec<SequenceHash> {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(blocks);
        buf
    }

    fn recycle(&mut self, edge: Vec<SequenceHash>) {
        Self::keep_spare(&mut self.spare, edge);
    }

    fn keep_spare(spare: &mut Vec<Vec<SequenceHash>>, mut edge: Vec<SequenceHash>) {
        if spare.len() < SPARE_EDGES && (1..=SPARE_EDGE_MAX).contains(&edge.capacity()) {
            edge.clear();
            spare.push(edge);
        }
    }

    /// Make `child` the first child of `parent`.
    fn link(&mut self, parent: u32, child: u32) {
        let first = self.nodes[parent as usize].first_child;
        let c = &mut self.nodes[child as usize];
        c.parent = parent;
        c.prev_sibling = NONE;
        c.next_sibling = first;
        if first != NONE {
            self.nodes[first as usize].prev_sibling = child;
        }
        let p = &mut self.nodes[parent as usize];
        p.first_child = child;
        p.children += 1;
    }

    fn unlink(&mut self, child: u32) {
        let Node {
            parent,
            prev_sibling: prev,
            next_sibling: next,
            ..
        } = self.nodes[child as usize];
        if prev == NONE {
            self.nodes[parent as usize].first_child = next;
        } else {
            self.nodes[prev as usize].next_sibling = next;
        }
        if next != NONE {
            self.nodes[next as usize].prev_sibling = prev;
        }
        self.nodes[parent as usize].children -= 1;
    }

    /// Put `new` (unlinked) in `old`'s place among its parent's children; `old` is left unlinked.
    fn replace(&mut self, old: u32, new: u32) {
        let Node {
            parent,
            prev_sibling: prev,
            next_sibling: next,
            ..
        } = self.nodes[old as usize];
        let n = &mut self.nodes[new as usize];
        n.parent = parent;
        n.prev_sibling = prev;
        n.next_sibling = next;
        if prev == NONE {
            self.nodes[parent as usize].first_child = new;
        } else {
            self.nodes[prev as usize].next_sibling = new;
        }
        if next != NONE {
            self.nodes[next as usize].prev_sibling = new;
        }
    }
}

/// How many leading blocks `a` and `b` share. Both are chains from the same position, so they
/// agree up to their first difference and nowhere after: a binary search, not a scan.
fn common_prefix(a: &[SequenceHash], b: &[SequenceHash]) -> usize {
    let n = a.len().min(b.len());
    if n == 0 || a[n - 1] == b[n - 1] {
        debug_assert!(a[..n] == b[..n], "not chains from the same position");
        return n;
    }
    // a[..lo] == b[..lo] and a[hi] != b[hi].
    let (mut lo, mut hi) = (0, n - 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if a[mid] == b[mid] {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    debug_assert!(a[..lo] == b[..lo], "not chains from the same position");
    lo
}

#[cfg(test)]
mod tests;
