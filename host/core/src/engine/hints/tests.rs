use super::super::{
    DiskTierConfig, ENGINE_SEED, EngineConfig, EngineModel, EngineRequest, HostTierConfig, Step,
};
use super::*;
use crate::kv_hints::actions::BlockPayload;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

/// 4-token blocks, 8 on the device; a host tier of `host` blocks and a disk tier of `disk`.
fn engine(host: Option<usize>, disk: Option<usize>) -> EngineModel {
    EngineModel::new(EngineConfig {
        block_size: 4,
        num_blocks: 8,
        host_tier: host.map(|num_blocks| HostTierConfig {
            num_blocks,
            block_bytes: 1_000,
            bandwidth_bytes_per_s: 1e8,
        }),
        disk_tier: disk.map(|num_blocks| DiskTierConfig {
            num_blocks,
            block_bytes: 1_000,
            bandwidth_bytes_per_s: 1e7,
        }),
        ..EngineConfig::default()
    })
    .expect("valid config")
}

fn tokens(tag: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| tag * 1000 + i).collect()
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

/// Step until idle.
/// Time to load `blocks` from the host tier, at its bandwidth.
fn host_load(engine: &EngineModel, blocks: usize) -> Duration {
    let host = engine.config().host_tier.as_ref().expect("a host tier");
    host.load_time(blocks)
}

fn drain(engine: &mut EngineModel) -> Vec<Step> {
    let mut steps = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
        assert!(steps.len() < 10_000, "engine never goes idle");
    }
    steps
}

/// Run one request of one output token to its end.
fn run(engine: &mut EngineModel, id: u64, prompt: Vec<u32>) -> Vec<Step> {
    engine
        .add_request(request(id, prompt, 1))
        .expect("accepted");
    drain(engine)
}

fn cached(steps: &[Step], id: u64) -> usize {
    steps
        .iter()
        .flat_map(|s| &s.admitted)
        .find(|a| a.id == id)
        .map(|a| a.cached_tokens)
        .expect("admitted")
}

fn action(kind: ActionType, hashes: &[u64]) -> HintAction {
    HintAction::new(
        format!("{}-1", kind.label()),
        kind,
        BlockPayload {
            block_hashes: hashes.to_vec(),
            tier: None,
            ttl_ms: None,
            session_id: Some("s".into()),
        },
    )
}

fn to(tier: HintTier, mut action: HintAction) -> HintAction {
    action.payload.tier = Some(tier);
    action
}

fn demote(tier: HintTier, hashes: &[u64]) -> HintAction {
    to(tier, action(ActionType::Demote, hashes))
}

fn prefetch(hashes: &[u64]) -> HintAction {
    to(HintTier::Device, action(ActionType::Prefetch, hashes))
}

fn pin(hashes: &[u64], ttl_ms: u64) -> HintAction {
    let mut pin = action(ActionType::Pin, hashes);
    pin.payload.ttl_ms = Some(ttl_ms);
    pin
}

/// Apply one action; its outcome.
fn apply(engine: &mut EngineModel, action: HintAction) -> ActionOutcome {
    let mut outcomes = engine.apply_hints(&[action]);
    assert_eq!(outcomes.len(), 1);
    outcomes.remove(0)
}

