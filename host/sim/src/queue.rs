//! The event queue of the virtual clock: earliest first; at one instant, engine step ends first
//! (by worker), then everything else in the order it was caused.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Events keyed by virtual time.
///
/// Same-instant order is part of a run's result, so it is fixed: a step that ends at the
/// instant something else happens has ended before it (the engine's next step has begun
/// without what arrives then), and step ends at one instant come in worker order. The rest
/// keeps insertion order, so same-instant events happen in the order they were caused. Step
/// ends do not depend on when they were queued, which lets the simulator skip the ones of an
/// engine's quiet steps and still place each exactly.
#[derive(Debug)]
pub(crate) struct EventQueue<E> {
    /// `(time in ns, order)` packed into one key, so a comparison is one `u128` compare.
    heap: BinaryHeap<Reverse<Entry<E>>>,
    next_seq: u64,
}

/// Bits of `order` holding the insertion number; the bits above say which kind of event.
const SEQ_BITS: u32 = 48;
/// The kind bits of every event but a step end.
const OTHER: u64 = (1 << (64 - SEQ_BITS)) - 1;

#[derive(Debug)]
struct Entry<E> {
    key: u128,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    /// Queue `event` at `at`, after everything queued for that instant so far.
    pub(crate) fn push(&mut self, at: Duration, event: E) {
        self.push_ordered(at, OTHER, event);
    }

    /// Queue the end of worker `worker`'s step at `at`: before every other kind of event at
    /// that instant, and before the step ends of higher workers.
    ///
    /// # Panics
    /// If `worker` does not fit the kind bits (65,535 workers).
    pub(crate) fn push_step_end(&mut self, at: Duration, worker: usize, event: E) {
        let kind = u64::try_from(worker).ok().filter(|&w| w < OTHER);
        self.push_ordered(at, kind.expect("fewer than 65,535 workers"), event);
    }

    fn push_ordered(&mut self, at: Duration, kind: u64, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let order = (kind << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
        // Virtual times stay far below the 584 years a u64 of nanoseconds holds.
        let key = (at.as_nanos() << 64) | u128::from(order);
        self.heap.push(Reverse(Entry { key, event }));
    }

    /// Events waiting.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn pop(&mut self) -> Option<(Duration, E)> {
        self.heap.pop().map(|Reverse(e)| {
            let nanos = (e.key >> 64) as u64;
            (Duration::from_nanos(nanos), e.event)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut EventQueue<char>) -> Vec<char> {
        std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect()
    }

    #[test]
    fn earliest_first_then_fifo() {
        let mut q = EventQueue::new();
        q.push(Duration::from_millis(5), 'c');
        q.push(Duration::from_millis(1), 'a');
        q.push(Duration::from_millis(5), 'd');
        q.push(Duration::from_millis(1), 'b');
        assert_eq!(drain(&mut q), ['a', 'b', 'c', 'd']);
    }

    #[test]
    fn step_ends_come_first_at_their_instant_by_worker() {
        let mut q = EventQueue::new();
        q.push(Duration::from_millis(5), 'x');
        q.push_step_end(Duration::from_millis(5), 3, 'c');
        q.push_step_end(Duration::from_millis(5), 1, 'b');
        q.push_step_end(Duration::from_millis(4), 7, 'a');
        q.push(Duration::from_millis(5), 'y');
        q.push_step_end(Duration::from_nanos(5_000_001), 0, 'z');
        assert_eq!(drain(&mut q), ['a', 'b', 'c', 'x', 'y', 'z']);
        let (at, _) = {
            q.push(Duration::new(3_600, 123), 'h');
            q.pop().unwrap()
        };
        assert_eq!(at, Duration::new(3_600, 123));
    }
}
