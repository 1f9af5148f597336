//! The engine's disk tier (G3), behind the host tier: what the host evicts is written to disk
//! instead of dropped, and a prefix found only there is loaded straight into the device at the
//! disk's bandwidth (vLLM's and the block manager's G2 -> G3 demotion).
//!
//! Bookkeeping on a `switchyard-kvbm` [`BlockPool`] like the host's; the bytes are the driver's
//! (every demotion and load is a [`KvTransfer::Copy`]).

use super::{CacheEvent, DEFAULT_BLOCK_BYTES, KvTransfer, Resident, TierStats, transfer_time};
use crate::worker::Tier;
use rustc_hash::FxHashMap;
use std::time::Duration;
use switchyard_kvbm::pool::{BlockPool, ImmutableBlock};
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::{SequenceHash, Tick, Tier as KvbmTier};

/// Disk-to-device bandwidth of a load by default: one NVMe Gen4 SSD's sequential read
/// (~7 GB/s) less file-system overhead.
pub const DEFAULT_DISK_BANDWIDTH: f64 = 5e9;

/// A disk tier behind the host tier.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskTierConfig {
    /// Blocks the disk tier holds.
    pub num_blocks: usize,
    /// Bytes of one KV block across layers; must equal the host tier's. Default
    /// [`DEFAULT_BLOCK_BYTES`].
    pub block_bytes: u64,
    /// Disk-to-device bandwidth of a load, in bytes per second; the load time of a disk hit is
    /// added to the step that admits the request. Default [`DEFAULT_DISK_BANDWIDTH`].
    pub bandwidth_bytes_per_s: f64,
}

impl DiskTierConfig {
    /// A disk tier of `num_blocks` blocks with the default block size and bandwidth.
    pub fn blocks(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            block_bytes: DEFAULT_BLOCK_BYTES,
            bandwidth_bytes_per_s: DEFAULT_DISK_BANDWIDTH,
        }
    }

    /// Time to load `blocks` blocks into the device.
    pub fn load_time(&self, blocks: usize) -> Duration {
        transfer_time(blocks, self.block_bytes, self.bandwidth_bytes_per_s)
    }

    pub(crate) fn validate(&self, host_block_bytes: Option<u64>) -> Result<(), &'static str> {
        let Some(host_block_bytes) = host_block_bytes else {
            return Err("a disk tier needs a host tier (it holds what the host evicts)");
        };
        if self.num_blocks == 0 || self.num_blocks >= u32::MAX as usize {
            return Err("disk tier num_blocks must be between 1 and 2^32 - 2");
        }
        if self.block_bytes != host_block_bytes {
            return Err("disk tier block_bytes must equal the host tier's");
        }
        if !(self.bandwidth_bytes_per_s.is_finite() && self.bandwidth_bytes_per_s > 0.0) {
            return Err("disk tier bandwidth must be positive and finite");
        }
        Ok(())
    }
}

/// A block leaving the host tier, with what the disk needs to describe it.
#[derive(Debug)]
pub(crate) struct Demoted {
    pub(crate) hash: u64,
    pub(crate) parent: Option<u64>,
    pub(crate) token_ids: Vec<u32>,
    /// Where its bytes are: the host slot it still occupies until the host's next write, or
    /// the device slot a demote hint writes it from.
    pub(crate) from: (Tier, u32),
}

/// The disk tier's state.
#[derive(Debug)]
pub(crate) struct DiskTier {
    config: DiskTierConfig,
    pool: BlockPool,
    stats: TierStats,
    /// Each disk block's slot, parent and tokens, so that a prefetch can describe what it
    /// loads.
    resident: FxHashMap<u64, Resident>,
}

// === impl DiskTier ===

impl DiskTier {
    pub(crate) fn new(config: DiskTierConfig) -> Self {
        Self {
            pool: new_pool(config.num_blocks),
            stats: TierStats {
                disk_capacity_blocks: config.num_blocks,
                ..TierStats::default()
            },
            config,
            resident: FxHashMap::default(),
        }
    }

    pub(crate) fn stats(&self) -> TierStats {
        TierStats {
            disk_blocks: self.pool.registered(),
            disk_evictions: self.pool.counters().evictions,
            ..self.stats
        }
    }

