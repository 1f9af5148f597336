use super::*;
use crate::config::TierConfig;
use crate::storage::{
    DiskStore, HostSlab, MemoryPool, TierStores, fetch_from_pool, perform, publish_to_pool,
};

const BLOCK_BYTES: usize = 256;

fn config(device: usize, host: Option<usize>, disk: Option<usize>) -> ManagerConfig {
    let mut config = ManagerConfig::new(16, BLOCK_BYTES as u64, device);
    config.host = host.map(TierConfig::blocks);
    config.disk = disk.map(TierConfig::blocks);
    config.offload_batch_blocks = 4;
    config
}

fn hashes(first: u64, len: u64) -> Vec<SequenceHash> {
    (first..first + len).map(SequenceHash).collect()
}

/// Compute and register a chain in G1, writing recognisable bytes into the device store.
fn compute(
    manager: &mut KvBlockManager,
    stores: &mut TierStores,
    chain: &[SequenceHash],
    retention: Retention,
    budget: &mut OffloadBudget,
    now: Tick,
) -> Result<Vec<ImmutableBlock>, KvbmError> {
    let blocks = manager.allocate(chain.len(), now)?;
    let mut out = Vec::new();
    let mut parent = None;
    for (block, &hash) in blocks.into_iter().zip(chain) {
        if let Some(device) = stores.get_mut(Tier::Device) {
            device.write_block(block.id(), hash, &[hash.0 as u8; BLOCK_BYTES])?;
        }
        out.push(manager.register(block.complete(hash, parent), retention, budget, now)?);
        parent = Some(hash);
    }
    Ok(out)
}

/// Run write-through to completion, performing the copies.
fn drain_offloads(
    manager: &mut KvBlockManager,
    stores: &mut TierStores,
    now: Tick,
) -> Result<usize, KvbmError> {
    let mut batches = 0;
    while let Some(batch) = manager.plan_offload(now)? {
        assert!(batch.len() <= manager.config().offload_batch_blocks);
        let performed = perform(&batch, stores);
        manager.commit(batch, &performed.failed, now)?;
        batches += 1;
    }
    Ok(batches)
}

fn stores(disk: Option<&std::path::Path>) -> Result<TierStores, Box<dyn std::error::Error>> {
    Ok(TierStores {
        device: Some(Box::new(HostSlab::new(64, BLOCK_BYTES)?)),
        host: Some(Box::new(HostSlab::new(64, BLOCK_BYTES)?)),
        disk: match disk {
            Some(dir) => Some(Box::new(DiskStore::open(dir, 64, BLOCK_BYTES, None)?)),
            None => None,
        },
    })
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn evicted_device_blocks_come_back_from_the_host_tier_with_their_bytes() -> TestResult {
    let mut manager = KvBlockManager::new(config(4, Some(8), None))?;
    let mut stores = stores(None)?;
    let chain = hashes(100, 4);
    drop(compute(
        &mut manager,
        &mut stores,
        &chain,
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    assert_eq!(drain_offloads(&mut manager, &mut stores, Tick(1))?, 1);
    // Another session fills G1: the first chain is evicted from the device.
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(200, 4),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(2),
    )?);
    let events = manager.drain_events();
    assert!(events.contains(&TierEvent::Removed {
        tier: Tier::Device,
        hashes: vec![
            SequenceHash(103),
            SequenceHash(102),
            SequenceHash(101),
            SequenceHash(100)
        ]
    }));
    assert!(events.contains(&TierEvent::Stored {
        tier: Tier::Host,
        hash: SequenceHash(101),
        parent: Some(SequenceHash(100))
    }));

    let found = manager.lookup(&chain, Tick(3));
    assert_eq!((found.device.len(), found.lower.len()), (0, 4));
    let batch = manager.onboard(found.lower, Tick(3))?;
    let performed = perform(&batch, &mut stores);
    assert!(performed.failed.is_empty());
    let committed = manager.commit(batch, &performed.failed, Tick(3))?;
    assert_eq!(committed.blocks.len(), 4);
    let mut out = vec![0; BLOCK_BYTES];
    for block in &committed.blocks {
        if let Some(device) = stores.get_mut(Tier::Device) {
            device.read_block(block.id(), block.hash(), &mut out)?;
        }
        assert_eq!(out, vec![block.hash().0 as u8; BLOCK_BYTES]);
    }
    let metrics = manager.metrics();
    assert_eq!(metrics.onboard_blocks_h2d, 4);
    // The second chain is still queued: write-through runs when the caller asks.
    assert_eq!(metrics.offload_blocks_d2h, 4);
    assert_eq!(manager.pending_offloads(), [4, 0]);
    assert_eq!(metrics.tiers[1].hits, 4);
    assert_eq!(metrics.matched_tokens, 64);
    Ok(())
}

#[test]
fn disk_takes_only_blocks_seen_twice_and_presence_is_skipped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut manager = KvBlockManager::new(config(4, Some(8), Some(16)))?;
    let mut stores = stores(Some(dir.path()))?;
    let chain = hashes(1, 2);
    drop(compute(
        &mut manager,
        &mut stores,
        &chain,
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    let metrics = manager.metrics();
    assert_eq!(
        (metrics.offload_blocks_d2h, metrics.offload_blocks_h2d),
        (2, 0)
    );
    assert_eq!(metrics.offload_skipped_cold, 2);
    // Seen again: the lookup hits G1, and the blocks now count twice.
    drop(manager.lookup(&chain, Tick(1)));
    // Evict them from G1 so the host hit re-queues them for disk.
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(50, 4),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(2),
    )?);
    let found = manager.lookup(&chain, Tick(3));
    assert_eq!(found.lower.len(), 2);
    drop(found);
    drain_offloads(&mut manager, &mut stores, Tick(4))?;
    let metrics = manager.metrics();
    assert_eq!(metrics.offload_blocks_h2d, 2);
    assert!(
        manager
            .pool(Tier::Disk)
            .is_some_and(|p| p.contains(SequenceHash(1)))
    );
    // The same blocks offered again are skipped by the presence filter.
    manager.queues[1].push_back(SequenceHash(1));
    assert!(manager.plan_offload(Tick(5))?.is_none());
    assert!(manager.metrics().offload_skipped_present >= 1);
    Ok(())
}

