use super::*;
use crate::protocol::PutRetention;
use proptest::prelude::*;
use std::collections::BTreeSet;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BLOCK: usize = 64;

/// A block's bytes follow from its hash, so any byte served can be checked.
fn bytes_of(hash: u64) -> Bytes {
    let mut bytes = vec![(hash % 251) as u8; BLOCK];
    bytes[..8].copy_from_slice(&hash.to_le_bytes());
    bytes.into()
}

fn block(hash: u64, parent: Option<u64>) -> PutBlock {
    PutBlock {
        hash,
        parent,
        token_ids: vec![hash as u32; 4],
        retention: None,
        bytes: bytes_of(hash),
    }
}

fn config(memory: usize, disk: Option<(&std::path::Path, usize, Option<u64>)>) -> PoolConfig {
    PoolConfig {
        disk: disk.map(|(dir, blocks, max_bytes)| DiskConfig {
            dir: dir.to_owned(),
            blocks,
            max_bytes,
        }),
        ..PoolConfig::memory(BLOCK, memory)
    }
}

/// What the events say each medium holds.
#[derive(Debug, Default)]
struct Replayed {
    cpu: BTreeSet<u64>,
    disk: BTreeSet<u64>,
}

impl Replayed {
    fn apply(&mut self, events: Vec<MooncakeEvent>) {
        for event in events {
            let set = match event.medium.as_str() {
                "CPU" => &mut self.cpu,
                "DISK" => &mut self.disk,
                other => panic!("unknown medium {other}"),
            };
            for hash in event.seq_hashes {
                match event.event_type {
                    MooncakeEventType::Stored => assert!(set.insert(hash.0), "stored twice"),
                    MooncakeEventType::Removed => assert!(set.remove(&hash.0), "removed absent"),
                }
            }
        }
    }
}

fn drain(receiver: &mut mpsc::UnboundedReceiver<Vec<MooncakeEvent>>, replayed: &mut Replayed) {
    while let Ok(events) = receiver.try_recv() {
        replayed.apply(events);
    }
}

#[test]
fn puts_and_gets_round_trip_and_duplicates_are_touched() -> TestResult {
    let pool = Pool::open(config(4, None), None)?;
    let summary = pool.put(&[block(1, None), block(2, Some(1))])?;
    assert_eq!((summary.stored, summary.duplicates), (2, 0));
    let again = pool.put(&[block(1, None)])?;
    assert_eq!(again.results, vec![PutResult::Duplicate]);
    assert_eq!(pool.exists(&[1, 2, 3]), vec![true, true, false]);
    assert_eq!(
        pool.get(&[2, 3, 1]),
        vec![Some(bytes_of(2)), None, Some(bytes_of(1))]
    );
    let counters = pool.counters();
    assert_eq!((counters.puts, counters.duplicate_puts), (2, 1));
    assert_eq!((counters.memory_hits, counters.memory_misses), (2, 1));
    assert_eq!(counters.bytes_out, 2 * BLOCK as u64);
    Ok(())
}

#[test]
fn memory_evictions_go_to_disk_and_a_disk_hit_comes_back_to_memory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let pool = Pool::open(config(2, Some((dir.path(), 4, None))), Some(sender))?;
    // A chain of three in a memory of two: the leaf goes to disk first.
    pool.put(&[block(1, None), block(2, Some(1)), block(3, Some(2))])?;
    assert_eq!(pool.hashes(PoolTier::Memory), vec![1, 3]);
    assert_eq!(pool.hashes(PoolTier::Disk), vec![2]);
    // Served from disk and moved back to memory, whose victim goes to disk in turn.
    assert_eq!(pool.get(&[2]), vec![Some(bytes_of(2))]);
    assert_eq!(pool.counters().disk_hits, 1);
    assert_eq!(pool.counters().promoted, 1);
    assert!(pool.hashes(PoolTier::Memory).contains(&2));
    assert_eq!(pool.hashes(PoolTier::Disk).len(), 1);
    assert!(!pool.hashes(PoolTier::Disk).contains(&2));
    // The next get of it is a memory hit.
    assert_eq!(pool.get(&[2]), vec![Some(bytes_of(2))]);
    assert_eq!(
        (pool.counters().memory_hits, pool.counters().disk_hits),
        (1, 1)
    );
    let events: Vec<MooncakeEvent> = std::iter::from_fn(|| receiver.try_recv().ok())
        .flatten()
        .collect();
    // The disk store is self-describing too: tokens and parent.
    let to_disk = events
        .iter()
        .find(|e| e.medium == "DISK" && e.event_type == MooncakeEventType::Stored)
        .ok_or("a disk store event")?;
    assert_eq!(to_disk.seq_hashes, vec![EngineHash(2)]);
    assert_eq!(to_disk.parent_hash, Some(EngineHash(1)));
    assert_eq!(to_disk.token_ids, vec![2; 4]);
    // Its store in memory comes before its removal from disk, so the events never say the
    // pool lost it.
    let position = |medium: &str, kind: MooncakeEventType| {
        events.iter().rposition(|e| {
            e.medium == medium && e.event_type == kind && e.seq_hashes.contains(&EngineHash(2))
        })
    };
    let back = position("CPU", MooncakeEventType::Stored).ok_or("stored in memory again")?;
    let gone = position("DISK", MooncakeEventType::Removed).ok_or("removed from disk")?;
    assert!(back < gone, "{events:?}");
    let mut replayed = Replayed::default();
    replayed.apply(events);
    let held = |tier| pool.hashes(tier).into_iter().collect::<BTreeSet<_>>();
    assert_eq!(replayed.cpu, held(PoolTier::Memory));
    assert_eq!(replayed.disk, held(PoolTier::Disk));
    Ok(())
}

