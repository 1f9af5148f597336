//! Retention: how long a block deserves to stay. Soft priority with lazy decay (TensorRT-LLM's
//! token-range shape), ephemeral blocks, and the outcome of a bounded pin.

use std::time::Duration;

use crate::error::KvbmError;
use crate::types::Tick;

/// The priority of a block nobody tagged (TensorRT-LLM's default).
pub const DEFAULT_PRIORITY: u8 = 35;
/// The highest priority.
pub const MAX_PRIORITY: u8 = 100;

/// A block's retention: a priority in 0..=100 (lower is evicted first) that returns to
/// [`DEFAULT_PRIORITY`] at `until`, or an ephemeral mark (evicted before anything else, never
/// written through). Retention is an attachment of the block: it travels with it across tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    priority: u8,
    until: Option<Tick>,
    ephemeral: bool,
}

impl Default for Retention {
    fn default() -> Self {
        Retention::DEFAULT
    }
}

impl Retention {
    /// Untagged: the default priority, forever.
    pub const DEFAULT: Retention = Retention {
        priority: DEFAULT_PRIORITY,
        until: None,
        ephemeral: false,
    };

    /// `priority` until `until` (`None`: for good), then the default.
    pub fn new(priority: u8, until: Option<Tick>) -> Result<Retention, KvbmError> {
        if priority > MAX_PRIORITY {
            return Err(KvbmError::PriorityOutOfRange { priority });
        }
        Ok(Retention {
            priority,
            until,
            ephemeral: false,
        })
    }

    /// `priority` for `duration` from `now` (`None`: for good).
    pub fn for_duration(
        priority: u8,
        duration: Option<Duration>,
        now: Tick,
    ) -> Result<Retention, KvbmError> {
        Retention::new(priority, duration.map(|d| now.after(d)))
    }

    /// Ephemeral: evicted first and never written through (thinking tokens once the reasoning
    /// loop closed, a finished subagent).
    pub const fn ephemeral() -> Retention {
        Retention {
            priority: 0,
            until: None,
            ephemeral: true,
        }
    }

    /// Whether the block is ephemeral.
    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral
    }

    /// The priority as declared, before decay.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// When the priority returns to the default.
    pub fn until(&self) -> Option<Tick> {
        self.until
    }

    /// The priority at `now`: the declared one until it expires, then the default.
    pub fn effective_priority(&self, now: Tick) -> u8 {
        match self.until {
            Some(until) if now >= until => DEFAULT_PRIORITY,
            _ => self.priority,
        }
    }

    /// The retention as it stands at `now` (expired ones become the default).
    pub fn at(&self, now: Tick) -> Retention {
        if self.ephemeral {
            return *self;
        }
        match self.until {
            Some(until) if now >= until => Retention::DEFAULT,
            _ => *self,
        }
    }

    /// Whether this differs from an untagged block at `now`.
    pub fn is_tagged_at(&self, now: Tick) -> bool {
        self.at(now) != Retention::DEFAULT
    }

    /// Two users of one block: the block keeps the stronger claim (a shared prefix takes the
    /// max; it is ephemeral only if both are).
    pub fn merge(self, other: Retention, now: Tick) -> Retention {
        let (a, b) = (self.at(now), other.at(now));
        match (a.ephemeral, b.ephemeral) {
            (true, true) => a,
            (true, false) => b,
            (false, true) => a,
            (false, false) => {
                if a.priority > b.priority {
                    a
                } else if b.priority > a.priority {
                    b
                } else {
                    // Same priority: the longer lease wins (`None` is forever).
                    let until = match (a.until, b.until) {
                        (None, _) | (_, None) => None,
                        (Some(x), Some(y)) => Some(x.max(y)),
                    };
                    Retention { until, ..a }
                }
            }
        }
    }
}

/// A request's retention for a range of its tokens (TensorRT-LLM `TokenRangeRetentionConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRangeRetention {
    /// First token of the range.
    pub token_start: u64,
    /// One past the last token; `None`: to the end of the request.
    pub token_end: Option<u64>,
    /// Priority 0..=100 of every block the range touches.
    pub priority: u8,
    /// How long the priority holds before it returns to the default; `None`: for good.
    pub duration: Option<Duration>,
}

