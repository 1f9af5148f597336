//! Blocks the router *expects* a rank to hold because it just sent it a request.
//!
//! Two uses share this structure: bookings (siblings fanned out in the same millisecond see each
//! other before the engine's events arrive; short TTL) and approximate mode (workers that publish no
//! KV events are indexed from the gateway's own decisions; long TTL and a per-rank size bound).

use crate::hash::{HashMapByHash, SequenceHash};
use crate::worker::Rank;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Stale queue entries tolerated beyond twice the live ones before the queue is compacted.
const COMPACT_SLACK: usize = 1024;

/// Predicted blocks per rank with expiry times and a per-rank size bound.
#[derive(Debug, Clone)]
pub struct PredictedBlocks {
    entries: HashMapByHash<SmallVec<[(Rank, Duration); 2]>>,
    /// Per rank, insertion order with the expiry each insertion set: oldest first.
    order: HashMap<Rank, VecDeque<(Duration, SequenceHash)>>,
    live: HashMap<Rank, usize>,
    max_blocks_per_rank: usize,
}

// === impl PredictedBlocks ===

impl PredictedBlocks {
    /// An empty set holding at most `max_blocks_per_rank` blocks per rank (older ones are dropped).
    pub fn new(max_blocks_per_rank: usize) -> Self {
        Self {
            entries: HashMapByHash::default(),
            order: HashMap::new(),
            live: HashMap::new(),
            max_blocks_per_rank: max_blocks_per_rank.max(1),
        }
    }

    /// Expect `rank` to hold `blocks` until `now + ttl` (refreshing blocks already expected).
    pub fn insert(&mut self, rank: Rank, blocks: &[SequenceHash], ttl: Duration, now: Duration) {
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
    pub fn clear(&mut self, rank: Rank) {
        while self.pop_oldest(rank, None) {}
        self.order.remove(&rank);
    }

    /// Drop expectations that expired at or before `now`.
    pub fn expire(&mut self, now: Duration) {
        let ranks: Vec<Rank> = self.order.keys().copied().collect();
        for rank in ranks {
            while self.pop_oldest(rank, Some(now)) {}
        }
    }

    /// Prefix depth, in blocks, that each rank is expected to hold for `hashes`.
    pub fn find_matches(&self, hashes: &[SequenceHash], now: Duration) -> Vec<(Rank, u32)> {
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
    pub fn len(&self, rank: Rank) -> usize {
        self.live.get(&rank).copied().unwrap_or(0)
    }

    /// Whether nothing is expected of any rank.
    pub fn is_empty(&self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::BlockHasher;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn refreshing_the_same_prefix_keeps_the_queue_bounded() {
        let rank = Rank::new(0, 0);
        let hashes = BlockHasher::new(4).sequence(&(0..400).collect::<Vec<u32>>());
        let mut predicted = PredictedBlocks::new(1 << 20);
        for i in 0..10_000u64 {
            predicted.insert(rank, &hashes, secs(120), Duration::from_millis(i));
        }
        assert_eq!(predicted.len(rank), hashes.len());
        let queued = predicted.order[&rank].len();
        assert!(
            queued <= 2 * hashes.len() + COMPACT_SLACK + hashes.len(),
            "{queued} queue entries for {} live blocks",
            hashes.len()
        );
        // Still exact: everything expires with the last refresh, not before.
        predicted.expire(Duration::from_millis(9_999) + secs(119));
        assert_eq!(predicted.find_matches(&hashes, secs(120))[0].1, 100);
        predicted.expire(Duration::from_millis(9_999) + secs(121));
        assert!(predicted.is_empty());
    }

    #[test]
    fn expected_blocks_expire() {
        let seq = BlockHasher::new(1).sequence(&[1, 2, 3]);
        let a = Rank::new(0, 0);
        let mut p = PredictedBlocks::new(100);
        p.insert(a, &seq[..2], secs(5), secs(0));
        assert_eq!(p.find_matches(&seq, secs(1)), vec![(a, 2)]);
        assert!(
            p.find_matches(&seq, secs(5)).is_empty(),
            "expired at the TTL"
        );
        p.expire(secs(6));
        assert!(p.is_empty());
        assert_eq!(p.len(a), 0);
    }

    #[test]
    fn refresh_extends_life() {
        let seq = BlockHasher::new(1).sequence(&[1, 2]);
        let a = Rank::new(0, 0);
        let mut p = PredictedBlocks::new(100);
        p.insert(a, &seq, secs(5), secs(0));
        p.insert(a, &seq, secs(5), secs(4));
        p.expire(secs(6));
        assert_eq!(p.find_matches(&seq, secs(6)), vec![(a, 2)]);
        assert_eq!(p.len(a), 2);
        p.expire(secs(9));
        assert_eq!(p.len(a), 0);
    }

    #[test]
    fn size_bound_drops_oldest() {
        let h = BlockHasher::new(1);
        let (old, new) = (h.sequence(&[1, 2, 3]), h.sequence(&[7, 8, 9]));
        let a = Rank::new(0, 0);
        let b = Rank::new(1, 0);
        let mut p = PredictedBlocks::new(4);
        p.insert(a, &old, secs(100), secs(0));
        p.insert(b, &old, secs(100), secs(0));
        p.insert(a, &new, secs(100), secs(1));
        assert_eq!(p.len(a), 4);
        assert_eq!(p.find_matches(&new, secs(2)), vec![(a, 3)]);
        assert_eq!(
            p.find_matches(&old, secs(2)),
            vec![(b, 3)],
            "a lost its oldest blocks"
        );
        p.clear(b);
        assert!(p.find_matches(&old, secs(2)).is_empty());
    }
}