#[test]
fn ephemeral_blocks_and_capped_requests_are_not_written_through() -> TestResult {
    let mut manager = KvBlockManager::new(config(8, Some(8), None))?;
    let mut stores = stores(None)?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(1, 2),
        Retention::ephemeral(),
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    let mut budget = OffloadBudget::capped(16);
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(10, 3),
        Retention::DEFAULT,
        &mut budget,
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    let metrics = manager.metrics();
    assert_eq!(metrics.offload_blocks_d2h, 1);
    assert_eq!(metrics.offload_skipped_ephemeral, 2);
    assert_eq!(metrics.offload_skipped_request_cap, 2);
    Ok(())
}

#[test]
fn retention_travels_with_the_block() -> TestResult {
    let mut manager = KvBlockManager::new(config(2, Some(4), None))?;
    let mut stores = stores(None)?;
    let high = Retention::new(90, None)?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(1, 1),
        high,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    assert_eq!(
        manager
            .pool(Tier::Host)
            .and_then(|p| p.retention(SequenceHash(1))),
        Some(high)
    );
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(5, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(1),
    )?);
    let found = manager.lookup(&hashes(1, 1), Tick(2));
    let batch = manager.onboard(found.lower, Tick(2))?;
    let performed = perform(&batch, &mut stores);
    let committed = manager.commit(batch, &performed.failed, Tick(2))?;
    assert_eq!(committed.blocks[0].retention(), high);
    Ok(())
}