fn removed(steps: &[Step], tier: Tier) -> Vec<u64> {
    steps
        .iter()
        .flat_map(|s| &s.events)
        .filter_map(|e| match e {
            CacheEvent::Removed { tier: t, hashes } if *t == tier => Some(hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
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

/// Copies of a step list from tier `from` into the device, by hash.
fn loads(steps: &[Step], from: Tier) -> Vec<u64> {
    steps
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Copy {
                hash,
                from: (f, _),
                to: (Tier::Device, _),
            } if *f == from => Some(*hash),
            _ => None,
        })
        .collect()
}

/// A session's turn: its prompt (4 full blocks and one token) run once, and its hashes.
fn first_turn(engine: &mut EngineModel) -> (Vec<u32>, Vec<u64>) {
    let prompt = tokens(1, 17);
    let hashes = engine.cache().hash_blocks(&prompt);
    run(engine, 1, prompt.clone());
    assert_eq!(engine.cache().cached_prefix(&hashes), 4);
    (prompt, hashes)
}

/// Hints name blocks by the engine's hashes: the router's algorithm (xxh3 of each block's
/// little-endian token ids, chained from the root) under the engine's seed instead of the
/// router's. A gateway translates router hashes into these (the KV events carry both the
/// engine's hashes and the tokens they re-hash to the router's).
#[test]
fn hints_name_blocks_by_the_routers_hash_under_the_engine_seed() {
    use crate::hash::{BlockHasher, HASH_SEED};
    let engine = engine(Some(32), None);
    let prompt = tokens(1, 17);
    let engine_hashes: Vec<u64> = BlockHasher::with_seed(4, ENGINE_SEED)
        .sequence(&prompt)
        .iter()
        .map(|h| h.0)
        .collect();
    assert_eq!(engine.cache().hash_blocks(&prompt), engine_hashes);
    let router: Vec<u64> = BlockHasher::with_seed(4, HASH_SEED)
        .sequence(&prompt)
        .iter()
        .map(|h| h.0)
        .collect();
    assert_eq!(BlockHasher::new(4).sequence(&prompt)[0].0, router[0]);
    assert!(engine_hashes.iter().all(|h| !router.contains(h)));
}

#[test]
fn a_demoted_prefix_is_loaded_from_the_host_not_recomputed() {
    let mut engine = engine(Some(32), None);
    let (prompt, hashes) = first_turn(&mut engine);

    let outcome = apply(&mut engine, demote(HintTier::Host, &hashes));
    assert_eq!(
        (outcome.outcome, outcome.blocks, outcome.reason),
        (Outcome::Accepted, 4, None)
    );
    assert_eq!(engine.cache().cached_prefix(&hashes), 0, "off the device");
    // The router hears that the device lost them; the host had them by write-through.
    assert!(engine.has_work());
    let reported = drain(&mut engine);
    assert_eq!(removed(&reported, Tier::Device), hashes);
    assert!(reported.iter().all(|s| s.duration.is_zero()));
    assert_eq!(engine.stats().tiers.demoted_blocks, 4);
    assert_eq!(engine.stats().tiers.host_blocks, 4);

    let again = run(&mut engine, 2, prompt);
    assert_eq!(cached(&again, 2), 16);
    assert_eq!(loads(&again, Tier::Host), hashes);
    let stats = engine.stats();
    assert_eq!(stats.tiers.onboarded_blocks, 4);
    assert_eq!(stats.prefix_hits, 0, "not a device hit");
}

#[test]
fn a_prefetch_after_a_demote_makes_the_next_turn_a_device_hit() {
    let mut engine = engine(Some(32), None);
    let (prompt, hashes) = first_turn(&mut engine);
    apply(&mut engine, demote(HintTier::Host, &hashes));

    let outcome = apply(&mut engine, prefetch(&hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 4));
    assert_eq!(engine.cache().cached_prefix(&hashes), 4);
    let moved = drain(&mut engine);
    assert_eq!(loads(&moved, Tier::Host), hashes, "copied in prefix order");
    assert_eq!(stored(&moved, Tier::Device), hashes);
    assert!(moved.iter().all(|s| s.duration.is_zero()), "background");
    let tiers = engine.stats().tiers;
    assert_eq!(
        (tiers.prefetched_blocks, tiers.prefetched_bytes),
        (4, 4_000)
    );
    let load = host_load(&engine, 4);
    assert_eq!(tiers.prefetch_time, load);

    let again = run(&mut engine, 2, prompt);
    assert_eq!(cached(&again, 2), 16);
    let stats = engine.stats();
    assert_eq!(stats.prefix_hits, 16, "a device hit");
    assert_eq!(
        stats.tiers.onboarded_blocks, 0,
        "nothing loaded on the request path"
    );
    assert!(loads(&again, Tier::Host).is_empty());
}

#[test]
fn a_request_that_hits_a_prefetch_still_copying_waits_for_it() {
    let mut engine = engine(Some(32), None);
    let (prompt, hashes) = first_turn(&mut engine);
    apply(&mut engine, demote(HintTier::Host, &hashes));
    let load = host_load(&engine, 4);
    let at = engine.clock();
    apply(&mut engine, prefetch(&hashes));
    // The copy runs in the background; the request arrives at once and waits for it.
    engine.add_request(request(2, prompt, 1)).expect("accepted");
    let mut computed_at = None;
    while engine.has_work() {
        let start = engine.clock();
        let step = engine.step();
        if step.outputs.iter().any(|o| o.id == 2) {
            computed_at = Some(start);
        }
    }
    assert_eq!(computed_at, Some(at + load));
    assert_eq!(engine.stats().prefix_hits, 16, "a device hit all the same");
}

#[test]
fn a_prefetch_stops_at_the_first_block_in_no_tier() {
    let mut engine = engine(Some(32), None);
    let (_, hashes) = first_turn(&mut engine);
    apply(&mut engine, demote(HintTier::Host, &hashes[..2]));
    let unknown = [hashes[0], hashes[1], 77, hashes[2]];
    let outcome = apply(&mut engine, prefetch(&unknown));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Clipped, 2));
    assert_eq!(
        outcome.reason.as_deref(),
        Some("2 blocks not loaded: the prefix stops at block 2, in no tier")
    );

    let outcome = apply(&mut engine, prefetch(&[77, hashes[0]]));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Missing, 0));
}

