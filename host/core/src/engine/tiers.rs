//! The engine's lower tiers: the host tier (G2), where device blocks are written through and
//! where a prefix the device lost is loaded back from instead of recomputed (kv-cache.md, vLLM's
//! CPU offload), and the shared pool (G4), which the model only talks to through its driver.
//!
//! The bookkeeping is `switchyard-kvbm`'s [`BlockPool`] (its pure logic, built without the
//! `storage` feature): registry by sequence hash, leaf-first retention-aware eviction and the
//! removal log are the block manager's, not a copy. The device side stays the engine's
//! [`KvCache`](super::KvCache), whose reservation scheduling the model is built on.
//!
//! Movement is data: every write-through and onboard is a [`KvTransfer`] of the step, in order,
//! so a driver with real slabs (the mock engine) moves the bytes and one without (the simulator)
//! only charges the time.
//!
//! The shared pool lives outside the engine (every worker shares it; the driver owns it), so the
//! model keeps no state of it: the driver says per request how many leading prompt blocks the
//! pool holds ([`EngineRequest::pool_prefix_blocks`](super::EngineRequest::pool_prefix_blocks)),
//! the model loads the part the device and host lack ([`KvTransfer::Fetched`]) and asks the
//! driver to publish every block it computes ([`KvTransfer::Publish`]).

mod disk;

pub use disk::{DEFAULT_DISK_BANDWIDTH, DiskTierConfig};

use super::cache::{CacheEvent, StoredBlock};
use crate::worker::Tier;
use disk::{Demoted, DiskTier};
use rustc_hash::FxHashMap;
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

/// Pool-to-device bandwidth of a fetch from the shared pool by default: one 100 Gb/s NIC at line
/// rate (an RDMA transfer engine such as Mooncake's gets close to it), half the host tier's.
pub const DEFAULT_POOL_BANDWIDTH: f64 = 12.5e9;

/// Time to move `blocks` blocks of `block_bytes` at `bandwidth` bytes per second.
fn transfer_time(blocks: usize, block_bytes: u64, bandwidth: f64) -> Duration {
    Duration::from_secs_f64(blocks as f64 * block_bytes as f64 / bandwidth)
}

/// A host-memory tier behind the device cache.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTierConfig {
    /// Blocks the host tier holds. At least the device's (the block manager's sizing rule:
    /// every device block is written through, so a smaller tier would only churn).
    pub num_blocks: usize,
    /// Bytes of one KV block across layers: what an onboard moves, and what the mock engine's
    /// slabs hold per block. Default [`DEFAULT_BLOCK_BYTES`].
    pub block_bytes: u64,
    /// Host-to-device bandwidth of onboarding, in bytes per second: a request loading a hit
    /// waits this long (after the loads queued before it on the link) while the others step.
    /// Default [`DEFAULT_HOST_BANDWIDTH`].
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
        transfer_time(blocks, self.block_bytes, self.bandwidth_bytes_per_s)
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

/// The shared pool (G4) as the engine sees it: how fast blocks come from it. Its capacity and
/// contents are the driver's (the pool is shared by every worker).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolTierConfig {
    /// Bytes of one KV block across layers: what a fetch moves. Must equal the host tier's
    /// when there is one. Default [`DEFAULT_BLOCK_BYTES`].
    pub block_bytes: u64,
    /// Pool-to-device bandwidth of a fetch, in bytes per second: a request fetching a pool hit
    /// waits this long (after the fetches queued before it) while the others step. Default
    /// [`DEFAULT_POOL_BANDWIDTH`].
    pub bandwidth_bytes_per_s: f64,
}

impl Default for PoolTierConfig {
    fn default() -> Self {
        Self {
            block_bytes: DEFAULT_BLOCK_BYTES,
            bandwidth_bytes_per_s: DEFAULT_POOL_BANDWIDTH,
        }
    }
}

impl PoolTierConfig {
    /// Time to fetch `blocks` blocks into the device.
    pub fn load_time(&self, blocks: usize) -> Duration {
        transfer_time(blocks, self.block_bytes, self.bandwidth_bytes_per_s)
    }

