//! The block manager's configuration, validated once (the sizing rule lives here).

use std::time::Duration;

use crate::error::KvbmError;
use crate::types::Tier;

/// One local tier's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierConfig {
    /// Blocks the tier holds.
    pub capacity_blocks: usize,
    /// Blocks that may be pinned at once; pins beyond it are clipped. Default: none.
    pub pin_budget_blocks: usize,
}

impl TierConfig {
    /// `capacity_blocks` blocks, no pins.
    pub fn blocks(capacity_blocks: usize) -> TierConfig {
        TierConfig {
            capacity_blocks,
            pin_budget_blocks: 0,
        }
    }

    /// The same tier with a pin budget.
    pub fn with_pin_budget(self, pin_budget_blocks: usize) -> TierConfig {
        TierConfig {
            pin_budget_blocks,
            ..self
        }
    }
}

/// Configuration of a [`crate::KvBlockManager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// Tokens per block.
    pub block_size_tokens: u32,
    /// Bytes of one block across all layers (K and V): what a transfer moves.
    pub block_bytes: u64,
    /// G1, the device tier.
    pub device: TierConfig,
    /// G2, host memory; `None`: no host tier.
    pub host: Option<TierConfig>,
    /// G3, local disk; needs a host tier above it.
    pub disk: Option<TierConfig>,
    /// Most blocks in one write-through batch (KVBM uses 8..64). Default 32.
    pub offload_batch_blocks: usize,
    /// Accesses a block needs before it is written to disk (protects SSD life). Default 2.
    pub disk_min_accesses: u8,
    /// How long a prefetch may take before its blocks are no longer wanted. Default 100 ms.
    pub prefetch_grace: Duration,
    /// Time to recompute one block; a tier whose measured load time per block is longer is
    /// bypassed for reads. `None`: never bypass.
    pub recompute_per_block: Option<Duration>,
}

impl ManagerConfig {
    /// A device-only manager of `device_blocks` blocks with the defaults.
    pub fn new(block_size_tokens: u32, block_bytes: u64, device_blocks: usize) -> ManagerConfig {
        ManagerConfig {
            block_size_tokens,
            block_bytes,
            device: TierConfig::blocks(device_blocks),
            host: None,
            disk: None,
            offload_batch_blocks: 32,
            disk_min_accesses: 2,
            prefetch_grace: Duration::from_millis(100),
            recompute_per_block: None,
        }
    }

    /// The tier's configuration, if configured.
    pub fn tier(&self, tier: Tier) -> Option<TierConfig> {
        match tier {
            Tier::Device => Some(self.device),
            Tier::Host => self.host,
            Tier::Disk => self.disk,
            Tier::Pool => None,
        }
    }

    /// Checks every value and the sizing rule: each tier holds at least as many blocks as the
    /// one above it (a smaller tier only churns), and a disk tier needs a host tier.
    pub fn validate(&self) -> Result<(), KvbmError> {
        if self.block_size_tokens == 0 {
            return Err(invalid("block_size_tokens", "must be at least 1"));
        }
        if self.block_bytes == 0 {
            return Err(invalid("block_bytes", "must be at least 1"));
        }
        if self.offload_batch_blocks == 0 {
            return Err(invalid("offload_batch_blocks", "must be at least 1"));
        }
        for tier in Tier::LOCAL {
            if let Some(config) = self.tier(tier) {
                if config.capacity_blocks == 0 {
                    return Err(invalid(
                        "capacity_blocks",
                        format!("tier {tier} has 0 blocks"),
                    ));
                }
                if config.pin_budget_blocks > config.capacity_blocks {
                    return Err(invalid(
                        "pin_budget_blocks",
                        format!(
                            "tier {tier}: budget {} exceeds the capacity {}",
                            config.pin_budget_blocks, config.capacity_blocks
                        ),
                    ));
                }
            }
        }
        if self.disk.is_some() && self.host.is_none() {
            return Err(invalid("disk", "a disk tier needs a host tier above it"));
        }
        let mut above = (Tier::Device, self.device.capacity_blocks);
        for tier in [Tier::Host, Tier::Disk] {
            if let Some(config) = self.tier(tier) {
                if config.capacity_blocks < above.1 {
                    return Err(KvbmError::TierSmallerThanAbove {
                        tier,
                        blocks: config.capacity_blocks,
                        above: above.0,
                        above_blocks: above.1,
                    });
                }
                above = (tier, config.capacity_blocks);
            }
        }
        Ok(())
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> KvbmError {
    KvbmError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_rule_is_enforced_with_a_clear_error() {
        let mut config = ManagerConfig::new(16, 1024, 100);
        config.host = Some(TierConfig::blocks(50));
        let error = config.validate().err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some(
                "tier g2 has 50 blocks, fewer than the 100 of tier g1 above it (each tier must \
                 hold at least as many blocks as the one above)"
            )
        );
        config.host = Some(TierConfig::blocks(200));
        config.disk = Some(TierConfig::blocks(150));
        assert!(matches!(
            config.validate(),
            Err(KvbmError::TierSmallerThanAbove {
                tier: Tier::Disk,
                ..
            })
        ));
        config.disk = Some(TierConfig::blocks(400));
        assert!(config.validate().is_ok());
    }

    #[test]
    fn disk_without_host_and_zero_sizes_are_refused() {
        let mut config = ManagerConfig::new(16, 1024, 10);
        config.disk = Some(TierConfig::blocks(100));
        assert!(config.validate().is_err());
        assert!(ManagerConfig::new(0, 1024, 10).validate().is_err());
        assert!(ManagerConfig::new(16, 1024, 0).validate().is_err());
        let mut pins = ManagerConfig::new(16, 1024, 10);
        pins.device = TierConfig::blocks(10).with_pin_budget(11);
        assert!(pins.validate().is_err());
    }
}
