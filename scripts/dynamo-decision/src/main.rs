//! NVIDIA Dynamo 1.6.1's own routing decision on switchyard's router-bench fixture
//! (`host/core/benches/decision_fixture.rs`), timed the way switchyard's tail pass times
//! `router/route/32k-16w`, so that `scripts/decision-vs-dynamo.sh` can run both side by side.
//!
//! The fixture: 16 workers (ids 0..16, dp_rank 0), 16-token blocks, 16,384 device blocks each.
//! Worker `i` holds the first `i/16` of a 32K-token and of a 2K-token prompt on the device tier,
//! odd workers a further 1/8 of each prompt in the host tier (`StorageTier::HostPinned`, which
//! Dynamo's lookup continues into and its cost credits at `host_cache_hit_weight`), and unrelated
//! 512-block chains fill the rest. The tokens come from the same generator and seed as
//! switchyard's; every hash is Dynamo's own (`compute_block_hash_for_seq`,
//! `compute_seq_hash_for_block`), and the index is filled with `Stored` events and flushed before
//! anything is timed.
//!
//! A decision is `SelectionCore::select_and_reserve` (prompt normalisation, the KV indexer's
//! device and lower-tier lookup, overlap and load projection, the scheduler's worker selection
//! and the booking of the request's blocks) then `free_reservation`, in one `block_on` of a
//! current-thread tokio runtime, the way Dynamo's `selection_core` bench drives it. The worker
//! selection policy is Dynamo's production default (`dynamo-custom-policy-builtin`'s registry,
//! resolved from `KvRouterConfig::default()`).
//!
//! Passes, each warmed up, then `--rounds` rounds of `--calls` calls timed one by one; each prints
//! the p50, p99 and mean of every round, their medians over rounds, and one JSON line with
//! `p50_us`, `p99_us`, `mean_us`, `calls` and `winner` (and what was measured):
//! - `decision/hashes`: the request carries precomputed block and sequence hashes (switchyard's
//!   decision also starts from precomputed hashes); building the request (cloning the two hash
//!   vectors) is outside the timer, building the response (which returns the 2,048 booked
//!   sequence hashes) inside it, dropping it outside.
//! - `decision/tokens`: the request carries the 32K tokens; Dynamo hashes them inside the call.
//! - `lookup/tiered`: `Indexer::find_tiered_matches_ref_with_options`, the lookup the decision
//!   makes (device tier, then the host tier from each worker's device match).
//! - `lookup/device`: the primary indexer's `find_matches` alone (device tier only, the kind of
//!   lookup Dynamo publishes indexer figures for); the hash vector it takes by value is cloned
//!   outside the timer.
//!
//! After the decision passes, a breakdown (printed, no JSON) splits a `decision/hashes` call by
//! Dynamo's own `LookupTimings` into the indexer lookup, the rest of the selection and the free.
//!
//! Usage: dynamo-decision [--indexer-threads N] [--ingress host|zmq] [--rounds N] [--calls N]
//!        [--only decision|lookup] [--no-host-tier]
//!
//! `--indexer-threads` defaults to `KvRouterConfig::default().router_event_threads` (4): more
//! than one gives the `ConcurrentRadixTreeCompressed` indexer, read inline on the caller's thread;
//! 1 gives the single-threaded `KvIndexer`, read through a channel to its own thread (Dynamo's
//! `selection_core` bench uses 1). `--ingress host` (default) feeds the index from this process,
//! as an embedding host does; `zmq` is the standalone service's own ingress, which opens a ZMQ
//! SUB socket per worker on a dummy endpoint (as the `selection_core` bench does) that never
//! delivers anything, while events are still applied here. `--no-host-tier` leaves the host tier
//! empty (switchyard's fixture always has it), to show what the lower-tier walk costs.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use dynamo_kv_router::identity::RoutingPartitionId;
use dynamo_kv_router::indexer::{KvIndexerInterface, LowerTierQueryOptions};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent, RoutingConstraints, StorageTier,
    WorkerWithDpRank, compute_block_hash_for_seq, compute_seq_hash_for_block,
};
use dynamo_kv_router::services::indexer::backend::Indexer;
use dynamo_kv_router::services::indexer::registry::WorkerRegistry;
use dynamo_kv_router::services::selection::{
    KvEventIngress, KvIndexSource, PromptRequest, PromptView, SelectAndReserveRequest,
    SelectionAdmission, SelectionCore, SelectionOperation, SelectionOutcome,
    SelectionServiceBuilder, SessionBinding, WorkerRequest,
};
use dynamo_kv_router::{KvRouterConfig, WorkerType};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Runtime;

