//! An open-addressing map from `u64` keys to small `Copy` values: the index's and the ingestor's
//! tables.
//!
//! Linear probing over one array of `(key, value)` slots, Fibonacci hashing (one multiply, whose
//! high bits pick the slot by a second multiply, so counting keys spread as well as random ones),
//! and backward-shift deletion: no tombstones, so a table whose keys churn (an engine cache
//! evicting and storing all day) keeps the size its peak live count needed, and a hit is usually
//! one cache line. The standard `HashMap` keeps a control-byte array beside its slots and, with
//! tombstones, doubles a table whose live size sits just above half its capacity (16,384 blocks
//! per rank is exactly that case); this one stays at a load factor of at most 3/4 and grows in
//! steps of 1.5x and 4/3x (16, 24, 32, 48, ...), so that such a table is two-thirds full rather
//! than half: the engine-hash tables of 16 ranks of 16,384 blocks take 12 MiB instead of 16. A
//! fuller table probes further: the index applies Dynamo's event stream 13-17 % slower for it,
//! and the simulator's user time is level to 15 % higher; docs/benchmarks.md (a2), (n).

/// The reserved "empty slot" key; a real key 0 lives in a side slot.
const EMPTY: u64 = 0;

/// Smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// A map from `u64` keys to `Copy` values.
#[derive(Debug, Clone)]
pub struct U64Map<V: Copy + Default> {
    slots: Vec<(u64, V)>,
    /// Keys in `slots` (not counting `zero`).
    len: usize,
    zero: Option<V>,
}

impl<V: Copy + Default> Default for U64Map<V> {
    fn default() -> Self {
        Self::new()
    }
}

// === impl U64Map ===

impl<V: Copy + Default> U64Map<V> {
    /// Slots in a 64-byte cache line (at least one).
    const SLOTS_PER_LINE: usize = {
        let per_line = 64 / std::mem::size_of::<(u64, V)>();
        if per_line == 0 { 1 } else { per_line }
    };

