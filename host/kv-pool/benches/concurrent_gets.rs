//! Gets of a pool whose blocks are mostly on disk, from one caller and from several at once
//! (the service runs each request on its own blocking thread): blocks served per second.
//!
//!   cargo bench -p switchyard-kv-pool --bench concurrent_gets
//!
//! `POOL_BENCH_BLOCK_KIB` (256), `POOL_BENCH_DISK_BLOCKS` (1024), `POOL_BENCH_GETS` (4,000 per
//! round), `POOL_BENCH_CALLERS` ("1 4") override the defaults. The slot file goes to a temporary
//! directory (`TMPDIR`); its pages are cached, as a warm pool's are.

use std::time::Instant;

use bytes::Bytes;
use switchyard_kv_pool::protocol::PutBlock;
use switchyard_kv_pool::store::{DiskConfig, Pool, PoolConfig};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let block_bytes = env("POOL_BENCH_BLOCK_KIB", 256) * 1024;
    let disk_blocks = env("POOL_BENCH_DISK_BLOCKS", 1024);
    let gets = env("POOL_BENCH_GETS", 4_000);
    let callers: Vec<usize> = std::env::var("POOL_BENCH_CALLERS")
        .unwrap_or_else(|_| "1 4".into())
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    let memory_blocks = disk_blocks / 16;
    let held = (disk_blocks + memory_blocks) as u64;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = PoolConfig {
        disk: Some(DiskConfig {
            dir: dir.path().to_owned(),
            blocks: disk_blocks,
            max_bytes: None,
        }),
        ..PoolConfig::memory(block_bytes, memory_blocks)
    };
    let pool = Pool::open(config, None).expect("the pool opens");
    for hash in 1..=held {
        let block = PutBlock {
            hash,
            parent: None,
            token_ids: Vec::new(),
            retention: None,
            bytes: Bytes::from(vec![hash as u8; block_bytes]),
        };
        pool.put(&[block]).expect("stored");
    }
    println!(
        "{} KiB blocks, {memory_blocks} in memory and {disk_blocks} on disk; {gets} gets of 4 \
         blocks per round",
        block_bytes / 1024
    );
    for &callers in &callers {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for caller in 0..callers {
                let pool = &pool;
                scope.spawn(move || {
                    let mut state = (caller as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut next = || {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        1 + state % held
                    };
                    for _ in 0..gets / callers {
                        let hashes = [next(), next(), next(), next()];
                        let served = pool.get(&hashes).iter().filter(|b| b.is_some()).count();
                        assert_eq!(served, 4, "every block is held");
                    }
                });
            }
        });
        let seconds = start.elapsed().as_secs_f64();
        let blocks = (gets / callers * callers * 4) as f64;
        let counters = pool.counters();
        println!(
            "callers {callers}: {:.0} blocks/s, {:.2} GiB/s ({:.2} s; disk hits so far {})",
            blocks / seconds,
            blocks * block_bytes as f64 / seconds / f64::from(1 << 30),
            seconds,
            counters.disk_hits
        );
    }
}
