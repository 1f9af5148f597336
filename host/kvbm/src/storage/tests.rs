use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};

use super::*;
use crate::types::Tick;

fn block(fill: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| fill.wrapping_add(i as u8)).collect()
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn host_slab_round_trips_and_stale_slots_miss() -> TestResult {
    let mut slab = HostSlab::new(4, 64)?;
    slab.write_block(BlockId(2), SequenceHash(9), &block(1, 64))?;
    let mut out = vec![0; 64];
    slab.read_block(BlockId(2), SequenceHash(9), &mut out)?;
    assert_eq!(out, block(1, 64));
    assert!(
        slab.read_block(BlockId(2), SequenceHash(8), &mut out)
            .is_err()
    );
    assert!(matches!(
        slab.write_block(BlockId(4), SequenceHash(1), &out),
        Err(StorageError::SlotOutOfRange { .. })
    ));
    assert!(matches!(
        slab.write_block(BlockId(0), SequenceHash(1), &out[..10]),
        Err(StorageError::WrongBlockSize { .. })
    ));
    let mut other = HostSlab::new(4, 64)?;
    other.copy_from(&slab, &[(BlockId(2), BlockId(0))])?;
    other.read_block(BlockId(0), SequenceHash(9), &mut out)?;
    assert_eq!(out, block(1, 64));
    Ok(())
}

#[test]
fn disk_round_trips() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut disk = DiskStore::open(dir.path(), 8, 1000, None)?;
    disk.write_block(BlockId(3), SequenceHash(77), &block(5, 1000))?;
    let mut out = vec![0; 1000];
    disk.read_block(BlockId(3), SequenceHash(77), &mut out)?;
    assert_eq!(out, block(5, 1000));
    assert_eq!(disk.used_bytes(), disk.record_bytes());
    // Another hash in that slot, or an unwritten slot: a miss, not a corruption.
    assert!(matches!(
        disk.read_block(BlockId(3), SequenceHash(78), &mut out),
        Err(StorageError::Miss { .. })
    ));
    assert!(matches!(
        disk.read_block(BlockId(4), SequenceHash(77), &mut out),
        Err(StorageError::Miss { .. })
    ));
    assert_eq!(disk.counters().checksum_failures, 0);
    Ok(())
}

#[test]
fn a_reopened_disk_keeps_its_records_and_open_discards_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut disk = DiskStore::open(dir.path(), 8, 1000, None)?;
    disk.write_block(BlockId(1), SequenceHash(11), &block(1, 1000))?;
    disk.write_block(BlockId(6), SequenceHash(66), &block(6, 1000))?;
    // The same hash in a second slot (a block written again after its first slot was reused
    // elsewhere): the first slot wins.
    disk.write_block(BlockId(7), SequenceHash(11), &block(1, 1000))?;
    disk.flush()?;
    drop(disk);
    let (mut disk, kept) = DiskStore::reopen(dir.path(), 8, 1000, None)?;
    assert_eq!(
        slots(&kept),
        vec![
            (BlockId(1), SequenceHash(11)),
            (BlockId(6), SequenceHash(66))
        ]
    );
    assert_eq!(disk.used_bytes(), 2 * disk.record_bytes());
    let mut out = vec![0; 1000];
    disk.read_block(BlockId(6), SequenceHash(66), &mut out)?;
    assert_eq!(out, block(6, 1000));
    drop(disk);
    // A byte budget of one record keeps one.
    let record = DiskStore::open(tempfile::tempdir()?.path(), 1, 1000, None)?.record_bytes();
    let (_, kept) = DiskStore::reopen(dir.path(), 8, 1000, Some(record))?;
    assert_eq!(slots(&kept), vec![(BlockId(1), SequenceHash(11))]);
    // Fewer slots: records past them are cut off; another block size: nothing is ours, and the
    // file is emptied.
    let (_, kept) = DiskStore::reopen(dir.path(), 4, 1000, None)?;
    assert_eq!(slots(&kept), vec![(BlockId(1), SequenceHash(11))]);
    assert!(DiskStore::reopen(dir.path(), 4, 900, None)?.1.is_empty());
    assert_eq!(std::fs::metadata(dir.path().join("blocks.kvb"))?.len(), 0);
    // `open` starts empty.
    let (mut disk, _) = DiskStore::reopen(dir.path(), 4, 1000, None)?;
    disk.write_block(BlockId(2), SequenceHash(22), &block(2, 1000))?;
    drop(disk);
    assert_eq!(DiskStore::reopen(dir.path(), 4, 1000, None)?.1.len(), 1);
    let disk = DiskStore::open(dir.path(), 4, 1000, None)?;
    assert_eq!(disk.used_bytes(), 0);
    drop(disk);
    assert!(DiskStore::reopen(dir.path(), 4, 1000, None)?.1.is_empty());
    Ok(())
}