    /// An empty map; it allocates on the first insert.
    pub fn new() -> Self {
        Self {
            slots: Vec::new(),
            len: 0,
            zero: None,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot a key's probe starts at: its Fibonacci hash scaled onto the table (the high
    /// 64 bits of `hash * len`), which needs no power-of-two length.
    #[inline]
    fn home(&self, key: u64) -> usize {
        let hash = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((u128::from(hash) * self.slots.len() as u128) >> 64) as usize
    }

    /// The slot after `i`, wrapping around.
    #[inline]
    fn after(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// Slot of `key`, if present (`key` != 0).
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = self.after(i);
        }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        if key == EMPTY {
            return self.zero.as_ref();
        }
        self.find(key).map(|i| &self.slots[i].1)
    }

    /// Start bringing `key`'s home slot, and the cache line after it, into cache without waiting
    /// for them (the CPU's prefetch instruction): issued for a batch of keys before working on
    /// any, their misses overlap. In a table two-thirds full a probe, and a removal's backward
    /// shift even more, often runs on past the home slot's line: reading the next one too made
    /// the index apply Dynamo's stream about 6 % faster (docs/benchmarks.md (a2)).
    #[inline]
    pub fn prefetch(&self, key: u64) {
        if !self.slots.is_empty() {
            let home = self.home(key);
            prefetch(&self.slots[home]);
            if let Some(next) = self.slots.get(home + Self::SLOTS_PER_LINE) {
                prefetch(next);
            }
        }
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, mutably.
    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == EMPTY {
            return self.zero.as_mut();
        }
        self.find(key).map(|i| &mut self.slots[i].1)
    }

    /// The value of `key`, inserting `value` first if the key is absent.
    #[inline]
    pub fn get_or_insert(&mut self, key: u64, value: V) -> &mut V {
        if key == EMPTY {
            return self.zero.get_or_insert(value);
        }
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return &mut self.slots[i].1;
            }
            if k == EMPTY {
                self.slots[i] = (key, value);
                self.len += 1;
                return &mut self.slots[i].1;
            }
            i = self.after(i);
        }
    }

    /// Insert `key` with `value` unless it is present (then its value stays); whether it was
    /// absent. One probe, where `contains_key` then an insert would take two.
    #[inline]
    pub fn insert_if_absent(&mut self, key: u64, value: V) -> bool {
        let len = self.len();
        self.get_or_insert(key, value);
        self.len() != len
    }

    /// Remove `key`, returning its value.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.zero.take();
        }
        let slot = self.find(key)?;
        let value = self.slots[slot].1;
        self.remove_slot(slot);
        Some(value)
    }

    /// Change the value of `key` with `update` and remove the key if `update` returns false, in
    /// one probe. Returns `update`'s answer, or `None` if the key is absent.
    #[inline]
    pub fn update_or_remove(
        &mut self,
        key: u64,
        update: impl FnOnce(&mut V) -> bool,
    ) -> Option<bool> {
        if key == EMPTY {
            let keep = update(self.zero.as_mut()?);
            if !keep {
                self.zero = None;
            }
            return Some(keep);
        }
        let slot = self.find(key)?;
        let keep = update(&mut self.slots[slot].1);
        if !keep {
            self.remove_slot(slot);
        }
        Some(keep)
    }

    fn remove_slot(&mut self, mut hole: usize) {
        // Backward shift: pull later keys of the probe run into the hole unless their home lies
        // cyclically after the hole (then moving them would put them before their home).
        // Whether a key moves is data the branch predictor cannot learn, so the move is written
        // without a branch: the hole takes either the key or its own entry back (the index
        // applies Dynamo's stream ~7 % faster for it: docs/benchmarks.md (a2)).
        let mut j = hole;
        loop {
            j = self.after(j);
            let entry = self.slots[j];
            if entry.0 == EMPTY {
                break;
            }
            let home = self.home(entry.0);
            let stays = if hole <= j {
                (hole < home) & (home <= j)
            } else {
                (hole < home) | (home <= j)
            };
            self.slots[hole] = std::hint::select_unpredictable(stays, self.slots[hole], entry);
            hole = std::hint::select_unpredictable(stays, hole, j);
        }
        self.slots[hole] = (EMPTY, V::default());
        self.len -= 1;
    }

    /// Keep only the entries for which `keep` returns true (it may change the value).
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        if let Some(v) = &mut self.zero
            && !keep(EMPTY, v)
        {
            self.zero = None;
        }
        let old = std::mem::take(&mut self.slots);
        let live = old.len();
        self.len = 0;
        self.slots = vec![(EMPTY, V::default()); live];
        for (key, mut value) in old {
            if key != EMPTY && keep(key, &mut value) {
                *self.get_or_insert(key, value) = value;
            }
        }
    }

    /// Every value, mutably, in no particular order: one pass over the table, no probes.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.zero.iter_mut().chain(
            self.slots
                .iter_mut()
                .filter(|(key, _)| *key != EMPTY)
                .map(|(_, value)| value),
        )
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.zero
            .map(|_| EMPTY)
            .into_iter()
            .chain(self.slots.iter().map(|s| s.0).filter(|&k| k != EMPTY))
    }

    /// Remove everything, keeping the allocation.
    pub fn clear(&mut self) {
        self.slots.fill((EMPTY, V::default()));
        self.len = 0;
        self.zero = None;
    }

    /// Heap bytes of the table.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<(u64, V)>()
    }

    #[cold]
    fn grow(&mut self) {
        // 2^k -> 1.5 * 2^k -> 2^(k+1): each step leaves the table at least half full.
        let len = self.slots.len();
        let slots = if len.is_power_of_two() {
            len / 2 * 3
        } else {
            len / 3 * 4
        }
        .max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, V::default()); slots]);
        for (key, value) in old {
            if key == EMPTY {
                continue;
            }
            let mut i = self.home(key);
            while self.slots[i].0 != EMPTY {
                i = self.after(i);
            }
            self.slots[i] = (key, value);
        }
    }
}

