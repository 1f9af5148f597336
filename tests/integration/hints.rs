//! KV hints end to end, gateway and mock engine as processes: a turn that ends in a tool call
//! makes the `demote-on-tool-call` policy demote the session's blocks to the engine's host tier;
//! the harness's prefetch hook brings them back to the device; the next turn is served from the
//! device, and both sides count every hint's outcome.

use crate::support::{Gateway, MockEngine, client, get_text, sample};
use serde_json::{Value, json};
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct";

/// Poll `url`'s metrics until `name{labels}` reaches `at_least`; the last value seen.
async fn wait_for_metric(url: &str, name: &str, labels: &[&str], at_least: f64) -> f64 {
    let mut value = 0.0;
    for _ in 0..200 {
        value = sample(&get_text(&format!("{url}/metrics")).await, name, labels);
        if value >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    value
}

async fn chat(gateway: &Gateway, session: &str, messages: &[Value]) -> Value {
    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8});
    let response = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn cached_tokens(reply: &Value) -> (u64, u64) {
    let usage = &reply["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// A long, session-specific context (~1,500 tokens).
fn context() -> String {
    let words: Vec<String> = (0..500).map(|i| format!("w{}", (i * 7) % 997)).collect();
    format!("Repository notes: {}", words.join(" "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_call_demotes_the_session_and_the_prefetch_hook_brings_it_back() {
    let engine = MockEngine::start_with(
        50.0,
        1024,
        &["--host-tier-blocks", "4096", "--kv-block-bytes", "4096"],
    );
    let config = format!(
        "{}upstream = \"tokens\"\nkv_hints = \"endpoint\"\n\
         [policies]\nkv_hints = \"demote-on-tool-call\"\n",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    // The engine says where its device tier's bytes are: on the GPU check (a `cuda` build on
    // a machine with a GPU, KVBM_REQUIRE_GPU) in GPU memory, so the demote and the prefetch
    // below are copies over PCIe.
    let metrics = get_text(&format!("{}/metrics", engine.url)).await;
    let memory = if std::env::var_os("KVBM_REQUIRE_GPU").is_some() {
        "memory=\"cuda\""
    } else {
        "memory="
    };
    assert_eq!(
        sample(
            &metrics,
            "mock_kv_tier_memory_info",
            &["tier=\"g1\"", memory]
        ),
        1.0,
        "{metrics}"
    );

    // Turn 1 ends in a tool call. The policy has not seen `bash` yet and predicts it quick
    // (1 s, below its 2 s threshold), so nothing is demoted.
    let call = |n: u32| {
        format!("Run the tests. [[mock:tool_call bash {{\"command\": \"make test {n}\"}}]]")
    };
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("{} {}", context(), call(1))}),
    ];
    let first = chat(&gateway, "s1", &messages).await;
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    // The tool takes 2.5 s; its result comes back in turn 2, which calls it again. The
    // policy learnt that `bash` is slow: now it demotes.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let answer = |reply: &Value, messages: &mut Vec<Value>| {
        let message = &reply["choices"][0]["message"];
        messages.push(message.clone());
        messages.push(
            json!({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
            "content": "ok: 12 passed"}),
        );
    };
    answer(&first, &mut messages);
    messages.push(json!({"role": "user", "content": call(2)}));
    let second = chat(&gateway, "s1", &messages).await;
    assert_eq!(
        second["choices"][0]["finish_reason"], "tool_calls",
        "{second}"
    );
    let (first_prompt, _) = cached_tokens(&second);
    let full_blocks = first_prompt / 16;

    // The policy demoted the session: the engine moved its blocks off the device.
    let demoted = wait_for_metric(
        &gateway.url,
        "switchyard_kv_hint_actions_total",
        &["action=\"demote\"", "outcome=\"accepted\""],
        1.0,
    )
    .await;
    let hint_lines = |text: String| -> String {
        let lines = text.lines().filter(|line| {
            line.starts_with("switchyard_kv_hint") || line.starts_with("switchyard_kv_events")
        });
        lines.collect::<Vec<_>>().join("\n")
    };
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        demoted,
        1.0,
        "one demote, accepted:\n{}",
        hint_lines(metrics)
    );
    let moved = sample(
        &get_text(&format!("{}/metrics", gateway.url)).await,
        "switchyard_kv_hint_blocks_total",
        &["action=\"demote\"", "outcome=\"accepted\""],
    );
    assert!(
        moved + 1.0 >= full_blocks as f64,
        "{moved} of {full_blocks} blocks demoted"
    );
    let events = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        sample(
            &events,
            "switchyard_kv_lifecycle_events_total",
            &["kind=\"turn_end_with_tool_call\""]
        ),
        2.0
    );

    // The harness says the tool is about to return: the blocks come back to the device.
    let hook = client()
        .post(format!("{}/v1/agent/prefetch", gateway.url))
        .json(&json!({"session_id": "s1", "expected_in_ms": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(hook.status(), 202);
    let prefetched = wait_for_metric(
        &gateway.url,
        "switchyard_kv_hint_actions_total",
        &["action=\"prefetch\"", "outcome=\"accepted\""],
        1.0,
    )
    .await;
    assert!(prefetched >= 1.0, "the prefetch was accepted");

    // Turn 3 (the tool's result) is served from the device: the engine's device prefix hits
    // grow by the whole earlier prompt.
    let device_hits_before = engine.metric("vllm:prefix_cache_hits_total").await;
    answer(&second, &mut messages);
    let (_, cached) = cached_tokens(&chat(&gateway, "s1", &messages).await);
    assert!(
        cached + 32 >= first_prompt,
        "cached {cached} of {first_prompt}"
    );
    let device_hits = engine.metric("vllm:prefix_cache_hits_total").await - device_hits_before;
    assert!(
        device_hits + 32.0 >= first_prompt as f64,
        "device hits {device_hits} of {first_prompt}"
    );
    let tool_results = wait_for_metric(
        &gateway.url,
        "switchyard_kv_lifecycle_events_total",
        &["kind=\"tool_result\""],
        2.0,
    )
    .await;
    assert_eq!(tool_results, 2.0);

    // A prefetch for a session the gateway never routed is refused in the API's error shape.
    let unknown = client()
        .post(format!("{}/v1/agent/prefetch", gateway.url))
        .json(&json!({"session_id": "nobody", "expected_in_ms": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let body: Value = unknown.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nobody"),
        "{body}"
    );
}

/// Turn `n` of a reasoning session: a long thinking span, then a short answer.
fn thinking_turn(n: u32) -> String {
    let steps: Vec<String> = (0..60).map(|i| format!("step {n}.{i} holds")).collect();
    format!(
        "Think it through. [[mock:say <think>{}</think>Answer {n}.]]",
        steps.join(", ")
    )
}

/// A session whose turns think (DeepSeek-R1 style tags), with `[kv_hints] ephemeral_thinking`:
/// once the gateway has seen it think, its requests tell the engine not to offload past the
/// prompt, and the engine keeps the answer's blocks (the thinking span and all hashed after
/// it) out of the host tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thinking_sessions_answers_never_reach_the_host_tier() {
    let engine = MockEngine::start_with(
        50.0,
        1024,
        &["--host-tier-blocks", "4096", "--kv-block-bytes", "4096"],
    );
    let config = format!(
        "[model]\nreasoning_parser = \"deepseek_r1\"\n[kv_hints]\nephemeral_thinking = true\n\
         {}upstream = \"tokens\"\nkv_hints = \"endpoint\"\n",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);

    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful assistant."}),
        json!({"role": "user", "content": format!("{} {}", context(), thinking_turn(1))}),
    ];
    // Turn 1: nothing known yet, so it is written through whole.
    let first = chat(&gateway, "think", &messages).await;
    assert!(
        first["choices"][0]["message"]["reasoning_content"]
            .as_str()
            .is_some_and(|r| r.contains("step 1.59")),
        "{first}"
    );
    assert_eq!(engine.metric("kvbm_ephemeral_blocks").await, 0.0);
    let thought = wait_for_metric(
        &gateway.url,
        "switchyard_kv_lifecycle_events_total",
        &["kind=\"thinking_end\""],
        1.0,
    )
    .await;
    assert_eq!(thought, 1.0, "the span was seen");

    // Turn 2 of the same session: its answer's blocks are ephemeral, every one of them.
    let offloaded_before = engine.metric("kvbm_offload_blocks_d2h").await;
    messages.push(json!({"role": "assistant", "content": "Answer 1."}));
    messages.push(json!({"role": "user", "content": thinking_turn(2)}));
    let second = chat(&gateway, "think", &messages).await;
    let usage = &second["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion > 100, "a long thinking span: {second}");
    // The engine writes every token's KV but the last sampled one.
    let written_blocks = (prompt + completion - 1) / 16;
    let ephemeral = written_blocks - prompt / 16;
    assert_eq!(
        engine.metric("kvbm_ephemeral_blocks").await,
        ephemeral as f64,
        "prompt {prompt}, completion {completion}"
    );
    // Only prompt blocks went to the host: at most the prompt's full blocks.
    let offloaded = engine.metric("kvbm_offload_blocks_d2h").await - offloaded_before;
    assert!(
        offloaded > 0.0 && offloaded <= (prompt / 16) as f64,
        "{offloaded} blocks offloaded for a {prompt}-token prompt"
    );

    // Another session that never thought is written through whole.
    let plain = chat(
        &gateway,
        "plain",
        &[json!({"role": "user", "content": "Say hi. [[mock:say Hi there, all good.]]"})],
    )
    .await;
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    assert_eq!(
        engine.metric("kvbm_ephemeral_blocks").await,
        ephemeral as f64
    );
}