fn slots(kept: &[AdoptedRecord]) -> Vec<(BlockId, SequenceHash)> {
    kept.iter()
        .map(|record| (record.slot, record.hash))
        .collect()
}

fn meta(parent: Option<u64>, retention: Retention) -> BlockMeta {
    BlockMeta {
        parent: parent.map(SequenceHash),
        retention,
        tokens: Vec::new(),
    }
}

#[test]
fn a_reopened_disk_gives_back_each_blocks_parent_retention_and_tokens() -> TestResult {
    let dir = tempfile::tempdir()?;
    let keep = Retention::new(90, None)?;
    let lease = Retention::new(90, Some(Tick(1_000)))?;
    let mut disk = DiskStore::open(dir.path(), 8, 1000, None)?;
    let root = BlockMeta {
        tokens: (0..64).collect(),
        ..meta(None, keep)
    };
    let thinking = meta(Some(10), Retention::ephemeral());
    // Tokens that do not fit the record's padding (4,096 - 1,000 - 64 bytes) are not kept.
    let long = BlockMeta {
        tokens: vec![7; 800],
        ..meta(Some(11), lease)
    };
    for (slot, (hash, meta)) in [(10, &root), (11, &thinking), (12, &long)]
        .into_iter()
        .enumerate()
    {
        let slot = BlockId(slot as u32);
        disk.write_block_with(slot, SequenceHash(hash), meta, &block(slot.0 as u8, 1000))?;
    }
    let parent_at = disk.record_offset(BlockId(2)) + 1000 + 32;
    let token_at = disk.record_offset(BlockId(0)) + 1000 + 64;
    drop(disk);
    let (mut disk, kept) = DiskStore::reopen(dir.path(), 8, 1000, None)?;
    let found: Vec<_> = kept
        .iter()
        .map(|r| (r.slot, r.hash, r.meta.clone()))
        .collect();
    assert_eq!(
        found,
        vec![
            (BlockId(0), SequenceHash(10), root),
            (BlockId(1), SequenceHash(11), thinking),
            // A lease counts from the process that wrote it: back at the default.
            (
                BlockId(2),
                SequenceHash(12),
                meta(Some(11), Retention::DEFAULT)
            ),
        ]
    );
    let mut out = vec![0; 1000];
    disk.read_block(BlockId(1), SequenceHash(11), &mut out)?;
    assert_eq!(out, block(1, 1000));
    // The parent is under the checksum: a record whose parent changed is never served.
    let file = OpenOptions::new().write(true).open(disk.path())?;
    std::os::unix::fs::FileExt::write_all_at(&file, &99u64.to_le_bytes(), parent_at)?;
    assert!(matches!(
        disk.read_block(BlockId(2), SequenceHash(12), &mut out),
        Err(StorageError::Corrupt { .. })
    ));
    assert_eq!(disk.counters().checksum_failures, 1);
    // A changed token loses the tokens at the next reopen, not the block.
    std::os::unix::fs::FileExt::write_all_at(&file, &9u32.to_le_bytes(), token_at)?;
    drop(disk);
    let (mut disk, kept) = DiskStore::reopen(dir.path(), 8, 1000, None)?;
    assert_eq!(kept[0].hash, SequenceHash(10));
    assert!(kept[0].meta.tokens.is_empty());
    disk.read_block(BlockId(0), SequenceHash(10), &mut out)?;
    assert_eq!(out, block(0, 1000));
    Ok(())
}

