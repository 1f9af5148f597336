//! The tiered block manager: G1 device, G2 host, G3 disk pools, the write-through queues, the
//! admission filters of each edge, onboarding, prefetch and the bypass of slow tiers.
//!
//! It never moves bytes. Every movement is a [`TransferBatch`] the caller performs off the
//! request path (through [`crate::storage`] or its own executor) and then hands back to
//! [`KvBlockManager::commit`]. A batch owns its source blocks (they cannot be evicted while
//! copied) and its destination slots (dropped without commit, they return to reset).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::ManagerConfig;
use crate::error::KvbmError;
use crate::metrics::KvbmMetrics;
use crate::pool::{BlockPool, CompleteBlock, ImmutableBlock, MutableBlock};
use crate::retention::{PinOutcome, Retention, TokenRangeRetention, block_retentions};
use crate::shared_pool::SharedPool;
use crate::sketch::FrequencySketch;
use crate::types::{BlockId, SequenceHash, Tick, Tier};

static NEXT_MANAGER: AtomicU64 = AtomicU64::new(1);

/// A change of what a tier holds, in the shape of vLLM's `BlockStored` / `BlockRemoved` with a
/// `medium` (see [`Tier::medium`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierEvent {
    /// A block became readable in `tier`.
    Stored {
        tier: Tier,
        hash: SequenceHash,
        parent: Option<SequenceHash>,
    },
    /// Blocks left `tier` (evicted or found bad).
    Removed {
        tier: Tier,
        hashes: Vec<SequenceHash>,
    },
}

/// A request's write-through allowance (vLLM's `max_offload_tokens`): the knob for "do not
/// offload thinking tokens".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffloadBudget {
    /// Most tokens of this request to write through; `None`: no cap, `Some(0)`: none.
    pub max_offload_tokens: Option<u64>,
    /// Tokens queued for write-through so far.
    pub offloaded_tokens: u64,
}

impl OffloadBudget {
    /// No cap.
    pub fn unlimited() -> OffloadBudget {
        OffloadBudget::default()
    }

    /// At most `tokens` tokens.
    pub fn capped(tokens: u64) -> OffloadBudget {
        OffloadBudget {
            max_offload_tokens: Some(tokens),
            offloaded_tokens: 0,
        }
    }

    fn take(&mut self, tokens: u64) -> bool {
        match self.max_offload_tokens {
            Some(max) if self.offloaded_tokens + tokens > max => false,
            _ => {
                self.offloaded_tokens += tokens;
                true
            }
        }
    }
}

/// What a lookup found, position by position from the start of the prompt.
#[derive(Debug, Default)]
pub struct Lookup {
    /// Blocks of the prefix already in G1, in prompt order.
    pub device: Vec<ImmutableBlock>,
    /// Blocks of the prefix found only in a lower tier (held so they cannot be evicted before
    /// onboarding), in prompt order.
    pub lower: Vec<(Tier, ImmutableBlock)>,
    /// Blocks right after the local prefix that the shared pool reports present.
    pub pool_blocks: usize,
}

impl Lookup {
    /// Blocks of the prompt prefix available locally (device or lower).
    pub fn local_blocks(&self) -> usize {
        self.device.len() + self.lower.len()
    }
}

/// Why a batch exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferKind {
    /// Write-through to the tier below.
    Offload,
    /// A lower-tier hit loaded back into G1.
    Onboard,
    /// Named hashes staged into G1 ahead of use, within a grace.
    Prefetch,
}

/// One block to copy from `src` to `dst`.
#[derive(Debug)]
pub struct Transfer {
    source: ImmutableBlock,
    source_tier: Tier,
    dest: CompleteBlock,
    dest_tier: Tier,
    retention: Retention,
}

impl Transfer {
    /// The block's sequence hash.
    pub fn hash(&self) -> SequenceHash {
        self.source.hash()
    }

    /// Where to read: tier and slot.
    pub fn source(&self) -> (Tier, BlockId) {
        (self.source_tier, self.source.id())
    }

    /// Where to write: tier and slot.
    pub fn dest(&self) -> (Tier, BlockId) {
        (self.dest_tier, self.dest.id())
    }
}