const BLOCK_SIZE: u32 = 16;
const WORKERS: u64 = 16;
const BLOCKS_PER_WORKER: usize = 16_384;
/// Length of the unrelated chains that fill each worker's cache.
const FILLER_CHAIN: usize = 512;
const MODEL: &str = "default";
const GROUP: &str = "default";
/// Untimed calls before each pass.
const WARMUP_CALLS: usize = 500;

/// A prompt with Dynamo's hashes of it.
struct Prompt {
    tokens: Vec<u32>,
    locals: Vec<LocalBlockHash>,
    sequence: Vec<u64>,
}

impl Prompt {
    /// Drawn exactly as switchyard's fixture draws its prompts, so the tokens are the same.
    fn random(rng: &mut SmallRng, tokens: usize) -> Self {
        let tokens: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..150_000)).collect();
        let locals = compute_block_hash_for_seq(&tokens, BLOCK_SIZE, BlockHashOptions::default());
        let sequence = compute_seq_hash_for_block(&locals);
        Self {
            tokens,
            locals,
            sequence,
        }
    }
}

/// The standalone service's partition index without its ZMQ listeners: this process feeds the
/// index itself, as an embedding host (Dynamo's frontend) does with its own event transport.
struct HostFedIngress;

impl KvEventIngress for HostFedIngress {
    fn open(
        &self,
        registry: &WorkerRegistry,
        key: &RoutingPartitionId,
        block_size: u32,
    ) -> Indexer {
        registry.get_or_create_indexer(key.clone(), block_size)
    }
}

struct Options {
    indexer_threads: usize,
    /// Store the odd workers' further 1/8 of each prompt in the host tier.
    host_tier: bool,
    zmq_ingress: bool,
    rounds: usize,
    calls: usize,
    decision: bool,
    lookup: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        indexer_threads: KvRouterConfig::default().router_event_threads as usize,
        host_tier: true,
        zmq_ingress: false,
        rounds: 5,
        calls: 2_000,
        decision: true,
        lookup: true,
    };
    let usage = "usage: dynamo-decision [--indexer-threads N] [--ingress host|zmq] [--rounds N] \
                 [--calls N] [--only decision|lookup] [--no-host-tier]";
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--no-host-tier" {
            options.host_tier = false;
            continue;
        }
        let value = args
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value; {usage}"));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--indexer-threads" => options.indexer_threads = number().max(1),
            "--rounds" => options.rounds = number().max(1),
            "--calls" => options.calls = number().max(100),
            "--ingress" => {
                options.zmq_ingress = match value.as_str() {
                    "host" => false,
                    "zmq" => true,
                    _ => panic!("--ingress {value}; {usage}"),
                }
            }
            "--only" => {
                (options.decision, options.lookup) = match value.as_str() {
                    "decision" => (true, false),
                    "lookup" => (false, true),
                    _ => panic!("--only {value}; {usage}"),
                }
            }
            _ => panic!("unknown flag {flag}; {usage}"),
        }
    }
    options
}

