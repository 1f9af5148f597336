//! The simulator's engines with a host KV tier and a shared pool: the same engine model as the
//! mock engine's, on the virtual clock.

use std::time::Duration;
use switchyard_core::engine::{DiskTierConfig, EngineConfig, HostTierConfig, PoolTierConfig};
use switchyard_sim::workload::{Session, TraceRequest, Workload};
use switchyard_sim::{SimConfig, Simulation};

const BLOCK: u32 = 16;

/// `agents` sessions of 48-block prompts growing by 4 blocks a turn, with tool-call gaps.
fn agents(agents: u64, turns: u64) -> Workload {
    let sessions = (0..agents)
        .map(|a| {
            let mut history: Vec<u64> = (0..48).map(|b| a * 1_000_000 + b).collect();
            let requests = (0..turns)
                .map(|t| {
                    history.extend((0..4).map(|b| a * 1_000_000 + 1_000 + t * 10 + b));
                    TraceRequest {
                        gap: if t == 0 {
                            Duration::ZERO
                        } else {
                            Duration::from_millis(500)
                        },
                        hash_ids: history.clone(),
                        input_tokens: history.len() as u32 * BLOCK,
                        output_tokens: 20,
                    }
                })
                .collect();
            Session {
                id: format!("agent-{a}"),
                parent: None,
                start: Duration::from_millis(23 * a),
                spawn: None,
                requests,
            }
        })
        .collect();
    Workload {
        block_size: BLOCK,
        sessions,
    }
}

/// Two workers whose 256 device blocks the sessions overflow.
fn config(host_tier: Option<usize>) -> SimConfig {
    SimConfig {
        workers: 2,
        engine: EngineConfig {
            block_size: BLOCK as usize,
            num_blocks: 256,
            host_tier: host_tier.map(HostTierConfig::blocks),
            ..EngineConfig::default()
        },
        policy: "kv-cost".to_owned(),
        ..SimConfig::default()
    }
}

#[test]
fn a_host_tier_serves_what_the_device_evicted() {
    let workload = agents(16, 6);
    let run = |config| {
        Simulation::new(&workload, config)
            .expect("valid config")
            .run(&mut || {})
            .report()
    };
    let plain = run(config(None));
    let tiered = run(config(Some(4_096)));
    assert_eq!(plain.tiers, None);
    let tiers = tiered.tiers.expect("host tier report");
    eprintln!(
        "G1 only: hit {:.3}, TTFT mean {:.1} ms; G1+G2: hit {:.3} (host {:.3}), TTFT mean {:.1} ms, {} blocks onboarded",
        plain.prefix_hit_ratio,
        plain.ttft_ms.mean,
        tiered.prefix_hit_ratio,
        tiers.host_hit_ratio,
        tiered.ttft_ms.mean,
        tiers.onboarded_blocks
    );
    assert_eq!(tiered.requests, 96);
    assert!(tiers.host_hit_tokens > 0);
    assert_eq!(
        tiers.device_hit_tokens + tiers.host_hit_tokens,
        tiered.cached_tokens
    );
    assert!(tiered.cached_tokens > plain.cached_tokens);
    assert!(tiered.recomputed_tokens < plain.recomputed_tokens);
    // Loading beats recomputing.
    assert!(tiered.ttft_ms.mean < plain.ttft_ms.mean);
    // The same seed gives the same run.
    assert_eq!(run(config(Some(4_096))), tiered);
}

fn run(workload: &Workload, config: SimConfig) -> switchyard_sim::RunReport {
    Simulation::new(workload, config)
        .expect("valid config")
        .run(&mut || {})
        .report()
}

