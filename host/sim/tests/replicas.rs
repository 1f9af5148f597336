//! Several gateway replicas over one simulated fleet (`SimConfig::replicas`): one replica is
//! today's simulator to the bit, and how much session stickiness at the load balancer matters
//! depends on whether the replicas' indexes are fed by the engines' KV events.

use std::time::Duration;
use switchyard_core::engine::EngineConfig;
use switchyard_core::router::queue::QueueConfig;
use switchyard_sim::workload::{Session, Spawn, TraceRequest, Workload};
use switchyard_sim::{IndexMode, Outcome, ReplicaAffinity, SimConfig, Simulation};
use xxhash_rust::xxh3::Xxh3;

const BLOCK: u32 = 16;

/// `agents` agents of `turns` turns over private, growing contexts (`prompt_blocks`, then
/// `turn_blocks` more a turn), `gap` of tool time between turns; every third agent spawns a
/// joined two-turn sub-agent after its second turn that shares the agent's prompt.
fn agents(
    agents: u64,
    turns: u64,
    prompt_blocks: u64,
    turn_blocks: u64,
    gap: Duration,
) -> Workload {
    let mut sessions = Vec::new();
    for a in 0..agents {
        let prompt: Vec<u64> = (0..prompt_blocks).map(|b| a * 1_000_000 + b).collect();
        let mut history = prompt.clone();
        let requests = (0..turns)
            .map(|t| {
                history.extend((0..turn_blocks).map(|b| a * 1_000_000 + 1_000 + t * 100 + b));
                TraceRequest {
                    gap: if t == 0 { Duration::ZERO } else { gap },
                    hash_ids: history.clone(),
                    input_tokens: history.len() as u32 * BLOCK,
                    output_tokens: 24,
                }
            })
            .collect();
        sessions.push(Session {
            id: format!("agent-{a}"),
            parent: None,
            start: Duration::from_millis(41 * a),
            spawn: None,
            requests,
        });
        if a % 3 == 0 && turns > 2 {
            let mut child = prompt.clone();
            let requests = (0..2)
                .map(|t| {
                    child.extend((0..4).map(|b| a * 1_000_000 + 900_000 + t * 10 + b));
                    TraceRequest {
                        gap: if t == 0 { Duration::ZERO } else { gap / 2 },
                        hash_ids: child.clone(),
                        input_tokens: child.len() as u32 * BLOCK,
                        output_tokens: 16,
                    }
                })
                .collect();
            sessions.push(Session {
                id: format!("agent-{a}/sub"),
                parent: Some(format!("agent-{a}")),
                start: Duration::from_millis(3),
                spawn: Some(Spawn {
                    after: 1,
                    join: true,
                }),
                requests,
            });
        }
    }
    Workload {
        block_size: BLOCK,
        sessions,
    }
}

fn engine(num_blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK as usize,
        num_blocks,
        ..EngineConfig::default()
    }
}

/// Everything a run recorded, per request, folded into one number.
fn fingerprint(outcome: &Outcome) -> u64 {
    let mut h = Xxh3::new();
    let t = |d: Option<Duration>| d.map_or(u128::MAX, |d| d.as_nanos());
    for r in &outcome.records {
        let fields = [
            r.session as u128,
            r.request as u128,
            r.worker.map_or(u128::MAX, |w| w as u128),
            r.sent.as_nanos(),
            t(r.released),
            t(r.admitted),
            t(r.first_token),
            t(r.finished),
            u128::from(r.input_tokens),
            u128::from(r.output_tokens),
            u128::from(r.cached_tokens),
        ];
        for f in fields {
            h.update(&f.to_le_bytes());
        }
    }
    h.update(&outcome.recomputed_tokens.to_le_bytes());
    h.digest()
}

fn run(workload: &Workload, config: SimConfig) -> Outcome {
    Simulation::new(workload, config)
        .expect("valid config")
        .run(&mut || {})
}

/// KV routing alone, and KV routing with ThunderAgent admission and the router queue on an
/// overflowing fleet: the two golden runs.
fn golden_configs() -> [SimConfig; 2] {
    [
        SimConfig {
            workers: 4,
            engine: engine(4_096),
            ..SimConfig::default()
        },
        SimConfig {
            workers: 2,
            engine: engine(640),
            admission: "thunder-agent".to_owned(),
            queue: Some(QueueConfig {
                max_prefill_tokens: Some(256),
                ..QueueConfig::default()
            }),
            ..SimConfig::default()
        },
    ]
}

/// The simulator's records on these two runs before replicas existed (commit 02fcac3); the
/// second since `engine_stream = "auto"`, the default: engines answer whole, and the stored
/// event of each prompt's last block ends its prefill load in the router's view one event
/// delay after the first token would have (its router queue lets requests go that much later:
/// TTFT mean +0.6 %).
const GOLDEN: [u64; 2] = [0xb370_2410_4150_525f, 0xb812_e0f7_8856_1724];