#[test]
fn a_restarted_pool_keeps_its_disk_blocks_and_announces_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = Pool::open(config(1, Some((dir.path(), 4, None))), None)?;
    pool.put(&[block(1, None), block(2, None), block(3, None)])?;
    let on_disk = pool.hashes(PoolTier::Disk);
    assert_eq!(on_disk, vec![1, 2]);
    // One record corrupted while the pool is down: kept at start, never served.
    let (path, offset) = pool.disk_record(2).ok_or("block 2 is on disk")?;
    drop(pool);
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    std::os::unix::fs::FileExt::write_all_at(&file, b"garbage!", offset)?;

    let (sender, mut receiver) = mpsc::unbounded_channel();
    let pool = Pool::open(config(1, Some((dir.path(), 4, None))), Some(sender))?;
    assert_eq!(pool.counters().adopted, 2);
    assert_eq!(pool.hashes(PoolTier::Disk), on_disk);
    assert!(
        pool.hashes(PoolTier::Memory).is_empty(),
        "memory does not survive"
    );
    let mut replayed = Replayed::default();
    drain(&mut receiver, &mut replayed);
    assert_eq!(replayed.disk, BTreeSet::from([1, 2]), "announced at start");
    assert_eq!(pool.get(&[1, 2]), vec![Some(bytes_of(1)), None]);
    assert_eq!(pool.disk_counters().map(|c| c.checksum_failures), Some(1));
    // The events still replay to what each tier holds.
    drain(&mut receiver, &mut replayed);
    let held = |tier| pool.hashes(tier).into_iter().collect::<BTreeSet<_>>();
    assert_eq!(replayed.cpu, held(PoolTier::Memory));
    assert_eq!(replayed.disk, held(PoolTier::Disk));
    Ok(())
}

#[test]
fn a_restarted_pool_announces_its_disk_chains_root_first_with_parents_and_tokens() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = Pool::open(config(2, Some((dir.path(), 4, None))), None)?;
    // Memory of two: the chain's leaf 2 goes to disk first, then its parent 1 (slot order is
    // child, parent).
    pool.put(&[block(1, None), block(2, Some(1)), block(3, Some(2))])?;
    pool.put(&[block(9, None)])?;
    assert_eq!(pool.hashes(PoolTier::Disk), vec![1, 2]);
    drop(pool);

    let (sender, mut receiver) = mpsc::unbounded_channel();
    let _pool = Pool::open(config(2, Some((dir.path(), 4, None))), Some(sender))?;
    let mut announced = Vec::new();
    while let Ok(events) = receiver.try_recv() {
        announced.extend(
            events
                .into_iter()
                .map(|e| (e.seq_hashes[0].0, e.parent_hash.map(|p| p.0), e.token_ids)),
        );
    }
    // With the tokens their writer gave (`block` gives four per block).
    assert_eq!(
        announced,
        vec![(1, None, vec![1; 4]), (2, Some(1), vec![2; 4])]
    );
    Ok(())
}

#[test]
fn retention_decides_what_leaves_memory() -> TestResult {
    let pool = Pool::open(config(2, None), None)?;
    let keep = PutRetention {
        priority: 90,
        duration_ms: None,
    };
    pool.put(&[PutBlock {
        retention: Some(keep),
        ..block(1, None)
    }])?;
    pool.put(&[block(2, None), block(3, None)])?;
    assert_eq!(pool.hashes(PoolTier::Memory), vec![1, 3]);
    let bad = PutBlock {
        retention: Some(PutRetention {
            priority: 101,
            duration_ms: None,
        }),
        ..block(4, None)
    };
    assert!(matches!(pool.put(&[bad]), Err(PutError::Retention { .. })));
    Ok(())
}

#[test]
fn a_corrupt_disk_record_is_a_counted_miss() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let pool = Pool::open(config(1, Some((dir.path(), 2, None))), Some(sender))?;
    pool.put(&[block(1, None), block(2, None)])?;
    let (path, offset) = pool.disk_record(1).ok_or("block 1 is on disk")?;
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    std::os::unix::fs::FileExt::write_all_at(&file, b"garbage!", offset)?;
    assert_eq!(pool.get(&[1]), vec![None]);
    assert_eq!(pool.disk_counters().map(|c| c.checksum_failures), Some(1));
    assert_eq!(pool.counters().disk_misses, 1);
    assert_eq!(pool.exists(&[1]), vec![false]);
    let mut replayed = Replayed::default();
    drain(&mut receiver, &mut replayed);
    assert!(
        replayed.disk.is_empty(),
        "the corrupt block's removal was published"
    );
    Ok(())
}

