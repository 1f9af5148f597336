use super::*;

fn hash(n: u64) -> SequenceHash {
    SequenceHash(n)
}

/// Register a chain of `len` blocks starting at hash `first`; returns the handles.
fn chain(
    pool: &BlockPool,
    first: u64,
    len: u64,
    now: Tick,
) -> Result<Vec<ImmutableBlock>, KvbmError> {
    let allocation = pool.allocate(len as usize, now)?;
    let mut out = Vec::new();
    let mut parent = None;
    for (i, block) in allocation.blocks.into_iter().enumerate() {
        let h = hash(first + i as u64);
        let registration = pool.register(block.complete(h, parent), Retention::DEFAULT, now)?;
        out.push(registration.block);
        parent = Some(h);
    }
    Ok(out)
}

#[test]
fn drop_of_mutable_and_complete_returns_the_slot() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 4, 0)?;
    let allocation = pool.allocate(3, Tick(0))?;
    assert_eq!(pool.usage().leased, 3);
    let mut blocks = allocation.blocks;
    let complete = blocks.pop().map(|b| b.complete(hash(1), None));
    drop(blocks);
    assert_eq!(pool.usage().leased, 1);
    drop(complete);
    assert_eq!(pool.usage().free, 4);
    Ok(())
}

#[test]
fn registry_dedups_and_refcounts() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 4, 0)?;
    let mut blocks = pool.allocate(2, Tick(0))?.blocks;
    let (b, a) = (blocks.remove(1), blocks.remove(0));
    let first = pool.register(a.complete(hash(7), None), Retention::DEFAULT, Tick(0))?;
    let second = pool.register(b.complete(hash(7), None), Retention::DEFAULT, Tick(0))?;
    assert!(first.stored && !second.stored);
    assert_eq!(first.block.id(), second.block.id());
    assert_eq!(pool.refcount(hash(7)), Some(2));
    assert_eq!(pool.usage().free, 3);
    let clone = first.block.clone();
    assert_eq!(pool.refcount(hash(7)), Some(3));
    drop((first, second, clone));
    assert_eq!(pool.refcount(hash(7)), Some(0));
    assert_eq!(pool.usage().inactive, 1);
    Ok(())
}

#[test]
fn allocation_evicts_leaves_first_and_reports_it() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 3, 0)?;
    drop(chain(&pool, 10, 3, Tick(0))?);
    // The chain 10 <- 11 <- 12 must die suffix first even though 10 is the oldest.
    let allocation = pool.allocate(2, Tick(1))?;
    assert_eq!(allocation.evicted, vec![hash(12), hash(11)]);
    assert_eq!(pool.drain_removed(), vec![hash(12), hash(11)]);
    assert!(pool.contains(hash(10)));
    Ok(())
}

#[test]
fn out_of_blocks_is_an_error_and_leases_nothing() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Host, 2, 0)?;
    let held = chain(&pool, 1, 2, Tick(0))?;
    assert!(matches!(
        pool.allocate(1, Tick(0)),
        Err(KvbmError::OutOfBlocks { .. })
    ));
    assert_eq!(pool.usage().leased, 0);
    drop(held);
    assert_eq!(pool.allocate(1, Tick(0))?.evicted, vec![hash(2)]);
    Ok(())
}

#[test]
fn weak_handles_upgrade_until_evicted() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 1, 0)?;
    let block = chain(&pool, 5, 1, Tick(0))?.remove(0);
    let weak = block.downgrade();
    drop(block);
    let again = weak.upgrade();
    assert!(again.is_some());
    drop(again);
    assert_eq!(pool.evict_one(Tick(0)), Some(hash(5)));
    assert!(weak.upgrade().is_none());
    Ok(())
}

#[test]
fn pins_hold_until_they_expire_and_the_budget_clips() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 4, 1)?;
    drop(chain(&pool, 1, 1, Tick(0))?);
    drop(chain(&pool, 2, 1, Tick(0))?);
    let outcome = pool.pin(&[hash(1), hash(2), hash(99)], Tick(100), Tick(0));
    assert_eq!(
        outcome,
        PinOutcome {
            accepted: 1,
            clipped: 1,
            missing: 1
        }
    );
    assert_eq!(pool.counters().pins_clipped, 1);
    assert_eq!(pool.evict_one(Tick(10)), Some(hash(2)));
    assert_eq!(pool.evict_one(Tick(10)), None);
    assert_eq!(pool.evict_one(Tick(100)), Some(hash(1)));
    Ok(())
}

#[test]
fn retention_orders_eviction_and_decays() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 4, 0)?;
    drop(chain(&pool, 1, 1, Tick(0))?);
    drop(chain(&pool, 2, 1, Tick(0))?);
    pool.set_retention(hash(1), Retention::new(90, Some(Tick(50)))?, Tick(0));
    assert_eq!(pool.evict_one(Tick(10)), Some(hash(2)));
    drop(chain(&pool, 3, 1, Tick(20))?);
    assert_eq!(pool.next_victim(Tick(20)), Some(hash(3)));
    // Once its tag lapses, block 1 is a default block older than block 3: it goes first.
    assert_eq!(pool.next_victim(Tick(50)), Some(hash(1)));
    pool.set_retention(hash(3), Retention::ephemeral(), Tick(50));
    assert_eq!(pool.next_victim(Tick(50)), Some(hash(3)));
    Ok(())
}

#[test]
fn lru_order_and_chains_die_tail_first_in_one_run() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Device, 8, 0)?;
    drop(chain(&pool, 10, 3, Tick(0))?);
    drop(chain(&pool, 20, 2, Tick(0))?);
    drop(chain(&pool, 30, 1, Tick(0))?);
    // A touch makes chain 20's leaf the most recent.
    assert!(pool.touch(hash(21), Tick(0)));
    let order: Vec<u64> = std::iter::from_fn(|| pool.evict_one(Tick(1)).map(|h| h.0)).collect();
    assert_eq!(order, vec![12, 11, 10, 30, 21, 20]);
    Ok(())
}

#[test]
fn foreign_blocks_are_refused_and_returned() -> Result<(), KvbmError> {
    let a = BlockPool::new(Tier::Device, 1, 0)?;
    let b = BlockPool::new(Tier::Host, 1, 0)?;
    let block = a.allocate(1, Tick(0))?.blocks.remove(0);
    let result = b.register(block.complete(hash(1), None), Retention::DEFAULT, Tick(0));
    assert!(result.is_err());
    assert_eq!(a.usage().free, 1);
    assert_eq!(b.usage().free, 1);
    Ok(())
}

#[test]
fn store_takes_a_slot_once_and_logs_what_it_evicted() -> Result<(), KvbmError> {
    let pool = BlockPool::new(Tier::Pool, 2, 0)?;
    let now = Tick(1);
    let first = pool.store(hash(1), None, Retention::DEFAULT, now);
    assert!(first.is_some());
    assert_eq!(
        pool.store(hash(1), None, Retention::DEFAULT, now),
        None,
        "present"
    );
    assert!(
        pool.store(hash(2), Some(hash(1)), Retention::DEFAULT, now)
            .is_some()
    );
    // Full: the chain's leaf goes, never its prefix.
    assert!(
        pool.store(hash(9), None, Retention::DEFAULT, Tick(2))
            .is_some()
    );
    assert_eq!(pool.drain_removed(), vec![hash(2)]);
    assert!(pool.contains(hash(1)) && pool.contains(hash(9)));
    Ok(())
}