#[test]
fn a_version_1_record_is_still_read_and_reopens_as_a_leaf() -> TestResult {
    let dir = tempfile::tempdir()?;
    let payload = block(7, 1000);
    // Version 1's layout: the payload, then magic, version, hash, length and the XXH3 of hash
    // and payload; the file ends there.
    let mut record = payload.clone();
    record.extend_from_slice(b"SYKV");
    record.extend_from_slice(&[1, 0, 0, 0]);
    record.extend_from_slice(&77u64.to_le_bytes());
    record.extend_from_slice(&1000u64.to_le_bytes());
    let mut checksum = xxhash_rust::xxh3::Xxh3::new();
    checksum.update(&77u64.to_le_bytes());
    checksum.update(&payload);
    record.extend_from_slice(&checksum.digest().to_le_bytes());
    std::fs::write(dir.path().join("blocks.kvb"), &record)?;
    let (mut disk, kept) = DiskStore::reopen(dir.path(), 4, 1000, None)?;
    assert_eq!(
        kept,
        vec![AdoptedRecord {
            slot: BlockId(0),
            hash: SequenceHash(77),
            meta: BlockMeta::default(),
        }]
    );
    let mut out = vec![0; 1000];
    disk.read_block(BlockId(0), SequenceHash(77), &mut out)?;
    assert_eq!(out, payload);
    Ok(())
}

#[test]
fn a_reopened_disk_pool_still_evicts_a_chain_from_its_tail() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pool = StorePool::over(DiskStore::open(dir.path(), 3, 1000, None)?)?;
    let keep = Retention::new(90, None)?;
    let chain = [
        (1, None, keep),
        (2, Some(1), Retention::DEFAULT),
        (3, Some(2), Retention::DEFAULT),
    ];
    for (tick, (hash, parent, retention)) in chain.into_iter().enumerate() {
        let parent = parent.map(SequenceHash);
        let data = block(hash as u8, 1000);
        let at = Tick(tick as u64 + 1);
        pool.put_at(SequenceHash(hash), parent, retention, &data, at, None)?;
    }
    drop(pool);
    let (store, kept) = DiskStore::reopen(dir.path(), 3, 1000, None)?;
    let pool = StorePool::adopting(store, &kept)?;
    assert_eq!(pool.retention(SequenceHash(1)), Some(keep));
    pool.put_at(
        SequenceHash(9),
        None,
        Retention::DEFAULT,
        &block(9, 1000),
        Tick(1),
        None,
    )?;
    // Full at 3: the chain's leaf went, never its prefix (as leaves, the root went first).
    assert_eq!(pool.drain_removed(), vec![SequenceHash(3)]);
    assert!(pool.holds(SequenceHash(1)) && pool.holds(SequenceHash(2)));
    Ok(())
}

#[test]
fn a_corrupt_byte_is_a_counted_miss() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut disk = DiskStore::open(dir.path(), 4, 1000, None)?;
    disk.write_block(BlockId(1), SequenceHash(5), &block(0, 1000))?;
    disk.write_block(BlockId(2), SequenceHash(6), &block(9, 1000))?;
    disk.flush()?;
    let mut file = OpenOptions::new().write(true).open(disk.path())?;
    file.seek(SeekFrom::Start(disk.record_offset(BlockId(1)) + 500))?;
    file.write_all(&[0xFF])?;
    drop(file);
    let mut out = vec![0; 1000];
    assert!(matches!(
        disk.read_block(BlockId(1), SequenceHash(5), &mut out),
        Err(StorageError::Corrupt { .. })
    ));
    assert_eq!(disk.counters().checksum_failures, 1);
    // A damaged trailer (the magic) is caught as well.
    let mut file = OpenOptions::new().write(true).open(disk.path())?;
    file.seek(SeekFrom::Start(disk.record_offset(BlockId(1)) + 1000))?;
    file.write_all(b"X")?;
    drop(file);
    assert!(matches!(
        disk.read_block(BlockId(1), SequenceHash(5), &mut out),
        Err(StorageError::Corrupt { .. })
    ));
    assert_eq!(disk.counters().checksum_failures, 2);
    // Its neighbour is untouched.
    disk.read_block(BlockId(2), SequenceHash(6), &mut out)?;
    assert_eq!(out, block(9, 1000));
    Ok(())
}

#[test]
fn a_truncated_file_is_a_counted_miss() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut disk = DiskStore::open(dir.path(), 4, 1000, None)?;
    disk.write_block(BlockId(2), SequenceHash(5), &block(0, 1000))?;
    disk.flush()?;
    let file = OpenOptions::new().write(true).open(disk.path())?;
    file.set_len(disk.record_offset(BlockId(2)) + 100)?;
    drop(file);
    let mut out = vec![0; 1000];
    assert!(matches!(
        disk.read_block(BlockId(2), SequenceHash(5), &mut out),
        Err(StorageError::Corrupt { .. })
    ));
    // Rewrite it, then cut inside the trailer.
    disk.write_block(BlockId(2), SequenceHash(5), &block(0, 1000))?;
    disk.flush()?;
    let file = OpenOptions::new().write(true).open(disk.path())?;
    file.set_len(disk.record_offset(BlockId(2)) + 1000 + 10)?;
    drop(file);
    assert!(matches!(
        disk.read_block(BlockId(2), SequenceHash(5), &mut out),
        Err(StorageError::Corrupt { .. })
    ));
    assert_eq!(disk.counters().checksum_failures, 2);
    Ok(())
}

