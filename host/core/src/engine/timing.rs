//! How long one engine step takes (agentic-serving.md section 6).

use std::time::Duration;

/// Step time of a simulated engine, fitted per model and GPU; the default is the reference fit.
///
/// A step is one forward pass. With chunked prefill a pass may carry prefill chunks and decodes at
/// once; it then costs the prefill time *plus* the decode time: the prefill's matmuls and the
/// decodes' KV reads do not overlap much, and the sum keeps a mixed pass dearer than either part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// `[a, b, c]` of `prefill_ms = a*T^2 + b*T + c`, T = uncached tokens computed in the pass.
    pub prefill: [f64; 3],
    /// `[a, b, c]` of `decode_ms = a*u^2 + b*u + c`, u = KV tokens of running requests / capacity.
    pub decode: [f64; 3],
    /// Least time of a decode step, in milliseconds.
    pub min_decode_ms: f64,
}

impl Default for StepTiming {
    fn default() -> Self {
        Self {
            prefill: [4.21e-7, 0.01518, 16.5],
            decode: [-25.74, 54.01, 5.74],
            min_decode_ms: 1.0,
        }
    }
}

// === impl StepTiming ===

impl StepTiming {
    /// Milliseconds to prefill `tokens` uncached tokens in one pass.
    pub fn prefill_ms(&self, tokens: usize) -> f64 {
        let t = tokens as f64;
        let [a, b, c] = self.prefill;
        a * t * t + b * t + c
    }

    /// Milliseconds of one decode step at KV usage `usage` (0..=1).
    pub fn decode_ms(&self, usage: f64) -> f64 {
        let [a, b, c] = self.decode;
        (a * usage * usage + b * usage + c).max(self.min_decode_ms)
    }

    /// Duration of a pass computing `prefill_tokens` prompt tokens and, if `decoding`, one token
    /// of each decoding request at KV usage `usage`. An empty pass takes no time.
    pub fn step(&self, prefill_tokens: usize, decoding: bool, usage: f64) -> Duration {
        let prefill = if prefill_tokens > 0 {
            self.prefill_ms(prefill_tokens)
        } else {
            0.0
        };
        let decode = if decoding { self.decode_ms(usage) } else { 0.0 };
        Duration::from_secs_f64((prefill + decode).max(0.0) / 1000.0)
    }
}