/// A batch of copies for the caller to perform, then commit.
#[derive(Debug)]
pub struct TransferBatch {
    manager: u64,
    kind: TransferKind,
    deadline: Option<Tick>,
    transfers: Vec<Transfer>,
}

impl TransferBatch {
    /// Why it exists.
    pub fn kind(&self) -> TransferKind {
        self.kind
    }

    /// The copies, in order.
    pub fn transfers(&self) -> &[Transfer] {
        &self.transfers
    }

    /// Commit later than this and the batch is dropped (prefetch only).
    pub fn deadline(&self) -> Option<Tick> {
        self.deadline
    }

    /// Number of copies.
    pub fn len(&self) -> usize {
        self.transfers.len()
    }

    /// Whether there is nothing to copy.
    pub fn is_empty(&self) -> bool {
        self.transfers.is_empty()
    }
}

/// What a commit did.
#[derive(Debug, Default)]
pub struct Committed {
    /// The registered destination blocks (for onboarding: the request's new G1 prefix).
    pub blocks: Vec<ImmutableBlock>,
    /// Transfers the caller reported failed (their slots went back to reset).
    pub failed: usize,
    /// True when a prefetch came back after its grace and was dropped whole.
    pub expired: bool,
}

/// G1 slots leased for blocks to fetch from the shared pool (G4), in prompt order. Dropped
/// without commit, the slots return to reset.
#[derive(Debug)]
pub struct PoolFetch {
    manager: u64,
    blocks: Vec<CompleteBlock>,
}

impl PoolFetch {
    /// (hash, G1 slot) of each block to fetch.
    pub fn slots(&self) -> impl Iterator<Item = (SequenceHash, BlockId)> + '_ {
        self.blocks.iter().map(|b| (b.hash(), b.id()))
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there is nothing to fetch.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// Per-block load time of a tier, smoothed (EWMA, alpha 1/4).
#[derive(Debug, Clone, Copy, Default)]
struct LoadEstimate {
    nanos_per_block: Option<f64>,
}

/// The tiered KV block manager. See the crate docs for the lifecycle.
#[derive(Debug)]
pub struct KvBlockManager {
    id: u64,
    config: ManagerConfig,
    pools: [Option<BlockPool>; 3],
    sketch: FrequencySketch,
    /// Hashes waiting to be written G1 -> G2 (index 0) and G2 -> G3 (index 1).
    queues: [VecDeque<SequenceHash>; 2],
    load: [LoadEstimate; 3],
    shared_pool: Option<Arc<dyn SharedPool>>,
    events: Vec<TierEvent>,
    metrics: KvbmMetrics,
}

// === impl KvBlockManager ===

impl KvBlockManager {
    /// A manager for a validated `config`.
    pub fn new(config: ManagerConfig) -> Result<KvBlockManager, KvbmError> {
        config.validate()?;
        let mut pools: [Option<BlockPool>; 3] = [None, None, None];
        for (slot, tier) in pools.iter_mut().zip(Tier::LOCAL) {
            if let Some(tier_config) = config.tier(tier) {
                *slot = Some(BlockPool::new(
                    tier,
                    tier_config.capacity_blocks,
                    tier_config.pin_budget_blocks,
                )?);
            }
        }
        let largest = Tier::LOCAL
            .iter()
            .filter_map(|t| config.tier(*t))
            .map(|t| t.capacity_blocks)
            .max()
            .unwrap_or(1);
        Ok(KvBlockManager {
            id: NEXT_MANAGER.fetch_add(1, Ordering::Relaxed),
            sketch: FrequencySketch::new(largest),
            config,
            pools,
            queues: [VecDeque::new(), VecDeque::new()],
            load: [LoadEstimate::default(); 3],
            shared_pool: None,
            events: Vec::new(),
            metrics: KvbmMetrics::default(),
        })
    }