    /// How many leading blocks of `hashes` the disk holds (touching nothing).
    pub(crate) fn held_run(&self, hashes: &[u64]) -> usize {
        super::held(&self.pool, hashes)
    }

    /// The leading run of `hashes` the disk holds, held until loaded.
    pub(crate) fn lookup(&self, hashes: &[u64], now: Tick) -> Vec<ImmutableBlock> {
        super::leading_run(&self.pool, hashes, now)
    }

    /// Account for loading `blocks` and return the time it takes.
    pub(crate) fn charge_onboard(&mut self, blocks: usize, block_size: usize) -> Duration {
        let time = self.config.load_time(blocks);
        self.stats.disk_onboarded_blocks += blocks as u64;
        self.stats.disk_onboarded_bytes += blocks as u64 * self.config.block_bytes;
        self.stats.disk_hit_tokens += (blocks * block_size) as u64;
        self.stats.disk_onboard_time += time;
        time
    }

    /// Write a block the host evicted to disk (skipped if the disk has it: it is only touched),
    /// before the host reuses its slot.
    pub(crate) fn demote(
        &mut self,
        block: Demoted,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) {
        // Nothing holds a disk block between steps but a load in progress: there is room.
        let slot = self.pool.store(
            SequenceHash(block.hash),
            block.parent.map(SequenceHash),
            Retention::DEFAULT,
            now,
        );
        self.removals(events);
        let Some(slot) = slot else {
            return;
        };
        let resident = Resident {
            slot: slot.0,
            parent: block.parent,
            token_ids: block.token_ids.clone(),
        };
        self.resident.insert(block.hash, resident);
        transfers.push(KvTransfer::Copy {
            hash: block.hash,
            from: block.from,
            to: (Tier::Disk, slot.0),
        });
        self.stats.disk_stored_blocks += 1;
        self.stats.disk_stored_bytes += self.config.block_bytes;
        events.push(CacheEvent::Stored {
            tier: Tier::Disk,
            hashes: vec![block.hash],
            parent: block.parent,
            token_ids: block.token_ids,
        });
    }

    /// Drop everything (the engine's prefix cache reset).
    pub(crate) fn reset(&mut self) {
        self.pool = new_pool(self.config.num_blocks);
        self.resident.clear();
    }

    /// Whether the disk holds `hash`.
    pub(crate) fn holds(&self, hash: u64) -> bool {
        self.pool.contains(SequenceHash(hash))
    }

    /// The block `hash`, marked as just used, if the disk holds it.
    pub(crate) fn find(&self, hash: u64, now: Tick) -> Option<&Resident> {
        if !self.pool.touch(SequenceHash(hash), now) {
            return None;
        }
        self.resident.get(&hash)
    }

    /// Time to load `blocks` blocks from disk into the device.
    pub(crate) fn load_time(&self, blocks: usize) -> Duration {
        self.config.load_time(blocks)
    }

    /// Replace the retention of `hash`; `false` if the disk does not hold it.
    pub(crate) fn set_retention(&self, hash: u64, retention: Retention, now: Tick) -> bool {
        self.pool.set_retention(SequenceHash(hash), retention, now)
    }

    /// Drop the disk copy of `hash` (a removal event); `false` if there is none.
    pub(crate) fn drop_block(&mut self, hash: u64, events: &mut Vec<CacheEvent>) -> bool {
        let dropped = self.pool.invalidate(SequenceHash(hash));
        self.removals(events);
        dropped
    }

    /// Report what the disk evicted or dropped since the last call, and forget it.
    fn removals(&mut self, events: &mut Vec<CacheEvent>) {
        let removed = self.pool.drain_removed();
        if removed.is_empty() {
            return;
        }
        for hash in &removed {
            self.resident.remove(&hash.0);
        }
        events.push(CacheEvent::Removed {
            tier: Tier::Disk,
            hashes: removed.into_iter().map(|h| h.0).collect(),
        });
    }
}

fn new_pool(num_blocks: usize) -> BlockPool {
    // `validate` keeps the size in range, no pin budget is asked for: this cannot fail.
    BlockPool::new(KvbmTier::Disk, num_blocks, 0).expect("validated disk tier size")
}
