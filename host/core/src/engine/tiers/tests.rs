use super::super::{EngineConfig, EngineModel, EngineRequest, Step};
use super::*;
use proptest::prelude::*;
use std::collections::HashSet;

/// 4-token blocks, 8 on the device, `host` in the host tier at 10 us per block.
fn engine(host: Option<usize>) -> EngineModel {
    EngineModel::new(EngineConfig {
        block_size: 4,
        num_blocks: 8,
        host_tier: host.map(|num_blocks| HostTierConfig {
            num_blocks,
            block_bytes: 1_000,
            bandwidth_bytes_per_s: 1e8,
        }),
        ..EngineConfig::default()
    })
    .expect("valid config")
}

fn tokens(tag: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| tag * 1000 + i).collect()
}

fn run(engine: &mut EngineModel, id: u64, prompt: Vec<u32>) -> Vec<Step> {
    run_with_pool(engine, id, prompt, 0)
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id,
        prompt,
        max_tokens,
        pool_prefix_blocks: 0,
        pool_prefix_start: 0,
        max_offload_tokens: None,
    }
}

/// Time to load `blocks` from the host tier, at its bandwidth.
fn host_load(engine: &EngineModel, blocks: usize) -> Duration {
    let host = engine.config().host_tier.as_ref().expect("a host tier");
    host.load_time(blocks)
}

/// Run one request whose first `pool_prefix_blocks` blocks the driver found in the pool.
fn run_with_pool(
    engine: &mut EngineModel,
    id: u64,
    prompt: Vec<u32>,
    pool_prefix_blocks: usize,
) -> Vec<Step> {
    run_with_pool_run(engine, id, prompt, 0..pool_prefix_blocks)
}

/// Run one request whose blocks `pool` the driver fetched from the pool.
fn run_with_pool_run(
    engine: &mut EngineModel,
    id: u64,
    prompt: Vec<u32>,
    pool: std::ops::Range<usize>,
) -> Vec<Step> {
    engine
        .add_request(EngineRequest {
            id,
            prompt,
            max_tokens: 1,
            pool_prefix_blocks: pool.end,
            pool_prefix_start: pool.start,
            max_offload_tokens: None,
        })
        .expect("accepted");
    let mut steps = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
        assert!(steps.len() < 1_000, "engine never goes idle");
    }
    steps
}

fn cached(steps: &[Step], id: u64) -> usize {
    steps
        .iter()
        .flat_map(|s| &s.admitted)
        .find(|a| a.id == id)
        .map(|a| a.cached_tokens)
        .expect("admitted")
}

/// Model time from the start of `steps` to the end of the step that gave `id` its first token.
fn first_token_time(steps: &[Step], id: u64) -> Duration {
    let mut time = Duration::ZERO;
    for step in steps {
        time += step.duration;
        if step.outputs.iter().any(|o| o.id == id && o.first) {
            return time;
        }
    }
    panic!("request {id} never produced a token");
}