    /// Attach the shared pool (G4) that lookups consult beyond the local prefix.
    pub fn with_shared_pool(mut self, pool: Arc<dyn SharedPool>) -> KvBlockManager {
        self.shared_pool = Some(pool);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// The pool of a local tier, if configured.
    pub fn pool(&self, tier: Tier) -> Option<&BlockPool> {
        tier.local_index().and_then(|i| self.pools[i].as_ref())
    }

    fn pool_or_err(&self, tier: Tier) -> Result<&BlockPool, KvbmError> {
        self.pool(tier).ok_or(KvbmError::TierNotConfigured { tier })
    }

    /// `count` G1 blocks to fill (evicting inactive blocks as needed; see [`Self::drain_events`]).
    pub fn allocate(&mut self, count: usize, now: Tick) -> Result<Vec<MutableBlock>, KvbmError> {
        let result = self.pool_or_err(Tier::Device)?.allocate(count, now);
        self.collect_removals();
        Ok(result?.blocks)
    }

    /// Register a block the engine just computed in G1 and queue it for write-through
    /// (unless ephemeral, or the request's offload cap is spent).
    pub fn register(
        &mut self,
        block: CompleteBlock,
        retention: Retention,
        budget: &mut OffloadBudget,
        now: Tick,
    ) -> Result<ImmutableBlock, KvbmError> {
        let registration = self
            .pool_or_err(Tier::Device)?
            .register(block, retention, now)?;
        let block = registration.block;
        self.sketch.record(block.hash());
        if registration.stored {
            self.events.push(TierEvent::Stored {
                tier: Tier::Device,
                hash: block.hash(),
                parent: block.parent(),
            });
            if self.pools[1].is_some() {
                if retention.is_ephemeral() {
                    self.metrics.offload_skipped_ephemeral += 1;
                } else if !budget.take(u64::from(self.config.block_size_tokens)) {
                    self.metrics.offload_skipped_request_cap += 1;
                } else {
                    self.queues[0].push_back(block.hash());
                }
            }
        }
        Ok(block)
    }

    /// Find the longest prefix of `hashes` over all local tiers (hottest first per block),
    /// stopping at the first block no tier has. Tiers whose load loses to recompute are skipped.
    pub fn lookup(&mut self, hashes: &[SequenceHash], now: Tick) -> Lookup {
        let mut found = Lookup::default();
        let bypass = [
            false,
            self.is_bypassed(Tier::Host),
            self.is_bypassed(Tier::Disk),
        ];
        let mut matched = 0;
        'blocks: for &hash in hashes {
            self.sketch.record(hash);
            for (index, tier) in Tier::LOCAL.iter().enumerate() {
                let Some(pool) = &self.pools[index] else {
                    continue;
                };
                if bypass[index] {
                    if pool.contains(hash) {
                        self.metrics.bypassed_reads += 1;
                    }
                    continue;
                }
                if let Some(block) = pool.get(hash, now) {
                    self.metrics.tiers[index].hits += 1;
                    matched += 1;
                    if *tier == Tier::Device {
                        found.device.push(block);
                    } else {
                        // Seen again while only in G2: now it may deserve the disk.
                        if *tier == Tier::Host
                            && self.pools[2].as_ref().is_some_and(|p| !p.contains(hash))
                        {
                            self.queues[1].push_back(hash);
                        }
                        found.lower.push((*tier, block));
                    }
                    continue 'blocks;
                }
            }
            break;
        }
        self.metrics.matched_tokens += matched * u64::from(self.config.block_size_tokens);
        if let Some(pool) = &self.shared_pool {
            let rest = &hashes[found.local_blocks()..];
            found.pool_blocks = pool
                .contains(rest)
                .iter()
                .take_while(|present| **present)
                .count();
            self.metrics.pool_hits += found.pool_blocks as u64;
        }
        found
    }

    /// Copies that load the lower-tier part of a lookup into G1 (allocating, and so possibly
    /// evicting, G1 blocks).
    pub fn onboard(
        &mut self,
        lower: Vec<(Tier, ImmutableBlock)>,
        now: Tick,
    ) -> Result<TransferBatch, KvbmError> {
        self.onboard_batch(lower, TransferKind::Onboard, None, now)
    }

