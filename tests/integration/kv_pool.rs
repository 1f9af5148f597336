//! `switchyard kv-pool` as a process: the client puts and gets over HTTP (through memory and
//! disk), and SIGTERM stops it cleanly; and with a gateway and two mock engines, a subagent on
//! another worker loads its parent's prefix from the pool.

use crate::support::{Gateway, MockEngine, Proc, TempFile, client, get_text, metric_sum};
use serde_json::{Value, json};
use std::time::Duration;
use switchyard_kv_pool::{PoolClient, PoolError, PutBlock};
use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer};

const MODEL: &str = "smollm2-135m-instruct";

const BLOCK: u32 = 4096;
const TOKEN: &str = "integration-secret";

fn block(hash: u64, parent: Option<u64>) -> PutBlock {
    PutBlock {
        hash,
        parent,
        token_ids: (0..16).collect(),
        retention: None,
        bytes: vec![hash as u8; BLOCK as usize].into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_pool_process_serves_blocks_and_stops_on_sigterm() {
    let scratch = TempFile::new("kv-pool", "");
    let disk = scratch.path.with_file_name("disk");
    let disk = disk.to_str().unwrap();
    let mut pool = Proc::switchyard(&[
        "kv-pool",
        "--listen",
        "127.0.0.1:0",
        "--block-bytes",
        "4096",
        "--memory-blocks",
        "4",
        "--disk-dir",
        disk,
        "--disk-blocks",
        "16",
        "--events-endpoint",
        "tcp://127.0.0.1:0",
        "--events-replay-endpoint",
        "tcp://127.0.0.1:0",
        "--auth-token",
        TOKEN,
    ]);
    let url = pool.wait_for("kv pool listening on ");
    assert!(
        pool.wait_for("kv pool events on ")
            .starts_with("tcp://127.0.0.1:")
    );
    let client = PoolClient::new(&url, BLOCK).unwrap().with_token(TOKEN);

    // A chain of eight through a memory of four: half of it ends up on disk.
    let chain: Vec<PutBlock> = (1..=8).map(|h| block(h, (h > 1).then(|| h - 1))).collect();
    let summary = client.put(&chain).await.unwrap();
    assert_eq!((summary.stored, summary.duplicates), (8, 0));
    assert_eq!(client.put(&chain[..1]).await.unwrap().duplicates, 1);
    let hashes: Vec<u64> = (1..=9).collect();
    let mut expected: Vec<_> = chain.iter().map(|b| Some(b.bytes.clone())).collect();
    expected.push(None);
    assert_eq!(client.get(&hashes).await.unwrap(), expected);
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert_eq!(metric_sum(&metrics, "kvbm_tier_usage_blocks"), 8.0);
    assert!(metric_sum(&metrics, "kvbm_offload_blocks_h2d_total") >= 4.0);

    // The token is required.
    let anonymous = PoolClient::new(&url, BLOCK).unwrap();
    assert!(matches!(
        anonymous.exists(&[1]).await,
        Err(PoolError::Refused { status: 401, .. })
    ));

    pool.terminate();
    let status = pool
        .exited_within(Duration::from_secs(20))
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    // Gone: the engine would now recompute.
    let error = client.exists(&[1]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
}

/// A long system prompt shared by a parent session and its subagents (~1,400 tokens).
fn system_prompt() -> String {
    let rules: Vec<String> = (0..200)
        .map(|i| format!("rule {i}: keep module_{} tidy", (i * 37) % 211))
        .collect();
    format!("You are a coding agent. {}", rules.join("; "))
}

fn conversation(task: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": system_prompt()}),
        json!({"role": "user", "content": task}),
    ]
}

/// A pool process with a memory tier and event streams: it, its URL, its events and replay
/// endpoints.
fn start_pool() -> (Proc, String, String, String) {
    let pool = Proc::switchyard(&[
        "kv-pool",
        "--listen",
        "127.0.0.1:0",
        "--block-bytes",
        "4096",
        "--memory-blocks",
        "4096",
        "--events-endpoint",
        "tcp://127.0.0.1:0",
        "--events-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let url = pool.wait_for("kv pool listening on ");
    let events = pool.wait_for("kv pool events on ");
    let replay = pool.wait_for("kv pool replay on ");
    (pool, url, events, replay)
}

/// Prompt tokens and cached tokens of one chat completion through the gateway.
async fn chat(gateway: &Gateway, session: &str, task: &str) -> (u64, u64) {
    let body = json!({"model": MODEL, "messages": conversation(task), "max_tokens": 4});
    let response = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let reply: Value = response.json().await.unwrap();
    let usage = &reply["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// Leading tokens two tasks' prompts share (the system prompt and the template around it).
fn shared_prefix_tokens(a: &str, b: &str) -> u64 {
    let tokenizer = ModelTokenizer::embedded_agent_model().unwrap();
    let encode = |task| {
        let messages = conversation(task);
        tokenizer
            .encode_chat(&ChatTemplateInput {
                messages: &messages,
                tools: None,
                add_generation_prompt: true,
                extra: None,
            })
            .unwrap()
    };
    let (a, b) = (encode(a), encode(b));
    a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64
}

async fn gateway_metric(gateway: &Gateway, name: &str, worker: &str) -> f64 {
    let text = get_text(&format!("{}/metrics", gateway.url)).await;
    metric_sum(
        &text
            .lines()
            .filter(|l| l.contains(&format!("worker=\"{worker}\"")))
            .collect::<Vec<_>>()
            .join("\n"),
        name,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subagent_on_another_worker_reuses_the_parents_prefix_through_the_pool() {
    let (pool, pool_url, pool_events, pool_replay) = start_pool();
    let engine_flags = ["--kv-pool", pool_url.as_str(), "--kv-block-bytes", "4096"];
    let mut engines = [
        Some(MockEngine::start_with(50.0, 1024, &engine_flags)),
        Some(MockEngine::start_with(50.0, 1024, &engine_flags)),
    ];
    let config = {
        let listed: Vec<&MockEngine> = engines.iter().flatten().collect();
        format!(
            "{}[kv_pool]\nkv_events = \"{pool_events}\"\nreplay = \"{pool_replay}\"\n",
            Gateway::config_for(&listed, "kv-cost")
        )
    };
    let gateway = Gateway::start(&config);

    // The parent's turn is computed on one worker, which writes its blocks through to the pool.
    let (parent_prompt, _) = chat(&gateway, "parent", "Plan the refactor of module_7.").await;
    let mut served = Vec::new();
    for engine in engines.iter().flatten() {
        served.push(engine.metric("vllm:prompt_tokens_total").await);
    }
    let first = served
        .iter()
        .position(|t| *t > 0.0)
        .expect("one worker served");
    let other = 1 - first;
    let shared = shared_prefix_tokens(
        "Plan the refactor of module_7.",
        "Write the tests for module_7.",
    );
    assert!(shared > 1_000, "the shared prefix is {shared} tokens");
    assert!(shared < parent_prompt);

    // The pool holds it, and the gateway has indexed all of the pool's events: its count of
    // them has stopped moving.
    let (mut indexed, mut stable) = (0.0, 0);
    for _ in 0..200 {
        let now = gateway_metric(&gateway, "switchyard_kv_events_messages_total", "pool").await;
        let held = metric_sum(
            &get_text(&format!("{pool_url}/metrics")).await,
            "kvbm_tier_usage_blocks",
        );
        let settled = now > 0.0 && now == indexed && held * 16.0 >= shared as f64;
        stable = if settled { stable + 1 } else { 0 };
        indexed = now;
        if stable == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stable, 3, "the pool's events never settled in the gateway");

    // That worker goes away; its KV lives on in the pool. A subagent with the same system
    // prompt is placed on the other worker, which loads the prefix instead of computing it.
    engines[first] = None;
    let worker = format!("{other}.0");
    let (_, cached) = chat(&gateway, "subagent-1", "Write the tests for module_7.").await;
    assert!(
        cached * 10 >= shared * 9,
        "the subagent found {cached} of {shared} shared tokens cached"
    );
    let survivor = engines[other].as_ref().unwrap();
    assert!(
        survivor.metric("kvbm_onboard_blocks_g4_total").await * 16.0 >= (shared * 9 / 10) as f64
    );
    // The router credited the pool for the run the worker lacked: all of it.
    let credited = gateway_metric(&gateway, "switchyard_routed_shared_tokens_total", &worker).await;
    assert!(
        credited * 10.0 >= (shared * 9) as f64,
        "credited {credited} shared tokens"
    );

    // Now the worker holds the prefix itself: the next subagent's pool credit is only what lies
    // beyond the worker's own device prefix, which is nothing the pool has.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pool_bytes_out = || async {
        metric_sum(
            &get_text(&format!("{pool_url}/metrics")).await,
            "kvbm_pool_bytes_out_total",
        )
    };
    let sent_before = pool_bytes_out().await;
    let (_, cached) = chat(&gateway, "subagent-2", "Review module_7's error handling.").await;
    assert!(cached * 10 >= shared * 9);
    // And the worker fetched none of it from the pool: it asks only for what it lacks.
    assert_eq!(
        pool_bytes_out().await,
        sent_before,
        "the pool sent blocks the worker's device held"
    );
    let again = gateway_metric(&gateway, "switchyard_routed_shared_tokens_total", &worker).await;
    assert!(
        again - credited < 16.0 * 2.0,
        "credited {} more shared tokens for a prefix on the device",
        again - credited
    );
    pool.terminate();
}

/// The pool dies (SIGKILL) under traffic: the engines recompute what they would have loaded and
/// count the writes that failed; no request fails and nothing stays booked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_dies_costs_recompute_never_a_request() {
    let (mut pool, pool_url, pool_events, pool_replay) = start_pool();
    let engine_flags = ["--kv-pool", pool_url.as_str(), "--kv-block-bytes", "4096"];
    let engines = [
        MockEngine::start_with(50.0, 1024, &engine_flags),
        MockEngine::start_with(50.0, 1024, &engine_flags),
    ];
    let config = format!(
        "{}[kv_pool]\nkv_events = \"{pool_events}\"\nreplay = \"{pool_replay}\"\n",
        Gateway::config_for(&[&engines[0], &engines[1]], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    chat(&gateway, "before", "Plan the refactor of module_7.").await;
    pool.kill();
    // `chat` asserts a 200 for each: new sessions (written through to a dead pool) and one
    // continuing (whose prefix a worker may have expected from the pool).
    for i in 0..6 {
        chat(
            &gateway,
            &format!("after-{i}"),
            &format!("Write the tests for module_{i}."),
        )
        .await;
    }
    chat(&gateway, "before", "Plan the refactor of module_7.").await;
    let mut noticed = 0.0;
    for engine in &engines {
        noticed += engine.metric("kvbm_pool_publish_failed_total").await
            + engine.metric("kvbm_pool_unavailable_total").await;
    }
    assert!(noticed > 0.0, "no engine noticed the pool was gone");
    let in_flight = metric_sum(
        &get_text(&format!("{}/metrics", gateway.url)).await,
        "switchyard_worker_in_flight",
    );
    assert_eq!(in_flight, 0.0);
}