fn stored(steps: &[Step], tier: Tier) -> Vec<u64> {
    steps
        .iter()
        .flat_map(|s| &s.events)
        .filter_map(|e| match e {
            CacheEvent::Stored {
                tier: t, hashes, ..
            } if *t == tier => Some(hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A session's prefix, then other traffic that takes the whole device, then the session again.
fn session_evicted_by_traffic(engine: &mut EngineModel) -> (Vec<u64>, Vec<Step>, Vec<Step>) {
    let prompt = tokens(1, 17); // 4 full blocks + 1 token
    let hashes = engine.cache().hash_blocks(&prompt);
    let first = run(engine, 1, prompt.clone());
    let _traffic = run(engine, 2, tokens(2, 29)); // 8 blocks: the whole device
    assert_eq!(engine.cache().cached_prefix(&hashes), 0, "evicted from G1");
    let again = run(engine, 3, prompt);
    (hashes, first, again)
}

#[test]
fn a_prefix_evicted_from_the_device_is_loaded_from_the_host() {
    let mut tiered = engine(Some(32));
    let (hashes, first, again) = session_evicted_by_traffic(&mut tiered);

    // Written through as it was computed, with the host's medium and its tokens.
    assert_eq!(stored(&first, Tier::Host), hashes);
    assert!(first.iter().flat_map(|s| &s.transfers).any(|t| matches!(
        t,
        KvTransfer::Copy {
            from: (Tier::Device, _),
            to: (Tier::Host, _),
            ..
        }
    )));

    // Served from the host: cached tokens, a copy per block, a GPU store of the loaded blocks.
    assert_eq!(cached(&again, 3), 16);
    let copies: Vec<u64> = again
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Copy {
                hash,
                from: (Tier::Host, _),
                to: (Tier::Device, _),
            } => Some(*hash),
            _ => None,
        })
        .collect();
    assert_eq!(copies, hashes);
    assert_eq!(stored(&again, Tier::Device), hashes);
    let stats = tiered.stats().tiers;
    assert_eq!(stats.onboarded_blocks, 4);
    assert_eq!(stats.onboarded_bytes, 4_000);
    assert_eq!(stats.host_hit_tokens, 16);
    let load = host_load(&tiered, 4);
    assert_eq!(stats.onboard_time, load);
    // vLLM's prefix-cache counters stay the device's.
    assert_eq!(tiered.stats().prefix_hits, 0);

    // Without the tier the same traffic recomputes; the request waits for its load (the
    // others would step meanwhile), then computes its last token: sooner than recomputing.
    let mut plain = engine(None);
    let (_, _, recomputed) = session_evicted_by_traffic(&mut plain);
    assert_eq!(cached(&recomputed, 3), 0);
    let timing = tiered.config().timing;
    assert_eq!(
        first_token_time(&again, 3),
        timing.step(1, false, 1.0 / 8.0 * 17.0 / 4.0) + load
    );
    assert!(first_token_time(&again, 3) < first_token_time(&recomputed, 3));
    assert!(plain.stats().tiers == TierStats::default());
}

#[test]
fn the_host_tier_evicts_and_says_so() {
    let mut tiered = engine(Some(8));
    let first = tokens(1, 17);
    let hashes = tiered.cache().hash_blocks(&first);
    run(&mut tiered, 1, first);
    let steps = run(&mut tiered, 2, tokens(2, 32)); // 8 more blocks: the host is full
    let removed: Vec<u64> = steps
        .iter()
        .flat_map(|s| &s.events)
        .filter_map(|e| match e {
            CacheEvent::Removed {
                tier: Tier::Host,
                hashes,
            } => Some(hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    // The oldest sequence goes, tail first (leaf-first).
    let mut expected = hashes.clone();
    expected.reverse();
    assert_eq!(removed, expected);
    assert_eq!(tiered.stats().tiers.host_blocks, 8);
    assert_eq!(tiered.stats().tiers.host_evictions, 4);
}

#[test]
fn a_reset_clears_the_host_tier_too() {
    let mut tiered = engine(Some(16));
    run(&mut tiered, 1, tokens(1, 17));
    assert!(tiered.reset_prefix_cache());
    let again = run(&mut tiered, 2, tokens(1, 17));
    assert_eq!(cached(&again, 2), 0);
}

#[test]
fn a_host_tier_smaller_than_the_device_is_refused() {
    let config = EngineConfig {
        num_blocks: 8,
        host_tier: Some(HostTierConfig::blocks(4)),
        ..EngineConfig::default()
    };
    assert!(EngineModel::new(config).is_err());
}

/// 4-token blocks, 8 on the device, `host` host blocks at 10 us per block, and with `pool` a
/// shared pool at 20 us per block.
fn tiered(host: Option<usize>, pool: bool) -> EngineModel {
    let mut config = engine(host).config().clone();
    config.pool = pool.then_some(PoolTierConfig {
        block_bytes: 1_000,
        bandwidth_bytes_per_s: 5e7,
    });
    EngineModel::new(config).expect("valid config")
}

/// The driver's side of a shared pool: blocks by engine hash, with their parent and tokens.
#[derive(Default)]
struct ToyPool(std::collections::HashMap<u64, (Option<u64>, Vec<u32>)>);

impl ToyPool {
    /// Execute the steps' publishes.
    fn publish(&mut self, steps: &[Step]) {
        for (hash, parent, tokens) in published(steps) {
            self.0.entry(hash).or_insert((parent, tokens));
        }
    }

    /// How many leading blocks of `prompt` the pool holds, in `engine`'s hashes.
    fn prefix(&self, engine: &EngineModel, prompt: &[u32]) -> usize {
        let hashes = engine.cache().hash_blocks(prompt);
        hashes.iter().take_while(|h| self.0.contains_key(h)).count()
    }
}

fn published(steps: &[Step]) -> Vec<(u64, Option<u64>, Vec<u32>)> {
    steps
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Publish {
                hash,
                parent,
                from: (Tier::Device, _),
                token_ids,
            } => Some((*hash, *parent, token_ids.clone())),
            _ => None,
        })
        .collect()
}

/// The blocks a step loaded, in order: `(true, hash)` from the host, `(false, hash)` from the
/// pool.
fn loads(steps: &[Step]) -> Vec<(bool, u64)> {
    steps
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Copy {
                hash,
                from: (Tier::Host, _),
                to: (Tier::Device, _),
            } => Some((true, *hash)),
            KvTransfer::Fetched { hash, .. } => Some((false, *hash)),
            _ => None,
        })
        .collect()
}

fn pool_config(engine: &EngineModel) -> PoolTierConfig {
    engine.config().pool.clone().expect("a pool")
}

#[test]
fn a_prefix_published_by_one_engine_is_fetched_by_another() {
    let prompt = tokens(1, 17); // 4 full blocks + 1 token
    let mut pool = ToyPool::default();
    let mut a = tiered(None, true);
    let hashes = a.cache().hash_blocks(&prompt);
    let computed = run(&mut a, 1, prompt.clone());

    // A publishes every block it computed, in order, each after its computation, with its
    // parent and tokens.
    let publishes = published(&computed);
    let parents: Vec<Option<u64>> = std::iter::once(None)
        .chain(hashes[..3].iter().copied().map(Some))
        .collect();
    assert_eq!(publishes.iter().map(|p| p.0).collect::<Vec<_>>(), hashes);
    assert_eq!(publishes.iter().map(|p| p.1).collect::<Vec<_>>(), parents);
    for (block, (_, _, token_ids)) in prompt.chunks_exact(4).zip(&publishes) {
        assert_eq!(block, token_ids.as_slice());
    }
    let transfers: Vec<&KvTransfer> = computed.iter().flat_map(|s| &s.transfers).collect();
    for hash in &hashes {
        let at = |publish: bool| {
            transfers.iter().position(|t| match t {
                KvTransfer::Computed { hash: h, .. } => !publish && h == hash,
                KvTransfer::Publish { hash: h, .. } => publish && h == hash,
                _ => false,
            })
        };
        assert!(at(false) < at(true), "published before it was computed");
    }
    assert_eq!(a.stats().tiers.pool_published_blocks, 4);
    pool.publish(&computed);

    // B, which never saw the prompt, is told the pool holds it: it fetches instead of computing.
    let mut b = tiered(None, true);
    let found = pool.prefix(&b, &prompt);
    assert_eq!(found, 4);
    let fetched = run_with_pool(&mut b, 2, prompt.clone(), found);
    assert_eq!(cached(&fetched, 2), 16);
    assert_eq!(
        loads(&fetched),
        hashes.iter().map(|&h| (false, h)).collect::<Vec<_>>()
    );
    // Device blocks now (a GPU store), and not published back: B computed none of them.
    assert_eq!(stored(&fetched, Tier::Device), hashes);
    assert!(published(&fetched).is_empty());
    let stats = b.stats().tiers;
    assert_eq!(stats.pool_fetched_blocks, 4);
    assert_eq!(stats.pool_fetched_bytes, 4_000);
    assert_eq!(stats.pool_hit_tokens, 16);
    assert_eq!(stats.pool_published_blocks, 0);
    let load = pool_config(&b).load_time(4);
    assert_eq!(stats.pool_onboard_time, load);
    assert_eq!(
        b.stats().prefix_hits,
        0,
        "vLLM's prefix-cache counters stay the device's"
    );

    // The request waits for the fetch, then computes its last token: sooner than computing.
    let timing = b.config().timing;
    assert_eq!(
        first_token_time(&fetched, 2),
        timing.step(1, false, 1.0 / 8.0 * 17.0 / 4.0) + load
    );
    let mut c = tiered(None, true);
    let recomputed = run(&mut c, 3, prompt);
    assert_eq!(cached(&recomputed, 3), 0);
    assert!(first_token_time(&fetched, 2) < first_token_time(&recomputed, 3));
}

/// A driver that moves bytes fetches only what the engine lacks at arrival (`held_prefix`);
/// the pool serves the request only if the engine's own blocks still reach that run.
#[test]
fn a_driver_fetches_only_the_blocks_past_what_the_engine_holds() {
    let prompt = tokens(1, 17); // 4 full blocks + 1 token
    let mut b = tiered(None, true);
    let hashes = b.cache().hash_blocks(&prompt);
    assert_eq!(b.held_prefix(&hashes), 0);
    // B computed the first two blocks for an earlier request: it holds them.
    run(&mut b, 1, prompt[..9].to_vec());
    let held = b.held_prefix(&hashes);
    assert_eq!(held, 2);
    // The driver fetched blocks 2 and 3 only: B loads those and reuses its own.
    let steps = run_with_pool_run(&mut b, 2, prompt.clone(), held..4);
    assert_eq!(cached(&steps, 2), 16);
    assert_eq!(
        loads(&steps),
        hashes[2..].iter().map(|&h| (false, h)).collect::<Vec<_>>()
    );
    assert_eq!(b.stats().tiers.pool_fetched_blocks, 2);
    assert_eq!(b.held_prefix(&hashes), 4);

    // An engine that no longer holds the blocks before the fetched run cannot use it: it
    // computes the prompt.
    let mut c = tiered(None, true);
    let steps = run_with_pool_run(&mut c, 3, prompt, 2..4);
    assert_eq!(cached(&steps, 3), 0);
    assert!(loads(&steps).is_empty());
}

/// `held_prefix` counts the host tier's run after the device's, and touches nothing.
#[test]
fn the_held_prefix_reaches_into_the_host_tier() {
    let mut engine = engine(Some(16));
    let first = tokens(1, 17);
    let hashes = engine.cache().hash_blocks(&first);
    run(&mut engine, 1, first);
    // Other prompts push the first out of the 8-block device; the host keeps it.
    run(&mut engine, 2, tokens(2, 17));
    run(&mut engine, 3, tokens(3, 17));
    assert_eq!(engine.cache().cached_prefix(&hashes), 0);
    assert_eq!(engine.held_prefix(&hashes), 4);
    let stats = engine.stats().tiers;
    assert_eq!(engine.held_prefix(&hashes), 4);
    assert_eq!(engine.stats().tiers, stats);
}

#[test]
fn without_a_pool_nothing_changes() {
    // The driver's count is ignored by an engine without a pool...
    let mut told = engine(None);
    let mut untold = engine(None);
    let with_count = run_with_pool(&mut told, 1, tokens(1, 17), 4);
    let without = run_with_pool(&mut untold, 1, tokens(1, 17), 0);
    assert_eq!(with_count, without);
    assert_eq!(cached(&with_count, 1), 0);
    assert!(with_count.iter().all(|s| s.transfers.is_empty()));
    assert_eq!(told.stats(), untold.stats());
    assert_eq!(told.stats().tiers, TierStats::default());

    // ... and a host tier alone publishes nothing.
    let mut host_only = engine(Some(16));
    let steps = run_with_pool(&mut host_only, 1, tokens(1, 17), 4);
    assert!(published(&steps).is_empty());
    assert!(loads(&steps).is_empty());
    assert_eq!(host_only.stats().tiers.pool_hit_tokens, 0);
}

#[test]
fn a_prefix_is_loaded_from_the_nearest_tier_first() {
    let prompt = tokens(1, 17);
    let mut pool = ToyPool::default();
    let mut a = tiered(None, true);
    let hashes = a.cache().hash_blocks(&prompt);
    pool.publish(&run(&mut a, 1, prompt.clone()));

    // B computed the first two blocks, then other traffic took the device but the first one:
    // block 0 on the device, block 1 in the host tier, blocks 2 and 3 only in the pool.
    let mut b = tiered(Some(32), true);
    run(&mut b, 1, tokens(1, 9));
    run(&mut b, 2, tokens(2, 25));
    assert_eq!(b.cache().cached_prefix(&hashes), 1);
    let found = pool.prefix(&b, &prompt);
    let again = run_with_pool(&mut b, 3, prompt, found);

    assert_eq!(cached(&again, 3), 16);
    assert_eq!(
        loads(&again),
        vec![(true, hashes[1]), (false, hashes[2]), (false, hashes[3])]
    );
    let stats = b.stats();
    assert_eq!(stats.prefix_hits, 4);
    assert_eq!(stats.tiers.host_hit_tokens, 4);
    assert_eq!(stats.tiers.pool_hit_tokens, 8);
    let host = b.config().host_tier.clone().expect("a host tier");
    // The host's link and the pool's overlap: the request waits for the longer load.
    let load = host.load_time(1).max(pool_config(&b).load_time(2));
    let timing = b.config().timing;
    assert_eq!(
        first_token_time(&again, 3),
        timing.step(1, false, 1.0 / 8.0 * 17.0 / 4.0) + load
    );
    // What came from the pool is written through to the host like any device block.
    assert_eq!(stored(&again, Tier::Host), hashes[2..].to_vec());
}

#[test]
fn a_pool_with_a_bad_bandwidth_or_block_size_is_refused() {
    let with = |pool: PoolTierConfig| EngineConfig {
        host_tier: Some(HostTierConfig::blocks(EngineConfig::default().num_blocks)),
        pool: Some(pool),
        ..EngineConfig::default()
    };
    assert!(EngineModel::new(with(PoolTierConfig::default())).is_ok());
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let pool = PoolTierConfig {
            bandwidth_bytes_per_s: bad,
            ..PoolTierConfig::default()
        };
        assert!(EngineModel::new(with(pool)).is_err());
    }
    let other_size = PoolTierConfig {
        block_bytes: DEFAULT_BLOCK_BYTES / 2,
        ..PoolTierConfig::default()
    };
    assert!(EngineModel::new(with(other_size)).is_err());
}

