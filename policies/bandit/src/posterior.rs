//! Per-worker TTFT beliefs: an exponentially forgetting mean and variance.

use crate::rng::SplitMix64;

/// Weight of each older observation relative to the next: engines' speed drifts with load, so
/// old evidence fades (an effective memory of ~50 observations).
const FORGET: f64 = 0.98;
/// Pseudo-observations the pool prior is worth in a worker's posterior.
const PRIOR_WEIGHT: f64 = 1.0;
/// A draw is never below this fraction of the posterior mean (TTFT is positive).
const MIN_DRAW_FRACTION: f64 = 0.05;

/// Running (forgetting) estimate of a TTFT distribution.
#[derive(Debug, Clone, Default)]
pub(crate) struct Posterior {
    weight: f64,
    mean: f64,
    m2: f64,
}

impl Posterior {
    /// Folds in one TTFT observation (a weighted Welford update).
    pub(crate) fn update(&mut self, x: f64) {
        self.weight = self.weight * FORGET + 1.0;
        self.m2 *= FORGET;
        let delta = x - self.mean;
        self.mean += delta / self.weight;
        self.m2 += delta * (x - self.mean);
    }

    pub(crate) fn weight(&self) -> f64 {
        self.weight
    }

    pub(crate) fn mean(&self) -> f64 {
        self.mean
    }

    pub(crate) fn mean_or(&self, default: f64) -> f64 {
        if self.weight > 0.0 {
            self.mean
        } else {
            default
        }
    }

    fn variance_or(&self, default: f64) -> f64 {
        if self.weight > 1.0 {
            self.m2 / self.weight
        } else {
            default
        }
    }

    /// One Thompson draw of a worker's mean TTFT: its own evidence (`arm`, if any) blended with
    /// `PRIOR_WEIGHT` pseudo-observations of the pool; the spread shrinks as evidence grows.
    pub(crate) fn sample(arm: Option<&Self>, pool: &Self, rng: &mut SplitMix64) -> f64 {
        let prior_mean = pool.mean_or(1.0);
        // Unknown pool spread: as wide as the mean itself. Floor it so a constant pool still
        // explores a little.
        let spread = pool
            .variance_or(prior_mean * prior_mean)
            .max((0.1 * prior_mean).powi(2));
        let (weight, sum) = arm.map_or((0.0, 0.0), |a| (a.weight, a.weight * a.mean));
        let weight = weight + PRIOR_WEIGHT;
        let mean = (sum + PRIOR_WEIGHT * prior_mean) / weight;
        let draw = mean + (spread / weight).sqrt() * rng.normal();
        draw.max(MIN_DRAW_FRACTION * mean.abs())
    }
}