/// Round-robin placement spreads a session's turns over both workers: what one worker computed,
/// the other can only fetch from the pool.
#[test]
fn a_shared_pool_serves_a_prefix_computed_on_another_worker() {
    let workload = agents(4, 6);
    let spread = |pool: bool| SimConfig {
        policy: "round-robin".to_owned(),
        engine: EngineConfig {
            num_blocks: 4_096,
            pool: pool.then(PoolTierConfig::default),
            ..config(None).engine
        },
        pool_blocks: pool.then_some(8_192),
        ..config(None)
    };
    let plain = run(&workload, spread(false));
    let pooled = run(&workload, spread(true));
    let tiers = pooled.tiers.expect("tier report");
    eprintln!(
        "G1 only: hit {:.3}, TTFT mean {:.1} ms; G1+G4: hit {:.3} (pool {:.3}), TTFT mean {:.1} ms",
        plain.prefix_hit_ratio,
        plain.ttft_ms.mean,
        pooled.prefix_hit_ratio,
        tiers.pool_hit_ratio,
        pooled.ttft_ms.mean,
    );
    assert_eq!(pooled.requests, 24);
    assert_eq!(pooled.label(), "round-robin g1+g4@unlimited");
    assert!(tiers.pool_hit_tokens > 0);
    assert_eq!(
        tiers.pool_fetched_blocks * u64::from(BLOCK),
        tiers.pool_hit_tokens
    );
    assert_eq!(tiers.host_hit_tokens, 0);
    assert_eq!(
        tiers.device_hit_tokens + tiers.pool_hit_tokens,
        pooled.cached_tokens
    );
    // Every computed block was offered to the pool, which stored each distinct one once.
    assert!(tiers.pool_published_blocks >= tiers.pool_stored_blocks);
    assert!(tiers.pool_stored_blocks > 0);
    assert_eq!(tiers.pool_evictions, 0);
    assert!(pooled.recomputed_tokens < plain.recomputed_tokens);
    // Loads are asynchronous: a fetching request joins the batch at the first step after its
    // load, so on these short prompts (a block fetched costs about what computing it does, and
    // a step's fixed cost dominates) TTFT only stays level; the gain is the prefill not done.
    assert!(
        pooled.ttft_ms.mean < plain.ttft_ms.mean * 1.05,
        "{} vs {}",
        pooled.ttft_ms.mean,
        plain.ttft_ms.mean
    );
    assert_eq!(run(&workload, spread(true)), pooled);
}

#[test]
fn a_pool_needs_both_its_size_and_the_engines_settings() {
    let workload = agents(1, 1);
    let size_only = SimConfig {
        pool_blocks: Some(64),
        ..config(None)
    };
    assert!(Simulation::new(&workload, size_only).is_err());
    let mut settings_only = config(None);
    settings_only.engine.pool = Some(PoolTierConfig::default());
    assert!(Simulation::new(&workload, settings_only).is_err());
}

/// A host tier no larger than the device churns; a disk tier behind it keeps what it evicts.
#[test]
fn a_disk_tier_keeps_what_the_host_tier_evicted() {
    let workload = agents(16, 6);
    let small_host = config(Some(256));
    let mut with_disk = config(Some(256));
    with_disk.engine.disk_tier = Some(DiskTierConfig::blocks(8_192));
    let host_only = run(&workload, small_host);
    let disk = run(&workload, with_disk);
    let (h, d) = (
        host_only.tiers.expect("tier report"),
        disk.tiers.expect("tier report"),
    );
    eprintln!(
        "G1+G2: hit {:.3}, TTFT mean {:.1} ms; G1+G2+G3: hit {:.3} (disk {:.3}), TTFT mean {:.1} ms",
        host_only.prefix_hit_ratio,
        host_only.ttft_ms.mean,
        disk.prefix_hit_ratio,
        d.disk_hit_ratio,
        disk.ttft_ms.mean,
    );
    assert_eq!(h.disk_capacity_blocks, 0);
    assert_eq!(disk.label(), "kv-cost g1+g2+g3@unlimited");
    assert!(d.disk_stored_blocks > 0);
    assert!(d.disk_hit_tokens > 0);
    assert_eq!(
        d.disk_onboarded_blocks * u64::from(BLOCK),
        d.disk_hit_tokens
    );
    assert_eq!(
        d.device_hit_tokens + d.host_hit_tokens + d.disk_hit_tokens,
        disk.cached_tokens
    );
    assert!(disk.cached_tokens > host_only.cached_tokens);
    assert!(disk.recomputed_tokens < host_only.recomputed_tokens);
}
