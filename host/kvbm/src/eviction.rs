//! The order in which inactive blocks die. Three buckets, cheapest first:
//!
//! - ephemeral blocks, LRU (evicted before anything else);
//! - untagged blocks, an O(1) intrusive LRU list (the common case pays no log factor);
//! - tagged blocks, ordered by (priority, last use) in a B-tree; a tag with a duration is
//!   re-keyed to the default priority when it expires, lazily, at the next eviction.
//!
//! A victim is the smaller of the untagged head (default priority) and the tagged minimum.
//! Only leaves are ever inserted (the pool's job), so a prefix never dies before its suffix.
//!
//! Order within a priority is the order blocks became evictable. Each insertion takes a stamp
//! from one of two counters: the back counter grows (a block just released or touched is the
//! most recent), the front counter shrinks (a prefix whose last child was just evicted goes next,
//! so a chain dies tail-first in one run, as vLLM frees a request's blocks). List order is
//! therefore always stamp order, which keeps the list and the B-tree comparable.

use std::collections::BTreeSet;

use crate::retention::{DEFAULT_PRIORITY, Retention};
use crate::types::{BlockId, Tick};

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

impl Ends {
    const EMPTY: Ends = Ends {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bucket {
    Ephemeral,
    Untagged,
    Tagged { priority: u8, expiry: Option<Tick> },
}

/// The eviction candidates of one pool: inactive, unpinned leaves.
#[derive(Debug)]
pub(crate) struct Candidates {
    links: Vec<Link>,
    bucket: Vec<Option<Bucket>>,
    stamps: Vec<u64>,
    ephemeral: Ends,
    untagged: Ends,
    tagged: BTreeSet<(u8, u64, u32)>,
    expiries: BTreeSet<(Tick, u32)>,
    len: usize,
    back: u64,
    front: u64,
}

/// Where a newly evictable block enters the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    /// Most recently used: evicted last among its priority.
    Back,
    /// Next in line among its priority (a prefix whose suffix was just evicted).
    Front,
}

impl Candidates {
    pub(crate) fn new(capacity: usize) -> Candidates {
        Candidates {
            links: vec![
                Link {
                    prev: NIL,
                    next: NIL
                };
                capacity
            ],
            bucket: vec![None; capacity],
            stamps: vec![0; capacity],
            ephemeral: Ends::EMPTY,
            untagged: Ends::EMPTY,
            tagged: BTreeSet::new(),
            expiries: BTreeSet::new(),
            len: 0,
            back: 1 << 63,
            front: (1 << 63) - 1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, id: BlockId) -> bool {
        self.bucket.get(id.index()).is_some_and(Option::is_some)
    }

    /// Add `id` at `position` of its priority's order.
    pub(crate) fn insert(
        &mut self,
        id: BlockId,
        retention: Retention,
        position: Position,
        now: Tick,
    ) {
        if self.contains(id) || id.index() >= self.bucket.len() {
            return;
        }
        let retention = retention.at(now);
        let bucket = if retention.is_ephemeral() {
            Bucket::Ephemeral
        } else if retention == Retention::DEFAULT {
            Bucket::Untagged
        } else {
            Bucket::Tagged {
                priority: retention.priority(),
                expiry: retention.until(),
            }
        };
        let stamp = match position {
            Position::Back => {
                self.back += 1;
                self.back
            }
            Position::Front => {
                self.front -= 1;
                self.front
            }
        };
        self.stamps[id.index()] = stamp;
        self.place(id, bucket, position);
        self.len += 1;
    }

    fn place(&mut self, id: BlockId, bucket: Bucket, position: Position) {
        let stamp = self.stamps[id.index()];
        let list = match bucket {
            Bucket::Ephemeral => Some(&mut self.ephemeral),
            Bucket::Untagged => Some(&mut self.untagged),
            Bucket::Tagged { .. } => None,
        };
        match (bucket, list) {
            (_, Some(ends)) => match position {
                Position::Back => push_back(&mut self.links, ends, id.0),
                Position::Front => push_front(&mut self.links, ends, id.0),
            },
            (Bucket::Tagged { priority, expiry }, None) => {
                self.tagged.insert((priority, stamp, id.0));
                if let Some(expiry) = expiry {
                    self.expiries.insert((expiry, id.0));
                }
            }
            (_, None) => {}
        }
        self.bucket[id.index()] = Some(bucket);
    }

    /// Take `id` out; false if it was not a candidate.
    pub(crate) fn remove(&mut self, id: BlockId) -> bool {
        let Some(bucket) = self.bucket.get_mut(id.index()).and_then(Option::take) else {
            return false;
        };
        let stamp = self.stamps[id.index()];
        match bucket {
            Bucket::Ephemeral => unlink(&mut self.links, &mut self.ephemeral, id.0),
            Bucket::Untagged => unlink(&mut self.links, &mut self.untagged, id.0),
            Bucket::Tagged { priority, expiry } => {
                self.tagged.remove(&(priority, stamp, id.0));
                if let Some(expiry) = expiry {
                    self.expiries.remove(&(expiry, id.0));
                }
            }
        }
        self.len -= 1;
        true
    }

    /// Lazy decay: tags whose duration ended by `now` go back to the default priority.
    fn decay(&mut self, now: Tick) {
        while let Some(&(expiry, raw)) = self.expiries.first() {
            if expiry > now {
                break;
            }
            self.expiries.pop_first();
            let id = BlockId(raw);
            if let Some(Some(Bucket::Tagged { priority, .. })) = self.bucket.get(id.index()) {
                let stamp = self.stamps[id.index()];
                self.tagged.remove(&(*priority, stamp, raw));
                // Keyed like an untagged block of the same age, so the two orders agree.
                self.place(
                    id,
                    Bucket::Tagged {
                        priority: DEFAULT_PRIORITY,
                        expiry: None,
                    },
                    Position::Back,
                );
            }
        }
    }

    /// The next victim at `now`, without removing it.
    pub(crate) fn peek(&mut self, now: Tick) -> Option<BlockId> {
        self.decay(now);
        if self.ephemeral.head != NIL {
            return Some(BlockId(self.ephemeral.head));
        }
        let untagged = (self.untagged.head != NIL).then(|| {
            let raw = self.untagged.head;
            (DEFAULT_PRIORITY, self.stamps[raw as usize], raw)
        });
        let tagged = self.tagged.first().copied();
        match (untagged, tagged) {
            (Some(a), Some(b)) => Some(BlockId(a.min(b).2)),
            (Some(a), None) => Some(BlockId(a.2)),
            (None, Some(b)) => Some(BlockId(b.2)),
            (None, None) => None,
        }
    }

    /// Remove and return the next victim at `now`.
    pub(crate) fn pop(&mut self, now: Tick) -> Option<BlockId> {
        let victim = self.peek(now)?;
        self.remove(victim);
        Some(victim)
    }
}

fn push_back(links: &mut [Link], ends: &mut Ends, raw: u32) {
    links[raw as usize] = Link {
        prev: ends.tail,
        next: NIL,
    };
    if ends.tail == NIL {
        ends.head = raw;
    } else {
        links[ends.tail as usize].next = raw;
    }
    ends.tail = raw;
    ends.len += 1;
}

fn push_front(links: &mut [Link], ends: &mut Ends, raw: u32) {
    links[raw as usize] = Link {
        prev: NIL,
        next: ends.head,
    };
    if ends.head == NIL {
        ends.tail = raw;
    } else {
        links[ends.head as usize].prev = raw;
    }
    ends.head = raw;
    ends.len += 1;
}

fn unlink(links: &mut [Link], ends: &mut Ends, raw: u32) {
    let Link { prev, next } = links[raw as usize];
    if prev == NIL {
        ends.head = next;
    } else {
        links[prev as usize].next = next;
    }
    if next == NIL {
        ends.tail = prev;
    } else {
        links[next as usize].prev = prev;
    }
    links[raw as usize] = Link {
        prev: NIL,
        next: NIL,
    };
    ends.len -= 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(candidates: &mut Candidates, now: Tick) -> Vec<u32> {
        std::iter::from_fn(|| candidates.pop(now).map(|id| id.0)).collect()
    }

    #[test]
    fn ephemeral_then_priority_then_lru() -> Result<(), crate::KvbmError> {
        let mut c = Candidates::new(8);
        let now = Tick(0);
        c.insert(BlockId(0), Retention::DEFAULT, Position::Back, now);
        c.insert(BlockId(1), Retention::new(90, None)?, Position::Back, now);
        c.insert(BlockId(2), Retention::new(10, None)?, Position::Back, now);
        c.insert(BlockId(3), Retention::ephemeral(), Position::Back, now);
        c.insert(BlockId(4), Retention::DEFAULT, Position::Back, now);
        c.insert(BlockId(5), Retention::DEFAULT, Position::Front, now);
        assert_eq!(order(&mut c, now), vec![3, 2, 5, 0, 4, 1]);
        assert_eq!(c.len(), 0);
        Ok(())
    }

    #[test]
    fn expired_tags_decay_lazily_to_default() -> Result<(), crate::KvbmError> {
        let mut c = Candidates::new(4);
        c.insert(
            BlockId(0),
            Retention::new(90, Some(Tick(100)))?,
            Position::Back,
            Tick(0),
        );
        c.insert(BlockId(1), Retention::DEFAULT, Position::Back, Tick(0));
        assert_eq!(c.peek(Tick(50)), Some(BlockId(1)));
        // After the duration block 0 is an older default-priority block: it goes first.
        assert_eq!(order(&mut c, Tick(100)), vec![0, 1]);
        Ok(())
    }
}
