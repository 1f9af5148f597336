//! H2D and D2H bandwidth between the G1 device slab and a G2 host slab, through
//! `storage::copy_between`, the path the tiers use: blocks of 64 KiB, 512 KiB and 2 MiB; pinned
//! vs pageable host memory; one batch (one stream synchronisation) vs one block at a time (one
//! synchronisation each). Prints a markdown table and one JSON line. Without a driver or device
//! it says why and exits 0 (1 if `KVBM_REQUIRE_GPU` is set), so `scripts/gpu-check.sh` runs
//! anywhere.
//!
//! ```sh
//! cargo run --release -p switchyard-kvbm --features cuda --example gpu_bandwidth
//! # KVBM_GPU_BW_MIB: bytes moved per measurement (default 256); KVBM_GPU_BW_REPS: timed
//! # repetitions, after one warm-up (default 10). The median is reported, in GB/s (10^9 bytes).
//! ```

use std::error::Error;
use std::time::Instant;

use switchyard_kvbm::storage::{BlockCopy, BlockStore, DeviceSlab, HostSlab, copy_between};
use switchyard_kvbm::{BlockId, SequenceHash, StorageError};

const BLOCK_SIZES: [usize; 3] = [64 << 10, 512 << 10, 2 << 20];

struct Row {
    block_bytes: usize,
    direction: &'static str,
    host: &'static str,
    batched: f64,
    one_by_one: f64,
}

fn env_usize(name: &str, default: usize) -> Result<usize, Box<dyn Error>> {
    match std::env::var(name) {
        Ok(value) => Ok(value.parse().map_err(|e| format!("{name}={value}: {e}"))?),
        Err(_) => Ok(default),
    }
}

/// The bytes of block `index` (its hash): different for every block, so a misplaced copy shows.
fn pattern(index: u64, block_bytes: usize) -> Vec<u8> {
    let seed = index.wrapping_mul(2_654_435_761) as usize;
    (0..block_bytes)
        .map(|i| (seed.wrapping_add(i / 8) % 251) as u8)
        .collect()
}

/// Copy `copies` as one batch, or one `copy_between` per block; the first failure, if any.
fn transfer(
    source: &mut dyn BlockStore,
    dest: &mut dyn BlockStore,
    copies: &[BlockCopy],
    batched: bool,
) -> Result<(), StorageError> {
    if batched {
        return copy_between(source, dest, copies).into_iter().collect();
    }
    for copy in copies {
        copy_between(source, dest, std::slice::from_ref(copy))
            .into_iter()
            .collect::<Result<(), _>>()?;
    }
    Ok(())
}

/// Median GB/s of `reps` timed runs of `run` (after one warm-up), each moving `bytes`.
fn measure(
    reps: usize,
    bytes: usize,
    mut run: impl FnMut() -> Result<(), StorageError>,
) -> Result<f64, StorageError> {
    run()?;
    let mut rates = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        run()?;
        rates.push(bytes as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[rates.len() / 2])
}

fn main() -> Result<(), Box<dyn Error>> {
    let total_bytes = env_usize("KVBM_GPU_BW_MIB", 256)? << 20;
    let reps = env_usize("KVBM_GPU_BW_REPS", 10)?;
    let device_name = match DeviceSlab::open(0, 1, 4096) {
        Ok(probe) => probe.device_name()?,
        Err(error) => {
            println!("gpu_bandwidth: nothing measured: {error}");
            // scripts/gpu-check.sh sets this on a machine with a GPU: there, no device is a failure.
            if std::env::var_os("KVBM_REQUIRE_GPU").is_some() {
                return Err("KVBM_REQUIRE_GPU is set".into());
            }
            return Ok(());
        }
    };
    let mut rows = Vec::new();
    for block_bytes in BLOCK_SIZES {
        let blocks = (total_bytes / block_bytes).max(1);
        let bytes = blocks * block_bytes;
        let copies: Vec<BlockCopy> = (0..blocks)
            .map(|index| {
                let slot = BlockId(u32::try_from(index)?);
                Ok(BlockCopy {
                    hash: SequenceHash(index as u64),
                    from: slot,
                    to: slot,
                })
            })
            .collect::<Result<_, std::num::TryFromIntError>>()?;
        let mut device = DeviceSlab::open(0, blocks, block_bytes)?;
        let hosts = [
            ("pinned", HostSlab::pinned(0, blocks, block_bytes)?),
            ("pageable", HostSlab::new(blocks, block_bytes)?),
        ];
        for (host_name, mut host) in hosts {
            for copy in &copies {
                let data = pattern(copy.hash.0, block_bytes);
                host.write_block(copy.from, copy.hash, &data)?;
            }
            let mut rates = [[0.0; 2]; 2];
            for (mode, batched) in [true, false].into_iter().enumerate() {
                rates[0][mode] = measure(reps, bytes, || {
                    transfer(&mut host, &mut device, &copies, batched)
                })?;
                rates[1][mode] = measure(reps, bytes, || {
                    transfer(&mut device, &mut host, &copies, batched)
                })?;
            }
            for (direction, [batched, one_by_one]) in ["H2D", "D2H"].into_iter().zip(rates) {
                rows.push(Row {
                    block_bytes,
                    direction,
                    host: host_name,
                    batched,
                    one_by_one,
                });
            }
        }
        // The bytes made the round trip: the device holds every block, each in its own slot.
        let mut check = HostSlab::new(blocks, block_bytes)?;
        transfer(&mut device, &mut check, &copies, true)?;
        for copy in &copies {
            if check.block(copy.to)? != pattern(copy.hash.0, block_bytes).as_slice() {
                return Err(format!("block {} came back different", copy.to.0).into());
            }
        }
    }
    print_results(&device_name, total_bytes, reps, &rows);
    Ok(())
}

fn print_results(device_name: &str, total_bytes: usize, reps: usize, rows: &[Row]) {
    println!(
        "Device 0: {device_name}; {} MiB per measurement, median of {reps}; GB/s = 10^9 bytes/s.",
        total_bytes >> 20
    );
    println!();
    println!("| block | direction | host memory | batched GB/s | one by one GB/s |");
    println!("|---|---|---|---:|---:|");
    for row in rows {
        println!(
            "| {} KiB | {} | {} | {:.1} | {:.1} |",
            row.block_bytes >> 10,
            row.direction,
            row.host,
            row.batched,
            row.one_by_one
        );
    }
    println!();
    let results: Vec<String> = rows
        .iter()
        .flat_map(|row| {
            [("batched", row.batched), ("one_by_one", row.one_by_one)].map(|(mode, rate)| {
                format!(
                    "{{\"block_bytes\":{},\"direction\":\"{}\",\"host\":\"{}\",\"mode\":\"{mode}\",\"gb_per_s\":{rate:.2}}}",
                    row.block_bytes,
                    row.direction.to_lowercase(),
                    row.host
                )
            })
        })
        .collect();
    println!(
        "{{\"bench\":\"kvbm_gpu_bandwidth\",\"device\":{device_name:?},\"bytes_per_measurement\":{total_bytes},\"reps\":{reps},\"results\":[{}]}}",
        results.join(",")
    );
}
