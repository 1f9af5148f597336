//! The mock engine over real sockets: HTTP on 127.0.0.1, KV events over ZMQ.

use futures::StreamExt;
use serde_json::{Value, json};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::engine::ENGINE_SEED;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::IndexOp;
use switchyard_core::worker::{Rank, Tier};
use switchyard_kv_events::ingest::WireFormat;
use switchyard_kv_events::subscriber::{SubscriberConfig, SubscriberStats, run_subscriber};
use switchyard_mock_engine::{MockEngineConfig, MockEngineHandle, spawn};
use switchyard_tokenizer::ModelTokenizer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Every test finishes within this or fails.
const TEST_TIMEOUT: Duration = Duration::from_secs(20);

struct Engine {
    handle: MockEngineHandle,
    shutdown: CancellationToken,
    http: reqwest::Client,
}

impl Engine {
    async fn start(config: MockEngineConfig) -> Engine {
        let shutdown = CancellationToken::new();
        let tokenizer = ModelTokenizer::embedded_default().expect("embedded tokenizer");
        let handle = spawn(config, tokenizer, shutdown.clone())
            .await
            .expect("mock engine starts");
        Engine {
            handle,
            shutdown,
            http: reqwest::Client::new(),
        }
    }

    async fn fast() -> Engine {
        Engine::start(MockEngineConfig {
            speedup: 1000.0,
            ..MockEngineConfig::default()
        })
        .await
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.handle.base_url()))
            .json(&body)
            .send()
            .await
            .expect("request sent")
    }

    async fn post_json(&self, path: &str, body: Value) -> Value {
        let response = self.post(path, body).await;
        assert_eq!(response.status(), 200);
        response.json().await.expect("JSON body")
    }

    async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.handle.base_url());
        let response = self.http.get(url).send().await.expect("scraped");
        response.text().await.expect("text")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.handle.stopped().await.expect("clean stop");
    }
}

async fn bounded<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test timed out");
}