#[test]
fn disk_full_skips_writes_and_keeps_serving_reads() -> TestResult {
    let dir = tempfile::tempdir()?;
    let probe = DiskStore::open(dir.path(), 4, 1000, None)?;
    let record = probe.record_bytes();
    drop(probe);
    let mut disk = DiskStore::open(dir.path(), 4, 1000, Some(2 * record))?;
    disk.write_block(BlockId(0), SequenceHash(1), &block(1, 1000))?;
    disk.write_block(BlockId(1), SequenceHash(2), &block(2, 1000))?;
    assert!(matches!(
        disk.write_block(BlockId(2), SequenceHash(3), &block(3, 1000)),
        Err(StorageError::DiskFull { .. })
    ));
    assert!(disk.is_full());
    assert!(
        disk.write_block(BlockId(3), SequenceHash(4), &block(4, 1000))
            .is_err()
    );
    assert_eq!(disk.counters().writes_skipped_full, 2);
    assert!(disk.used_bytes() <= 2 * record);
    let mut out = vec![0; 1000];
    disk.read_block(BlockId(1), SequenceHash(2), &mut out)?;
    assert_eq!(out, block(2, 1000));
    Ok(())
}

#[test]
fn copy_between_moves_bytes_both_ways_with_one_copy() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut slab = HostSlab::new(4, 512)?;
    let mut disk = DiskStore::open(dir.path(), 4, 512, None)?;
    for slot in 0..4u32 {
        slab.write_block(
            BlockId(slot),
            SequenceHash(u64::from(slot)),
            &block(slot as u8, 512),
        )?;
    }
    let copies: Vec<BlockCopy> = (0..4u32)
        .map(|slot| BlockCopy {
            hash: SequenceHash(u64::from(slot)),
            from: BlockId(slot),
            to: BlockId(3 - slot),
        })
        .collect();
    assert!(
        copy_between(&mut slab, &mut disk, &copies)
            .iter()
            .all(Result::is_ok)
    );
    let mut back = HostSlab::new(4, 512)?;
    let reverse: Vec<BlockCopy> = copies
        .iter()
        .map(|c| BlockCopy {
            hash: c.hash,
            from: c.to,
            to: c.from,
        })
        .collect();
    assert!(
        copy_between(&mut disk, &mut back, &reverse)
            .iter()
            .all(Result::is_ok)
    );
    let mut out = vec![0; 512];
    for slot in 0..4u32 {
        back.read_block(BlockId(slot), SequenceHash(u64::from(slot)), &mut out)?;
        assert_eq!(out, block(slot as u8, 512));
    }
    // A miss in the source leaves the destination slot empty, not half-claimed.
    let missing = [BlockCopy {
        hash: SequenceHash(99),
        from: BlockId(0),
        to: BlockId(1),
    }];
    assert!(copy_between(&mut disk, &mut back, &missing)[0].is_err());
    assert!(
        back.read_block(BlockId(1), SequenceHash(1), &mut out)
            .is_err()
    );
    Ok(())
}

#[test]
fn stores_are_checked_against_the_configuration() -> TestResult {
    let mut config = crate::ManagerConfig::new(16, 512, 4);
    config.host = Some(crate::TierConfig::blocks(8));
    let mut stores = TierStores {
        device: Some(Box::new(HostSlab::new(4, 512)?)),
        host: Some(Box::new(HostSlab::new(8, 512)?)),
        disk: None,
    };
    stores.check(&config)?;
    stores.host = Some(Box::new(HostSlab::new(7, 512)?));
    assert!(matches!(
        stores.check(&config),
        Err(crate::KvbmError::StoreMismatch {
            tier: Tier::Host,
            ..
        })
    ));
    stores.host = Some(Box::new(HostSlab::new(8, 256)?));
    assert!(stores.check(&config).is_err());
    stores.host = None;
    assert!(stores.check(&config).is_err());
    Ok(())
}
