//! How long an unscripted answer is: a model stops on its own long before most output limits, so
//! the mock draws each answer's natural length from a log-normal distribution (the shape of
//! measured chat and agent output lengths) and ends with `stop` when that comes first.

use switchyard_core::hash::token_bytes;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The distribution of natural answer lengths, in tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnswerLength {
    /// The median answer length. Default 160 tokens.
    pub median_tokens: u32,
    /// The spread: the standard deviation of the length's natural logarithm. 0 answers exactly
    /// `median_tokens` every time. Default 0.8 (a tenth of answers are under 57 tokens, a
    /// tenth over 445).
    pub sigma: f64,
}

impl Default for AnswerLength {
    fn default() -> Self {
        Self {
            median_tokens: 160,
            sigma: 0.8,
        }
    }
}

impl AnswerLength {
    /// The natural length of the answer to `prompt`: the same prompt always gets the same length
    /// (retries and replays are reproducible), at least 1 token.
    pub fn draw(&self, prompt: &[u32]) -> u32 {
        let bytes = token_bytes(prompt);
        // Two independent uniforms in (0, 1), for a Box-Muller standard normal.
        let unit = |seed: u64| (xxh3_64_with_seed(&bytes, seed) >> 11) as f64 / (1u64 << 53) as f64;
        let (u1, u2) = (unit(1).max(f64::MIN_POSITIVE), unit(2));
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let length = f64::from(self.median_tokens.max(1)) * (self.sigma.max(0.0) * normal).exp();
        length.round().clamp(1.0, f64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_reproducible_and_spread_around_the_median() {
        let lengths = AnswerLength::default();
        let drawn: Vec<u32> = (0..2000u32)
            .map(|i| lengths.draw(&[i, i.wrapping_mul(7), 42]))
            .collect();
        assert_eq!(drawn[17], lengths.draw(&[17, 119, 42]));
        let mut sorted = drawn.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        assert!((130..=195).contains(&median), "median {median}");
        assert!(
            sorted[0] >= 1
                && sorted[sorted.len() / 10] < 100
                && sorted[sorted.len() * 9 / 10] > 280
        );
        let fixed = AnswerLength {
            median_tokens: 40,
            sigma: 0.0,
        };
        assert!(drawn.iter().take(50).all(|_| fixed.draw(&[1, 2, 3]) == 40));
    }
}