    fn onboard_batch(
        &mut self,
        lower: Vec<(Tier, ImmutableBlock)>,
        kind: TransferKind,
        deadline: Option<Tick>,
        now: Tick,
    ) -> Result<TransferBatch, KvbmError> {
        let allocation = self.pool_or_err(Tier::Device)?.allocate(lower.len(), now);
        self.collect_removals();
        let transfers = allocation?
            .blocks
            .into_iter()
            .zip(lower)
            .map(|(dest, (tier, source))| Transfer {
                retention: source.retention(),
                dest: dest.complete(source.hash(), source.parent()),
                dest_tier: Tier::Device,
                source_tier: tier,
                source,
            })
            .collect();
        Ok(TransferBatch {
            manager: self.id,
            kind,
            deadline,
            transfers,
        })
    }

    /// Lease G1 slots for `hashes`, the run a lookup found in the shared pool right after the
    /// local prefix (whose last block is `parent`). The caller copies the bytes
    /// ([`crate::storage::fetch_from_pool`]), then calls [`Self::commit_pool_fetch`].
    pub fn plan_pool_fetch(
        &mut self,
        hashes: &[SequenceHash],
        parent: Option<SequenceHash>,
        now: Tick,
    ) -> Result<PoolFetch, KvbmError> {
        let allocation = self.pool_or_err(Tier::Device)?.allocate(hashes.len(), now);
        self.collect_removals();
        let mut parent = parent;
        let blocks = allocation?
            .blocks
            .into_iter()
            .zip(hashes)
            .map(|(block, &hash)| {
                let complete = block.complete(hash, parent);
                parent = Some(hash);
                complete
            })
            .collect();
        Ok(PoolFetch {
            manager: self.id,
            blocks,
        })
    }

    /// Register the fetched blocks in G1, in order, up to the first failed one (the blocks
    /// after a hole could never be matched as a prefix); the rest return to reset. Fetched
    /// blocks are written through to G2 like computed ones.
    pub fn commit_pool_fetch(
        &mut self,
        fetch: PoolFetch,
        failed: &[SequenceHash],
        now: Tick,
    ) -> Result<Committed, KvbmError> {
        if fetch.manager != self.id {
            return Err(KvbmError::ForeignBatch);
        }
        let mut committed = Committed::default();
        let mut budget = OffloadBudget::unlimited();
        let mut blocks = fetch.blocks.into_iter();
        for block in blocks.by_ref() {
            if failed.contains(&block.hash()) {
                committed.failed += 1;
                self.metrics.transfers_failed += 1;
                break;
            }
            let registered = self.register(block, Retention::DEFAULT, &mut budget, now)?;
            self.metrics.onboard_blocks_pool += 1;
            self.metrics.onboard_bytes += self.config.block_bytes;
            committed.blocks.push(registered);
        }
        committed.failed += blocks.len();
        Ok(committed)
    }

    /// Stage named hashes into G1 ahead of a request: the contiguous run found in lower tiers
    /// (blocks already in G1 are skipped; the run stops at the first block no tier has). The
    /// batch must be committed within the configured grace, or it is dropped.
    pub fn prefetch(
        &mut self,
        hashes: &[SequenceHash],
        now: Tick,
    ) -> Result<TransferBatch, KvbmError> {
        let found = self.lookup(hashes, now);
        let deadline = now.after(self.config.prefetch_grace);
        self.onboard_batch(found.lower, TransferKind::Prefetch, Some(deadline), now)
    }

    /// The next write-through batch (G1 -> G2 first, then G2 -> G3), at most
    /// `offload_batch_blocks` long, after the edge's admission filters; `None` when both queues
    /// are empty or the tier below has no room now.
    pub fn plan_offload(&mut self, now: Tick) -> Result<Option<TransferBatch>, KvbmError> {
        for edge in 0..2 {
            if let Some(batch) = self.plan_edge(edge, now)? {
                return Ok(Some(batch));
            }
        }
        Ok(None)
    }