#[test]
fn one_replica_is_the_simulator_before_replicas() {
    let w = agents(18, 6, 48, 6, Duration::from_millis(700));
    for (config, golden) in golden_configs().into_iter().zip(GOLDEN) {
        let outcome = run(&w, config);
        assert_eq!(outcome.records.len(), w.request_count());
        assert_eq!(fingerprint(&outcome), golden, "{}", outcome.admission);
    }
}

#[test]
fn one_replica_ignores_the_affinity() {
    let w = agents(18, 6, 48, 6, Duration::from_millis(700));
    for affinity in [ReplicaAffinity::Random, ReplicaAffinity::RoundRobin] {
        let config = SimConfig {
            replica_affinity: affinity,
            ..golden_configs()[0].clone()
        };
        assert_eq!(fingerprint(&run(&w, config)), GOLDEN[0], "{affinity:?}");
    }
}

/// `replicas` replicas over 4 workers, the loaded fleet of the other tests.
fn replicated(replicas: usize, affinity: ReplicaAffinity, index: IndexMode) -> SimConfig {
    SimConfig {
        replicas,
        replica_affinity: affinity,
        index,
        ..golden_configs()[0].clone()
    }
}

fn hit(w: &Workload, config: SimConfig) -> f64 {
    let report = run(w, config).report();
    assert_eq!(report.requests, w.request_count() as u64);
    report.prefix_hit_ratio
}

#[test]
fn session_affinity_keeps_a_session_tree_on_one_replica_and_random_spreads_it() {
    let w = agents(18, 6, 48, 6, Duration::from_millis(700));
    let root = |s: usize| w.sessions[s].id.split('/').next().unwrap().to_owned();
    let sticky = run(
        &w,
        replicated(4, ReplicaAffinity::Session, IndexMode::Events),
    );
    let mut replica_of = std::collections::HashMap::new();
    for r in &sticky.records {
        let first = *replica_of.entry(root(r.session)).or_insert(r.replica);
        assert_eq!(
            r.replica, first,
            "session {} moved",
            w.sessions[r.session].id
        );
    }
    let used: std::collections::BTreeSet<usize> = replica_of.values().copied().collect();
    assert!(used.len() > 1, "18 sessions all hashed to one replica");
    for affinity in [ReplicaAffinity::Random, ReplicaAffinity::RoundRobin] {
        let spread = run(&w, replicated(4, affinity, IndexMode::Events));
        let moved = (0..w.sessions.len())
            .filter(|&s| {
                let replicas: std::collections::BTreeSet<usize> = spread
                    .records
                    .iter()
                    .filter(|r| r.session == s)
                    .map(|r| r.replica)
                    .collect();
                replicas.len() > 1
            })
            .count();
        assert!(moved > w.sessions.len() / 2, "{affinity:?}: {moved} moved");
        assert_eq!(spread.replicas, 4);
    }
}

#[test]
fn event_fed_replicas_keep_the_hit_ratio_without_stickiness() {
    let w = agents(18, 6, 48, 6, Duration::from_millis(700));
    let one = hit(
        &w,
        replicated(1, ReplicaAffinity::Session, IndexMode::Events),
    );
    for affinity in [ReplicaAffinity::Session, ReplicaAffinity::Random] {
        let four = hit(&w, replicated(4, affinity, IndexMode::Events));
        assert!(
            four > one - 0.05,
            "{affinity:?}: 4 replicas {four:.3} vs one {one:.3}"
        );
    }
}

#[test]
fn approximate_replicas_need_stickiness() {
    let w = agents(18, 6, 48, 6, Duration::from_millis(700));
    let one = hit(
        &w,
        replicated(1, ReplicaAffinity::Session, IndexMode::Approximate),
    );
    let sticky = hit(
        &w,
        replicated(4, ReplicaAffinity::Session, IndexMode::Approximate),
    );
    let random = hit(
        &w,
        replicated(4, ReplicaAffinity::Random, IndexMode::Approximate),
    );
    let events = hit(
        &w,
        replicated(4, ReplicaAffinity::Random, IndexMode::Events),
    );
    // Each replica knows only the sessions it routed itself: sticky, that is all of its own.
    assert!(sticky > one - 0.05, "sticky {sticky:.3} vs one {one:.3}");
    assert!(
        random < sticky - 0.1,
        "random {random:.3} vs sticky {sticky:.3}"
    );
    assert!(
        random < events - 0.1,
        "random {random:.3} vs events {events:.3}"
    );
}

#[test]
fn a_policy_instance_per_replica() {
    let w = agents(3, 2, 8, 2, Duration::from_millis(100));
    let policy = switchyard_core::router::native_policy("kv-cost").unwrap();
    let config = replicated(2, ReplicaAffinity::Session, IndexMode::Events);
    assert!(Simulation::with_policy(&w, config.clone(), policy).is_err());
    let zero = SimConfig {
        replicas: 0,
        ..config
    };
    assert!(Simulation::new(&w, zero).is_err());
}