#[test]
fn a_prefetch_never_evicts_referenced_blocks() {
    let mut engine = engine(Some(32), None);
    let (_, hashes) = first_turn(&mut engine);
    apply(&mut engine, demote(HintTier::Host, &hashes));
    drain(&mut engine);
    // A running request holds (or has promised to it) all 8 device blocks.
    let other = tokens(2, 20);
    engine
        .add_request(request(2, other.clone(), 13))
        .expect("fits");
    engine.step();
    let outcome = apply(&mut engine, prefetch(&hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Clipped, 0));
    assert!(outcome.reason.expect("reason").contains("no room"));
    let tokens_out: Vec<u32> = drain(&mut engine)
        .iter()
        .flat_map(|s| &s.outputs)
        .map(|o| o.token)
        .collect();
    assert_eq!(tokens_out.len(), 12, "the request ran to its end");
}

#[test]
fn a_demote_to_disk_moves_past_the_host() {
    let mut engine = engine(Some(8), Some(32));
    let (prompt, hashes) = first_turn(&mut engine);
    let outcome = apply(&mut engine, demote(HintTier::Disk, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 4));
    let moved = drain(&mut engine);
    assert_eq!(removed(&moved, Tier::Device), hashes);
    assert_eq!(removed(&moved, Tier::Host), hashes);
    assert_eq!(stored(&moved, Tier::Disk), hashes);
    let tiers = engine.stats().tiers;
    assert_eq!((tiers.host_blocks, tiers.disk_blocks), (0, 4));

    let again = run(&mut engine, 2, prompt);
    assert_eq!(cached(&again, 2), 16);
    assert_eq!(loads(&again, Tier::Disk), hashes);

    // Loaded back and written through to the host: demoted again, only the copies above go.
    let outcome = apply(&mut engine, demote(HintTier::Disk, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 4));
    let moved = drain(&mut engine);
    assert!(stored(&moved, Tier::Disk).is_empty(), "the disk had them");
    assert_eq!(removed(&moved, Tier::Host), hashes);
    // Nothing left above the disk: done already, nothing to move.
    let outcome = apply(&mut engine, demote(HintTier::Disk, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 0));
    let outcome = apply(&mut engine, demote(HintTier::Disk, &[41, 42]));
    assert_eq!(outcome.outcome, Outcome::Missing);
}

#[test]
fn a_demote_writes_a_block_the_host_no_longer_holds() {
    let mut engine = engine(Some(8), None);
    let (_, hashes) = first_turn(&mut engine);
    // Ephemeral drops the host copies and leaves the device ones.
    apply(&mut engine, action(ActionType::Ephemeral, &hashes));
    assert_eq!(engine.stats().tiers.host_blocks, 0);
    let outcome = apply(&mut engine, demote(HintTier::Host, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 4));
    let moved = drain(&mut engine);
    let written: Vec<u64> = moved
        .iter()
        .flat_map(|s| &s.transfers)
        .filter_map(|t| match t {
            KvTransfer::Copy {
                hash,
                from: (Tier::Device, _),
                to: (Tier::Host, _),
            } => Some(*hash),
            _ => None,
        })
        .collect();
    assert_eq!(written, hashes);
    assert_eq!(engine.stats().tiers.host_blocks, 4);
}

