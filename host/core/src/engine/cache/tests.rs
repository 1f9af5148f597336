use super::*;

/// A sequence of `blocks` full blocks of 4 tokens, distinct per `tag`.
fn tokens(tag: u32, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * 4).map(|i| tag * 1000 + i).collect()
}

/// Allocate, write and release one sequence of `tokens`; returns its block hashes.
fn run(cache: &mut KvCache, tokens: &[u32]) -> Vec<u64> {
    let hashes = cache.hash_blocks(tokens);
    let mut table = cache
        .allocate(&hashes, tokens.len().div_ceil(4))
        .expect("fits");
    cache.write(&mut table, tokens);
    cache.release(table);
    hashes
}

fn removed(events: &[CacheEvent]) -> Vec<u64> {
    events
        .iter()
        .flat_map(|e| match e {
            CacheEvent::Removed { hashes, .. } => hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn written_blocks_are_stored_and_reused() {
    let mut cache = KvCache::new(4, 8);
    let prompt = tokens(1, 3);
    let hashes = run(&mut cache, &prompt);
    assert_eq!(
        cache.take_events(),
        vec![CacheEvent::Stored {
            tier: Tier::Device,
            hashes: hashes.clone(),
            parent: None,
            token_ids: prompt.clone(),
        }]
    );
    assert_eq!(cache.cached_prefix(&hashes), 3);
    let table = cache.allocate(&hashes, 4).expect("fits");
    assert_eq!(table.hashes(), &hashes[..]);
    assert_eq!(cache.used_blocks(), 3);
}

#[test]
fn engine_hashes_are_not_the_routers() {
    let cache = KvCache::new(4, 1);
    let prompt = tokens(1, 2);
    let router: Vec<u64> = BlockHasher::new(4)
        .sequence(&prompt)
        .iter()
        .map(|h| h.0)
        .collect();
    assert_ne!(cache.hash_blocks(&prompt), router);
    // Unless the engine is given the router's seed (the simulator's default).
    let cache = KvCache::with_seed(4, 1, crate::hash::HASH_SEED);
    assert_eq!(cache.hash_blocks(&prompt), router);
}

#[test]
fn partial_blocks_are_not_cached_and_writes_continue_the_chain() {
    let mut cache = KvCache::new(4, 8);
    let all = tokens(1, 3);
    let mut table = cache.allocate(&[], 3).expect("fits");
    cache.write(&mut table, &all[..6]);
    cache.write(&mut table, &all);
    let events = cache.take_events();
    let hashes = cache.hash_blocks(&all);
    assert_eq!(
        events[1],
        CacheEvent::Stored {
            tier: Tier::Device,
            hashes: hashes[1..].to_vec(),
            parent: Some(hashes[0]),
            token_ids: all[4..].to_vec(),
        }
    );
    assert_eq!(table.len(), 3);
}

#[test]
fn evicts_least_recently_used_first() {
    let mut cache = KvCache::new(4, 3);
    let a = run(&mut cache, &tokens(1, 1));
    let b = run(&mut cache, &tokens(2, 1));
    let c = run(&mut cache, &tokens(3, 1));
    // A hit on `a` makes it the most recently used.
    let table = cache.allocate(&a, 1).expect("fits");
    cache.release(table);
    cache.take_events();
    run(&mut cache, &tokens(4, 1));
    run(&mut cache, &tokens(5, 1));
    assert_eq!(removed(&cache.take_events()), vec![b[0], c[0]]);
    assert_eq!(cache.cached_prefix(&a), 1);
}

#[test]
fn a_sequence_tail_is_evicted_before_its_head() {
    let mut cache = KvCache::new(4, 3);
    let hashes = run(&mut cache, &tokens(1, 3));
    cache.take_events();
    run(&mut cache, &tokens(2, 1));
    assert_eq!(removed(&cache.take_events()), vec![hashes[2]]);
    assert_eq!(cache.cached_prefix(&hashes), 2);
}

#[test]
fn reservations_bound_admission() {
    let mut cache = KvCache::new(4, 4);
    let first = cache.allocate(&[], 3).expect("fits");
    assert!(cache.allocate(&[], 2).is_none());
    let second = cache.allocate(&[], 1).expect("fits");
    assert!(cache.allocate(&[], 1).is_none());
    cache.release(first);
    cache.release(second);
    assert!(cache.allocate(&[], 4).is_some());
}

#[test]
fn a_free_cached_hit_counts_against_the_free_list() {
    let mut cache = KvCache::new(4, 2);
    let hashes = run(&mut cache, &tokens(1, 1));
    // One block to reuse, two fresh: three blocks, more than the two there are.
    assert!(cache.allocate(&hashes, 3).is_none());
    assert!(cache.allocate(&hashes, 2).is_some());
    assert_eq!(cache.used_blocks(), 1);
}

#[test]
fn duplicate_blocks_stay_anonymous() {
    let mut cache = KvCache::new(4, 4);
    let prompt = tokens(1, 2);
    let mut a = cache.allocate(&[], 2).expect("fits");
    let mut b = cache.allocate(&[], 2).expect("fits");
    cache.write(&mut a, &prompt);
    cache.write(&mut b, &prompt);
    assert_eq!(
        cache.take_events().len(),
        1,
        "one Stored, for the first copy"
    );
    assert_eq!(b.hashes(), a.hashes());
    cache.release(b);
    cache.release(a);
    // The anonymous copies are reused first, without events.
    run(&mut cache, &tokens(2, 2));
    assert!(removed(&cache.take_events()).is_empty());
    assert_eq!(cache.cached_prefix(&cache.hash_blocks(&prompt)), 2);
}

#[test]
fn reset_clears_only_an_idle_cache() {
    let mut cache = KvCache::new(4, 4);
    run(&mut cache, &tokens(1, 2));
    let held = cache.allocate(&[], 1).expect("fits");
    assert!(!cache.reset());
    cache.release(held);
    cache.take_events();
    assert!(cache.reset());
    assert_eq!(cache.take_events(), vec![CacheEvent::Cleared]);
    assert_eq!(cache.cached_hashes().count(), 0);
}
