//! The engine's host tier (G2): where device blocks are written through, and where a prefix
//! the device lost is loaded back from instead of recomputed (kv-cache.md, vLLM's CPU offload).
//!
//! The bookkeeping is `switchyard-kvbm`'s [`BlockPool`] (its pure logic, built without the
//! `storage` feature): registry by sequence hash, leaf-first retention-aware eviction and the
//! removal log are the block manager's, not a copy. The device side stays the engine's
//! [`KvCache`](super::KvCache), whose reservation scheduling the model is built on.
//!
//! Movement is data: every write-through and onboard is a [`KvTransfer`] of the step, in order,
//! so a driver with real slabs (the mock engine) moves the bytes and one without (the simulator)
//! only charges the time.

use super::cache::{CacheEvent, StoredBlock};
use crate::worker::Tier;
use std::time::Duration;
use switchyard_kvbm::pool::{BlockPool, ImmutableBlock};
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::{SequenceHash, Tick, Tier as KvbmTier};

/// Bytes of one 16-token KV block of a Llama-3-8B-class model in bf16
/// (32 layers x K and V x 8 heads x 128 dims x 2 bytes x 16 tokens).
pub const DEFAULT_BLOCK_BYTES: u64 = 2 << 20;

/// Host-to-device bandwidth an onboard achieves by default: half of PCIe Gen5's ~50 GB/s one
/// way, for pageable copies and batching losses (kv-cache.md).
pub const DEFAULT_HOST_BANDWIDTH: f64 = 25e9;

/// A host-memory tier behind the device cache.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTierConfig {
    /// Blocks the host tier holds. At least the device's (the block manager's sizing rule:
    /// every device block is written through, so a smaller tier would only churn).
    pub num_blocks: usize,
    /// Bytes of one KV block across layers: what an onboard moves, and what the mock engine's
    /// slabs hold per block. Default [`DEFAULT_BLOCK_BYTES`].
    pub block_bytes: u64,
    /// Host-to-device bandwidth of onboarding, in bytes per second; the load time of a hit is
    /// added to the step that admits the request. Default [`DEFAULT_HOST_BANDWIDTH`].
    pub bandwidth_bytes_per_s: f64,
}

impl HostTierConfig {
    /// A host tier of `num_blocks` blocks with the default block size and bandwidth.
    pub fn blocks(num_blocks: usize) -> Self {
        Self {
            num_blocks,
            block_bytes: DEFAULT_BLOCK_BYTES,
            bandwidth_bytes_per_s: DEFAULT_HOST_BANDWIDTH,
        }
    }

    /// Time to load `blocks` blocks into the device.
    pub fn load_time(&self, blocks: usize) -> Duration {
        Duration::from_secs_f64(
            blocks as f64 * self.block_bytes as f64 / self.bandwidth_bytes_per_s,
        )
    }

    pub(crate) fn validate(&self, device_blocks: usize) -> Result<(), &'static str> {
        if self.num_blocks < device_blocks || self.num_blocks >= u32::MAX as usize {
            return Err("host tier num_blocks must be at least the device's (and below 2^32 - 1)");
        }
        if self.block_bytes == 0 {
            return Err("host tier block_bytes must be positive");
        }
        if !(self.bandwidth_bytes_per_s.is_finite() && self.bandwidth_bytes_per_s > 0.0) {
            return Err("host tier bandwidth must be positive and finite");
        }
        Ok(())
    }
}

/// One movement of KV bytes implied by a step, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvTransfer {
    /// The step computed block `hash` into device slot `slot`.
    Computed {
        /// Engine sequence hash.
        hash: u64,
        /// Device block.
        slot: u32,
    },
    /// Copy block `hash` between tiers: `(tier, slot)` to `(tier, slot)`.
    Copy {
        /// Engine sequence hash.
        hash: u64,
        /// Source tier and slot.
        from: (Tier, u32),
        /// Destination tier and slot.
        to: (Tier, u32),
    },
}

/// Counters of the lower tiers, in the block manager's terms (`kvbm_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierStats {
    /// Host tier capacity in blocks (0: no host tier).
    pub host_capacity_blocks: usize,
    /// Blocks the host tier holds.
    pub host_blocks: usize,
    /// Device blocks written through to the host (`kvbm_offload_blocks_d2h`).
    pub offloaded_blocks: u64,
    /// Host blocks loaded back into the device (`kvbm_onboard_blocks_h2d`).
    pub onboarded_blocks: u64,
    /// Bytes of those offloads.
    pub offloaded_bytes: u64,
    /// Bytes of those onboards.
    pub onboarded_bytes: u64,
    /// Blocks the host tier evicted.
    pub host_evictions: u64,
    /// Prompt tokens served from the host tier (part of `cached_tokens`).
    pub host_hit_tokens: u64,
    /// Simulated time spent onboarding.
    pub onboard_time: Duration,
}