#[test]
fn blocks_a_request_references_are_never_freed() {
    let mut engine = engine(Some(32), None);
    let (prompt, hashes) = first_turn(&mut engine);
    // Running: admitted with the prefix, still decoding.
    engine
        .add_request(request(2, prompt.clone(), 5))
        .expect("fits");
    engine.step();
    for hint in [
        demote(HintTier::Host, &hashes),
        action(ActionType::Evict, &hashes),
    ] {
        let outcome = apply(&mut engine, hint);
        assert_eq!(outcome.outcome, Outcome::Clipped);
        assert!(outcome.reason.expect("reason").contains("in use"));
        assert_eq!(engine.cache().cached_prefix(&hashes), 4);
    }
    drain(&mut engine);

    // Queued: not admitted yet, its prompt's blocks are kept for it.
    engine.add_request(request(3, prompt, 1)).expect("fits");
    let outcome = apply(&mut engine, demote(HintTier::Host, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Clipped, 0));
    assert_eq!(cached(&drain(&mut engine), 3), 16);
    assert_eq!(
        engine.stats().prefix_hits,
        32,
        "both later turns hit the device"
    );
}

#[test]
fn an_evicted_prefix_is_recomputed() {
    let mut engine = engine(Some(32), Some(32));
    let (prompt, hashes) = first_turn(&mut engine);
    let outcome = apply(&mut engine, action(ActionType::Evict, &hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 4));
    let gone = drain(&mut engine);
    assert_eq!(removed(&gone, Tier::Device), hashes);
    assert_eq!(removed(&gone, Tier::Host), hashes);
    assert!(
        removed(&gone, Tier::Disk).is_empty(),
        "not on disk to begin with"
    );
    assert_eq!(cached(&run(&mut engine, 2, prompt), 2), 0);
    let outcome = apply(&mut engine, action(ActionType::Evict, &[5, 6]));
    assert_eq!(outcome.outcome, Outcome::Missing);
}

/// Fill the device with `blocks` blocks of other prompts, in 1-block requests.
fn pressure(engine: &mut EngineModel, first_id: u64, blocks: u32) {
    for i in 0..blocks {
        run(engine, first_id + u64::from(i), tokens(100 + i, 5));
    }
}

#[test]
fn a_pin_keeps_blocks_through_pressure_until_it_expires() {
    let mut engine = engine(None, None);
    let (prompt, hashes) = first_turn(&mut engine);
    // The budget is a quarter of 8 blocks.
    let pinned_at = engine.clock();
    let outcome = apply(&mut engine, pin(&hashes, 5_000));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Clipped, 2));
    assert!(outcome.reason.expect("reason").contains("pin budget"));
    assert_eq!(engine.pinned_blocks(), engine.pin_budget());
    // Re-pinning extends, at no cost.
    let outcome = apply(&mut engine, pin(&hashes[..2], 1));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 2));

    pressure(&mut engine, 10, 8);
    assert_eq!(
        engine.cache().cached_prefix(&hashes),
        2,
        "the pinned two stayed"
    );

    // Held until the pin's model time is up (each short request takes ~17 ms), then
    // evictable again.
    let expiry = pinned_at + Duration::from_secs(5);
    while engine.clock() < expiry {
        assert_eq!(engine.pinned_blocks(), 2);
        run(&mut engine, 50, tokens(3, 5));
    }
    engine.apply_hints(&[]);
    assert_eq!(engine.pinned_blocks(), 0);
    pressure(&mut engine, 60, 8);
    assert_eq!(engine.cache().cached_prefix(&hashes), 0);
    let outcome = apply(&mut engine, pin(&hashes, 1_000));
    assert_eq!(outcome.outcome, Outcome::Missing);
    assert_eq!(cached(&run(&mut engine, 99, prompt), 99), 0);
}

#[test]
fn idle_time_the_driver_lets_pass_expires_pins() {
    let mut engine = engine(None, None);
    let (_, hashes) = first_turn(&mut engine);
    let start = engine.clock();
    apply(&mut engine, pin(&hashes[..1], 1_000));
    engine.advance_clock_to(start + Duration::from_millis(999));
    engine.apply_hints(&[]);
    assert_eq!(engine.pinned_blocks(), 1);
    // Time never runs backwards.
    engine.advance_clock_to(start);
    assert_eq!(engine.clock(), start + Duration::from_millis(999));
    engine.advance_clock_to(start + Duration::from_secs(1));
    engine.apply_hints(&[]);
    assert_eq!(engine.pinned_blocks(), 0);
}