fn main() {
    let options = parse_options();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(16);
    let long = Prompt::random(&mut rng, 32 * 1024);
    let short = Prompt::random(&mut rng, 2 * 1024);
    let (service, indexer) = runtime.block_on(build_core(&options));
    let core = service.core();
    let (device_blocks, host_blocks) = runtime.block_on(fill_index(
        &indexer,
        &mut rng,
        &long,
        &short,
        options.host_tier,
    ));
    println!(
        "fixture: {WORKERS} workers x {BLOCKS_PER_WORKER} device blocks ({device_blocks} device + \
         {host_blocks} host blocks stored), prompts of {} and {} blocks; indexer: {}, {} thread(s), \
         {} ingress; first tokens {:?}; built in {:.0} ms",
        long.locals.len(),
        short.locals.len(),
        match &indexer {
            Indexer::Concurrent { .. } => "ConcurrentRadixTreeCompressed",
            Indexer::Single { .. } => "KvIndexer (RadixTree)",
            _ => "other",
        },
        options.indexer_threads,
        if options.zmq_ingress {
            "zmq"
        } else {
            "host-fed"
        },
        &long.tokens[..4],
        started.elapsed().as_secs_f64() * 1e3,
    );

    let winner = check_fixture(&runtime, core, &indexer, &long, options.host_tier);
    if options.decision {
        let hashes = SelectionInput::Hashes {
            block_hashes: long.locals.iter().map(|hash| hash.0 as i64).collect(),
            sequence_hashes: long.sequence.iter().map(|&hash| hash as i64).collect(),
            isl_tokens: long.tokens.len(),
        };
        let tokens = SelectionInput::Tokens(long.tokens.clone());
        for (name, input) in [("decision/hashes", &hashes), ("decision/tokens", &tokens)] {
            let mut next_id = 0u64;
            let mut call = || {
                next_id += 1;
                let id = format!("decision-{next_id}");
                let request = input.request(id.clone());
                let start = Instant::now();
                let response = runtime.block_on(async {
                    let response = core.select_and_reserve(request).await.expect("selection");
                    core.free_reservation(&id).await.expect("free");
                    response
                });
                let elapsed = start.elapsed();
                assert_eq!(response.worker_id, winner, "the decision changed");
                (elapsed.as_nanos() as f64, response.worker_id)
            };
            report(name, &options, &mut call);
        }
        breakdown(&runtime, core, &hashes, &options);
    }
    if options.lookup {
        let mut tiered = || {
            let start = Instant::now();
            let matches = runtime
                .block_on(indexer.find_tiered_matches_ref_with_options(
                    &long.locals,
                    LowerTierQueryOptions::default(),
                ))
                .expect("lookup");
            let elapsed = start.elapsed();
            (
                elapsed.as_nanos() as f64,
                deepest(&matches.device.overlap_scores.scores),
            )
        };
        report("lookup/tiered", &options, &mut tiered);
        let mut device = || {
            let hashes = long.locals.clone();
            let start = Instant::now();
            let scores = runtime
                .block_on(async {
                    match &indexer {
                        Indexer::Concurrent { primary, .. } => primary.find_matches(hashes).await,
                        Indexer::Single { primary, .. } => primary.find_matches(hashes).await,
                        _ => unreachable!("the core builds a local indexer"),
                    }
                })
                .expect("lookup");
            let elapsed = start.elapsed();
            (elapsed.as_nanos() as f64, deepest(&scores.scores))
        };
        report("lookup/device", &options, &mut device);
    }
    service.core().shutdown();
}

/// The worker with the most device blocks matched (lowest id on ties).
fn deepest<S>(scores: &HashMap<WorkerWithDpRank, u32, S>) -> u64 {
    scores
        .iter()
        .max_by_key(|(worker, blocks)| (**blocks, std::cmp::Reverse(worker.worker_id)))
        .map_or(u64::MAX, |(worker, _)| worker.worker_id)
}

/// A selection service over 16 schedulable workers, and its partition's indexer.
async fn build_core(
    options: &Options,
) -> (
    dynamo_kv_router::services::selection::SelectionService,
    Indexer,
) {
    let mut builder = SelectionServiceBuilder::new(
        KvRouterConfig::default(),
        WorkerType::Aggregated,
        dynamo_custom_policy_builtin::default_registry(),
    )
    .indexer_threads(options.indexer_threads);
    if !options.zmq_ingress {
        builder = builder.kv_index(KvIndexSource::Owned(Arc::new(HostFedIngress)));
    }
    let service = builder.build().await.expect("selection service");
    for worker_id in 0..WORKERS {
        service
            .upsert_worker(WorkerRequest {
                worker_id,
                model_name: MODEL.to_string(),
                routing_group: GROUP.to_string(),
                endpoint: Some(format!("http://worker-{worker_id}:8000")),
                kv_events_endpoint: options
                    .zmq_ingress
                    .then(|| format!("tcp://127.0.0.1:{}", 40_000 + worker_id)),
                block_size: Some(BLOCK_SIZE),
                max_num_batched_tokens: Some(8192),
                ..WorkerRequest::default()
            })
            .await
            .expect("upsert worker");
    }
    let indexer = service
        .core()
        .partition(&RoutingPartitionId::new(MODEL, GROUP))
        .expect("the partition exists once a worker is upserted")
        .indexer()
        .clone();
    (service, indexer)
}