/// The host tier's state.
#[derive(Debug)]
pub(crate) struct HostTier {
    config: HostTierConfig,
    pool: BlockPool,
    stats: TierStats,
}

// === impl HostTier ===

impl HostTier {
    pub(crate) fn new(config: HostTierConfig) -> Self {
        Self {
            pool: new_pool(config.num_blocks),
            stats: TierStats {
                host_capacity_blocks: config.num_blocks,
                ..TierStats::default()
            },
            config,
        }
    }

    pub(crate) fn stats(&self) -> TierStats {
        TierStats {
            host_blocks: self.pool.usage().registered,
            host_evictions: self.pool.counters().evictions,
            ..self.stats
        }
    }

    /// The leading run of `hashes` the host tier holds (the part of a prompt after its device
    /// prefix), held so nothing evicts it before it is loaded.
    pub(crate) fn lookup(&self, hashes: &[u64], now: Tick) -> Vec<ImmutableBlock> {
        hashes
            .iter()
            .map_while(|&hash| self.pool.get(SequenceHash(hash), now))
            .collect()
    }

    /// Account for onboarding `blocks` and return the time it takes.
    pub(crate) fn charge_onboard(&mut self, blocks: usize, block_size: usize) -> Duration {
        let time = self.config.load_time(blocks);
        self.stats.onboarded_blocks += blocks as u64;
        self.stats.onboarded_bytes += blocks as u64 * self.config.block_bytes;
        self.stats.host_hit_tokens += (blocks * block_size) as u64;
        self.stats.onboard_time += time;
        time
    }

    /// Write through the blocks the device just cached: copy each one the host lacks into a
    /// host slot (evicting what the pool says), and report the host's stores and removals.
    pub(crate) fn write_through(
        &mut self,
        stored: Vec<StoredBlock>,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) {
        let missing: Vec<StoredBlock> = stored
            .into_iter()
            .filter(|b| !self.pool.touch(SequenceHash(b.hash), now))
            .collect();
        if missing.is_empty() {
            return;
        }
        // All or nothing: the host has room unless every block is in use (being onboarded).
        let Ok(allocation) = self.pool.allocate(missing.len(), now) else {
            return;
        };
        self.removals(events);
        let mut run: Option<(Option<u64>, Vec<u64>, Vec<u32>)> = None;
        for (dest, block) in allocation.blocks.into_iter().zip(missing) {
            let slot = dest.id().0;
            let complete = dest.complete(SequenceHash(block.hash), block.parent.map(SequenceHash));
            let Ok(registration) = self.pool.register(complete, Retention::DEFAULT, now) else {
                continue;
            };
            if !registration.stored {
                continue;
            }
            transfers.push(KvTransfer::Copy {
                hash: block.hash,
                from: (Tier::Device, block.slot),
                to: (Tier::Host, slot),
            });
            self.stats.offloaded_blocks += 1;
            self.stats.offloaded_bytes += self.config.block_bytes;
            // Consecutive blocks of a sequence go out as one event, as vLLM batches them.
            match &mut run {
                Some((_, hashes, tokens)) if hashes.last() == block.parent.as_ref() => {
                    hashes.push(block.hash);
                    tokens.extend(block.token_ids);
                }
                _ => {
                    flush_run(run.take(), events);
                    run = Some((block.parent, vec![block.hash], block.token_ids));
                }
            }
        }
        flush_run(run, events);
    }

    /// Drop everything (the engine's prefix cache reset).
    pub(crate) fn reset(&mut self) {
        self.pool = new_pool(self.config.num_blocks);
    }

    fn removals(&mut self, events: &mut Vec<CacheEvent>) {
        let removed = self.pool.drain_removed();
        if !removed.is_empty() {
            events.push(CacheEvent::Removed {
                tier: Tier::Host,
                hashes: removed.into_iter().map(|h| h.0).collect(),
            });
        }
    }
}

fn new_pool(num_blocks: usize) -> BlockPool {
    // `validate` keeps the size in range, no pin budget is asked for: this cannot fail.
    BlockPool::new(KvbmTier::Host, num_blocks, 0).expect("validated host tier size")
}

/// A `Stored` event of the host tier, self-describing (tokens and parent) like the device's.
fn flush_run(run: Option<(Option<u64>, Vec<u64>, Vec<u32>)>, events: &mut Vec<CacheEvent>) {
    if let Some((parent, hashes, token_ids)) = run {
        events.push(CacheEvent::Stored {
            tier: Tier::Host,
            hashes,
            parent,
            token_ids,
        });
    }
}

#[cfg(test)]
mod tests;