    pub(crate) fn validate(&self, host: Option<&HostTierConfig>) -> Result<(), &'static str> {
        if self.block_bytes == 0 {
            return Err("pool block_bytes must be positive");
        }
        if host.is_some_and(|host| host.block_bytes != self.block_bytes) {
            return Err("pool block_bytes must equal the host tier's");
        }
        if !(self.bandwidth_bytes_per_s.is_finite() && self.bandwidth_bytes_per_s > 0.0) {
            return Err("pool bandwidth must be positive and finite");
        }
        Ok(())
    }
}

/// One movement of KV bytes implied by a step, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Block `hash` came from the shared pool into device slot `slot`: the driver writes the
    /// bytes it fetched for the request (it looked the prefix up; see
    /// [`EngineRequest::pool_prefix_blocks`](super::EngineRequest::pool_prefix_blocks)).
    Fetched {
        /// Engine sequence hash.
        hash: u64,
        /// Device block.
        slot: u32,
    },
    /// Put block `hash` into the shared pool, from `(tier, slot)` (write-through of a block the
    /// device computed; off the request path, so no time is charged). Idempotent on the pool
    /// side: a block it already has costs nothing.
    Publish {
        /// Engine sequence hash.
        hash: u64,
        /// The block before it (`None` at the start of a sequence), so the pool can evict leaves
        /// first.
        parent: Option<u64>,
        /// Where the bytes are: tier and slot.
        from: (Tier, u32),
        /// Its `block_size` tokens: the pool's events carry them, so that a reader with another
        /// hash (the router) can re-hash the block.
        token_ids: Vec<u32>,
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
    /// Simulated time spent onboarding from the host tier.
    pub onboard_time: Duration,
    /// Prompt tokens served from the shared pool (part of `cached_tokens`).
    pub pool_hit_tokens: u64,
    /// Blocks fetched from the shared pool into the device.
    pub pool_fetched_blocks: u64,
    /// Bytes of those fetches.
    pub pool_fetched_bytes: u64,
    /// Computed device blocks handed to the driver to publish to the pool.
    pub pool_published_blocks: u64,
    /// Simulated time spent fetching from the pool.
    pub pool_onboard_time: Duration,
    /// Disk tier capacity in blocks (0: no disk tier).
    pub disk_capacity_blocks: usize,
    /// Blocks the disk tier holds.
    pub disk_blocks: usize,
    /// Host evictions written to disk (`kvbm_offload_blocks_h2d`, G2 -> G3).
    pub disk_stored_blocks: u64,
    /// Bytes of those writes.
    pub disk_stored_bytes: u64,
    /// Disk blocks loaded into the device (`kvbm_onboard_blocks_d2d`, G3 -> G1).
    pub disk_onboarded_blocks: u64,
    /// Bytes of those loads.
    pub disk_onboarded_bytes: u64,
    /// Blocks the disk tier evicted.
    pub disk_evictions: u64,
    /// Prompt tokens served from the disk tier (part of `cached_tokens`).
    pub disk_hit_tokens: u64,
    /// Simulated time spent loading from disk.
    pub disk_onboard_time: Duration,
    /// Blocks prefetch hints loaded into the device from the host or disk, in the background.
    pub prefetched_blocks: u64,
    /// Bytes of those loads.
    pub prefetched_bytes: u64,
    /// Transfer time of those loads: the engine's background copy time, added to no step (a
    /// request that hits a block still copying waits for it).
    pub prefetch_time: Duration,
    /// Blocks demote hints moved down (their device or host copy dropped, a copy kept below).
    pub demoted_blocks: u64,
    /// Computed blocks past their request's `max_offload_tokens`, not written through (nor
    /// published) because the client does not expect to reuse them.
    pub ephemeral_blocks: u64,
}