/// The retention of each of a request's `block_count` blocks of `block_size` tokens: a range
/// covers every block it touches, overlapping ranges keep the stronger claim, untouched blocks
/// are untagged.
pub fn block_retentions(
    ranges: &[TokenRangeRetention],
    block_size: u32,
    block_count: usize,
    now: Tick,
) -> Result<Vec<Retention>, KvbmError> {
    if block_size == 0 {
        return Err(KvbmError::InvalidConfig {
            field: "block_size",
            reason: "must be at least 1 token".into(),
        });
    }
    let mut out = vec![Retention::DEFAULT; block_count];
    let block_size = u64::from(block_size);
    for range in ranges {
        let retention = Retention::for_duration(range.priority, range.duration, now)?;
        if let Some(end) = range.token_end
            && end <= range.token_start
        {
            return Err(KvbmError::BadTokenRange {
                start: range.token_start,
                end,
            });
        }
        let first = usize::try_from(range.token_start / block_size).unwrap_or(usize::MAX);
        let last = match range.token_end {
            // The block holding token end-1 is the last one touched.
            Some(end) => usize::try_from((end - 1) / block_size).unwrap_or(usize::MAX),
            None => usize::MAX,
        };
        for (index, slot) in out.iter_mut().enumerate() {
            if index >= first && index <= last {
                // A range sets the priority it names, overriding the default even when lower.
                *slot = if *slot == Retention::DEFAULT {
                    retention
                } else {
                    slot.merge(retention, now)
                };
            }
        }
    }
    Ok(out)
}

/// The answer to a pin request: how many blocks were pinned and how many the budget clipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinOutcome {
    /// Blocks pinned (or whose pin was extended).
    pub accepted: usize,
    /// Blocks refused because the tier's pin budget was spent.
    pub clipped: usize,
    /// Named blocks that are not in the tier.
    pub missing: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_block_they_touch() -> Result<(), KvbmError> {
        let ranges = [TokenRangeRetention {
            token_start: 5,
            token_end: Some(17),
            priority: 90,
            duration: Some(Duration::from_secs(1)),
        }];
        let out = block_retentions(&ranges, 4, 6, Tick(0))?;
        let priorities: Vec<u8> = out.iter().map(|r| r.effective_priority(Tick(0))).collect();
        assert_eq!(priorities, vec![35, 90, 90, 90, 90, 35]);
        assert_eq!(
            out[1].effective_priority(Tick(1_000_000_000)),
            DEFAULT_PRIORITY
        );
        Ok(())
    }

    #[test]
    fn open_range_and_low_priority() -> Result<(), KvbmError> {
        let ranges = [TokenRangeRetention {
            token_start: 8,
            token_end: None,
            priority: 0,
            duration: None,
        }];
        let out = block_retentions(&ranges, 4, 4, Tick(0))?;
        let priorities: Vec<u8> = out.iter().map(|r| r.priority()).collect();
        assert_eq!(priorities, vec![35, 35, 0, 0]);
        Ok(())
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(Retention::new(101, None).is_err());
        let reversed = [TokenRangeRetention {
            token_start: 8,
            token_end: Some(8),
            priority: 50,
            duration: None,
        }];
        assert!(block_retentions(&reversed, 4, 4, Tick(0)).is_err());
        assert!(block_retentions(&[], 0, 4, Tick(0)).is_err());
    }

    #[test]
    fn merge_keeps_the_stronger_claim() -> Result<(), KvbmError> {
        let now = Tick(10);
        let high = Retention::new(80, Some(Tick(100)))?;
        assert_eq!(Retention::ephemeral().merge(high, now), high);
        assert_eq!(Retention::DEFAULT.merge(high, now), high);
        // Expired claims no longer count.
        assert_eq!(
            high.merge(Retention::DEFAULT, Tick(200)),
            Retention::DEFAULT
        );
        Ok(())
    }
}