#[test]
fn pins_give_way_to_a_request_that_needs_the_whole_device() {
    let mut engine = engine(None, None);
    let (_, hashes) = first_turn(&mut engine);
    apply(&mut engine, pin(&hashes[..2], 3_600_000));
    let whole = tokens(2, 29); // 8 blocks
    let steps = run(&mut engine, 2, whole);
    assert_eq!(steps.iter().flat_map(|s| &s.outputs).count(), 1);
    assert_eq!(engine.pinned_blocks(), 0);
}

#[test]
fn retained_blocks_are_evicted_last_and_ephemeral_ones_first() {
    let mut engine = engine(None, None);
    let kept = tokens(1, 9); // 2 full blocks
    let dropped = tokens(2, 9);
    let kept_hashes = engine.cache().hash_blocks(&kept);
    let dropped_hashes = engine.cache().hash_blocks(&dropped);
    run(&mut engine, 1, kept.clone());
    run(&mut engine, 2, dropped.clone());
    // Without hints the oldest (kept) would go first.
    let outcome = apply(&mut engine, action(ActionType::Retain, &kept_hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 2));
    // The unmarked free blocks go first, the newest (dropped) among them, the retained last.
    pressure(&mut engine, 10, 6);
    assert_eq!(engine.cache().cached_prefix(&kept_hashes), 2);
    assert_eq!(engine.cache().cached_prefix(&dropped_hashes), 0);

    // Ephemeral jumps the queue: the newest block goes before older ones.
    let mut engine = self::engine(None, None);
    run(&mut engine, 1, kept);
    run(&mut engine, 2, dropped);
    apply(&mut engine, action(ActionType::Ephemeral, &dropped_hashes));
    pressure(&mut engine, 10, 2);
    assert_eq!(engine.cache().cached_prefix(&kept_hashes), 2);
    assert_eq!(engine.cache().cached_prefix(&dropped_hashes), 0);
}

#[test]
fn a_prefetch_outranks_an_earlier_ephemeral_mark() {
    let mut engine = engine(Some(32), None);
    let prompt = tokens(2, 9);
    let hashes = engine.cache().hash_blocks(&prompt);
    run(&mut engine, 1, tokens(1, 9));
    run(&mut engine, 2, prompt);
    apply(&mut engine, action(ActionType::Ephemeral, &hashes));
    let outcome = apply(&mut engine, prefetch(&hashes));
    assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Accepted, 0));
    pressure(&mut engine, 10, 2);
    assert_eq!(
        engine.cache().cached_prefix(&hashes),
        2,
        "no longer evicted first"
    );
}

#[test]
fn every_refusal_is_rejected_with_a_reason() {
    let mut host_only = engine(Some(32), None);
    let mut bare = engine(None, None);
    let (_, hashes) = first_turn(&mut host_only);
    let mut unknown = action(ActionType::Demote, &hashes);
    unknown.action_type = "kv.fetch".into();
    let mut old = demote(HintTier::Host, &hashes);
    old.action_version = "0".into();
    let cases = [
        (false, unknown, "unsupported action kv.fetch@1"),
        (false, old, "unsupported action switchyard.kv.demote@0"),
        (false, demote(HintTier::Disk, &hashes), "no disk tier"),
        (false, demote(HintTier::Shared, &hashes), "not shared"),
        (false, action(ActionType::Demote, &hashes), "needs a tier"),
        (
            false,
            to(HintTier::Host, action(ActionType::Prefetch, &hashes)),
            "not host",
        ),
        (false, action(ActionType::Pin, &hashes), "ttl_ms"),
        (false, pin(&hashes, 0), "ttl_ms"),
        (false, action(ActionType::Retain, &[]), "no blocks"),
        (true, demote(HintTier::Host, &hashes), "no host tier"),
        (true, prefetch(&hashes), "no host or disk tier"),
    ];
    for (on_bare, hint, why) in cases {
        let engine = if on_bare { &mut bare } else { &mut host_only };
        let outcome = apply(engine, hint);
        assert_eq!((outcome.outcome, outcome.blocks), (Outcome::Rejected, 0));
        let reason = outcome.reason.expect("a reason");
        assert!(reason.contains(why), "{reason:?} should say {why:?}");
    }
    assert_eq!(host_only.cache().cached_prefix(&hashes), 4, "nothing moved");
}

