//! The simulator end to end on small synthetic workloads.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::engine::{EngineConfig, HostTierConfig};
use switchyard_core::router::{
    Candidate, EngineStream, KvCost, PolicyRequest, RoundRobin, RouterConfig, RoutingPolicy,
    Selection,
};
use switchyard_sim::workload::{Session, Spawn, TraceRequest, Workload};
use switchyard_sim::{IndexMode, SimConfig, Simulation};

const BLOCK: u32 = 16;

/// `agents` conversations of `turns` turns: each agent's private prompt of `prompt_blocks`
/// blocks, and each turn appends `turn_blocks` blocks to the agent's history.
struct Agents {
    prompt_blocks: u64,
    turn_blocks: u64,
    output_tokens: u32,
    /// Between agents' starts.
    stagger: Duration,
}

impl Agents {
    fn workload(&self, agents: u64, turns: u64, gap: Duration) -> Workload {
        let sessions = (0..agents)
            .map(|a| {
                let mut history: Vec<u64> =
                    (0..self.prompt_blocks).map(|b| a * 1_000_000 + b).collect();
                let requests = (0..turns)
                    .map(|t| {
                        history.extend(
                            (0..self.turn_blocks).map(|b| a * 1_000_000 + 1_000 + t * 10 + b),
                        );
                        TraceRequest {
                            gap: if t == 0 { Duration::ZERO } else { gap },
                            hash_ids: history.clone(),
                            input_tokens: history.len() as u32 * BLOCK,
                            output_tokens: self.output_tokens,
                        }
                    })
                    .collect();
                Session {
                    id: format!("agent-{a}"),
                    parent: None,
                    start: self.stagger * a as u32,
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
}

/// 32-block private prompts, 4 blocks a turn.
fn multi_turn(agents: u64, turns: u64, gap: Duration) -> Workload {
    Agents {
        prompt_blocks: 32,
        turn_blocks: 4,
        output_tokens: 20,
        stagger: Duration::from_millis(37),
    }
    .workload(agents, turns, gap)
}

fn config(policy: &str) -> SimConfig {
    SimConfig {
        workers: 4,
        engine: EngineConfig {
            block_size: BLOCK as usize,
            num_blocks: 4_096,
            ..EngineConfig::default()
        },
        policy: policy.to_owned(),
        ..SimConfig::default()
    }
}

fn run(workload: &Workload, config: SimConfig) -> switchyard_sim::Outcome {
    Simulation::new(workload, config)
        .expect("valid config")
        .run(&mut || {})
}

#[test]
fn same_seed_same_report() {
    let w = multi_turn(12, 5, Duration::from_millis(300));
    let a = run(&w, config("kv-cost")).report();
    let b = run(&w, config("kv-cost")).report();
    assert_eq!(a, b);
    assert_eq!(a.requests, 60);
    assert_eq!(a.failed_requests, 0);
}

#[test]
fn kv_routing_beats_round_robin_on_multi_turn_agents() {
    let w = multi_turn(16, 6, Duration::from_millis(200));
    let kv = run(&w, config("kv-cost")).report();
    let rr = run(&w, config("round-robin")).report();
    assert!(
        kv.prefix_hit_ratio > rr.prefix_hit_ratio + 0.1,
        "kv {} vs rr {}",
        kv.prefix_hit_ratio,
        rr.prefix_hit_ratio
    );
    assert!(kv.ttft_ms.mean < rr.ttft_ms.mean);
    assert!(kv.recomputed_tokens < rr.recomputed_tokens);
}

#[test]
fn the_next_request_starts_its_gap_after_the_previous_finished() {
    let w = multi_turn(3, 4, Duration::from_secs(10));
    for speedup in [1.0, 4.0] {
        let outcome = run(
            &w,
            SimConfig {
                speedup,
                ..config("kv-cost")
            },
        );
        for pair in outcome.records.windows(2) {
            let [a, b] = pair else { continue };
            if a.session == b.session {
                let finished = a.finished.expect("finished");
                assert_eq!(b.sent, finished + Duration::from_secs(10).div_f64(speedup));
            }
        }
    }
}

#[test]
fn a_joining_subagent_holds_its_parent_back() {
    let mut w = multi_turn(1, 2, Duration::from_secs(1));
    let mut child = multi_turn(1, 3, Duration::from_secs(2)).sessions.remove(0);
    child.id = "child".into();
    child.parent = Some("agent-0".into());
    child.start = Duration::from_millis(500);
    child.spawn = Some(Spawn {
        after: 0,
        join: true,
    });
    w.sessions.push(child);
    let outcome = run(&w, config("kv-cost"));
    let by = |s: usize| outcome.records.iter().filter(move |r| r.session == s);
    let parent_first = by(0).next().expect("first").finished.expect("done");
    let child_first = by(1).next().expect("child");
    assert_eq!(child_first.sent, parent_first + Duration::from_millis(500));
    let child_last = by(1).next_back().expect("child").finished.expect("done");
    let parent_second = by(0).nth(1).expect("second");
    assert_eq!(parent_second.sent, child_last + Duration::from_secs(1));
}

#[test]
fn the_concurrency_cap_holds_sessions_back() {
    let w = multi_turn(8, 3, Duration::from_millis(100));
    let outcome = run(
        &w,
        SimConfig {
            concurrency: Some(2),
            ..config("round-robin")
        },
    );
    // At every send, at most two sessions have started and not finished.
    for r in &outcome.records {
        let active = w.sessions.iter().enumerate().filter(|(s, _)| {
            let mine: Vec<_> = outcome.records.iter().filter(|x| x.session == *s).collect();
            let first = mine.first().map(|x| x.sent);
            let last = mine.last().and_then(|x| x.finished);
            matches!((first, last), (Some(f), Some(l)) if f <= r.sent && r.sent < l)
        });
        assert!(active.count() <= 2);
    }
}

/// What a policy was asked (the candidates) and answered, call by call.
type Calls = Arc<Mutex<Vec<(Vec<Candidate>, Selection)>>>;

/// Wraps a policy and records what it was asked and answered.
#[derive(Debug)]
struct Recording<P> {
    inner: P,
    calls: Calls,
}

impl<P: RoutingPolicy> RoutingPolicy for Recording<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn select(&mut self, request: &PolicyRequest, candidates: &[Candidate]) -> Selection {
        let selection = self.inner.select(request, candidates);
        if let Ok(mut calls) = self.calls.lock() {
            calls.push((candidates.to_vec(), selection.clone()));
        }
        selection
    }
}

/// Sim/prod parity: every request is placed by one call into the router's policy, in send order,
/// and lands on the worker the router derives from that answer (cheapest cost at temperature 0;
/// ties go to the emptier worker, as `Router::route` breaks them).
#[test]
fn every_placement_is_the_routers_decision() {
    let w = multi_turn(10, 4, Duration::from_millis(150));
    for policy in ["kv-cost", "round-robin"] {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let inner: Box<dyn RoutingPolicy> = if policy == "kv-cost" {
            Box::new(Recording {
                inner: KvCost,
                calls: calls.clone(),
            })
        } else {
            Box::new(Recording {
                inner: RoundRobin::default(),
                calls: calls.clone(),
            })
        };
        let outcome = Simulation::with_policy(&w, config("ignored"), inner)
            .expect("valid")
            .run(&mut || {});
        let calls = calls.lock().expect("calls");
        assert_eq!(calls.len(), outcome.records.len());
        for ((candidates, selection), record) in calls.iter().zip(&outcome.records) {
            let worker = record.worker.expect("placed");
            let chosen = match selection {
                Selection::Pick(i) => vec![*i],
                Selection::Costs(costs) => {
                    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
                    (0..costs.len())
                        .filter(|&i| costs[i] - min <= 1e-9 * min.abs().max(1.0))
                        .collect()
                }
                Selection::Reject(_) => Vec::new(),
            };
            assert!(
                chosen
                    .iter()
                    .any(|&i| candidates[i].rank.worker.0 as usize == worker),
                "{policy}: worker {worker} is not the policy's choice"
            );
        }
    }
}

/// A request's prefill load ends, in the router's view, at the first of its first token and the
/// stored event of its prompt's last full block, when the router hears of them. Without either
/// (the gateway's `engine_stream = "as-client"`, a client that does not stream and a worker that
/// publishes no KV events) the load lasts until the request ends; `auto` streams exactly there.
/// The second agent arrives while the first decodes its long answer.
#[test]
fn a_prefill_load_ends_at_the_first_token_or_the_prompts_stored_event() {
    let w = Agents {
        prompt_blocks: 32,
        turn_blocks: 4,
        output_tokens: 400,
        stagger: Duration::from_secs(1),
    }
    .workload(2, 1, Duration::ZERO);
    let first_prompt = 36 * u64::from(BLOCK);
    // Events that come only after the second arrival stand for a worker whose events are late.
    let late = Duration::from_secs(2);
    let runs = [
        (EngineStream::Auto, IndexMode::Events, None, 0),
        (
            EngineStream::Auto,
            IndexMode::Events,
            Some(late),
            first_prompt,
        ),
        (EngineStream::Auto, IndexMode::Approximate, None, 0),
        (EngineStream::Always, IndexMode::Events, Some(late), 0),
        (EngineStream::Always, IndexMode::Approximate, None, 0),
        (EngineStream::AsClient, IndexMode::Events, None, 0),
        (
            EngineStream::AsClient,
            IndexMode::Events,
            Some(late),
            first_prompt,
        ),
        (
            EngineStream::AsClient,
            IndexMode::Approximate,
            None,
            first_prompt,
        ),
    ];
    for (engine_stream, index, event_delay, load) in runs {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let policy = Box::new(Recording {
            inner: KvCost,
            calls: calls.clone(),
        });
        let base = config("ignored");
        let config = SimConfig {
            router: RouterConfig {
                engine_stream,
                ..base.router.clone()
            },
            index,
            event_delay: event_delay.unwrap_or(SimConfig::default().event_delay),
            ..base
        };
        let outcome = Simulation::with_policy(&w, config, policy)
            .expect("valid")
            .run(&mut || {});
        // The engines answer whole wherever the router hears of the prefill's end otherwise
        // (two requests: too few to learn a pace without events).
        let whole = match (engine_stream, index) {
            (EngineStream::Always, _) | (EngineStream::Auto, IndexMode::Approximate) => 0,
            _ => 2,
        };
        assert_eq!(outcome.whole_answers, whole, "{engine_stream:?}, {index:?}");
        let first = &outcome.records[0];
        let arrival = Duration::from_secs(1);
        assert!(
            first.first_token.is_some_and(|t| t < arrival),
            "prefilled before"
        );
        assert!(first.finished.is_some_and(|t| t > arrival), "decoding at");
        let calls = calls.lock().expect("calls");
        let (second, _) = &calls[1];
        assert_eq!(second.iter().map(|c| c.active_requests).sum::<u32>(), 1);
        assert_eq!(
            second.iter().map(|c| c.active_prefill_tokens).sum::<u64>(),
            load,
            "{engine_stream:?}, {index:?}, events late: {event_delay:?}"
        );
    }
}

/// `agents` agents of `turns` turns over private, growing contexts (64 blocks, then 8 more a
/// turn), with `gap` of tool time between turns: together far more KV than `config_small` has.
fn overflowing(agents: u64, turns: u64, gap: Duration) -> Workload {
    Agents {
        prompt_blocks: 64,
        turn_blocks: 8,
        output_tokens: 32,
        stagger: Duration::from_millis(50),
    }
    .workload(agents, turns, gap)
}

/// Two workers of 640 blocks: room for about six of the agents' contexts each.
fn config_small(admission: &str) -> SimConfig {
    SimConfig {
        workers: 2,
        engine: EngineConfig {
            block_size: BLOCK as usize,
            num_blocks: 640,
            ..EngineConfig::default()
        },
        admission: admission.to_owned(),
        ..SimConfig::default()
    }
}

#[test]
fn thunder_agent_completes_every_request_once_and_recomputes_less_than_request_routing() {
    let w = overflowing(24, 8, Duration::from_secs(1));
    let none = run(&w, config_small("none"));
    let thunder = run(&w, config_small("thunder-agent"));
    for outcome in [&none, &thunder] {
        let mut seen: Vec<(usize, usize)> = outcome
            .records
            .iter()
            .map(|r| {
                assert!(
                    r.finished.is_some(),
                    "{}: {r:?} did not finish",
                    outcome.admission
                );
                (r.session, r.request)
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), outcome.records.len(), "a request ran twice");
        assert_eq!(seen.len(), w.request_count(), "a request never ran");
    }
    // The contexts do not fit: request-level routing re-prefills evicted programs.
    assert!(none.recomputed_tokens > 0);
    assert!(
        thunder.recomputed_tokens < none.recomputed_tokens,
        "thunder-agent {} vs none {}",
        thunder.recomputed_tokens,
        none.recomputed_tokens
    );
    let stats = thunder.report().admission_stats;
    assert!(stats.pauses > 0, "{stats:?}");
    assert_eq!(stats.forced_releases, 0);
}

/// With a host tier the KV of a paused program outlives its pause on its worker; the
/// reference's best-fit resume moves it elsewhere and re-prefills it, `migrate_after` waits for
/// home and loads it from the host tier instead. (Tool calls of 6 s: programs are paused while
/// ACTING, not only new ones held.)
#[test]
fn with_a_host_tier_resuming_at_home_recomputes_less() {
    let w = Agents {
        prompt_blocks: 48,
        turn_blocks: 16,
        output_tokens: 32,
        stagger: Duration::from_millis(50),
    }
    .workload(16, 10, Duration::from_secs(6));
    let with_host = |admission: &str| {
        let mut config = config_small(admission);
        config.engine.host_tier = Some(HostTierConfig::blocks(8_192));
        run(&w, config).report()
    };
    let best_fit = with_host("thunder-agent");
    let home = with_host("thunder-agent:migrate_after=10m");
    for report in [&best_fit, &home] {
        assert_eq!(report.requests, w.request_count() as u64);
        assert_eq!(report.failed_requests, 0);
    }
    assert!(best_fit.admission_stats.resumes > 0);
    assert!(
        home.recomputed_tokens < best_fit.recomputed_tokens,
        "home {} vs best fit {}",
        home.recomputed_tokens,
        best_fit.recomputed_tokens
    );
    assert!(home.prefix_hit_ratio > best_fit.prefix_hit_ratio);
}

#[test]
fn admission_policies_run_end_to_end_and_are_named_in_the_report() {
    let w = overflowing(8, 3, Duration::from_secs(1));
    for spec in [
        "continuum",
        "autellix",
        "thunder-agent:decay_half_life=1h:sticky=false",
    ] {
        let report = run(&w, config_small(spec)).report();
        assert_eq!(report.requests, w.request_count() as u64, "{spec}");
        assert_eq!(report.admission, spec);
        assert!(report.label().contains(spec), "{}", report.label());
    }
    let bad = Simulation::new(&w, config_small("thunder-agent:speed=11"));
    assert!(bad.is_err());
}
