//! How fast a rank gets through the prefill booked on it, learnt from the prefills whose end the
//! router saw (a first token, a stored event). Where nothing will tell the router that a
//! prefill ended (a rank without KV events, an answer the engine does not stream), it ends the
//! load at the time this pace predicts instead of at the end of the whole answer.
//!
//! A request booked behind `backlog` uncached prompt tokens (its own included) is taken to get
//! its first token `intercept + slope x backlog` seconds later: a line fitted to the heard ends.
//! The intercept holds what does not grow with the backlog (the engine's own queue, the decode
//! steps a chunked prefill shares); a line through the origin alone ended loads too late for
//! large backlogs (docs/benchmarks.md (k)).

use std::time::Duration;

/// Samples before the pace is trusted.
const MIN_SAMPLES: u32 = 3;
/// One prediction in this many is replaced by a stream, so that the pace keeps learning where
/// clients do not stream.
const RECALIBRATE_EVERY: u32 = 16;
/// Weight of the newest sample in the fit: each older one fades by `1 -` this, as the engine's
/// load drifts (an effective memory of about 8 samples).
const NEWEST_WEIGHT: f64 = 0.125;

/// One rank's learnt prefill pace: `seconds = intercept + slope x backlog`, fitted by least
/// squares over its samples, the older ones weighing less.
#[derive(Debug, Clone, Default)]
pub(super) struct PrefillPace {
    /// Exponentially weighted sums of the samples' weights, backlogs (x), seconds (y), x² and xy.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    samples: u32,
    /// Predictions made since the last sample or recalibration.
    predicted: u32,
}

impl PrefillPace {
    /// A prefill booked behind `backlog` tokens ended `elapsed` after its booking.
    pub(super) fn observe(&mut self, backlog: u64, elapsed: Duration) {
        if backlog == 0 {
            return; // nothing was prefilled: no pace to learn
        }
        let (x, y) = (backlog as f64, elapsed.as_secs_f64());
        let keep = 1.0 - NEWEST_WEIGHT;
        self.w = keep * self.w + 1.0;
        self.x = keep * self.x + x;
        self.y = keep * self.y + y;
        self.xx = keep * self.xx + x * x;
        self.xy = keep * self.xy + x * y;
        self.samples = self.samples.saturating_add(1);
        self.predicted = 0;
    }

    /// When a prefill booked now behind `backlog` tokens should end; `None` while the pace is
    /// unknown, or when it is time to hear a real end again (the caller then streams).
    pub(super) fn predict(&mut self, backlog: u64, now: Duration) -> Option<Duration> {
        if self.samples < MIN_SAMPLES || self.predicted + 1 >= RECALIBRATE_EVERY {
            self.predicted = 0;
            return None;
        }
        self.predicted += 1;
        let secs = self
            .seconds(backlog as f64)
            .min(Duration::MAX.as_secs_f64() / 2.0);
        Some(now.saturating_add(Duration::from_secs_f64(secs)))
    }

    /// The fitted line at `backlog`. Where the samples do not spread enough to fit a slope
    /// (the same backlog each time), or the fit slopes down or crosses zero above the origin
    /// (a prefill's cost growing faster than its length: small backlogs would end at once),
    /// the line goes through the origin and the samples' mean (their seconds per token,
    /// weighted by backlog).
    fn seconds(&self, backlog: f64) -> f64 {
        let (mean_x, mean_y) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mean_x * mean_x;
        let cov = self.xy / self.w - mean_x * mean_y;
        if var > (0.01 * mean_x).powi(2) && cov > 0.0 {
            let slope = cov / var;
            let intercept = mean_y - slope * mean_x;
            if intercept >= 0.0 {
                return intercept + slope * backlog;
            }
        }
        backlog * mean_y / mean_x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The prediction, to the microsecond (the pace is a float).
    fn predicted_us(pace: &mut PrefillPace, backlog: u64, now: Duration) -> Option<u128> {
        pace.predict(backlog, now)
            .map(|at| (at.as_nanos() + 500) / 1_000)
    }

    #[test]
    fn it_predicts_after_enough_samples_and_recalibrates_now_and_then() {
        let mut pace = PrefillPace::default();
        for _ in 0..MIN_SAMPLES - 1 {
            pace.observe(1_000, ms(100));
            assert_eq!(pace.predict(1_000, ms(0)), None);
        }
        // A fully cached prompt teaches nothing.
        pace.observe(0, ms(50));
        assert_eq!(pace.predict(1_000, ms(0)), None);
        pace.observe(1_000, ms(100));
        // One backlog only: 0.1 ms a token, so 200 ms behind 2,000 tokens.
        assert_eq!(predicted_us(&mut pace, 2_000, ms(10)), Some(210_000));
        let predictions = (0..RECALIBRATE_EVERY * 2)
            .map(|_| pace.predict(1_000, ms(0)))
            .collect::<Vec<_>>();
        let streamed = predictions.iter().filter(|p| p.is_none()).count();
        assert_eq!(streamed, 2, "{predictions:?}");
    }

    #[test]
    fn a_fixed_delay_and_a_pace_per_token_are_told_apart() {
        // 50 ms whatever the backlog (the engine's queue, a decode step), then 0.1 ms a token.
        let mut pace = PrefillPace::default();
        for backlog in [1_000, 3_000, 2_000] {
            pace.observe(backlog, ms(50) + Duration::from_micros(100 * backlog));
        }
        assert_eq!(predicted_us(&mut pace, 5_000, ms(0)), Some(550_000));
        assert_eq!(predicted_us(&mut pace, 0, ms(0)), Some(50_000));

        // Samples that slope down fit no line: the pace goes through the origin.
        let mut pace = PrefillPace::default();
        for (backlog, elapsed) in [(1_000, 300), (3_000, 100), (2_000, 200)] {
            pace.observe(backlog, ms(elapsed));
        }
        assert_eq!(pace.predict(0, ms(7)), Some(ms(7)));
        assert!(pace.predict(2_000, ms(0)).is_some_and(|at| at > ms(100)));

        // Nor do samples whose line would cross zero above the origin (a cost growing faster
        // than the backlog): a small prefill is not taken as done at once.
        let mut pace = PrefillPace::default();
        for (backlog, elapsed) in [(1_000, 10), (2_000, 100), (3_000, 190)] {
            pace.observe(backlog, ms(elapsed));
        }
        let small = predicted_us(&mut pace, 500, ms(0)).expect("a prediction");
        assert!(small > 10_000, "{small} us");
    }
}
