use super::*;
use proptest::prelude::*;
use std::collections::HashSet;

fn config(block_size: usize, num_blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size,
        num_blocks,
        ..EngineConfig::default()
    }
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

/// Step until idle; returns every step.
fn drain(engine: &mut EngineModel) -> Vec<Step> {
    let mut steps = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
        assert!(steps.len() < 10_000, "engine never goes idle");
    }
    steps
}

fn cached_tokens(steps: &[Step], id: u64) -> Option<usize> {
    steps
        .iter()
        .flat_map(|s| &s.admitted)
        .find(|a| a.id == id)
        .map(|a| a.cached_tokens)
}

#[test]
fn a_repeated_prompt_hits_its_full_blocks() {
    let mut engine = EngineModel::new(config(16, 64)).expect("valid");
    let prompt: Vec<u32> = (0..40).collect();
    engine
        .add_request(request(1, prompt.clone(), 4))
        .expect("fits");
    let first = drain(&mut engine);
    engine.add_request(request(2, prompt, 4)).expect("fits");
    let second = drain(&mut engine);
    assert_eq!(cached_tokens(&first, 1), Some(0));
    assert_eq!(cached_tokens(&second, 2), Some(32));
    let stats = engine.stats();
    assert_eq!((stats.prefix_queries, stats.prefix_hits), (80, 32));
    assert_eq!((stats.prompt_tokens, stats.finished), (80, 2));
}

/// An engine given the router's seed names its blocks by the router's hashes in its events.
#[test]
fn the_hash_seed_names_the_blocks_of_the_events() {
    let prompt: Vec<u32> = (0..12).collect();
    let stored = |hash_seed| {
        let mut engine = EngineModel::new(EngineConfig {
            hash_seed,
            ..config(4, 16)
        })
        .expect("valid");
        engine
            .add_request(request(1, prompt.clone(), 1))
            .expect("fits");
        let steps = drain(&mut engine);
        let events = steps.iter().flat_map(|s| &s.events);
        events
            .flat_map(|e| match e {
                CacheEvent::Stored { hashes, .. } => hashes.clone(),
                _ => Vec::new(),
            })
            .collect::<Vec<u64>>()
    };
    let router: Vec<u64> = crate::hash::BlockHasher::new(4)
        .sequence(&prompt)
        .iter()
        .map(|h| h.0)
        .collect();
    assert_eq!(stored(crate::hash::HASH_SEED)[..3], router[..]);
    assert_ne!(stored(ENGINE_SEED)[..3], router[..]);
}

#[test]
fn the_last_prompt_token_is_always_computed() {
    let mut engine = EngineModel::new(config(16, 64)).expect("valid");
    let prompt: Vec<u32> = (0..48).collect();
    engine
        .add_request(request(1, prompt.clone(), 1))
        .expect("fits");
    drain(&mut engine);
    engine.add_request(request(2, prompt, 1)).expect("fits");
    // Three full blocks cached, but the third is recomputed to sample from.
    assert_eq!(cached_tokens(&drain(&mut engine), 2), Some(32));
}

#[test]
fn generates_max_tokens_deterministic_tokens_from_the_vocabulary() {
    let run = |id| {
        let mut engine = EngineModel::new(config(16, 64)).expect("valid");
        engine
            .add_request(request(id, (0..20).collect(), 5))
            .expect("fits");
        drain(&mut engine)
            .into_iter()
            .flat_map(|s| s.outputs)
            .collect::<Vec<_>>()
    };
    let outputs = run(1);
    assert_eq!(outputs.len(), 5);
    assert!(outputs[0].first && outputs.iter().skip(1).all(|o| !o.first));
    assert!(outputs[4].finished && outputs.iter().take(4).all(|o| !o.finished));
    let vocab = EngineConfig::default().output_vocab;
    assert!(outputs.iter().all(|o| vocab.contains(&o.token)));
    let tokens = |outs: &[TokenOut]| outs.iter().map(|o| o.token).collect::<Vec<_>>();
    assert_eq!(tokens(&outputs), tokens(&run(2)));
}

#[test]
fn generated_blocks_are_cached_too() {
    let mut engine = EngineModel::new(config(4, 16)).expect("valid");
    let prompt: Vec<u32> = (0..4).collect();
    engine
        .add_request(request(1, prompt.clone(), 6))
        .expect("fits");
    let steps = drain(&mut engine);
    let output: Vec<u32> = steps
        .iter()
        .flat_map(|s| &s.outputs)
        .map(|o| o.token)
        .collect();
    // 4 prompt + 5 fed-back outputs: two full blocks, the second made of output tokens.
    let all: Vec<u32> = prompt.iter().chain(&output).copied().collect();
    let hashes = engine.cache().hash_blocks(&all[..8]);
    assert_eq!(engine.cache().cached_prefix(&hashes), 2);
}