#[test]
fn outcomes_say_what_was_done_in_order() {
    let mut engine = engine(Some(32), None);
    let (_, hashes) = first_turn(&mut engine);
    let actions = [
        demote(HintTier::Host, &[hashes[0], 9, 9]),
        demote(HintTier::Host, &[1, 2]),
        demote(HintTier::Host, &[hashes[0]]),
        action(ActionType::Retain, &hashes[1..]),
        action(ActionType::Ephemeral, &[3]),
    ];
    let outcomes = engine.apply_hints(&actions);
    let ids: Vec<&str> = outcomes.iter().map(|o| o.action_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "demote-1",
            "demote-1",
            "demote-1",
            "retain-1",
            "ephemeral-1"
        ]
    );
    let got: Vec<(Outcome, u32)> = outcomes.iter().map(|o| (o.outcome, o.blocks)).collect();
    assert_eq!(
        got,
        [
            (Outcome::Clipped, 1), // the duplicate counts once
            (Outcome::Missing, 0),
            (Outcome::Accepted, 0), // already in the host: nothing left to move
            (Outcome::Accepted, 3),
            (Outcome::Missing, 0),
        ]
    );
    assert_eq!(
        outcomes[0].reason.as_deref(),
        Some("1 block not on the device")
    );
}

#[test]
fn an_envelope_of_another_protocol_version_is_refused() {
    let mut engine = engine(Some(32), None);
    let (_, hashes) = first_turn(&mut engine);
    let mut envelope = KvHintsEnvelope {
        protocol_version: "0.2".into(),
        message_id: "m1".into(),
        actions: vec![demote(HintTier::Host, &hashes)],
    };
    assert_eq!(
        engine.apply_envelope(&envelope),
        Err(HintsError::ProtocolVersion("0.2".into()))
    );
    assert_eq!(engine.cache().cached_prefix(&hashes), 4);
    envelope.protocol_version = PROTOCOL_VERSION.into();
    let reply = engine.apply_envelope(&envelope).expect("accepted");
    assert_eq!(reply.message_id, "m1");
    assert_eq!(reply.outcomes[0].outcome, Outcome::Accepted);
}

#[test]
fn a_reset_drops_hint_pins_too() {
    let mut engine = engine(Some(32), None);
    let (_, hashes) = first_turn(&mut engine);
    apply(&mut engine, pin(&hashes[..1], 60_000));
    assert!(engine.reset_prefix_cache());
    assert_eq!(
        (engine.pinned_blocks(), engine.cache().used_blocks()),
        (0, 0)
    );
}

/// Bytes as the mock engine keeps them, by content: each (tier, slot) holds the hash of the
/// block last written there. A load must bring back what computing the block wrote.
#[derive(Debug, Default)]
struct Shadow {
    slots: HashMap<(Tier, u32), u64>,
}

impl Shadow {
    fn replay(&mut self, transfers: &[KvTransfer]) -> Result<(), TestCaseError> {
        for transfer in transfers {
            match *transfer {
                KvTransfer::Computed { hash, slot } => {
                    self.slots.insert((Tier::Device, slot), hash);
                }
                KvTransfer::Copy { hash, from, to } => {
                    prop_assert_eq!(self.slots.get(&from), Some(&hash), "copy of {:?}", transfer);
                    self.slots.insert(to, hash);
                }
                KvTransfer::Fetched { .. } | KvTransfer::Publish { .. } => {}
            }
        }
        Ok(())
    }
}

/// One move of the random interleaving: a request, or a hint on some earlier prompt's blocks.
#[derive(Debug, Clone)]
enum Move {
    Request {
        tag: u32,
        len: usize,
        max_tokens: u32,
    },
    Hint {
        kind: usize,
        tag: u32,
        len: usize,
        tier: usize,
        ttl_ms: u64,
    },
    Step,
}

fn moves() -> impl Strategy<Value = Move> {
    prop_oneof![
        (0u32..5, 1usize..30, 1u32..4).prop_map(|(tag, len, max_tokens)| Move::Request {
            tag,
            len,
            max_tokens
        }),
        (0usize..7, 0u32..5, 4usize..30, 0usize..4, 1u64..50).prop_map(
            |(kind, tag, len, tier, ttl_ms)| Move::Hint {
                kind,
                tag,
                len,
                tier,
                ttl_ms
            }
        ),
        Just(Move::Step),
    ]
}