/// Store the fixture's blocks as `Stored` events and wait until every indexer has applied them.
/// Returns the (device, host) blocks stored.
async fn fill_index(
    indexer: &Indexer,
    rng: &mut SmallRng,
    long: &Prompt,
    short: &Prompt,
    host_tier: bool,
) -> (usize, usize) {
    let (mut device_total, mut host_total) = (0, 0);
    for worker in 0..WORKERS {
        let mut event_id = 0;
        let mut held = 0;
        for prompt in [long, short] {
            let len = prompt.locals.len();
            let device = len * worker as usize / WORKERS as usize;
            let host_end = (device + len / 8).min(len);
            let mut store = |tier, range: std::ops::Range<usize>| {
                event_id += 1;
                let parent = range.start.checked_sub(1).map(|i| prompt.sequence[i]);
                let event = stored(
                    worker,
                    event_id,
                    tier,
                    parent,
                    &prompt.locals[range.clone()],
                    &prompt.sequence[range],
                );
                async move { indexer.apply_event_routed(event).await.expect("store") }
            };
            if device > 0 {
                store(StorageTier::Device, 0..device).await;
            }
            if host_tier && worker % 2 == 1 && host_end > device {
                store(StorageTier::HostPinned, device..host_end).await;
                host_total += host_end - device;
            }
            held += device;
        }
        device_total += held;
        while held < BLOCKS_PER_WORKER {
            let len = FILLER_CHAIN.min(BLOCKS_PER_WORKER - held);
            let locals: Vec<LocalBlockHash> =
                (0..len).map(|_| LocalBlockHash(rng.random())).collect();
            let sequence = compute_seq_hash_for_block(&locals);
            event_id += 1;
            indexer
                .apply_event_routed(stored(
                    worker,
                    event_id,
                    StorageTier::Device,
                    None,
                    &locals,
                    &sequence,
                ))
                .await
                .expect("store");
            held += len;
            device_total += len;
        }
    }
    match indexer {
        Indexer::Concurrent {
            primary,
            lower_tier,
            ..
        } => {
            primary.flush_and_wait().await.expect("flush");
            for tier in lower_tier.all() {
                tier.flush_and_wait().await.expect("flush");
            }
        }
        Indexer::Single {
            primary,
            lower_tier,
            ..
        } => {
            primary.flush_and_wait().await.expect("flush");
            for tier in lower_tier.all() {
                tier.flush_and_wait().await.expect("flush");
            }
        }
        _ => unreachable!("the core builds a local indexer"),
    }
    (device_total, host_total)
}

fn stored(
    worker: u64,
    event_id: u64,
    tier: StorageTier,
    parent: Option<u64>,
    locals: &[LocalBlockHash],
    sequence: &[u64],
) -> RouterEvent {
    let blocks = locals
        .iter()
        .zip(sequence)
        .map(|(&tokens_hash, &hash)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(hash),
            tokens_hash,
            mm_extra_info: None,
        })
        .collect();
    RouterEvent::with_storage_tier(
        worker,
        KvCacheEvent {
            event_id,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            }),
            dp_rank: 0,
        },
        tier,
    )
}