#[test]
fn chunked_prefill_spreads_a_long_prompt_over_steps() {
    let mut engine = EngineModel::new(EngineConfig::default()).expect("valid");
    engine
        .add_request(request(1, (0..20_000).collect(), 2))
        .expect("fits");
    let steps = drain(&mut engine);
    assert_eq!(
        steps.len(),
        4,
        "8192 + 8192 + 3616 prompt tokens, then one decode"
    );
    assert!(steps[1].outputs.is_empty());
    assert!(steps[2].outputs[0].first);
    let timing = StepTiming::default();
    assert_eq!(
        steps[0].duration,
        Duration::from_secs_f64(timing.prefill_ms(8192) / 1000.0)
    );
    assert_eq!(
        steps[2].duration,
        Duration::from_secs_f64(timing.prefill_ms(3616) / 1000.0)
    );
}

#[test]
fn a_pass_mixing_prefill_and_decode_costs_both() {
    let mut engine = EngineModel::new(config(16, 100)).expect("valid");
    engine
        .add_request(request(1, (0..16).collect(), 10))
        .expect("fits");
    engine.step();
    engine
        .add_request(request(2, (100..200).collect(), 10))
        .expect("fits");
    let step = engine.step();
    // Request 1 decodes its 17th token, request 2 prefills 100.
    let usage = (17.0 + 100.0) / 1600.0;
    let timing = StepTiming::default();
    let expected = (timing.prefill_ms(100) + timing.decode_ms(usage)) / 1000.0;
    assert!((step.duration.as_secs_f64() - expected).abs() < 1e-9);
}

#[test]
fn timing_follows_the_reference_fit() {
    let timing = StepTiming::default();
    assert!((timing.prefill_ms(1000) - (0.421 + 15.18 + 16.5)).abs() < 1e-9);
    assert!((timing.decode_ms(0.0) - 5.74).abs() < 1e-9);
    assert!((timing.decode_ms(1.0) - (54.01 - 25.74 + 5.74)).abs() < 1e-9);
    let steep = StepTiming {
        decode: [-100.0, 0.0, 5.0],
        ..timing
    };
    assert_eq!(steep.decode_ms(1.0), 1.0, "floor of 1 ms");
    assert_eq!(timing.step(0, false, 0.5), Duration::ZERO);
}

#[test]
fn requests_wait_for_blocks_and_the_sequence_limit() {
    let mut engine = EngineModel::new(EngineConfig {
        max_num_seqs: 2,
        ..config(4, 10)
    })
    .expect("valid");
    // Each needs (16 + 4 - 1) / 4 = 5 blocks: two fit at once.
    for id in 0..3 {
        let prompt = (0..16).map(|t| t + 100 * id as u32).collect();
        engine.add_request(request(id, prompt, 4)).expect("fits");
    }
    let first = engine.step();
    assert_eq!(first.admitted.len(), 2);
    assert_eq!(engine.stats().waiting, 1);
    let mut steps = vec![first];
    while engine.has_work() {
        steps.push(engine.step());
        assert!(engine.cache().used_blocks() <= 10);
        assert!(engine.stats().running <= 2);
    }
    let admitted_at = steps
        .iter()
        .position(|s| s.admitted.iter().any(|a| a.id == 2));
    let finished_at = steps
        .iter()
        .position(|s| s.outputs.iter().any(|o| o.finished));
    assert!(admitted_at > finished_at);
}

#[test]
fn refuses_requests_that_cannot_run() {
    let mut engine = EngineModel::new(config(4, 4)).expect("valid");
    assert_eq!(
        engine.add_request(request(1, Vec::new(), 1)),
        Err(RequestError::EmptyPrompt)
    );
    assert_eq!(
        engine.add_request(request(1, vec![1], 0)),
        Err(RequestError::NoOutput)
    );
    assert_eq!(
        engine.add_request(request(1, vec![1; 16], 2)),
        Err(RequestError::TooLong {
            needed: 5,
            capacity: 4
        })
    );
    engine
        .add_request(request(1, vec![1; 16], 1))
        .expect("fits");
    assert_eq!(
        engine.add_request(request(1, vec![1], 1)),
        Err(RequestError::DuplicateId(1))
    );
    assert!(EngineModel::new(config(0, 4)).is_err());
}

