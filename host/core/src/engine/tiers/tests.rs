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
    engine
        .add_request(EngineRequest {
            id,
            prompt,
            max_tokens: 1,
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
    let load = tiered
        .config()
        .host_tier
        .as_ref()
        .expect("tiered")
        .load_time(4);
    assert_eq!(stats.onboard_time, load);
    // vLLM's prefix-cache counters stay the device's.
    assert_eq!(tiered.stats().prefix_hits, 0);

    // Without the tier the same traffic recomputes; the load is charged, and is cheaper.
    let mut plain = engine(None);
    let (_, _, recomputed) = session_evicted_by_traffic(&mut plain);
    assert_eq!(cached(&recomputed, 3), 0);
    let timing = tiered.config().timing;
    assert_eq!(
        again[0].duration,
        timing.step(1, false, 1.0 / 8.0 * 17.0 / 4.0) + load
    );
    assert!(again[0].duration < recomputed[0].duration);
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