/// 4-token blocks, 8 on the device, `host` host blocks at 10 us per block, `disk` disk blocks at
/// 25 us per block.
fn with_disk(host: usize, disk: usize) -> EngineModel {
    let mut config = engine(Some(host)).config().clone();
    config.disk_tier = Some(DiskTierConfig {
        num_blocks: disk,
        block_bytes: 1_000,
        bandwidth_bytes_per_s: 4e7,
    });
    EngineModel::new(config).expect("valid config")
}

#[test]
fn a_host_eviction_is_written_to_disk_and_loaded_back_from_it() {
    let mut tiered = with_disk(8, 32);
    let prompt = tokens(1, 17);
    let hashes = tiered.cache().hash_blocks(&prompt);
    run(&mut tiered, 1, prompt.clone());
    // 8 more blocks: the device loses the prompt, the host evicts it to disk.
    let traffic = run(&mut tiered, 2, tokens(2, 32));
    let mut demoted = hashes.clone();
    demoted.reverse(); // leaf-first
    assert_eq!(stored(&traffic, Tier::Disk), demoted);
    // Each block is copied to disk before the host slot it leaves is written again.
    for step in &traffic {
        for (at, transfer) in step.transfers.iter().enumerate() {
            if let KvTransfer::Copy {
                from: (Tier::Host, slot),
                to: (Tier::Disk, _),
                ..
            } = transfer
            {
                let overwritten = step.transfers.iter().position(
                    |t| matches!(t, KvTransfer::Copy { to: (Tier::Host, s), .. } if s == slot),
                );
                assert!(overwritten.is_some_and(|o| o > at));
            }
        }
    }
    assert_eq!(tiered.stats().tiers.disk_stored_blocks, 4);
    assert_eq!(tiered.stats().tiers.disk_blocks, 4);

    let again = run(&mut tiered, 3, prompt.clone());
    assert_eq!(cached(&again, 3), 16);
    let loads: Vec<u64> = again
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Copy {
                hash,
                from: (Tier::Disk, _),
                to: (Tier::Device, _),
            } => Some(*hash),
            _ => None,
        })
        .collect();
    assert_eq!(loads, hashes);
    assert_eq!(stored(&again, Tier::Device), hashes);
    // Back in the host tier too, like any device block.
    assert_eq!(stored(&again, Tier::Host), hashes);
    let stats = tiered.stats().tiers;
    assert_eq!(stats.disk_hit_tokens, 16);
    assert_eq!(stats.disk_onboarded_blocks, 4);
    assert_eq!(stats.disk_onboarded_bytes, 4_000);
    assert_eq!(stats.host_hit_tokens, 0);
    let load = tiered
        .config()
        .disk_tier
        .as_ref()
        .expect("a disk tier")
        .load_time(4);
    assert_eq!(stats.disk_onboard_time, load);
    let timing = tiered.config().timing;
    assert_eq!(
        first_token_time(&again, 3),
        timing.step(1, false, 1.0 / 8.0 * 17.0 / 4.0) + load
    );
    let mut plain = engine(Some(8));
    run(&mut plain, 1, prompt.clone());
    run(&mut plain, 2, tokens(2, 32));
    let recomputed = run(&mut plain, 3, prompt);
    assert_eq!(cached(&recomputed, 3), 0);
    assert!(first_token_time(&again, 3) < first_token_time(&recomputed, 3));
}

