//! The KV-hint path in the simulator: each replica's tracker, policy and engines on the virtual
//! clock, as the gateway's hint task drives them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::engine::{EngineConfig, HostTierConfig};
use switchyard_core::kv_hints::params::native_kv_hints_spec;
use switchyard_core::kv_hints::{HintOutcome, IndexState, KvHint, KvHintPolicy, LifecycleEvent};
use switchyard_policy_host::WasmKvHints;
use switchyard_policy_host::{EngineConfig as PolicyEngineConfig, PolicyEngine, PolicyStats};
use switchyard_sim::workload::{Session, Spawn, TraceRequest, Workload};
use switchyard_sim::{RunReport, SimConfig, Simulation};

const BLOCK: u32 = 16;

/// `agents` sessions of 48-block private prompts growing by 4 blocks a turn, `gap` of tool time
/// between turns. With `subagents`, every second agent spawns a joined two-turn sub-agent after
/// its first turn, on the agent's prompt and then 4 blocks of its own a turn.
fn agents(agents: u64, turns: u64, gap: Duration, subagents: bool) -> Workload {
    let mut sessions = Vec::new();
    for a in 0..agents {
        let mut history: Vec<u64> = (0..48).map(|b| a * 1_000_000 + b).collect();
        let prompt = history.clone();
        let requests = (0..turns)
            .map(|t| {
                history.extend((0..4).map(|b| a * 1_000_000 + 1_000 + t * 10 + b));
                TraceRequest {
                    gap: if t == 0 { Duration::ZERO } else { gap },
                    hash_ids: history.clone(),
                    input_tokens: history.len() as u32 * BLOCK,
                    output_tokens: 20,
                }
            })
            .collect();
        sessions.push(Session {
            id: format!("agent-{a}"),
            parent: None,
            start: Duration::from_millis(23 * a),
            spawn: None,
            requests,
        });
        if subagents && a % 2 == 0 {
            let mut child = prompt;
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
                    after: 0,
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

/// Two workers whose 256 device blocks the sessions overflow, each with a host tier that holds
/// every session.
fn config(kv_hints: Option<&str>) -> SimConfig {
    SimConfig {
        workers: 2,
        engine: EngineConfig {
            block_size: BLOCK as usize,
            num_blocks: 256,
            host_tier: Some(HostTierConfig::blocks(4_096)),
            ..EngineConfig::default()
        },
        kv_hints: kv_hints.map(str::to_owned),
        ..SimConfig::default()
    }
}

fn run(workload: &Workload, config: SimConfig) -> RunReport {
    Simulation::new(workload, config)
        .expect("valid config")
        .run(&mut || {})
        .report()
}

#[test]
fn demote_on_tool_call_demotes_waiting_sessions_and_prefetches_them_back() {
    let workload = agents(16, 6, Duration::from_secs(2), false);
    // The usage gate off: every slow tool call demotes, whatever room the device has.
    let spec = "demote-on-tool-call:demote_threshold=100ms:demote_above_usage=0";
    let baseline = run(&workload, config(Some("no-hints")));
    let hinted = run(&workload, config(Some(spec)));
    let hints = hinted.kv_hints.clone().expect("a hint report");
    let tiers = hinted.tiers.expect("a tier report");
    eprintln!("{hints:#?}");
    assert_eq!(hinted.requests, 96);
    assert_eq!(hints.policy, spec);
    assert!(hinted.label().contains(&format!("hints:{spec}@")));
    // Every turn but a session's last ends in a tool call, whose result is the next turn.
    assert_eq!(hints.events["turn_end_with_tool_call"], 16 * 5);
    assert_eq!(hints.events["tool_result"], 16 * 5);
    assert_eq!(hints.events["session_end"], 16);
    // Unseen tools are predicted to take 1 s, over the 100 ms threshold: every tool call is
    // demoted (on each rank the session ran on), and every ended session is evicted.
    let demotes = hints.total("demote");
    assert!(demotes.actions >= 16 * 5);
    assert!(hints.count("demote", "accepted").actions > 0);
    assert!(hints.count("prefetch", "accepted").actions > 0);
    assert!(hints.total("evict").actions >= 16);
    assert_eq!(hints.unnamed_blocks, 0);
    for action in hints.actions.keys() {
        assert_eq!(hints.count(action, "rejected").actions, 0, "{action}");
    }
    // The engines' own counters agree with the outcomes they answered.
    assert_eq!(tiers.demoted_blocks, demotes.blocks);
    assert_eq!(tiers.prefetched_blocks, hints.total("prefetch").blocks);
    assert!(tiers.prefetched_blocks > 0 && tiers.prefetch_s > 0.0);
    // What the prefetches brought back is found on the device rather than loaded on admission.
    let before = baseline.tiers.expect("a tier report");
    assert!(
        tiers.device_hit_tokens > before.device_hit_tokens,
        "device hits {} with hints vs {} without",
        tiers.device_hit_tokens,
        before.device_hit_tokens
    );
    assert!(tiers.host_hit_tokens < before.host_hit_tokens);
    // With the gate (the default 0.9), a tool call is demoted only while a rank holding the
    // session is that full by the index: fewer demotes, none before the devices fill.
    let gated = run(
        &workload,
        config(Some("demote-on-tool-call:demote_threshold=100ms")),
    );
    let gated_demotes = gated.kv_hints.expect("a hint report").total("demote");
    assert!(
        gated_demotes.actions < demotes.actions,
        "{} demotes gated vs {} not",
        gated_demotes.actions,
        demotes.actions
    );
    let table = switchyard_sim::Report {
        schema: switchyard_sim::REPORT_SCHEMA.into(),
        trace: "agents".into(),
        runs: vec![baseline, hinted.clone()],
    }
    .table();
    assert!(table.contains("demote done/all"), "{table}");
    // The same run twice is the same run.
    assert_eq!(run(&workload, config(Some(spec))), hinted);
}

#[test]
fn no_hints_runs_the_path_and_changes_nothing() {
    let workload = agents(16, 6, Duration::from_secs(2), true);
    let without = run(&workload, config(None));
    let mut with = run(&workload, config(Some("no-hints")));
    assert_eq!(without.kv_hints, None);
    let hints = with.kv_hints.take().expect("a hint report");
    // The tracker ran and the policy was asked, on events and on ticks while tools ran...
    assert!(hints.events["turn_end_with_tool_call"] > 0);
    assert!(hints.events["subagent_spawn"] > 0);
    assert!(hints.policy_calls > hints.events.values().sum::<u64>());
    // ...and, answering nothing, left the run exactly as it was.
    assert_eq!(hints.hints, 0);
    assert!(hints.actions.is_empty());
    assert_eq!(with, without);
}

#[test]
fn subagent_strategies_share_a_parents_prefix_and_reclaim_a_finished_subagent() {
    let workload = agents(8, 4, Duration::from_secs(1), true);
    let report = run(
        &workload,
        config(Some("share-to-subagent+subagent-reclaim")),
    );
    let hints = report.kv_hints.expect("a hint report");
    let spawned = hints.events["subagent_spawn"];
    assert_eq!(spawned, 4);
    assert_eq!(hints.events["subagent_end"], spawned);
    // A share retains the parent's prefix where it is (a prefetch only when the child runs
    // elsewhere); an ended subagent's private blocks and every ended session are evicted.
    assert!(hints.total("retain").actions >= spawned);
    let evicts = hints.total("evict");
    assert!(evicts.actions >= 8 + spawned, "{hints:#?}");
    assert!(hints.count("evict", "accepted").blocks > 0);
    assert_eq!(report.requests, 8 * 4 + spawned * 2);
}

/// A policy that records what it hears of its actions' outcomes.
#[derive(Debug)]
struct Listening {
    policy: Box<dyn KvHintPolicy>,
    heard: Arc<Mutex<Vec<HintOutcome>>>,
}

impl KvHintPolicy for Listening {
    fn name(&self) -> &str {
        self.policy.name()
    }

    fn on_events(
        &mut self,
        events: &[LifecycleEvent],
        index: &IndexState,
        now: Duration,
    ) -> Vec<KvHint> {
        self.policy.on_events(events, index, now)
    }

    fn on_outcomes(&mut self, outcomes: &[HintOutcome], now: Duration) {
        self.heard
            .lock()
            .expect("not poisoned")
            .extend_from_slice(outcomes);
        self.policy.on_outcomes(outcomes, now);
    }
}

/// As in the gateway, a policy hears what became of its actions before its next events: every
/// outcome it hears was counted in the report, and only the run's last round goes unheard.
#[test]
fn the_policy_hears_its_actions_outcomes() {
    let workload = agents(16, 6, Duration::from_secs(2), false);
    let spec = "demote-on-tool-call:demote_threshold=100ms:demote_above_usage=0";
    let heard = Arc::new(Mutex::new(Vec::new()));
    let policy = Listening {
        policy: native_kv_hints_spec(spec).expect("a strategy"),
        heard: heard.clone(),
    };
    let report = Simulation::new(&workload, config(None))
        .expect("valid config")
        .with_kv_hint_policies(vec![Box::new(policy)])
        .expect("one policy for one replica")
        .run(&mut || {})
        .report();
    let hints = report.kv_hints.as_ref().expect("a hint report");
    let heard = heard.lock().expect("not poisoned");
    let mut by_kind: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for o in heard.iter() {
        assert!(
            o.session_id
                .as_deref()
                .is_some_and(|s| s.starts_with("agent-"))
        );
        assert!(o.rank.worker.0 < 2, "{o:?}");
        let sum = by_kind
            .entry((o.action.label(), o.outcome.label()))
            .or_default();
        sum.0 += 1;
        sum.1 += u64::from(o.blocks);
    }
    assert!(by_kind[&("demote", "accepted")].0 > 0, "{by_kind:?}");
    assert!(by_kind[&("prefetch", "accepted")].0 > 0, "{by_kind:?}");
    for ((action, outcome), (actions, blocks)) in by_kind {
        let counted = hints.count(action, outcome);
        assert!(
            actions <= counted.actions && blocks <= counted.blocks,
            "{action} {outcome}"
        );
    }
    let counted: u64 = ["demote", "prefetch", "evict", "retain", "pin"]
        .iter()
        .map(|a| hints.total(a).actions)
        .sum();
    assert!(
        heard.len() as u64 + 4 >= counted,
        "{} of {counted}",
        heard.len()
    );
}

/// Hints given to a built simulation read the index even when routing does not (round robin),
/// so the engines' events must reach it, as when the configuration names the hints.
#[test]
fn hint_policies_given_later_see_the_index_under_round_robin() {
    let workload = agents(16, 6, Duration::from_secs(2), false);
    let spec = "demote-on-tool-call:demote_threshold=100ms:demote_above_usage=0";
    let round_robin = |kv_hints: Option<&str>| SimConfig {
        policy: "round-robin".to_owned(),
        ..config(kv_hints)
    };
    let later = Simulation::new(&workload, round_robin(None))
        .expect("valid config")
        .with_kv_hint_policies(vec![native_kv_hints_spec(spec).expect("a strategy")])
        .expect("one policy for one replica")
        .run(&mut || {})
        .report();
    let hints = later.kv_hints.as_ref().expect("a hint report");
    assert!(hints.count("demote", "accepted").actions > 0, "{hints:#?}");
    // The same run, but for the name: a policy object names itself without its parameters.
    let mut named = run(&workload, round_robin(Some(spec)));
    named.kv_hints.as_mut().expect("a hint report").policy = hints.policy.clone();
    assert_eq!(later, named);
}

/// A `kv-hints` component through the gateway's policy host, under the simulator's deadlines
/// (a call cut off by a busy machine would answer no hints and make the run differ from the
/// native one).
fn wasm(name: &str) -> Box<dyn KvHintPolicy> {
    let engine = PolicyEngine::new(PolicyEngineConfig::simulation()).expect("a policy engine");
    let bytes = switchyard_policy_artifacts::find(name).expect("a built-in component");
    let component = engine.load_kv_hints(bytes).expect("a kv-hints component");
    Box::new(WasmKvHints::new(
        component,
        Arc::new(PolicyStats::default()),
    ))
}

/// The component runs the native strategy's defaults (a 2 s demote threshold, unseen tools
/// predicted at 1 s), so the tools here take 3 s: every call after the first one is demoted.
#[test]
fn native_and_wasm_demote_on_tool_call_give_the_same_report() {
    let workload = agents(16, 6, Duration::from_secs(3), false);
    let native = run(&workload, config(Some("demote-on-tool-call")));
    let component = Simulation::new(&workload, config(None))
        .expect("valid config")
        .with_kv_hint_policies(vec![wasm("demote-on-tool-call")])
        .expect("one policy for one replica")
        .run(&mut || {})
        .report();
    let hints = native.kv_hints.as_ref().expect("a hint report");
    assert!(hints.count("demote", "accepted").actions > 0, "{hints:#?}");
    assert!(hints.total("prefetch").actions > 0, "{hints:#?}");
    assert_eq!(component, native);
}

#[test]
fn bad_hint_settings_are_refused() {
    let workload = agents(1, 1, Duration::ZERO, false);
    let unknown = Simulation::new(&workload, config(Some("continuum")));
    let message = unknown.expect_err("not a strategy").to_string();
    assert!(message.contains("continuum"), "{message}");
    let no_tick = SimConfig {
        kv_hints_tick: Duration::ZERO,
        ..config(Some("no-hints"))
    };
    assert!(Simulation::new(&workload, no_tick).is_err());
    let none_for_one_replica = Simulation::new(&workload, config(None))
        .expect("valid config")
        .with_kv_hint_policies(Vec::new());
    assert!(none_for_one_replica.is_err());
}