#[test]
fn token_ranges_set_retention_in_every_tier() -> TestResult {
    let mut manager = KvBlockManager::new(config(4, Some(4), None))?;
    let mut stores = stores(None)?;
    let chain = hashes(1, 3);
    drop(compute(
        &mut manager,
        &mut stores,
        &chain,
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    let ranges = [TokenRangeRetention {
        token_start: 0,
        token_end: Some(20),
        priority: 80,
        duration: Some(Duration::from_secs(1)),
    }];
    manager.retain_ranges(&chain, &ranges, Tick(0))?;
    for tier in [Tier::Device, Tier::Host] {
        let pool = manager.pool(tier).ok_or("tier")?;
        let priorities: Vec<u8> = chain
            .iter()
            .filter_map(|h| pool.retention(*h))
            .map(|r| r.effective_priority(Tick(0)))
            .collect();
        assert_eq!(priorities, vec![80, 80, 35]);
    }
    Ok(())
}

#[test]
fn prefetch_past_its_grace_is_dropped() -> TestResult {
    let mut manager = KvBlockManager::new(config(2, Some(4), None))?;
    let mut stores = stores(None)?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(1, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(9, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(1),
    )?);
    let batch = manager.prefetch(&hashes(1, 3), Tick(10))?;
    assert_eq!(batch.len(), 2);
    let late = Tick(10).after(Duration::from_millis(101));
    let committed = manager.commit(batch, &[], late)?;
    assert!(committed.expired && committed.blocks.is_empty());
    assert_eq!(
        manager.pool(Tier::Device).map(|p| p.usage().leased),
        Some(0)
    );
    let batch = manager.prefetch(&hashes(1, 2), Tick(20))?;
    let performed = perform(&batch, &mut stores);
    let committed = manager.commit(batch, &performed.failed, Tick(21))?;
    assert_eq!(committed.blocks.len(), 2);
    assert_eq!(manager.metrics().prefetch_expired, 1);
    Ok(())
}

#[test]
fn a_tier_slower_than_recompute_is_bypassed() -> TestResult {
    let mut cfg = config(2, Some(4), None);
    cfg.recompute_per_block = Some(Duration::from_micros(100));
    let mut manager = KvBlockManager::new(cfg)?;
    let mut stores = stores(None)?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(1, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(9, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(1),
    )?);
    assert_eq!(
        manager.metrics().tiers[1].load_bytes_per_s,
        0,
        "nothing measured yet"
    );
    manager.record_load(Tier::Host, 2, Duration::from_micros(20));
    assert_eq!(manager.lookup(&hashes(1, 2), Tick(2)).lower.len(), 2);
    // 10 us a block.
    let fast = manager.metrics().tiers[1].load_bytes_per_s;
    assert_eq!(fast, BLOCK_BYTES as u64 * 100_000);
    manager.record_load(Tier::Host, 1, Duration::from_millis(5));
    assert!(manager.is_bypassed(Tier::Host));
    assert!(manager.metrics().tiers[1].load_bytes_per_s < fast / 100);
    assert_eq!(manager.lookup(&hashes(1, 2), Tick(3)).local_blocks(), 0);
    assert_eq!(manager.metrics().bypassed_reads, 1);
    Ok(())
}

#[test]
fn a_corrupt_disk_block_is_a_miss_and_leaves_the_tier() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(2, Some(2), Some(8));
    cfg.disk_min_accesses = 1;
    let mut manager = KvBlockManager::new(cfg)?;
    let mut stores = stores(Some(dir.path()))?;
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(1, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(0))?;
    assert_eq!(manager.metrics().offload_blocks_h2d, 2);
    // Push both out of G1 and G2.
    drop(compute(
        &mut manager,
        &mut stores,
        &hashes(10, 2),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(1),
    )?);
    drain_offloads(&mut manager, &mut stores, Tick(1))?;
    let found = manager.lookup(&hashes(1, 2), Tick(2));
    assert!(found.lower.iter().all(|(tier, _)| *tier == Tier::Disk));
    let slot = found.lower[0].1.id();
    let path = dir.path().join("blocks.kvb");
    let mut bytes = std::fs::read(&path)?;
    let offset = slot.index() * (BLOCK_BYTES + 32).div_ceil(4096) * 4096 + 40; // a payload byte
    bytes[offset] ^= 0xFF;
    std::fs::write(&path, &bytes)?;
    let batch = manager.onboard(found.lower, Tick(2))?;
    let performed = perform(&batch, &mut stores);
    assert_eq!(performed.corrupt, vec![(Tier::Disk, SequenceHash(1))]);
    let committed = manager.commit(batch, &performed.failed, Tick(2))?;
    assert_eq!(committed.blocks.len(), 1);
    for (tier, hash) in performed.corrupt {
        manager.report_corrupt(tier, hash);
    }
    assert!(
        !manager
            .pool(Tier::Disk)
            .is_some_and(|p| p.contains(SequenceHash(1)))
    );
    assert_eq!(manager.metrics().checksum_failures, 1);
    Ok(())
}

#[test]
fn batches_are_checked_against_their_manager() -> TestResult {
    let mut a = KvBlockManager::new(config(2, Some(2), None))?;
    let mut b = KvBlockManager::new(config(2, Some(2), None))?;
    let mut stores = stores(None)?;
    drop(compute(
        &mut a,
        &mut stores,
        &hashes(1, 1),
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?);
    let batch = a.plan_offload(Tick(0))?.ok_or("no batch")?;
    assert!(matches!(
        b.commit(batch, &[], Tick(0)),
        Err(KvbmError::ForeignBatch)
    ));
    // The dropped batch returned its slot.
    assert_eq!(a.pool(Tier::Host).map(|p| p.usage().free), Some(2));
    Ok(())
}

#[test]
fn a_second_worker_reuses_a_prefix_through_the_shared_pool() -> TestResult {
    let pool = Arc::new(MemoryPool::new(16, BLOCK_BYTES)?);
    let mut worker_a = KvBlockManager::new(config(4, None, None))?.with_shared_pool(pool.clone());
    let mut worker_b = KvBlockManager::new(config(4, None, None))?.with_shared_pool(pool.clone());
    let mut stores_a = stores(None)?;
    let mut stores_b = stores(None)?;
    let system_prompt = hashes(1, 3);
    let computed = compute(
        &mut worker_a,
        &mut stores_a,
        &system_prompt,
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(0),
    )?;
    let device_a = stores_a.get_mut(Tier::Device).ok_or("device")?;
    assert!(publish_to_pool(pool.as_ref(), device_a, &computed).is_empty());

    // Worker B has block 1 itself; the pool supplies the rest of the prompt.
    drop(compute(
        &mut worker_b,
        &mut stores_b,
        &system_prompt[..1],
        Retention::DEFAULT,
        &mut OffloadBudget::unlimited(),
        Tick(1),
    )?);
    let mut prompt = system_prompt.clone();
    prompt.push(SequenceHash(50));
    let found = worker_b.lookup(&prompt, Tick(2));
    assert_eq!((found.device.len(), found.pool_blocks), (1, 2));
    let start = found.local_blocks();
    let fetch = worker_b.plan_pool_fetch(
        &prompt[start..start + found.pool_blocks],
        Some(prompt[start - 1]),
        Tick(2),
    )?;
    let device_b = stores_b.get_mut(Tier::Device).ok_or("device")?;
    let failed = fetch_from_pool(pool.as_ref(), &fetch, device_b);
    let committed = worker_b.commit_pool_fetch(fetch, &failed, Tick(2))?;
    assert_eq!(committed.blocks.len(), 2);
    assert_eq!(committed.blocks[1].parent(), Some(SequenceHash(2)));
    let mut out = vec![0; BLOCK_BYTES];
    device_b.read_block(committed.blocks[1].id(), SequenceHash(3), &mut out)?;
    assert_eq!(out, vec![3u8; BLOCK_BYTES]);
    drop((found, committed));
    assert_eq!(worker_b.lookup(&prompt, Tick(3)).device.len(), 3);
    let metrics = worker_b.metrics();
    assert_eq!((metrics.onboard_blocks_pool, metrics.pool_hits), (2, 2));
    Ok(())
}

#[test]
fn a_pool_fetch_stops_at_the_first_hole() -> TestResult {
    let pool = Arc::new(MemoryPool::new(16, BLOCK_BYTES)?);
    let mut manager = KvBlockManager::new(config(4, None, None))?.with_shared_pool(pool.clone());
    for hash in hashes(1, 3) {
        pool.put(hash, None, &[hash.0 as u8; BLOCK_BYTES])?;
    }
    let fetch = manager.plan_pool_fetch(&hashes(1, 3), None, Tick(0))?;
    let committed = manager.commit_pool_fetch(fetch, &[SequenceHash(2)], Tick(0))?;
    assert_eq!((committed.blocks.len(), committed.failed), (1, 2));
    drop(committed);
    let usage = manager
        .pool(Tier::Device)
        .map(|p| p.usage())
        .ok_or("pool")?;
    assert_eq!((usage.registered, usage.leased, usage.free), (1, 0, 3));
    Ok(())
}
