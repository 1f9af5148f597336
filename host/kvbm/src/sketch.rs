//! A count-min frequency sketch with aging (TinyLFU): 4 rows of 4-bit counters, halved every
//! `10 x capacity` increments, so old popularity fades.

use crate::types::SequenceHash;

const ROWS: usize = 4;
const MAX_COUNT: u8 = 15;
const SEEDS: [u64; ROWS] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x27D4_EB2F_1656_67C5,
];

/// Approximate access counts by sequence hash, in a fixed amount of memory.
#[derive(Debug, Clone)]
pub struct FrequencySketch {
    counters: Vec<u8>,
    mask: usize,
    increments: u64,
    reset_after: u64,
}

impl FrequencySketch {
    /// A sketch sized for a cache of `capacity` blocks.
    pub fn new(capacity: usize) -> FrequencySketch {
        let width = capacity.max(16).next_power_of_two();
        FrequencySketch {
            counters: vec![0; width * ROWS],
            mask: width - 1,
            increments: 0,
            reset_after: 10 * width as u64,
        }
    }

    fn cell(&self, hash: SequenceHash, row: usize) -> usize {
        let mixed = (hash.0 ^ SEEDS[row]).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        row * (self.mask + 1) + ((mixed >> 29) as usize & self.mask)
    }

    /// Count one access.
    pub fn record(&mut self, hash: SequenceHash) {
        for row in 0..ROWS {
            let cell = self.cell(hash, row);
            if self.counters[cell] < MAX_COUNT {
                self.counters[cell] += 1;
            }
        }
        self.increments += 1;
        if self.increments >= self.reset_after {
            for counter in &mut self.counters {
                *counter /= 2;
            }
            self.increments = 0;
        }
    }

    /// The estimated count (never below the true count since the last aging step).
    pub fn estimate(&self, hash: SequenceHash) -> u8 {
        (0..ROWS)
            .map(|row| self.counters[self.cell(hash, row)])
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ages() {
        let mut sketch = FrequencySketch::new(16);
        let hot = SequenceHash(42);
        for _ in 0..6 {
            sketch.record(hot);
        }
        assert_eq!(sketch.estimate(hot), 6);
        assert_eq!(sketch.estimate(SequenceHash(7)), 0);
        // 10 x width increments in all halve every counter.
        for _ in 6..(10 * 16) {
            sketch.record(SequenceHash(7));
        }
        assert_eq!(sketch.estimate(hot), 3);
    }
}
