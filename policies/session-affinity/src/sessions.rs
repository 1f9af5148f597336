//! A bounded session -> worker map with least-recently-used eviction.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

/// A worker rank as `(worker_id, dp_rank)`.
type Rank = (u32, u32);

/// Fixed-key hashing: `RandomState` would import WASI randomness into the component, and a
/// policy's inputs are not adversarial keys.
type FixedState = BuildHasherDefault<DefaultHasher>;

/// Remembers up to `capacity` sessions; when full, forgets the least recently used quarter at
/// once, so the eviction scan is paid once per `capacity / 4` inserts, not per insert.
#[derive(Debug)]
pub(crate) struct SessionMap {
    entries: HashMap<String, (Rank, u64), FixedState>,
    capacity: usize,
    clock: u64,
}

impl SessionMap {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::default(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// The session's worker, marking the session as recently used.
    pub(crate) fn get(&mut self, session: &str) -> Option<Rank> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(session).map(|(rank, used)| {
            *used = clock;
            *rank
        })
    }

    /// The session's worker, leaving its recency alone.
    pub(crate) fn peek(&self, session: &str) -> Option<Rank> {
        self.entries.get(session).map(|(rank, _)| *rank)
    }

    pub(crate) fn insert(&mut self, session: &str, rank: Rank) {
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(session) {
            *entry = (rank, self.clock);
            return;
        }
        if self.entries.len() >= self.capacity {
            self.evict_oldest_quarter();
        }
        self.entries.insert(session.to_owned(), (rank, self.clock));
    }

    pub(crate) fn remove(&mut self, session: &str) {
        self.entries.remove(session);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn evict_oldest_quarter(&mut self) {
        let mut stamps: Vec<u64> = self.entries.values().map(|(_, used)| *used).collect();
        let cut = (stamps.len() / 4).max(1) - 1;
        let (_, threshold, _) = stamps.select_nth_unstable(cut);
        let threshold = *threshold;
        self.entries.retain(|_, (_, used)| *used > threshold);
    }
}