/// Check that the index holds what the fixture stored and that the decision picks the deepest
/// holder, worker 15, from hashes and from tokens alike. Returns the winner.
fn check_fixture(
    runtime: &Runtime,
    core: &SelectionCore,
    indexer: &Indexer,
    long: &Prompt,
    host_tier: bool,
) -> u64 {
    let matches =
        runtime
            .block_on(indexer.find_tiered_matches_ref_with_options(
                &long.locals,
                LowerTierQueryOptions::default(),
            ))
            .expect("lookup");
    let host = matches.lower_tier.get(&StorageTier::HostPinned);
    let len = long.locals.len();
    for worker in 0..WORKERS {
        let rank = WorkerWithDpRank::new(worker, 0);
        let device = matches
            .device
            .overlap_scores
            .scores
            .get(&rank)
            .copied()
            .unwrap_or(0) as usize;
        let host = host
            .and_then(|host| host.hits.get(&rank))
            .copied()
            .unwrap_or(0);
        let want_device = len * worker as usize / WORKERS as usize;
        let want_host = if host_tier && worker % 2 == 1 {
            (want_device + len / 8).min(len) - want_device
        } else {
            0
        };
        assert_eq!(
            (device, host),
            (want_device, want_host),
            "worker {worker}: (device, host) blocks matched"
        );
    }
    println!(
        "lookup check: every worker matches i/16 of the prompt on device{}",
        if host_tier {
            ", odd ones 1/8 more on host"
        } else {
            " (no host tier)"
        }
    );

    let mut winners = Vec::new();
    for (input, request) in [
        (
            "hashes",
            SelectionInput::Hashes {
                block_hashes: long.locals.iter().map(|hash| hash.0 as i64).collect(),
                sequence_hashes: long.sequence.iter().map(|&hash| hash as i64).collect(),
                isl_tokens: long.tokens.len(),
            },
        ),
        ("tokens", SelectionInput::Tokens(long.tokens.clone())),
    ] {
        let response = runtime.block_on(async {
            let response = core
                .select_and_reserve(request.request(format!("check-{input}")))
                .await
                .expect("selection");
            core.free_reservation(&format!("check-{input}"))
                .await
                .expect("free");
            response
        });
        println!(
            "decision check ({input}): worker {} (dp_rank {}), overlap {:?}, effective prefill \
             tokens {}",
            response.worker_id,
            response.dp_rank,
            response.overlap,
            response.effective_prefill_tokens,
        );
        winners.push(response.worker_id);
    }
    assert_eq!(winners[0], winners[1], "hashes and tokens decide alike");
    assert_eq!(
        winners[0],
        WORKERS - 1,
        "the deepest holder, worker 15, wins"
    );
    winners[0]
}

/// Where a decision from precomputed hashes spends its time, by Dynamo's own `LookupTimings`:
/// `SelectionCore::run_selection` with the booking admission `select_and_reserve` uses (the same
/// selection, borrowing the prompt instead of taking a request), then `free_reservation`.
fn breakdown(runtime: &Runtime, core: &SelectionCore, input: &SelectionInput, options: &Options) {
    let SelectionInput::Hashes {
        block_hashes,
        sequence_hashes,
        isl_tokens,
    } = input
    else {
        unreachable!("the breakdown is of the hashes input")
    };
    let calls = options.calls * options.rounds;
    let (mut totals, mut lookups, mut selections, mut frees) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for call in 0..WARMUP_CALLS + calls {
        let id = format!("breakdown-{call}");
        let operation = SelectionOperation {
            key: RoutingPartitionId::new(MODEL, GROUP),
            prompt: PromptView {
                token_ids: None,
                mm_routing_info: None,
                block_mm_infos: None,
                block_hashes: Some(block_hashes),
                sequence_hashes: Some(sequence_hashes),
                isl_tokens: Some(*isl_tokens),
                lora_name: None,
                cache_namespace: None,
                is_eagle: None,
            },
            router_config_override: None,
            expected_output_tokens: None,
            priority_jump: 0.0,
            strict_priority: 0,
            policy_class: None,
            session_context: None,
            session: SessionBinding::None,
            affinity_target: None,
            pinned_worker: None,
            allowed_worker_ids: None,
            routing_constraints: RoutingConstraints::default(),
            admission: SelectionAdmission::Book {
                selection_id: id.clone(),
            },
            track_active_blocks: true,
            return_routing_hashes: false,
            replay_id: None,
        };
        let start = Instant::now();
        let (run, selected_at) = runtime.block_on(async {
            let run = core.run_selection(operation).await;
            let selected_at = start.elapsed();
            core.free_reservation(&id).await.expect("free");
            (run, selected_at)
        });
        let total = start.elapsed();
        let SelectionOutcome::Selected(selected) = run.result.expect("selection") else {
            panic!("the queue rejected a selection");
        };
        assert_eq!(selected.response.best_worker.worker_id, WORKERS - 1);
        if call >= WARMUP_CALLS {
            let lookup = run.lookup.expect("lookup timings");
            totals.push(total.as_nanos() as f64);
            lookups.push(lookup.indexer.as_nanos() as f64);
            selections.push(selected_at.as_nanos() as f64);
            frees.push((total - selected_at).as_nanos() as f64);
        }
    }
    let p50 = |values: &mut Vec<f64>| median(values) / 1e3;
    let (total, lookup, selection, free) = (
        p50(&mut totals),
        p50(&mut lookups),
        p50(&mut selections),
        p50(&mut frees),
    );
    println!(
        "\ndecision/hashes breakdown, {calls} calls of run_selection (Book) + free_reservation, \
         p50 of each part:\n  total {total:.1} us = run_selection {selection:.1} us (of which the \
         indexer's tiered lookup {lookup:.1} us, the rest normalisation, overlap analysis, \
         scheduling and booking {:.1} us) + free_reservation {free:.1} us",
        selection - lookup
    );
}