#[test]
fn cancel_frees_blocks_and_keeps_the_cache() {
    let mut engine = EngineModel::new(config(4, 16)).expect("valid");
    engine
        .add_request(request(1, (0..12).collect(), 10))
        .expect("fits");
    engine
        .add_request(request(2, (0..8).collect(), 10))
        .expect("fits");
    engine.step();
    assert!(engine.cancel(2));
    assert!(engine.cancel(1));
    assert!(!engine.cancel(1));
    assert_eq!(engine.cache().used_blocks(), 0);
    assert_eq!(engine.stats().running, 0);
    assert!(!engine.has_work());
    assert_eq!(engine.cache().cached_hashes().count(), 3);
}

#[test]
fn reset_reports_cleared_on_the_next_step() {
    let mut engine = EngineModel::new(config(4, 16)).expect("valid");
    engine
        .add_request(request(1, (0..12).collect(), 2))
        .expect("fits");
    engine.step();
    assert!(!engine.reset_prefix_cache(), "a request is running");
    drain(&mut engine);
    assert!(engine.reset_prefix_cache());
    assert!(engine.has_work());
    let step = engine.step();
    assert_eq!(step.events, vec![CacheEvent::Cleared]);
    assert_eq!(step.duration, Duration::ZERO);
}

#[derive(Debug, Clone)]
enum Op {
    Add { prefix: u32, len: usize, out: u32 },
    Cancel(u64),
    Step,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3u32, 1..40usize, 1..8u32).prop_map(|(prefix, len, out)| Op::Add { prefix, len, out }),
        (0..20u64).prop_map(Op::Cancel),
        Just(Op::Step),
        Just(Op::Step),
    ]
}

proptest! {
    /// Replaying the events reproduces the cache, and nothing is removed before it was stored.
    #[test]
    fn events_replay_to_the_cache_content(ops in prop::collection::vec(op(), 1..120)) {
        let mut engine = EngineModel::new(EngineConfig {
            max_batched_tokens: 24,
            max_num_seqs: 4,
            ..config(4, 24)
        }).expect("valid");
        let mut replayed = HashSet::new();
        let mut apply = |events: Vec<CacheEvent>| -> Result<(), TestCaseError> {
            for event in events {
                match event {
                    CacheEvent::Stored { hashes, token_ids, .. } => {
                        prop_assert_eq!(token_ids.len(), hashes.len() * 4);
                        for hash in hashes {
                            prop_assert!(replayed.insert(hash), "stored twice");
                        }
                    }
                    CacheEvent::Removed { hashes, .. } => {
                        for hash in hashes {
                            prop_assert!(replayed.remove(&hash), "removed before stored");
                        }
                    }
                    CacheEvent::Cleared => replayed.clear(),
                }
            }
            Ok(())
        };
        for (id, op) in ops.into_iter().enumerate() {
            match op {
                Op::Add { prefix, len, out } => {
                    // Shared prefixes: prompts start with one of three token runs.
                    let prompt = (0..len as u32).map(|t| prefix * 100 + t).collect();
                    engine.add_request(request(id as u64, prompt, out)).ok();
                }
                Op::Cancel(id) => {
                    engine.cancel(id);
                }
                Op::Step => apply(engine.step().events)?,
            }
            prop_assert!(engine.cache().used_blocks() <= 24);
        }
        while engine.has_work() {
            apply(engine.step().events)?;
        }
        let cached: HashSet<u64> = engine.cache().cached_hashes().collect();
        prop_assert_eq!(replayed, cached);
        prop_assert_eq!(engine.cache().used_blocks(), 0);
    }
}

/// A random schedule: requests (shared prefixes, lengths, outputs) added at random steps.
fn quiet_workload() -> impl Strategy<Value = Vec<(usize, u32, usize, u32)>> {
    // (step to add it at, prefix family, prompt length, output tokens)
    prop::collection::vec((0usize..60, 0u32..3, 1usize..90, 1u32..80), 1..8)
}