fn random_hint(kind: usize, hashes: &[u64], tier: usize, ttl_ms: u64) -> HintAction {
    let tier = [
        HintTier::Device,
        HintTier::Host,
        HintTier::Disk,
        HintTier::Shared,
    ][tier];
    let mut hint = match ActionType::ALL.get(kind) {
        Some(&kind) => action(kind, hashes),
        None => {
            let mut other = action(ActionType::Evict, hashes);
            other.action_type = "switchyard.kv.share".into();
            other
        }
    };
    hint.payload.tier = Some(tier);
    hint.payload.ttl_ms = Some(ttl_ms);
    hint
}

/// The tokens each request generated.
fn outputs(steps: &[Step], into: &mut HashMap<u64, Vec<u32>>) {
    for out in steps.iter().flat_map(|s| &s.outputs) {
        into.entry(out.id).or_default().push(out.token);
    }
}

/// Per step: the device never holds more than it has, every copy moves the bytes its source
/// holds, and each tier's events apply to the set of blocks it holds.
fn check_step(
    engine: &EngineModel,
    step: &Step,
    shadow: &mut Shadow,
    sets: &mut [HashSet<u64>; 3],
) -> Result<(), TestCaseError> {
    prop_assert!(engine.cache().used_blocks() <= engine.cache().num_blocks());
    shadow.replay(&step.transfers)?;
    for event in &step.events {
        match event {
            CacheEvent::Stored {
                tier,
                hashes,
                token_ids,
                ..
            } => {
                prop_assert_eq!(token_ids.len(), hashes.len() * 4);
                for hash in hashes {
                    prop_assert!(sets[*tier as usize].insert(*hash), "stored twice");
                }
            }
            CacheEvent::Removed { tier, hashes } => {
                for hash in hashes {
                    prop_assert!(sets[*tier as usize].remove(hash), "removed unstored");
                }
            }
            CacheEvent::Cleared => sets[0].clear(),
        }
    }
    Ok(())
}

proptest! {
    /// Hints never change results, only where bytes live: whatever hints are interleaved
    /// with requests, every request completes with the tokens it gets without hints, the
    /// device never holds more than it has, every load brings back the block's own bytes, and
    /// each tier's events replay to what it holds.
    #[test]
    fn hints_never_change_what_requests_compute(
        plan in proptest::collection::vec(moves(), 1..40),
        disk in any::<bool>(),
    ) {
        let mut hinted = engine(Some(10), disk.then_some(16));
        let mut plain = engine(Some(10), disk.then_some(16));
        let mut shadow = Shadow::default();
        let mut sets: [HashSet<u64>; 3] = Default::default();
        let (mut got, mut expected) = (HashMap::new(), HashMap::new());
        for (id, m) in plan.into_iter().enumerate() {
            match m {
                Move::Request { tag, len, max_tokens } => {
                    let prompt = tokens(tag, len);
                    hinted.add_request(request(id as u64, prompt.clone(), max_tokens))
                        .expect("fits");
                    plain.add_request(request(id as u64, prompt, max_tokens)).expect("fits");
                }
                Move::Hint { kind, tag, len, tier, ttl_ms } => {
                    let hashes = hinted.cache().hash_blocks(&tokens(tag, len));
                    let outcomes = hinted.apply_hints(&[random_hint(kind, &hashes, tier, ttl_ms)]);
                    prop_assert_eq!(outcomes.len(), 1);
                    prop_assert!(outcomes[0].blocks as usize <= hashes.len());
                }
                Move::Step => {}
            }
            if hinted.has_work() {
                let step = hinted.step();
                check_step(&hinted, &step, &mut shadow, &mut sets)?;
                outputs(&[step], &mut got);
            }
            outputs(&[plain.step()], &mut expected);
        }
        let mut steps = 0;
        while hinted.has_work() {
            let step = hinted.step();
            check_step(&hinted, &step, &mut shadow, &mut sets)?;
            outputs(&[step], &mut got);
            steps += 1;
            prop_assert!(steps < 10_000, "never goes idle");
        }
        outputs(&drain(&mut plain), &mut expected);
        prop_assert_eq!(got, expected);
        let cached: HashSet<u64> = hinted.cache().cached_hashes().collect();
        prop_assert_eq!(&sets[0], &cached);
        let tiers = hinted.stats().tiers;
        prop_assert_eq!(sets[1].len(), tiers.host_blocks);
        prop_assert_eq!(sets[2].len(), tiers.disk_blocks);
    }
}