#[test]
fn a_disk_tier_needs_a_host_tier_of_its_block_size() {
    let device = EngineConfig::default().num_blocks;
    let with = |host: Option<HostTierConfig>, disk: DiskTierConfig| EngineConfig {
        host_tier: host,
        disk_tier: Some(disk),
        ..EngineConfig::default()
    };
    let host = || Some(HostTierConfig::blocks(device));
    assert!(EngineModel::new(with(host(), DiskTierConfig::blocks(device))).is_ok());
    assert!(EngineModel::new(with(None, DiskTierConfig::blocks(device))).is_err());
    let other_size = DiskTierConfig {
        block_bytes: 1,
        ..DiskTierConfig::blocks(device)
    };
    assert!(EngineModel::new(with(host(), other_size)).is_err());
    assert!(EngineModel::new(with(host(), DiskTierConfig::blocks(0))).is_err());
}

proptest! {
    /// With a disk tier too, each tier's events replay to what it holds, and a disk copy is
    /// announced while the engine still knows the block (before the host's removal).
    #[test]
    fn events_replay_to_each_tier_with_a_disk(
        prompts in proptest::collection::vec((0u32..6, 1usize..30), 1..25),
    ) {
        let mut tiered = with_disk(8, 10);
        let mut sets: [HashSet<u64>; 3] = Default::default();
        let index = |tier: Tier| match tier {
            Tier::Device => 0,
            Tier::Host => 1,
            Tier::Disk => 2,
        };
        for (id, (tag, len)) in prompts.into_iter().enumerate() {
            for step in run(&mut tiered, id as u64, tokens(tag, len)) {
                for event in step.events {
                    match event {
                        CacheEvent::Stored { tier, hashes, token_ids, .. } => {
                            prop_assert_eq!(token_ids.len(), hashes.len() * 4);
                            for hash in hashes {
                                if tier != Tier::Device {
                                    prop_assert!(sets.iter().any(|s| s.contains(&hash)));
                                }
                                prop_assert!(sets[index(tier)].insert(hash));
                            }
                        }
                        CacheEvent::Removed { tier, hashes } => {
                            for hash in hashes {
                                prop_assert!(sets[index(tier)].remove(&hash));
                            }
                        }
                        CacheEvent::Cleared => {}
                    }
                }
            }
            let cached: HashSet<u64> = tiered.cache().cached_hashes().collect();
            prop_assert_eq!(&sets[0], &cached);
            let stats = tiered.stats().tiers;
            prop_assert_eq!(sets[1].len(), stats.host_blocks);
            prop_assert_eq!(sets[2].len(), stats.disk_blocks);
        }
    }
}