proptest! {
    /// Quiet runs are exactly the steps they replace: an engine that runs every quiet stretch
    /// at once (sometimes only part of it) ends each stretch in the same state, and then
    /// produces the same steps, as one stepped one step at a time.
    #[test]
    fn quiet_runs_equal_the_steps_they_replace(
        workload in quiet_workload(),
        cut in 1usize..1_000,
    ) {
        let prompt = |family: u32, len: usize| -> Vec<u32> {
            (0..len as u32).map(|t| family * 1_000 + t).collect()
        };
        let mut stepped = EngineModel::new(config(8, 48)).expect("valid");
        let mut skipping = EngineModel::new(config(8, 48)).expect("valid");
        let mut step = 0;
        loop {
            for (id, &(at, family, len, out)) in workload.iter().enumerate() {
                if at == step {
                    let req = || request(id as u64, prompt(family, len), out);
                    prop_assert_eq!(stepped.add_request(req()), skipping.add_request(req()));
                }
            }
            if !stepped.has_work() && workload.iter().all(|w| w.0 <= step) {
                break;
            }
            let quiet = skipping.quiet_steps();
            prop_assert_eq!(quiet, stepped.quiet_steps());
            // Never past the next arrival: the schedule adds requests between steps.
            let next_arrival = workload.iter().map(|w| w.0).filter(|&at| at > step).min();
            let run = quiet
                .min(1 + cut % (quiet + 1))
                .min(next_arrival.map_or(usize::MAX, |at| at - step - 1));
            if run >= 1 {
                let durations: Vec<Duration> = skipping.quiet_durations(run).collect();
                let plan = skipping.plan_quiet(run);
                prop_assert_eq!(plan.duration(), durations.iter().sum::<Duration>());
                skipping.run_quiet(plan);
                for expected in durations {
                    let s = stepped.step();
                    prop_assert_eq!(s.duration, expected);
                    prop_assert!(s.events.is_empty() && s.admitted.is_empty());
                    prop_assert!(s.transfers.is_empty());
                    prop_assert!(s.outputs.iter().all(|o| !o.first && !o.finished));
                }
                step += run;
                prop_assert_eq!(skipping.clock(), stepped.clock());
                prop_assert_eq!(skipping.stats(), stepped.stats());
            } else {
                let (a, b) = (stepped.step(), skipping.step());
                prop_assert_eq!(a, b);
                step += 1;
            }
            prop_assert!(step < 20_000, "never idle");
        }
        prop_assert_eq!(skipping.clock(), stepped.clock());
        prop_assert_eq!(skipping.stats(), stepped.stats());
        let cached = |e: &EngineModel| e.cache().cached_hashes().collect::<HashSet<u64>>();
        prop_assert_eq!(cached(&skipping), cached(&stepped));
    }
}

#[test]
fn a_lone_decode_is_quiet_between_block_boundaries_and_before_its_last_token() {
    let mut engine = EngineModel::new(config(8, 48)).expect("valid");
    engine
        .add_request(request(1, (0..10).collect(), 30))
        .expect("fits");
    // The prefill: nothing quiet while a prompt is computed.
    assert_eq!(engine.quiet_steps(), 0);
    let first = engine.step();
    assert!(first.outputs[0].first);
    // 10 tokens written, 3 of the 2 blocks' 16 free (block 2 fills at 16), then a new block.
    assert_eq!(engine.quiet_steps(), 5);
    engine.run_quiet(engine.plan_quiet(5));
    assert_eq!(engine.quiet_steps(), 0);
    let fill = engine.step();
    assert_eq!(fill.events.len(), 1, "the second block is full: {fill:?}");
    assert_eq!(
        engine.quiet_steps(),
        0,
        "the next token takes a third block"
    );
    engine.step();
    assert_eq!(engine.quiet_steps(), 6);
    // Another request waiting: nothing is quiet.
    engine
        .add_request(request(2, (0..10).collect(), 3))
        .expect("fits");
    assert_eq!(engine.quiet_steps(), 0);
}

#[test]
#[should_panic(expected = "not that many quiet steps from here")]
fn a_quiet_plan_runs_only_where_it_was_made() {
    let mut engine = EngineModel::new(config(8, 48)).expect("valid");
    engine
        .add_request(request(1, (0..10).collect(), 30))
        .expect("fits");
    engine.step();
    let plan = engine.plan_quiet(5);
    engine.step();
    engine.run_quiet(plan);
}

#[test]
fn an_engine_that_publishes_no_events_runs_the_same_steps() {
    let mut publishing = EngineModel::new(config(8, 6)).expect("valid");
    let mut silent = EngineModel::new(config(8, 6)).expect("valid");
    silent.publish_events(false);
    // Three prompts over six blocks: stores, and evictions of what the first cached.
    for id in 0..3u64 {
        let prompt: Vec<u32> = (0..20).map(|t| t + 100 * id as u32).collect();
        for engine in [&mut publishing, &mut silent] {
            engine
                .add_request(request(id, prompt.clone(), 4))
                .expect("fits");
        }
    }
    let mut published = 0;
    while publishing.has_work() {
        let (a, b) = (publishing.step(), silent.step());
        assert_eq!((a.duration, &a.outputs), (b.duration, &b.outputs));
        assert!(b.events.is_empty(), "{b:?}");
        published += a.events.len();
    }
    assert!(!silent.has_work());
    assert!(published > 0);
    assert_eq!(publishing.stats(), silent.stats());
}

#[test]
fn the_streamed_prompt_seed_is_the_one_shot_hash() {
    for len in [0, 1, 255, 256, 257, 1_000] {
        let prompt: Vec<u32> = (0..len).map(|t| t * 7_919 + 13).collect();
        let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(prompt_seed(&prompt), xxh3_64_with_seed(&bytes, ENGINE_SEED));
    }
}