    fn plan_edge(&mut self, edge: usize, now: Tick) -> Result<Option<TransferBatch>, KvbmError> {
        let (Some(source_pool), Some(dest_pool)) =
            (self.pools[edge].clone(), self.pools[edge + 1].clone())
        else {
            self.queues[edge].clear();
            return Ok(None);
        };
        let mut sources = Vec::new();
        while sources.len() < self.config.offload_batch_blocks {
            let Some(hash) = self.queues[edge].pop_front() else {
                break;
            };
            if dest_pool.contains(hash) || sources.iter().any(|b: &ImmutableBlock| b.hash() == hash)
            {
                self.metrics.offload_skipped_present += 1;
                continue;
            }
            if edge == 1 && self.sketch.estimate(hash) < self.config.disk_min_accesses {
                self.metrics.offload_skipped_cold += 1;
                continue;
            }
            // Gone from the source already: nothing to write.
            let Some(block) = source_pool.get(hash, now) else {
                continue;
            };
            if block.retention().is_ephemeral() {
                self.metrics.offload_skipped_ephemeral += 1;
                continue;
            }
            sources.push(block);
        }
        if sources.is_empty() {
            return Ok(None);
        }
        let allocation = dest_pool.allocate(sources.len(), now);
        self.collect_removals();
        let allocation = match allocation {
            Ok(allocation) => allocation,
            Err(KvbmError::OutOfBlocks { .. }) => {
                // Everything below is in use: retry later, in the same order.
                for block in sources.iter().rev() {
                    self.queues[edge].push_front(block.hash());
                }
                return Ok(None);
            }
            Err(other) => return Err(other),
        };
        let source_tier = Tier::LOCAL[edge];
        let dest_tier = Tier::LOCAL[edge + 1];
        let transfers = allocation
            .blocks
            .into_iter()
            .zip(sources)
            .map(|(dest, source)| Transfer {
                retention: source.retention(),
                dest: dest.complete(source.hash(), source.parent()),
                dest_tier,
                source_tier,
                source,
            })
            .collect();
        Ok(Some(TransferBatch {
            manager: self.id,
            kind: TransferKind::Offload,
            deadline: None,
            transfers,
        }))
    }

    /// The caller copied the batch; register its destinations (with the source's retention:
    /// retention travels with the block). `failed` names the hashes whose copy failed.
    pub fn commit(
        &mut self,
        batch: TransferBatch,
        failed: &[SequenceHash],
        now: Tick,
    ) -> Result<Committed, KvbmError> {
        if batch.manager != self.id {
            return Err(KvbmError::ForeignBatch);
        }
        let mut committed = Committed::default();
        if batch.deadline.is_some_and(|deadline| now > deadline) {
            self.metrics.prefetch_expired += 1;
            committed.expired = true;
            return Ok(committed);
        }
        let bytes = self.config.block_bytes;
        for transfer in batch.transfers {
            let hash = transfer.hash();
            if failed.contains(&hash) {
                committed.failed += 1;
                self.metrics.transfers_failed += 1;
                continue;
            }
            let pool = self.pool_or_err(transfer.dest_tier)?.clone();
            let registration = pool.register(transfer.dest, transfer.retention, now)?;
            if registration.stored {
                self.events.push(TierEvent::Stored {
                    tier: transfer.dest_tier,
                    hash,
                    parent: registration.block.parent(),
                });
            }
            match (transfer.source_tier, transfer.dest_tier) {
                (Tier::Device, Tier::Host) => {
                    self.metrics.offload_blocks_d2h += 1;
                    self.metrics.offload_bytes += bytes;
                    if self.pools[2].is_some() {
                        self.queues[1].push_back(hash);
                    }
                }
                (Tier::Host, Tier::Disk) => {
                    self.metrics.offload_blocks_h2d += 1;
                    self.metrics.offload_bytes += bytes;
                }
                (Tier::Host, Tier::Device) => {
                    self.metrics.onboard_blocks_h2d += 1;
                    self.metrics.onboard_bytes += bytes;
                }
                (Tier::Disk, Tier::Device) => {
                    self.metrics.onboard_blocks_d2d += 1;
                    self.metrics.onboard_bytes += bytes;
                }
                _ => {}
            }
            committed.blocks.push(registration.block);
        }
        Ok(committed)
    }

    /// Replace the retention of `hashes` in every tier that holds them.
    pub fn set_retention(&mut self, hashes: &[SequenceHash], retention: Retention, now: Tick) {
        for pool in self.pools.iter().flatten() {
            for &hash in hashes {
                pool.set_retention(hash, retention, now);
            }
        }
    }

