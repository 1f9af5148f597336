//! The simulator's engines with a host KV tier: the same engine model as the mock engine's,
//! on the virtual clock.

use std::time::Duration;
use switchyard_core::engine::{EngineConfig, HostTierConfig};
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