impl std::ops::AddAssign for TierStats {
    /// Sum of two engines' counters (a deployment's, or one engine's tiers).
    fn add_assign(&mut self, other: TierStats) {
        self.host_capacity_blocks += other.host_capacity_blocks;
        self.host_blocks += other.host_blocks;
        self.offloaded_blocks += other.offloaded_blocks;
        self.onboarded_blocks += other.onboarded_blocks;
        self.offloaded_bytes += other.offloaded_bytes;
        self.onboarded_bytes += other.onboarded_bytes;
        self.host_evictions += other.host_evictions;
        self.host_hit_tokens += other.host_hit_tokens;
        self.onboard_time += other.onboard_time;
        self.pool_hit_tokens += other.pool_hit_tokens;
        self.pool_fetched_blocks += other.pool_fetched_blocks;
        self.pool_fetched_bytes += other.pool_fetched_bytes;
        self.pool_published_blocks += other.pool_published_blocks;
        self.pool_onboard_time += other.pool_onboard_time;
        self.disk_capacity_blocks += other.disk_capacity_blocks;
        self.disk_blocks += other.disk_blocks;
        self.disk_stored_blocks += other.disk_stored_blocks;
        self.disk_stored_bytes += other.disk_stored_bytes;
        self.disk_onboarded_blocks += other.disk_onboarded_blocks;
        self.disk_onboarded_bytes += other.disk_onboarded_bytes;
        self.disk_evictions += other.disk_evictions;
        self.disk_hit_tokens += other.disk_hit_tokens;
        self.disk_onboard_time += other.disk_onboard_time;
        self.prefetched_blocks += other.prefetched_blocks;
        self.prefetched_bytes += other.prefetched_bytes;
        self.prefetch_time += other.prefetch_time;
        self.demoted_blocks += other.demoted_blocks;
        self.ephemeral_blocks += other.ephemeral_blocks;
    }
}

impl std::iter::Sum for TierStats {
    fn sum<I: Iterator<Item = TierStats>>(iter: I) -> TierStats {
        iter.fold(TierStats::default(), |mut sum, t| {
            sum += t;
            sum
        })
    }
}

/// The host tier's state, and the disk tier behind it.
#[derive(Debug)]
pub(crate) struct HostTier {
    config: HostTierConfig,
    pool: BlockPool,
    stats: TierStats,
    disk: Option<DiskTier>,
    /// Where each host block is, its parent and tokens, so that an eviction can be written to
    /// disk and a prefetch can describe what it loads.
    resident: FxHashMap<u64, Resident>,
}

/// A block a tier holds, as a load into the device needs it.
#[derive(Debug, Clone)]
pub(crate) struct Resident {
    pub(crate) slot: u32,
    pub(crate) parent: Option<u64>,
    pub(crate) token_ids: Vec<u32>,
}

// === impl HostTier ===

impl HostTier {
    pub(crate) fn new(config: HostTierConfig, disk: Option<DiskTierConfig>) -> Self {
        Self {
            pool: new_pool(config.num_blocks),
            stats: TierStats {
                host_capacity_blocks: config.num_blocks,
                ..TierStats::default()
            },
            config,
            disk: disk.map(DiskTier::new),
            resident: FxHashMap::default(),
        }
    }

    pub(crate) fn stats(&self) -> TierStats {
        let mut stats = TierStats {
            host_blocks: self.pool.registered(),
            host_evictions: self.pool.counters().evictions,
            ..self.stats
        };
        if let Some(disk) = &self.disk {
            stats += disk.stats();
        }
        stats
    }

    /// The leading run of `hashes` the disk tier holds (the part of a prompt after what the
    /// device and host hold), held until loaded; empty without a disk tier.
    pub(crate) fn disk_lookup(&self, hashes: &[u64], now: Tick) -> Vec<ImmutableBlock> {
        match &self.disk {
            Some(disk) => disk.lookup(hashes, now),
            None => Vec::new(),
        }
    }

    /// Account for loading `blocks` from disk and return the time it takes.
    pub(crate) fn charge_disk_onboard(&mut self, blocks: usize, block_size: usize) -> Duration {
        match &mut self.disk {
            Some(disk) if blocks > 0 => disk.charge_onboard(blocks, block_size),
            _ => Duration::ZERO,
        }
    }

    /// How many leading blocks of `hashes` the host tier, then the disk tier after them, hold
    /// (touching nothing).
    pub(crate) fn held_run(&self, hashes: &[u64]) -> usize {
        let host = held(&self.pool, hashes);
        let disk = self
            .disk
            .as_ref()
            .map_or(0, |d| d.held_run(&hashes[host..]));
        host + disk
    }