/// Ask the CPU to bring `value`'s cache line in, without waiting for it: issued for a batch of
/// table slots before working on any, their cache misses overlap. A plain load would not do: the
/// core cannot retire it, nor anything after it, until the line arrives, so a batch of them
/// stalls as long as the misses do. A no-op where the target has no stable prefetch intrinsic.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees, never faults, and `value` is a live
    // reference anyway; SSE is part of the x86_64 baseline.
    #[allow(
        unsafe_code,
        reason = "the prefetch intrinsic is unsafe to call, see SAFETY"
    )]
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Any sequence of inserts, updates and removals (keys from a small range, so runs collide
        /// and wrap, and key 0 included) leaves the same contents as `HashMap`.
        #[test]
        fn agrees_with_hashmap(ops in proptest::collection::vec((0u8..5, 0u64..200, any::<u32>()), 1..600)) {
            let mut map = U64Map::<u32>::new();
            let mut model = HashMap::<u64, u32>::new();
            for (op, key, value) in ops {
                // Spread some keys over the whole range; keep small ones to hit key 0.
                let key = if key % 3 == 0 { key } else { key.wrapping_mul(0xD6E8_FEB8_6659_FD93) };
                match op {
                    0 => {
                        let got = *map.get_or_insert(key, value);
                        let want = *model.entry(key).or_insert(value);
                        prop_assert_eq!(got, want);
                    }
                    1 => {
                        let absent = !model.contains_key(&key);
                        model.entry(key).or_insert(value);
                        prop_assert_eq!(map.insert_if_absent(key, value), absent);
                    }
                    2 => prop_assert_eq!(map.remove(key), model.remove(&key)),
                    3 => {
                        let flip = |v: &mut u32| {
                            *v ^= 1;
                            (*v).is_multiple_of(2)
                        };
                        let got = map.update_or_remove(key, flip);
                        let want = model.get_mut(&key).map(flip);
                        if want == Some(false) {
                            model.remove(&key);
                        }
                        prop_assert_eq!(got, want);
                    }
                    _ => {
                        map.retain(|k, v| { *v = v.wrapping_add(1); k % 2 == 0 });
                        model.retain(|k, v| { *v = v.wrapping_add(1); k % 2 == 0 });
                    }
                }
                prop_assert_eq!(map.len(), model.len());
            }
            for v in map.values_mut() {
                *v = v.wrapping_mul(3);
            }
            for v in model.values_mut() {
                *v = v.wrapping_mul(3);
            }
            for (&k, &v) in &model {
                prop_assert_eq!(map.get(k), Some(&v));
            }
            let mut keys: Vec<u64> = map.keys().collect();
            keys.sort_unstable();
            let mut want: Vec<u64> = model.keys().copied().collect();
            want.sort_unstable();
            prop_assert_eq!(keys, want);
        }
    }

    #[test]
    fn churn_does_not_grow_the_table() {
        let mut map = U64Map::<u64>::new();
        let mix = |i: u64| i.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        for i in 0..16_384 {
            map.get_or_insert(mix(i), i);
        }
        // 16,384 keys need more than 21,845 slots at a load of 3/4: 24,576, not 32,768.
        let bytes = map.heap_bytes();
        assert_eq!(bytes, 24_576 * std::mem::size_of::<(u64, u64)>());
        for i in 16_384..400_000 {
            map.get_or_insert(mix(i), i);
            assert_eq!(map.remove(mix(i - 16_384)), Some(i - 16_384));
        }
        assert_eq!(map.len(), 16_384);
        assert_eq!(map.heap_bytes(), bytes);
        for i in 400_000 - 16_384..400_000 {
            assert_eq!(map.get(mix(i)), Some(&i));
        }
    }
}
