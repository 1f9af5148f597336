//! A client key's tokens per minute (`[[server.api_keys]] tokens_per_minute`).
//!
//! A token bucket that may go into debt: a request is let in while the bucket holds any tokens,
//! and is charged what it really used (its prompt once tokenized, its completion when it ends),
//! since neither is known when it arrives. A key that overdraws waits until the refill pays the
//! debt back, so over any minute a key uses at most its limit plus one request's tokens.
//! (`governor`'s GCRA needs the cost up front, which is why this is not it.)

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One key's budget, shared by its requests and kept across a reload.
#[derive(Debug)]
pub(crate) struct KeyTokens {
    per_minute: u64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Tokens left; below zero, the debt the refill pays back first.
    tokens: f64,
    at: Instant,
}

impl KeyTokens {
    /// A full bucket of `per_minute` tokens (at least one).
    pub(crate) fn new(per_minute: u64, now: Instant) -> Self {
        let per_minute = per_minute.max(1);
        Self {
            per_minute,
            state: Mutex::new(Bucket {
                tokens: per_minute as f64,
                at: now,
            }),
        }
    }

    /// The configured limit.
    pub(crate) fn per_minute(&self) -> u64 {
        self.per_minute
    }

    /// `Ok` while the bucket holds tokens; otherwise how long until it does.
    pub(crate) fn admit(&self, now: Instant) -> Result<(), Duration> {
        let tokens = self.refilled(now).tokens;
        if tokens > 0.0 {
            return Ok(());
        }
        // Until the debt is paid and one token more earned.
        let per_second = self.per_minute as f64 / 60.0;
        let wait = (1.0 - tokens) / per_second;
        // A debt beyond what a `Duration` holds waits "forever", never panics.
        Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::MAX))
    }

    /// Takes `tokens` the key used (into debt if need be).
    pub(crate) fn charge(&self, tokens: u64, now: Instant) {
        let mut bucket = self.refilled(now);
        bucket.tokens -= tokens as f64;
    }

    /// The bucket, topped up for the time since it was last looked at (never past full).
    fn refilled(&self, now: Instant) -> std::sync::MutexGuard<'_, Bucket> {
        let mut bucket = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        let full = self.per_minute as f64;
        bucket.tokens = (bucket.tokens + elapsed * full / 60.0).min(full);
        bucket.at = bucket.at.max(now);
        bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_let_in_until_it_overdraws_then_waits_for_the_refill_to_pay_the_debt() {
        let t0 = Instant::now();
        let budget = KeyTokens::new(600, t0); // 10 tokens a second
        assert_eq!(budget.admit(t0), Ok(()));
        budget.charge(500, t0);
        assert_eq!(budget.admit(t0), Ok(()), "100 tokens are left");
        // A long completion overdraws: 100 - 150 = -50.
        budget.charge(150, t0);
        let wait = budget.admit(t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs_f64(5.1), "51 tokens at 10/s");
        assert!(budget.admit(t0 + Duration::from_secs(5)).is_err());
        assert_eq!(budget.admit(t0 + Duration::from_millis(5_200)), Ok(()));
    }

    #[test]
    fn the_bucket_never_fills_past_one_minute_of_tokens() {
        let t0 = Instant::now();
        let budget = KeyTokens::new(60, t0);
        // An hour idle earns no more than the limit.
        let later = t0 + Duration::from_secs(3_600);
        budget.charge(60, later);
        assert!(budget.admit(later).is_err());
        assert_eq!(budget.admit(later + Duration::from_secs(2)), Ok(()));
    }

    #[test]
    fn a_debt_too_large_for_a_duration_is_a_wait_not_a_panic() {
        let t0 = Instant::now();
        let budget = KeyTokens::new(1, t0);
        for _ in 0..4 {
            budget.charge(u64::MAX, t0);
        }
        assert_eq!(budget.admit(t0), Err(Duration::MAX));
    }

    #[test]
    fn a_clock_read_out_of_order_does_not_refill_twice() {
        let t0 = Instant::now();
        let budget = KeyTokens::new(60, t0);
        let t1 = t0 + Duration::from_secs(10);
        budget.charge(70, t1); // full 60 - 70 = -10
        // A request that read the clock earlier charges later: no refill, no panic.
        budget.charge(0, t0);
        assert_eq!(budget.admit(t1), Err(Duration::from_secs(11)));
    }
}