proptest! {
    /// Whatever the traffic, the events of each tier replay to what that tier holds, and a
    /// device block's host copy is announced after the device store that named it.
    #[test]
    fn events_replay_to_each_tier(
        prompts in proptest::collection::vec((0u32..6, 1usize..30), 1..25),
    ) {
        let mut tiered = engine(Some(12));
        let mut device = HashSet::new();
        let mut host = HashSet::new();
        let mut known = HashSet::new();
        for (id, (tag, len)) in prompts.into_iter().enumerate() {
            for step in run(&mut tiered, id as u64, tokens(tag, len)) {
                for event in step.events {
                    match event {
                        CacheEvent::Stored { tier, hashes, token_ids, .. } => {
                            prop_assert_eq!(token_ids.len(), hashes.len() * 4);
                            for hash in hashes {
                                match tier {
                                    Tier::Host => {
                                        prop_assert!(known.contains(&hash));
                                        prop_assert!(host.insert(hash));
                                    }
                                    _ => {
                                        known.insert(hash);
                                        prop_assert!(device.insert(hash));
                                    }
                                }
                            }
                        }
                        CacheEvent::Removed { tier, hashes } => {
                            let set = if tier == Tier::Host { &mut host } else { &mut device };
                            for hash in hashes {
                                prop_assert!(set.remove(&hash));
                            }
                        }
                        CacheEvent::Cleared => {}
                    }
                }
            }
            let cached: HashSet<u64> = tiered.cache().cached_hashes().collect();
            prop_assert_eq!(&device, &cached);
            prop_assert_eq!(host.len(), tiered.stats().tiers.host_blocks);
        }
    }
}