fn chat(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "any",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// The JSON chunks of an SSE body, and whether it ended with `[DONE]`.
fn sse_chunks(body: &str) -> (Vec<Value>, bool) {
    let data: Vec<&str> = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    let done = data.last() == Some(&"[DONE]");
    let chunks = data
        .iter()
        .filter(|d| **d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect();
    (chunks, done)
}

/// A `gauge` or counter value from the metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(&format!("{name}{{")))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

#[tokio::test]
async fn chat_completion_counts_the_templated_prompt() {
    bounded(async {
        let engine = Engine::fast().await;
        let body = engine
            .post_json("/v1/chat/completions", chat("Hello there", 5, false))
            .await;
        let tokenizer = ModelTokenizer::embedded_default().expect("tokenizer");
        let messages = [json!({"role": "user", "content": "Hello there"})];
        let prompt = tokenizer
            .encode_chat(&switchyard_tokenizer::ChatTemplateInput {
                messages: &messages,
                add_generation_prompt: true,
                ..Default::default()
            })
            .expect("encoded");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "smollm2-135m-instruct");
        assert_eq!(body["choices"][0]["message"]["role"], "assistant");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        let content = body["choices"][0]["message"]["content"].as_str();
        assert!(content.is_some_and(|c| !c.is_empty()));
        assert_eq!(body["usage"]["prompt_tokens"], prompt.len());
        assert_eq!(body["usage"]["completion_tokens"], 5);
        assert_eq!(body["usage"]["total_tokens"], prompt.len() + 5);
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn streamed_chat_matches_the_plain_answer() {
    bounded(async {
        let engine = Engine::fast().await;
        let plain = engine
            .post_json("/v1/chat/completions", chat("Tell me more", 12, false))
            .await;
        let response = engine
            .post("/v1/chat/completions", chat("Tell me more", 12, true))
            .await;
        assert_eq!(response.status(), 200);
        let (chunks, done) = sse_chunks(&response.text().await.expect("body"));
        assert!(done);
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, plain["choices"][0]["message"]["content"]);
        let usage = chunks.last().expect("usage chunk");
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 12);
        let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
        assert_eq!(finish, "length");
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn completions_take_lists_of_token_ids() {
    bounded(async {
        let engine = Engine::fast().await;
        let request = json!({"prompt": [[1000, 1001, 1002], [2000, 2001]], "max_tokens": 3});
        let body = engine.post_json("/v1/completions", request).await;
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"].as_array().map(Vec::len), Some(2));
        assert_eq!(body["choices"][1]["index"], 1);
        assert_eq!(body["usage"]["prompt_tokens"], 5);
        assert_eq!(body["usage"]["completion_tokens"], 6);

        let request =
            json!({"prompt": [1000, 1001], "stream": true, "nvext": {"agent_hints": {"osl": 4}}});
        let response = engine.post("/v1/completions", request).await;
        let (chunks, done) = sse_chunks(&response.text().await.expect("body"));
        assert!(done);
        assert_eq!(
            chunks.len(),
            4,
            "one chunk per token, no usage unless asked"
        );
        assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");

        let request = json!({"prompt": [1000, 99_999_999], "max_tokens": 3});
        let response = engine.post("/v1/completions", request).await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.expect("error body");
        assert_eq!(
            error["error"]["message"],
            "Token id 99999999 is out of vocabulary"
        );
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    bounded(async {
        let engine = Engine::fast().await;
        let prompt: Vec<u32> = (1000..1040).collect();
        let request = json!({"prompt": prompt, "max_tokens": 2});
        let first = engine.post_json("/v1/completions", request.clone()).await;
        let second = engine.post_json("/v1/completions", request).await;
        assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            second["usage"]["prompt_tokens_details"]["cached_tokens"],
            32
        );

        let metrics = engine.metrics().await;
        assert_eq!(metric(&metrics, "vllm:prefix_cache_queries_total"), 80.0);
        assert_eq!(metric(&metrics, "vllm:prefix_cache_hits_total"), 32.0);
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn metrics_use_vllm_names() {
    bounded(async {
        let engine = Engine::fast().await;
        engine
            .post_json("/v1/completions", json!({"prompt": "Hi", "max_tokens": 3}))
            .await;
        let text = engine.metrics().await;
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
        ] {
            metric(&text, name);
        }
        assert_eq!(metric(&text, "vllm:generation_tokens_total"), 3.0);
        assert_eq!(metric(&text, "vllm:request_success_total"), 1.0);
        assert!(
            text.contains(r#"vllm:cache_config_info{block_size="16",num_gpu_blocks="16384"} 1"#)
        );
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    bounded(async {
        let engine = Engine::fast().await;
        let response = engine
            .http
            .post(format!("{}/v1/chat/completions", engine.handle.base_url()))
            .body("{not json")
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["type"], "BadRequestError");
        assert!(body["error"]["message"].is_string());
        assert!(body["error"].get("param").is_some());

        let too_long = json!({"prompt": vec![1000; 270_000], "max_tokens": 1});
        assert_eq!(engine.post("/v1/completions", too_long).await.status(), 400);
        let empty = json!({"prompt": [], "max_tokens": 1});
        assert_eq!(engine.post("/v1/completions", empty).await.status(), 400);

        let models: Value = engine
            .http
            .get(format!("{}/v1/models", engine.handle.base_url()))
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("JSON");
        assert_eq!(models["data"][0]["id"], "smollm2-135m-instruct");
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn kv_events_rehash_to_the_routers_blocks() {
    bounded(async {
        let engine = Engine::start(MockEngineConfig {
            speedup: 1000.0,
            kv_events: Some("tcp://127.0.0.1:0".to_owned()),
            replay_endpoint: Some("tcp://127.0.0.1:0".to_owned()),
            ..MockEngineConfig::default()
        })
        .await;
        let (ops_tx, mut ops) = mpsc::channel(64);
        let stats = Arc::new(SubscriberStats::default());
        let subscriber = tokio::spawn(run_subscriber(
            SubscriberConfig {
                rank: Rank::new(0, 0),
                block_size: 16,
                endpoint: engine
                    .handle
                    .kv_events_endpoint()
                    .expect("events")
                    .to_owned(),
                replay_endpoint: engine.handle.replay_endpoint().map(str::to_owned),
                bind: false,
                topic: String::new(),
                format: WireFormat::Vllm,
                engine_names: None,
            },
            ops_tx,
            stats.clone(),
            engine.shutdown.clone(),
        ));
        while !stats.snapshot().connected {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A PUB socket drops what it sends before the subscription has arrived.
        tokio::time::sleep(Duration::from_millis(200)).await;

        let prompt: Vec<u32> = (1000..1064).collect();
        engine
            .post_json(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": 1}),
            )
            .await;
        let stored = loop {
            match ops.recv().await.expect("subscriber running") {
                IndexOp::Store { blocks, .. } => break blocks,
                _ => continue,
            }
        };
        assert_eq!(stored, BlockHasher::new(16).sequence(&prompt));

        let reset = format!("{}/reset_prefix_cache", engine.handle.base_url());
        let response = engine.http.post(reset).send().await.expect("sent");
        assert_eq!(response.status(), 200);
        while !matches!(ops.recv().await, Some(IndexOp::Clear { .. })) {}
        engine.stop().await;
        subscriber.await.expect("subscriber stops");
    })
    .await;
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_request() {
    bounded(async {
        // Real time: 4,000 tokens take far longer than the test.
        let engine = Engine::start(MockEngineConfig::default()).await;
        let response = engine
            .post(
                "/v1/chat/completions",
                chat("Write a long story", 4000, true),
            )
            .await;
        let mut body = response.bytes_stream();
        body.next().await.expect("first chunk").expect("bytes");
        assert_eq!(
            metric(&engine.metrics().await, "vllm:num_requests_running"),
            1.0
        );
        drop(body);
        while metric(&engine.metrics().await, "vllm:num_requests_running") != 0.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            metric(&engine.metrics().await, "vllm:kv_cache_usage_perc"),
            0.0
        );
        engine.stop().await;
    })
    .await;
}

/// A prompt sent with `nvext.cache_control` keeps its KV through a flood of other prompts that
/// evicts an unpinned one.
#[tokio::test]
async fn cache_control_pins_the_prompt_through_eviction_pressure() {
    bounded(async {
        let engine = Engine::start(MockEngineConfig {
            speedup: 1000.0,
            num_blocks: 64,
            ..MockEngineConfig::default()
        })
        .await;
        let prompt = |seed: u32| (0..320).map(|i| 1000 + seed * 7 + i).collect::<Vec<u32>>();
        let cached =
            |body: &Value| body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        let pinned = json!({"prompt": prompt(0), "max_tokens": 1,
                            "nvext": {"cache_control": {"type": "ephemeral", "ttl": "1h"}}});
        let unpinned = json!({"prompt": prompt(1), "max_tokens": 1});
        engine.post_json("/v1/completions", pinned.clone()).await;
        engine.post_json("/v1/completions", unpinned.clone()).await;
        // 20 blocks each: the flood needs every unpinned block of the 64-block cache.
        for seed in 2..8 {
            let flood = json!({"prompt": prompt(seed), "max_tokens": 1});
            engine.post_json("/v1/completions", flood).await;
        }
        let again = engine.post_json("/v1/completions", pinned).await;
        assert_eq!(
            cached(&again),
            Some(320 - 16),
            "the pinned prompt stayed cached"
        );
        let again = engine.post_json("/v1/completions", unpinned).await;
        assert_eq!(cached(&again), Some(0), "the unpinned prompt was evicted");
        let bad = engine
            .post(
                "/v1/completions",
                json!({"prompt": [1, 2], "nvext": {"cache_control": {"ttl": "forever"}}}),
            )
            .await;
        assert_eq!(bad.status(), 400);
        engine.stop().await;
    })
    .await;
}

/// The value of one exact series (`name` or `name{labels}`) in the metrics text.
fn series(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

/// A mock engine with a host tier behind a small device, publishing KV events.
async fn tiered_engine() -> Engine {
    Engine::start(MockEngineConfig {
        speedup: 1000.0,
        num_blocks: 64,
        host_tier: Some(switchyard_mock_engine::HostTierConfig {
            num_blocks: 64,
            block_bytes: 4096,
            bandwidth_bytes_per_s: 1e9,
        }),
        kv_events: Some("tcp://127.0.0.1:0".to_owned()),
        replay_endpoint: Some("tcp://127.0.0.1:0".to_owned()),
        ..MockEngineConfig::default()
    })
    .await
}

/// Subscribe to the engine's KV events as the router's index sees them (router hashes).
async fn subscribe(engine: &Engine) -> mpsc::Receiver<IndexOp> {
    let (ops_tx, ops) = mpsc::channel(256);
    let stats = Arc::new(SubscriberStats::default());
    tokio::spawn(run_subscriber(
        SubscriberConfig {
            rank: Rank::new(0, 0),
            block_size: 16,
            endpoint: engine
                .handle
                .kv_events_endpoint()
                .expect("events")
                .to_owned(),
            replay_endpoint: engine.handle.replay_endpoint().map(str::to_owned),
            bind: false,
            topic: String::new(),
            format: WireFormat::Vllm,
            engine_names: None,
        },
        ops_tx,
        stats.clone(),
        engine.shutdown.clone(),
    ));
    while !stats.snapshot().connected {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A PUB socket drops what it sends before the subscription has arrived.
    tokio::time::sleep(Duration::from_millis(200)).await;
    ops
}

/// Wait for an op on `tier` of kind `store` (else remove) naming every block of `blocks`.
async fn until_op(
    ops: &mut mpsc::Receiver<IndexOp>,
    store: bool,
    tier: Tier,
    blocks: &[SequenceHash],
) {
    let mut seen = std::collections::HashSet::new();
    while !blocks.iter().all(|b| seen.contains(b)) {
        match ops.recv().await.expect("subscriber running") {
            IndexOp::Store {
                tier: t, blocks, ..
            } if store && t == tier => seen.extend(blocks),
            IndexOp::Remove {
                tier: t, blocks, ..
            } if !store && t == tier => seen.extend(blocks),
            _ => {}
        }
    }
}

fn hints_envelope(actions: Value) -> Value {
    json!({"protocol_version": "0.1", "message_id": "m-1", "actions": actions})
}

fn hint(kind: &str, hashes: &[u64], tier: Option<&str>) -> Value {
    json!({
        "action_id": format!("{kind}-1"),
        "action_type": format!("switchyard.kv.{kind}"),
        "action_version": "1",
        "payload": {"block_hashes": hashes, "tier": tier, "session_id": "s-1"},
    })
}

/// The templated prompt of one user message, as the engine tokenizes it.
fn chat_prompt(content: &str) -> Vec<u32> {
    let tokenizer = ModelTokenizer::embedded_default().expect("tokenizer");
    let messages = [json!({"role": "user", "content": content})];
    tokenizer
        .encode_chat(&switchyard_tokenizer::ChatTemplateInput {
            messages: &messages,
            add_generation_prompt: true,
            ..Default::default()
        })
        .expect("encoded")
}

const LONG_QUESTION: &str = "Tell me about the history of the railways through the Alps, \
    the tunnels under the Gotthard and the Simplon, and how the switchyards at their ends \
    sorted the freight trains before and after electrification.";

/// A chat turn, a demote of its prompt's blocks (named by the engine's hashes), a prefetch,
/// and the next turn: the device loses the blocks and the host keeps them (KV events), the
/// prefetch brings them back as a device hit, and the metrics count each hint.
#[tokio::test]
async fn kv_hints_move_a_turns_prompt_down_and_back() {
    bounded(async {
        let engine = tiered_engine().await;
        let mut ops = subscribe(&engine).await;
        let prompt = chat_prompt(LONG_QUESTION);
        let engine_hashes: Vec<u64> = BlockHasher::with_seed(16, ENGINE_SEED)
            .sequence(&prompt)
            .iter()
            .map(|h| h.0)
            .collect();
        let router_hashes = BlockHasher::new(16).sequence(&prompt);
        let blocks = engine_hashes.len();
        assert!(blocks >= 3, "a prompt of several blocks");

        let first = engine
            .post_json("/v1/chat/completions", chat(LONG_QUESTION, 2, false))
            .await;
        assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        until_op(&mut ops, true, Tier::Host, &router_hashes).await;

        // The router's hashes are not the engine's: a hint must name the engine's.
        let router_named: Vec<u64> = router_hashes.iter().map(|h| h.0).collect();
        let envelope = hints_envelope(json!([hint("demote", &router_named, Some("host"))]));
        let reply = engine.post_json("/v1/kv_hints", envelope).await;
        assert_eq!(reply["outcomes"][0]["outcome"], "missing");

        let envelope = hints_envelope(json!([hint("demote", &engine_hashes, Some("host"))]));
        let reply = engine.post_json("/v1/kv_hints", envelope).await;
        assert_eq!(reply["message_id"], "m-1");
        assert_eq!(reply["outcomes"][0]["action_id"], "demote-1");
        assert_eq!(reply["outcomes"][0]["outcome"], "accepted");
        assert_eq!(reply["outcomes"][0]["blocks"], blocks);
        until_op(&mut ops, false, Tier::Device, &router_hashes).await;
        let metrics = engine.metrics().await;
        assert!(series(&metrics, r#"kvbm_tier_usage_blocks{tier="g2"}"#) >= blocks as f64);
        assert_eq!(series(&metrics, "kvbm_demoted_blocks"), blocks as f64);

        let envelope = hints_envelope(json!([hint("prefetch", &engine_hashes, Some("device"))]));
        let reply = engine.post_json("/v1/kv_hints", envelope).await;
        assert_eq!(reply["outcomes"][0]["outcome"], "accepted");
        assert_eq!(reply["outcomes"][0]["blocks"], blocks);
        until_op(&mut ops, true, Tier::Device, &router_hashes).await;

        let next = engine
            .post_json("/v1/chat/completions", chat(LONG_QUESTION, 2, false))
            .await;
        let reusable = (prompt.len() - 1) / 16 * 16;
        assert_eq!(
            next["usage"]["prompt_tokens_details"]["cached_tokens"],
            reusable
        );
        let metrics = engine.metrics().await;
        assert_eq!(
            metric(&metrics, "vllm:prefix_cache_hits_total"),
            reusable as f64,
            "a device hit"
        );
        assert_eq!(series(&metrics, "kvbm_onboard_blocks_h2d"), 0.0);
        assert_eq!(series(&metrics, "kvbm_prefetch_blocks"), blocks as f64);
        let demoted = r#"mock_kv_hints_total{action="demote",outcome="accepted"}"#;
        assert_eq!(series(&metrics, demoted), 1.0);
        let missed = r#"mock_kv_hints_total{action="demote",outcome="missing"}"#;
        assert_eq!(series(&metrics, missed), 1.0);
        let prefetched = r#"mock_kv_hint_blocks_total{action="prefetch",outcome="accepted"}"#;
        assert_eq!(series(&metrics, prefetched), blocks as f64);
        engine.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_kv_hints_endpoint_advertises_and_refuses_bad_envelopes() {
    bounded(async {
        let engine = Engine::fast().await;
        let url = format!("{}/v1/kv_hints", engine.handle.base_url());
        let advertised: Value = engine
            .http
            .get(&url)
            .send()
            .await
            .expect("sent")
            .json()
            .await
            .expect("JSON");
        assert_eq!(advertised["protocol_version"], "0.1");
        let types = advertised["action_types"].as_array().expect("a list");
        assert!(types.contains(&json!("switchyard.kv.pin")));
        assert!(
            !types.contains(&json!("switchyard.kv.demote")),
            "no lower tier to demote to"
        );

        let response = engine
            .http
            .post(&url)
            .body("{\"protocol_version\": \"0.1\"")
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(body["error"]["type"], "BadRequestError");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("invalid kv_hints envelope"), "{message}");

        let mut envelope = hints_envelope(json!([hint("evict", &[1], None)]));
        envelope["protocol_version"] = json!("0.2");
        let response = engine.post("/v1/kv_hints", envelope).await;
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.expect("JSON error");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("\"0.2\""), "{message}");

        let mut unknown = hint("evict", &[1], None);
        unknown["action_type"] = json!("kv.fetch");
        let reply = engine
            .post_json("/v1/kv_hints", hints_envelope(json!([unknown])))
            .await;
        assert_eq!(reply["outcomes"][0]["outcome"], "rejected");
        let metrics = engine.metrics().await;
        let other = r#"mock_kv_hints_total{action="other",outcome="rejected"}"#;
        assert_eq!(series(&metrics, other), 1.0);
        engine.stop().await;
    })
    .await;
}

/// A `kv_hints` field rides on a request (vLLM's merged field): applied before the request is
/// scheduled, and counted.
#[tokio::test]
async fn a_kv_hints_field_on_a_request_is_applied_first() {
    bounded(async {
        let engine = Engine::fast().await;
        let old: Vec<u32> = (1000..1040).collect();
        let old_hashes: Vec<u64> = BlockHasher::with_seed(16, ENGINE_SEED)
            .sequence(&old)
            .iter()
            .map(|h| h.0)
            .collect();
        let run = json!({"prompt": old, "max_tokens": 1});
        engine.post_json("/v1/completions", run.clone()).await;
        let with_hints = json!({
            "prompt": [2000, 2001, 2002], "max_tokens": 1,
            "kv_hints": hints_envelope(json!([hint("evict", &old_hashes, None)])),
        });
        engine.post_json("/v1/completions", with_hints).await;
        let again = engine.post_json("/v1/completions", run).await;
        assert_eq!(
            again["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
            "evicted"
        );
        let metrics = engine.metrics().await;
        let evicted = r#"mock_kv_hint_blocks_total{action="evict",outcome="accepted"}"#;
        assert_eq!(series(&metrics, evicted), 2.0);

        let mut bad = hints_envelope(json!([]));
        bad["protocol_version"] = json!("9");
        let refused = json!({"prompt": [1, 2], "max_tokens": 1, "kv_hints": bad});
        assert_eq!(engine.post("/v1/completions", refused).await.status(), 400);
        engine.stop().await;
    })
    .await;
}