    /// Apply a request's token-range retention to its blocks `hashes` (in prompt order) in
    /// every tier: each range covers every block it touches.
    pub fn retain_ranges(
        &mut self,
        hashes: &[SequenceHash],
        ranges: &[TokenRangeRetention],
        now: Tick,
    ) -> Result<(), KvbmError> {
        let retentions =
            block_retentions(ranges, self.config.block_size_tokens, hashes.len(), now)?;
        for (hash, retention) in hashes.iter().zip(retentions) {
            self.set_retention(&[*hash], retention, now);
        }
        Ok(())
    }

    /// Pin `hashes` in `tier` until `until`, within that tier's budget (overflow is clipped,
    /// counted and reported).
    pub fn pin(
        &mut self,
        tier: Tier,
        hashes: &[SequenceHash],
        until: Tick,
        now: Tick,
    ) -> Result<PinOutcome, KvbmError> {
        let outcome = self.pool_or_err(tier)?.pin(hashes, until, now);
        if let Some(metrics) = self.metrics.tier_mut(tier) {
            metrics.pins_clipped += outcome.clipped as u64;
        }
        Ok(outcome)
    }

    /// A read of `hash` from `tier` failed its checksum or was truncated: drop the block.
    pub fn report_corrupt(&mut self, tier: Tier, hash: SequenceHash) {
        self.metrics.checksum_failures += 1;
        if let Some(pool) = self.pool(tier) {
            pool.invalidate(hash);
        }
        self.collect_removals();
    }

    /// Feed a measured load: `blocks` blocks from `tier` took `elapsed`.
    pub fn record_load(&mut self, tier: Tier, blocks: usize, elapsed: Duration) {
        let (Some(index), true) = (tier.local_index(), blocks > 0) else {
            return;
        };
        let sample = elapsed.as_nanos() as f64 / blocks as f64;
        let estimate = &mut self.load[index].nanos_per_block;
        *estimate = Some(match *estimate {
            Some(old) => old + (sample - old) / 4.0,
            None => sample,
        });
    }

    /// Whether reads skip `tier` because loading a block takes longer than recomputing it.
    pub fn is_bypassed(&self, tier: Tier) -> bool {
        let (Some(index), Some(recompute)) = (tier.local_index(), self.config.recompute_per_block)
        else {
            return false;
        };
        self.load[index]
            .nanos_per_block
            .is_some_and(|load| load > recompute.as_nanos() as f64)
    }

    /// Blocks waiting for write-through on each edge (G1 -> G2, G2 -> G3).
    pub fn pending_offloads(&self) -> [usize; 2] {
        [self.queues[0].len(), self.queues[1].len()]
    }

    /// Events since the last call, in order.
    pub fn drain_events(&mut self) -> Vec<TierEvent> {
        self.collect_removals();
        std::mem::take(&mut self.events)
    }

    /// A snapshot of every counter.
    pub fn metrics(&mut self) -> KvbmMetrics {
        self.collect_removals();
        let mut metrics = self.metrics;
        for (index, pool) in self.pools.iter().enumerate() {
            if let Some(pool) = pool {
                metrics.set_usage(Tier::LOCAL[index], pool.usage());
                metrics.tiers[index].evictions = pool.counters().evictions;
                metrics.tiers[index].load_bytes_per_s = self.load[index]
                    .nanos_per_block
                    .filter(|nanos| *nanos > 0.0)
                    .map_or(0, |nanos| {
                        (self.config.block_bytes as f64 * 1e9 / nanos) as u64
                    });
            }
        }
        metrics
    }

    fn collect_removals(&mut self) {
        for (index, pool) in self.pools.iter().enumerate() {
            if let Some(pool) = pool {
                let hashes = pool.drain_removed();
                if !hashes.is_empty() {
                    self.events.push(TierEvent::Removed {
                        tier: Tier::LOCAL[index],
                        hashes,
                    });
                }
            }
        }
    }
}

#[cfg(all(test, feature = "storage"))]
mod tests;