/// Run one request of `max_tokens` tokens, none offloaded past `max_offload_tokens`.
fn run_capped(
    engine: &mut EngineModel,
    id: u64,
    prompt: Vec<u32>,
    max_tokens: u32,
    max_offload_tokens: Option<u64>,
) -> Vec<Step> {
    engine
        .add_request(EngineRequest {
            id,
            prompt,
            max_tokens,
            pool_prefix_blocks: 0,
            pool_prefix_start: 0,
            max_offload_tokens,
        })
        .expect("accepted");
    let mut steps = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
    }
    steps
}

/// An older session's 2 blocks, then a turn that thinks (2 prompt blocks, 2 output blocks)
/// capped or not, then a request that needs one cached block back. Returns the older session's
/// hashes, the thinking turn's steps and the block hashes of its sequence.
fn thinking_turn(cap: Option<u64>) -> (EngineModel, Vec<u64>, Vec<Step>, Vec<u64>) {
    let mut engine = engine(Some(32));
    let older = tokens(1, 8);
    let older_hashes = engine.cache().hash_blocks(&older);
    run(&mut engine, 1, older);
    // 8 prompt tokens and 9 generated: 16 tokens written, 4 full blocks.
    let steps = run_capped(&mut engine, 2, tokens(2, 8), 9, cap);
    let turn = stored(&steps, Tier::Device);
    assert_eq!(turn.len(), 4);
    // 3 blocks: evict-first ones, then the 2 never used, then the least recently used.
    run(&mut engine, 3, tokens(3, 12));
    (engine, older_hashes, steps, turn)
}

