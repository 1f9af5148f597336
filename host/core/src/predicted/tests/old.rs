//! `PredictedBlocks` as it was before the per-rank tries (one hash-map entry and one queue entry
//! per block per rank), kept as the reference the property test compares the current one against.

use crate::hash::{HashMapByHash, SequenceHash};
use crate::worker::Rank;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Stale queue entries tolerated beyond twice the live ones before the queue is compacted.
const COMPACT_SLACK: usize = 1024;

/// Predicted blocks per rank with expiry times and a per-rank size bound.
#[derive(Debug, Clone)]
pub(super) struct PredictedBlocks {
    entries: HashMapByHash<SmallVec<[(Rank, Duration); 2]>>,
    /// Per rank, insertion order with the expiry each insertion set: oldest first.
    order: HashMap<Rank, VecDeque<(Duration, SequenceHash)>>,
    live: HashMap<Rank, usize>,
    max_blocks_per_rank: usize,
}

// === impl PredictedBlocks ===

impl PredictedBlocks {
    /// An empty set holding at most `max_blocks_per_rank` blocks per rank (older ones are dropped).
    pub(super) fn new(max_blocks_per_rank: usize) -> Self {
        Self {
            entries: HashMapByHash::default(),
            order: HashMap::new(),
            live: HashMap::new(),
            max_blocks_per_rank: max_blocks_per_rank.max(1),
        }
    }

    /// Expect `rank` to hold `blocks` until `now + ttl` (refreshing blocks already expected).
    pub(super) fn insert(
        &mut self,
        rank: Rank,
        blocks: &[SequenceHash],
        ttl: Duration,
        now: Duration,
    ) {
        let expires = now + ttl;
        let order = self.order.entry(rank).or_default();
        for &hash in blocks {
            let owners = self.entries.entry(hash).or_default();
            match owners.iter_mut().find(|(r, _)| *r == rank) {
                Some((_, at)) => *at = (*at).max(expires),
                None => {
                    owners.push((rank, expires));
                    *self.live.entry(rank).or_default() += 1;
                }
            }
            order.push_back((expires, hash));
        }
        // A refresh leaves its older queue entry behind (skipped when popped). Agents resend the
        // same prefix on every request, so without compaction the queue grew by the prompt's
        // blocks per request until they expired: ~4 KB a request, over a gigabyte in
        // `approx_ttl` at a few thousand requests a second.
        let live = self.live.get(&rank).copied().unwrap_or(0);
        if order.len() > 2 * live + COMPACT_SLACK {
            let entries = &self.entries;
            order.retain(|(expires, hash)| {
                entries
                    .get(hash)
                    .is_some_and(|owners| owners.iter().any(|(r, at)| *r == rank && at == expires))
            });
        }
        while self.live.get(&rank).copied().unwrap_or(0) > self.max_blocks_per_rank {
            if !self.pop_oldest(rank, None) {
                break;
            }
        }
    }

    /// Drop everything expected of `rank` (its worker restarted or became unhealthy).
    pub(super) fn clear(&mut self, rank: Rank) {
        while self.pop_oldest(rank, None) {}
        self.order.remove(&rank);
    }

    /// Drop expectations that expired at or before `now`.
    pub(super) fn expire(&mut self, now: Duration) {
        let ranks: Vec<Rank> = self.order.keys().copied().collect();
        for rank in ranks {
            while self.pop_oldest(rank, Some(now)) {}
        }
    }

    /// Prefix depth, in blocks, that each rank is expected to hold for `hashes`.
    pub(super) fn find_matches(&self, hashes: &[SequenceHash], now: Duration) -> Vec<(Rank, u32)> {
        let mut runs: SmallVec<[(Rank, u32, bool); 8]> = SmallVec::new();
        for (i, hash) in hashes.iter().enumerate() {
            let Some(owners) = self.entries.get(hash) else {
                break;
            };
            let live = |rank: Rank| owners.iter().any(|(r, at)| *r == rank && *at > now);
            if i == 0 {
                runs.extend(
                    owners
                        .iter()
                        .filter(|(_, at)| *at > now)
                        .map(|(r, _)| (*r, 1, true)),
                );
                continue;
            }
            let mut any = false;
            for run in runs.iter_mut().filter(|r| r.2) {
                run.2 = live(run.0);
                run.1 += run.2 as u32;
                any |= run.2;
            }
            if !any {
                break;
            }
        }
        runs.into_iter().map(|(r, d, _)| (r, d)).collect()
    }

    /// Blocks currently expected of `rank`.
    pub(super) fn len(&self, rank: Rank) -> usize {
        self.live.get(&rank).copied().unwrap_or(0)
    }

    /// Whether nothing is expected of any rank.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pop `rank`'s oldest insertion; with `before`, only if it expired by then. Returns whether
    /// an insertion was popped (it may have been a stale one, refreshed since).
    fn pop_oldest(&mut self, rank: Rank, before: Option<Duration>) -> bool {
        let Some(order) = self.order.get_mut(&rank) else {
            return false;
        };
        let Some(&(expires, hash)) = order.front() else {
            return false;
        };
        if before.is_some_and(|now| expires > now) {
            return false;
        }
        order.pop_front();
        let Some(owners) = self.entries.get_mut(&hash) else {
            return true;
        };
        let Some(pos) = owners.iter().position(|(r, _)| *r == rank) else {
            return true;
        };
        // A later insertion refreshed this block: that one's queue entry will remove it.
        if owners[pos].1 > expires {
            return true;
        }
        owners.swap_remove(pos);
        if owners.is_empty() {
            self.entries.remove(&hash);
        }
        if let Some(n) = self.live.get_mut(&rank) {
            *n -= 1;
        }
        true
    }
}