/// What a request carries for the prompt.
enum SelectionInput {
    Hashes {
        block_hashes: Vec<i64>,
        sequence_hashes: Vec<i64>,
        isl_tokens: usize,
    },
    Tokens(Vec<u32>),
}

impl SelectionInput {
    fn request(&self, selection_id: String) -> SelectAndReserveRequest {
        let prompt = match self {
            Self::Hashes {
                block_hashes,
                sequence_hashes,
                isl_tokens,
            } => PromptRequest {
                block_hashes: Some(block_hashes.clone()),
                sequence_hashes: Some(sequence_hashes.clone()),
                isl_tokens: Some(*isl_tokens),
                ..PromptRequest::default()
            },
            Self::Tokens(tokens) => PromptRequest {
                token_ids: Some(tokens.clone()),
                ..PromptRequest::default()
            },
        };
        SelectAndReserveRequest {
            model_name: MODEL.to_string(),
            routing_group: GROUP.to_string(),
            selection_id: Some(selection_id),
            prompt,
            router_config_override: None,
            expected_output_tokens: None,
            priority_jump: None,
            strict_priority: None,
            session_id: None,
            session_context: None,
            affinity_target: None,
            pinned_worker: None,
            allowed_worker_ids: None,
            routing_constraints: RoutingConstraints::default(),
        }
    }
}

/// Warm `call` up, time `options.rounds` rounds of `options.calls` calls, print each round and
/// the medians over rounds, then the JSON line. `call` returns its time in nanoseconds, measured
/// around the operation alone, and the worker it found.
fn report(name: &str, options: &Options, call: &mut dyn FnMut() -> (f64, u64)) {
    let mut winner = u64::MAX;
    for _ in 0..WARMUP_CALLS {
        winner = black_box(call()).1;
    }
    let (mut p50s, mut p99s, mut means) = (Vec::new(), Vec::new(), Vec::new());
    println!(
        "\n{name}: {} rounds of {} calls timed one by one",
        options.rounds, options.calls
    );
    for round in 0..options.rounds {
        let mut times: Vec<f64> = (0..options.calls).map(|_| black_box(call()).0).collect();
        times.sort_by(f64::total_cmp);
        let (p50, p99) = (times[times.len() / 2], times[times.len() * 99 / 100]);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        println!(
            "  round {}: p50 {:.1} us, p99 {:.1} us, mean {:.1} us",
            round + 1,
            p50 / 1e3,
            p99 / 1e3,
            mean / 1e3
        );
        p50s.push(p50);
        p99s.push(p99);
        means.push(mean);
    }
    let (p50, p99, mean) = (
        median(&mut p50s) / 1e3,
        median(&mut p99s) / 1e3,
        median(&mut means) / 1e3,
    );
    println!("  median of rounds: p50 {p50:.1} us, p99 {p99:.1} us, mean {mean:.1} us");
    println!(
        "{{\"bench\":\"{name}\",\"side\":\"dynamo\",\"p50_us\":{p50:.3},\"p99_us\":{p99:.3},\
         \"mean_us\":{mean:.3},\"calls\":{},\"rounds\":{},\"winner\":{winner},\
         \"indexer_threads\":{},\"host_tier\":{},\"ingress\":\"{}\"}}",
        options.rounds * options.calls,
        options.rounds,
        options.indexer_threads,
        options.host_tier,
        if options.zmq_ingress { "zmq" } else { "host" },
    );
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