#[test]
fn a_full_disk_degrades_and_never_fails_a_put() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Room for 8 blocks by count but one record by bytes.
    let pool = Pool::open(config(1, Some((dir.path(), 8, Some(4096)))), None)?;
    for hash in 0..6 {
        pool.put(&[block(hash, None)])?;
    }
    assert_eq!(pool.hashes(PoolTier::Disk).len(), 1);
    assert_eq!(pool.hashes(PoolTier::Memory), vec![5]);
    assert!(pool.counters().spill_failures >= 3);
    assert!(
        pool.disk_counters()
            .is_some_and(|c| c.writes_skipped_full >= 3)
    );
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Put(Vec<(u64, Option<u64>, Option<u8>)>),
    Get(Vec<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    let hash = 0u64..24;
    prop_oneof![
        3 => prop::collection::vec(
            (hash.clone(), prop::option::of(0u64..24), prop::option::of(0u8..=100)),
            1..5
        )
        .prop_map(Op::Put),
        1 => prop::collection::vec(hash, 1..5).prop_map(Op::Get),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of puts and gets: each tier stays within its capacity, every get returns
    /// exactly the bytes put for its hash or a miss, a block is in at most one tier, and the
    /// events replay to exactly what each tier holds.
    #[test]
    fn bounds_bytes_and_events_hold(
        ops in prop::collection::vec(op(), 1..40),
        memory in 1usize..5,
        disk in prop::option::of((1usize..6, prop::option::of(1u64..4))),
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = disk.map(|(blocks, records)| (dir.path(), blocks, records.map(|r| r * 4096)));
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let pool = Pool::open(config(memory, disk), Some(sender)).expect("opens");
        let mut replayed = Replayed::default();
        for op in ops {
            match op {
                Op::Put(blocks) => {
                    let blocks: Vec<PutBlock> = blocks
                        .into_iter()
                        .map(|(hash, parent, priority)| PutBlock {
                            retention: priority.map(|priority| PutRetention { priority, duration_ms: Some(5) }),
                            ..block(hash, parent)
                        })
                        .collect();
                    let summary = pool.put(&blocks).expect("a valid put never fails");
                    prop_assert_eq!(summary.results.len(), blocks.len());
                }
                Op::Get(hashes) => {
                    for (hash, got) in hashes.iter().zip(pool.get(&hashes)) {
                        if let Some(got) = got {
                            prop_assert_eq!(got, bytes_of(*hash));
                        }
                    }
                }
            }
            let memory_held = pool.hashes(PoolTier::Memory);
            let disk_held = pool.hashes(PoolTier::Disk);
            prop_assert!(memory_held.len() <= memory);
            prop_assert!(disk_held.len() <= disk.map_or(0, |(_, blocks, _)| blocks));
            prop_assert!(memory_held.iter().all(|h| !disk_held.contains(h)));
            drain(&mut receiver, &mut replayed);
            prop_assert_eq!(replayed.cpu.iter().copied().collect::<Vec<_>>(), memory_held);
            prop_assert_eq!(replayed.disk.iter().copied().collect::<Vec<_>>(), disk_held);
        }
    }
}

/// Callers at once, their disk reads outside the pool's lock: every get returns exactly the
/// bytes put for its hash or a miss, reads and promotions happen, and the events still replay to
/// exactly what each tier holds.
#[test]
fn callers_at_once_read_the_disk_outside_the_lock_and_the_events_still_hold() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let pool = Pool::open(config(4, Some((dir.path(), 24, None))), Some(sender))?;
    let rounds = 400u64;
    std::thread::scope(|scope| {
        for caller in 0..4u64 {
            let pool = &pool;
            scope.spawn(move || {
                // A fixed walk per caller over 32 hashes: puts that spill memory to disk,
                // gets that mostly find the disk.
                let mut state = caller.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state % 32
                };
                for _ in 0..rounds {
                    let hash = next();
                    if hash % 3 == 0 {
                        pool.put(&[block(hash, None)])
                            .expect("a valid put never fails");
                    } else {
                        let hashes = [hash, next(), next()];
                        for (hash, got) in hashes.iter().zip(pool.get(&hashes)) {
                            if let Some(got) = got {
                                assert_eq!(got, bytes_of(*hash), "the bytes of {hash}");
                            }
                        }
                    }
                }
            });
        }
    });
    let counters = pool.counters();
    assert!(
        counters.disk_hits > 0 && counters.promoted > 0,
        "{counters:?}"
    );
    let mut replayed = Replayed::default();
    drain(&mut receiver, &mut replayed);
    let memory = pool.hashes(PoolTier::Memory);
    let disk = pool.hashes(PoolTier::Disk);
    assert!(memory.iter().all(|h| !disk.contains(h)));
    assert_eq!(replayed.cpu.into_iter().collect::<Vec<_>>(), memory);
    assert_eq!(replayed.disk.into_iter().collect::<Vec<_>>(), disk);
    Ok(())
}