#[test]
fn blocks_past_the_offload_limit_are_not_written_through_and_go_first() {
    let (engine, older, steps, turn) = thinking_turn(Some(8));
    // Only the prompt's blocks reached the host.
    assert_eq!(stored(&steps, Tier::Host), turn[..2]);
    assert_eq!(engine.stats().tiers.ephemeral_blocks, 2);
    // The capped output went first, before the older session's blocks.
    assert_eq!(engine.cache().cached_prefix(&older), 2);
    assert_eq!(engine.cache().cached_prefix(&turn), 2);

    // Without the limit everything is written through, and the older session pays.
    let (engine, older, steps, turn) = thinking_turn(None);
    assert_eq!(stored(&steps, Tier::Host), turn);
    assert_eq!(engine.stats().tiers.ephemeral_blocks, 0);
    assert_eq!(engine.cache().cached_prefix(&older), 1);
    assert_eq!(engine.cache().cached_prefix(&turn), 4);
}

// === Asynchronous loads ===

/// 4-token blocks, 64 on the device, a host tier of 256 at 10 ms per block: a load of a few
/// blocks spans several decode steps.
fn slow_link() -> EngineModel {
    EngineModel::new(EngineConfig {
        block_size: 4,
        num_blocks: 64,
        host_tier: Some(HostTierConfig {
            num_blocks: 256,
            block_bytes: 1_000_000,
            bandwidth_bytes_per_s: 1e8,
        }),
        ..EngineConfig::default()
    })
    .expect("valid config")
}

/// Run `prompt` once (4 full blocks and a token), then traffic that takes the whole device, so
/// that the prompt's blocks are left only in the host tier. Returns its hashes.
fn only_in_host(engine: &mut EngineModel, id: u64, prompt: &[u32]) -> Vec<u64> {
    let hashes = engine.cache().hash_blocks(prompt);
    run(engine, id, prompt.to_vec());
    run(engine, id + 1, tokens(id as u32 + 100, 64 * 4 - 1));
    assert_eq!(engine.cache().cached_prefix(&hashes), 0, "evicted from G1");
    assert!(
        hashes
            .iter()
            .all(|&h| engine.host.as_ref().expect("host").holds(h))
    );
    hashes
}

