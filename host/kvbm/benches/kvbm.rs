//! `cargo bench -p switchyard-kvbm`
//!
//! - `kvbm/lifecycle/*`: block lifecycle operations per second (pure logic, no bytes).
//! - `kvbm/g2_g3/*`: moving real bytes between the host slab (G2) and the disk tier (G3),
//!   against a plain sequential copy of the same bytes to and from one file on the same disk,
//!   in the same run. Compare the ratios, not the absolute numbers (the machine is shared).

use std::fs::File;
use std::hint::black_box;
use std::io::{Read, Write};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use switchyard_kvbm::pool::BlockPool;
use switchyard_kvbm::retention::Retention;
use switchyard_kvbm::storage::{BlockCopy, BlockStore, DiskStore, HostSlab, copy_between};
use switchyard_kvbm::{
    BlockId, KvBlockManager, ManagerConfig, OffloadBudget, SequenceHash, Tick, Tier, TierConfig,
};

const CHAIN: usize = 64;

fn lifecycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("kvbm/lifecycle");
    group.throughput(Throughput::Elements(CHAIN as u64));

    // Allocate a chain (evicting an old one once full), complete, register, drop.
    group.bench_function(BenchmarkId::new("allocate_register_drop", CHAIN), |b| {
        let pool = BlockPool::new(Tier::Device, 16 * CHAIN, 0).unwrap_or_else(|e| panic!("{e}"));
        let mut next = 0u64;
        b.iter(|| {
            let Ok(allocation) = pool.allocate(CHAIN, Tick(next)) else {
                return;
            };
            let mut parent = None;
            let mut held = Vec::with_capacity(CHAIN);
            for block in allocation.blocks {
                next += 1;
                let hash = SequenceHash(next);
                if let Ok(r) =
                    pool.register(block.complete(hash, parent), Retention::DEFAULT, Tick(next))
                {
                    held.push(r.block);
                }
                parent = Some(hash);
            }
            black_box(&held);
        });
    });

    // A prefix hit of a whole chain, then release.
    group.bench_function(BenchmarkId::new("match_prefix_release", CHAIN), |b| {
        let pool = BlockPool::new(Tier::Device, 4 * CHAIN, 0).unwrap_or_else(|e| panic!("{e}"));
        let hashes: Vec<SequenceHash> = (1..=CHAIN as u64).map(SequenceHash).collect();
        if let Ok(allocation) = pool.allocate(CHAIN, Tick(0)) {
            let mut parent = None;
            for (block, hash) in allocation.blocks.into_iter().zip(&hashes) {
                drop(pool.register(block.complete(*hash, parent), Retention::DEFAULT, Tick(0)));
                parent = Some(*hash);
            }
        }
        b.iter(|| black_box(pool.match_prefix(&hashes, Tick(1))));
    });

    // The manager's whole path for one chain: lookup, allocate, register with write-through
    // queued, plan and commit the offload batches (no bytes moved).
    group.bench_function(BenchmarkId::new("manager_compute_offload", CHAIN), |b| {
        let mut config = ManagerConfig::new(16, 1, 8 * CHAIN);
        config.host = Some(TierConfig::blocks(16 * CHAIN));
        config.offload_batch_blocks = 32;
        let mut manager = KvBlockManager::new(config).unwrap_or_else(|e| panic!("{e}"));
        let mut next = 0u64;
        b.iter(|| {
            let hashes: Vec<SequenceHash> = (0..CHAIN)
                .map(|_| {
                    next += 1;
                    SequenceHash(next)
                })
                .collect();
            let now = Tick(next);
            drop(manager.lookup(&hashes, now));
            let Ok(blocks) = manager.allocate(CHAIN, now) else {
                return;
            };
            let mut parent = None;
            let mut budget = OffloadBudget::unlimited();
            let mut held = Vec::with_capacity(CHAIN);
            for (block, hash) in blocks.into_iter().zip(&hashes) {
                if let Ok(r) = manager.register(
                    block.complete(*hash, parent),
                    Retention::DEFAULT,
                    &mut budget,
                    now,
                ) {
                    held.push(r);
                }
                parent = Some(*hash);
            }
            drop(held);
            while let Ok(Some(batch)) = manager.plan_offload(now) {
                drop(manager.commit(batch, &[], now));
            }
            black_box(manager.drain_events());
        });
    });
    group.finish();
}

fn fill(slab: &mut HostSlab, blocks: usize, block_bytes: usize) {
    let mut data = vec![0u8; block_bytes];
    for slot in 0..blocks {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = (slot.wrapping_mul(31) ^ i) as u8;
        }
        let _ = slab.write_block(BlockId(slot as u32), SequenceHash(slot as u64), &data);
    }
}

fn g2_g3(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("kvbm-bench")
        .tempdir_in(std::env::temp_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("kvbm/g2_g3");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    group.warm_up_time(Duration::from_secs(1));
    for (block_bytes, blocks) in [(64 << 10, 256usize), (512 << 10, 64), (2 << 20, 16)] {
        let label = format!("{}KiB", block_bytes >> 10);
        let total = (block_bytes * blocks) as u64;
        group.throughput(Throughput::Bytes(total));
        let mut host = HostSlab::new(blocks, block_bytes).unwrap_or_else(|e| panic!("{e}"));
        fill(&mut host, blocks, block_bytes);
        let mut disk = DiskStore::open(&dir.path().join(&label), blocks, block_bytes, None)
            .unwrap_or_else(|e| panic!("{e}"));
        let copies: Vec<BlockCopy> = (0..blocks)
            .map(|slot| BlockCopy {
                hash: SequenceHash(slot as u64),
                from: BlockId(slot as u32),
                to: BlockId(slot as u32),
            })
            .collect();

        // G2 -> G3: checksummed records written straight from the slab, one flush.
        group.bench_function(BenchmarkId::new("offload_g2_to_g3", &label), |b| {
            b.iter(|| black_box(copy_between(&mut host, &mut disk, &copies)));
        });
        // G3 -> G2: verified reads straight into the slab.
        group.bench_function(BenchmarkId::new("onboard_g3_to_g2", &label), |b| {
            b.iter(|| black_box(copy_between(&mut disk, &mut host, &copies)));
        });

        // Baselines: the same bytes, one sequential file, same directory. `plain_file_write`
        // creates (truncates) the file each time, like `cp`.
        let plain = dir.path().join(format!("plain-{label}.bin"));
        let source: Vec<u8> = host
            .block(BlockId(0))
            .map(|b| b.repeat(blocks))
            .unwrap_or_default();
        group.bench_function(BenchmarkId::new("plain_file_write", &label), |b| {
            b.iter(|| {
                if let Ok(mut file) = File::create(&plain) {
                    let _ = file.write_all(&source);
                    let _ = file.flush();
                }
            });
        });
        // The same file rewritten in place, as the disk tier rewrites its slot file.
        group.bench_function(BenchmarkId::new("plain_file_overwrite", &label), |b| {
            b.iter(|| {
                if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&plain) {
                    let _ = file.write_all(&source);
                    let _ = file.flush();
                }
            });
        });
        let mut back = vec![0u8; source.len()];
        group.bench_function(BenchmarkId::new("plain_file_read", &label), |b| {
            b.iter(|| {
                if let Ok(mut file) = File::open(&plain) {
                    let _ = file.read_exact(&mut back);
                }
                black_box(&back);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, lifecycle, g2_g3);
criterion_main!(benches);