    /// The leading run of `hashes` the host tier holds (the part of a prompt after its device
    /// prefix), held so nothing evicts it before it is loaded.
    pub(crate) fn lookup(&self, hashes: &[u64], now: Tick) -> Vec<ImmutableBlock> {
        leading_run(&self.pool, hashes, now)
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

    /// Count blocks kept from write-through by their request's offload limit.
    pub(crate) fn skipped_ephemeral(&mut self, blocks: u64) {
        self.stats.ephemeral_blocks += blocks;
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
        self.removals(now, events, transfers);
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
            let resident = Resident {
                slot,
                parent: block.parent,
                token_ids: block.token_ids.clone(),
            };
            self.resident.insert(block.hash, resident);
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
        self.resident.clear();
        if let Some(disk) = &mut self.disk {
            disk.reset();
        }
    }

    /// Whether a disk tier is behind this one.
    pub(crate) fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Whether the host tier holds `hash`.
    pub(crate) fn holds(&self, hash: u64) -> bool {
        self.pool.contains(SequenceHash(hash))
    }

    /// Mark `hash` as just used in the host tier; whether the host holds it.
    pub(crate) fn touch(&self, hash: u64, now: Tick) -> bool {
        self.pool.touch(SequenceHash(hash), now)
    }

    /// Whether the disk tier holds `hash`.
    pub(crate) fn disk_holds(&self, hash: u64) -> bool {
        self.disk.as_ref().is_some_and(|disk| disk.holds(hash))
    }

    /// The nearest copy of `hash` below the device (host, then disk), marked as just used.
    pub(crate) fn find(&self, hash: u64, now: Tick) -> Option<(Tier, Resident)> {
        if self.pool.touch(SequenceHash(hash), now)
            && let Some(resident) = self.resident.get(&hash)
        {
            return Some((Tier::Host, resident.clone()));
        }
        let disk = self.disk.as_ref()?.find(hash, now)?;
        Some((Tier::Disk, disk.clone()))
    }

    /// Replace the retention of `hash` in the host and disk tiers; `false` if neither holds
    /// it.
    pub(crate) fn set_retention(&self, hash: u64, retention: Retention, now: Tick) -> bool {
        let host = self.pool.set_retention(SequenceHash(hash), retention, now);
        let disk = self
            .disk
            .as_ref()
            .is_some_and(|disk| disk.set_retention(hash, retention, now));
        host || disk
    }

    /// Drop the host copy of `hash` without writing it to disk (a removal event); `false` if
    /// there is none.
    pub(crate) fn drop_block(
        &mut self,
        hash: u64,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) -> bool {
        if !self.pool.invalidate(SequenceHash(hash)) {
            return false;
        }
        // Forgotten first, so that the removal below does not write it to disk.
        self.resident.remove(&hash);
        self.removals(now, events, transfers);
        true
    }

    /// Drop the disk copy of `hash` (a removal event); `false` if there is none.
    pub(crate) fn drop_disk_block(&mut self, hash: u64, events: &mut Vec<CacheEvent>) -> bool {
        self.disk
            .as_mut()
            .is_some_and(|disk| disk.drop_block(hash, events))
    }

    /// Move the host copy of `hash` to disk: written there from its host slot, then dropped
    /// from the host. Whether the disk holds it after.
    pub(crate) fn move_to_disk(
        &mut self,
        hash: u64,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) -> bool {
        if self.pool.invalidate(SequenceHash(hash)) {
            // The host's removal path writes what it drops to disk.
            self.removals(now, events, transfers);
        }
        self.disk_holds(hash)
    }

    /// Write a device block straight to disk (a demote past a host that lacks it). Whether
    /// the disk holds it after.
    pub(crate) fn write_to_disk(
        &mut self,
        block: StoredBlock,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) -> bool {
        let Some(disk) = &mut self.disk else {
            return false;
        };
        let hash = block.hash;
        let block = Demoted {
            hash,
            parent: block.parent,
            token_ids: block.token_ids,
            from: (Tier::Device, block.slot),
        };
        disk.demote(block, now, events, transfers);
        disk.holds(hash)
    }

    /// Account for a prefetch that loads `host_blocks` from the host and `disk_blocks` from
    /// disk, in the background; returns the transfer time on each link: (host, disk).
    pub(crate) fn charge_prefetch(
        &mut self,
        host_blocks: usize,
        disk_blocks: usize,
    ) -> (Duration, Duration) {
        let disk_time = self
            .disk
            .as_ref()
            .map_or(Duration::ZERO, |disk| disk.load_time(disk_blocks));
        let host_time = self.config.load_time(host_blocks);
        let blocks = (host_blocks + disk_blocks) as u64;
        self.stats.prefetched_blocks += blocks;
        self.stats.prefetched_bytes += blocks * self.config.block_bytes;
        self.stats.prefetch_time += host_time + disk_time;
        (host_time, disk_time)
    }

    /// Count a block a demote moved down.
    pub(crate) fn count_demoted(&mut self) {
        self.stats.demoted_blocks += 1;
    }

    /// Report the host's evictions; with a disk tier, write each one to disk first (its host
    /// slot is only overwritten by the copies that follow).
    fn removals(
        &mut self,
        now: Tick,
        events: &mut Vec<CacheEvent>,
        transfers: &mut Vec<KvTransfer>,
    ) {
        let removed = self.pool.drain_removed();
        for hash in &removed {
            let resident = self.resident.remove(&hash.0);
            if let (Some(disk), Some(resident)) = (&mut self.disk, resident) {
                let block = Demoted {
                    hash: hash.0,
                    parent: resident.parent,
                    token_ids: resident.token_ids,
                    from: (Tier::Host, resident.slot),
                };
                disk.demote(block, now, events, transfers);
            }
        }
        if !removed.is_empty() {
            events.push(CacheEvent::Removed {
                tier: Tier::Host,
                hashes: removed.into_iter().map(|h| h.0).collect(),
            });
        }
    }
}

/// What the engine keeps of the shared pool: its settings and counters (the pool's contents are
/// the driver's).
#[derive(Debug)]
pub(crate) struct PoolTier {
    config: PoolTierConfig,
    stats: TierStats,
}

// === impl PoolTier ===

impl PoolTier {
    pub(crate) fn new(config: PoolTierConfig) -> Self {
        Self {
            config,
            stats: TierStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> TierStats {
        self.stats
    }

    /// Account for fetching `blocks` and return the time it takes.
    pub(crate) fn charge_fetch(&mut self, blocks: usize, block_size: usize) -> Duration {
        let time = self.config.load_time(blocks);
        self.stats.pool_fetched_blocks += blocks as u64;
        self.stats.pool_fetched_bytes += blocks as u64 * self.config.block_bytes;
        self.stats.pool_hit_tokens += (blocks * block_size) as u64;
        self.stats.pool_onboard_time += time;
        time
    }

    /// Ask the driver to publish the blocks the device just computed, in order.
    pub(crate) fn publish(&mut self, computed: &[StoredBlock], transfers: &mut Vec<KvTransfer>) {
        self.stats.pool_published_blocks += computed.len() as u64;
        transfers.extend(computed.iter().map(|b| KvTransfer::Publish {
            hash: b.hash,
            parent: b.parent,
            from: (Tier::Device, b.slot),
            token_ids: b.token_ids.clone(),
        }));
    }
}

/// How many leading blocks of `hashes` `pool` holds, touching none.
pub(super) fn held(pool: &BlockPool, hashes: &[u64]) -> usize {
    (hashes.iter())
        .take_while(|&&hash| pool.contains(SequenceHash(hash)))
        .count()
}

/// The leading run of `hashes` that `pool` holds, each block held (so nothing evicts it before
/// it is loaded).
pub(super) fn leading_run(pool: &BlockPool, hashes: &[u64], now: Tick) -> Vec<ImmutableBlock> {
    hashes
        .iter()
        .map_while(|&hash| pool.get(SequenceHash(hash), now))
        .collect()
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