/// Each step with the model time it started at.
fn drain_timed(engine: &mut EngineModel) -> Vec<(Duration, Step)> {
    let mut steps = Vec::new();
    while engine.has_work() {
        let start = engine.clock();
        steps.push((start, engine.step()));
        assert!(steps.len() < 10_000, "engine never goes idle");
    }
    steps
}

/// When the step that computes `id`'s first token started.
fn first_compute(steps: &[(Duration, Step)], id: u64) -> Duration {
    steps
        .iter()
        .find(|(_, s)| s.outputs.iter().any(|o| o.id == id && o.first))
        .map(|(start, _)| *start)
        .expect("a first token")
}

#[test]
fn a_request_loading_from_the_host_does_not_delay_the_others() {
    let mut engine = slow_link();
    let prompt = tokens(1, 17);
    only_in_host(&mut engine, 1, &prompt);
    let load = host_load(&engine, 4);
    assert_eq!(load, Duration::from_millis(40));

    // A long decode runs; then the session comes back and must load its 4 blocks.
    engine
        .add_request(request(10, tokens(10, 9), 60))
        .expect("accepted");
    let warmup = engine.step();
    assert!(warmup.outputs.iter().any(|o| o.id == 10 && o.first));
    let admitted_at = engine.clock();
    engine.add_request(request(3, prompt, 1)).expect("accepted");
    let steps = drain_timed(&mut engine);
    let (_, admission) = &steps[0];
    assert_eq!(admission.admitted.len(), 1);
    assert_eq!(
        admission.admitted[0].cached_tokens, 16,
        "loaded, not computed"
    );

    // (a) While the load runs, every step is one decode of request 10 alone: the load adds
    // nothing to its duration (a synchronous load made the first one 40 ms longer).
    let timing = engine.config().timing;
    let capacity = 64.0 * 4.0;
    let started = first_compute(&steps, 3);
    let during: Vec<_> = steps.iter().filter(|(at, _)| *at < started).collect();
    assert!(during.len() >= 3, "{} steps during the load", during.len());
    for (at, step) in &during {
        let decode = step.outputs.iter().find(|o| o.id == 10);
        assert!(decode.is_some(), "request 10 stepped at {at:?}");
        assert!(step.outputs.iter().all(|o| o.id == 10));
        // A decode at most at the usage of request 10's KV (at most 9 + 60 tokens) and
        // request 3's loaded 16: far less than the 40 ms load.
        assert!(step.duration <= timing.step(0, true, 85.0 / capacity));
        assert!(step.duration < load / 3);
    }

    // (b) Request 3 computes in the first step that starts once the load is done.
    assert!(started >= admitted_at + load, "{started:?} < {load:?}");
    let before = during.last().expect("steps during the load");
    assert!(before.0 < admitted_at + load);
    assert_eq!(engine.stats().tiers.onboard_time, load);
}

#[test]
fn loads_on_the_same_link_queue() {
    let mut engine = slow_link();
    let (a, b) = (tokens(1, 17), tokens(2, 17));
    only_in_host(&mut engine, 1, &a);
    only_in_host(&mut engine, 5, &b);
    // Both left the device; both are in the host.
    let host = engine.host.as_ref().expect("host");
    for hashes in [
        engine.cache().hash_blocks(&a),
        engine.cache().hash_blocks(&b),
    ] {
        assert_eq!(engine.cache().cached_prefix(&hashes), 0);
        assert!(hashes.iter().all(|&h| host.holds(h)));
    }
    let load = host_load(&engine, 4);
    let start = engine.clock();
    for (id, prompt) in [(20, a), (21, b)] {
        engine
            .add_request(request(id, prompt, 1))
            .expect("accepted");
    }
    let steps = drain_timed(&mut engine);
    assert_eq!(steps[0].1.admitted.len(), 2, "both admitted at once");
    // Nothing else runs: the engine waits in steps of at most LOAD_POLL.
    assert!(
        steps
            .iter()
            .all(|(_, s)| s.duration <= crate::engine::LOAD_POLL || !s.outputs.is_empty())
    );
    let (first, second) = (first_compute(&steps, 20), first_compute(&steps, 21));
    // The first load takes the link for 40 ms, the second starts after it.
    assert_eq!(first, start + load);
    assert_eq!(second, start + 2 * load);
    assert_eq!(engine.stats().tiers.onboard_time, 2 * load);
}
