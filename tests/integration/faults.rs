//! Faults between the gateway and an engine (docs/reliability.md, "Faults and load"): a TCP
//! proxy of ours stands in front of a real mock-engine process and breaks its answers in the
//! ways networks and engines do; the client must always see a retry before the first byte or a
//! clean error in its API's own shape after it, and the gateway must release what it booked.

use crate::support::{Gateway, MockEngine, client, eventually, get_text, metric_sum, sample};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to the next answer on each connection.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Forward everything.
    None,
    /// Reset the connection (RST) when the engine's answer starts, before any byte reaches the
    /// gateway.
    ResetBeforeResponse,
    /// Forward this many bytes of the answer (head included), then reset.
    ResetAfter(usize),
    /// Forward this many bytes, then nothing more, holding the connection open.
    StallAfter(usize),
    /// Hold the answer's first byte back this long.
    SlowFirstByte(Duration),
}

/// A proxy on 127.0.0.1 in front of one engine. The fault is read each time the gateway sends
/// request bytes, so it applies to the next answer even on a pooled keep-alive connection.
struct FaultProxy {
    url: String,
    fault: Arc<Mutex<Fault>>,
    /// Dropped with the proxy: its thread and every connection end.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FaultProxy {
    fn start(engine: &MockEngine) -> FaultProxy {
        let upstream = engine.url.trim_start_matches("http://").to_owned();
        let fault = Arc::new(Mutex::new(Fault::None));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shared = fault.clone();
        // Its own thread and runtime: the proxy serves whatever the test's runtime is doing.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let accept = async {
                    while let Ok((client, _)) = listener.accept().await {
                        let (upstream, fault) = (upstream.clone(), shared.clone());
                        tokio::spawn(async move {
                            if let Ok(engine) = TcpStream::connect(&upstream).await {
                                relay(client, engine, fault).await;
                            }
                        });
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        FaultProxy {
            url,
            fault,
            _stop: stop,
        }
    }

    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }
}

/// How a relayed connection ended.
enum End {
    Closed,
    Reset,
    Stalled,
}

async fn relay(mut client: TcpStream, mut engine: TcpStream, current: Arc<Mutex<Fault>>) {
    let _ = client.set_nodelay(true);
    let (mut up, mut down) = (vec![0; 64 << 10], vec![0; 64 << 10]);
    // The fault in force for the answer being relayed, and how much of it went out.
    let (mut fault, mut forwarded) = (Fault::None, 0);
    let end = loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let Ok(n @ 1..) = read else { break End::Closed };
                // Request bytes: the next answer is under the fault now in force.
                fault = *current.lock().unwrap();
                forwarded = 0;
                if engine.write_all(&up[..n]).await.is_err() {
                    break End::Closed;
                }
            }
            read = engine.read(&mut down) => {
                let Ok(n @ 1..) = read else { break End::Closed };
                let (send, end) = match fault {
                    Fault::None => (n, None),
                    Fault::ResetBeforeResponse => (0, Some(End::Reset)),
                    Fault::ResetAfter(limit) | Fault::StallAfter(limit) => {
                        let send = n.min(limit.saturating_sub(forwarded));
                        let end = if matches!(fault, Fault::ResetAfter(_)) {
                            End::Reset
                        } else {
                            End::Stalled
                        };
                        (send, (forwarded + send >= limit).then_some(end))
                    }
                    Fault::SlowFirstByte(delay) => {
                        if forwarded == 0 {
                            tokio::time::sleep(delay).await;
                        }
                        (n, None)
                    }
                };
                if client.write_all(&down[..send]).await.is_err() {
                    break End::Closed;
                }
                forwarded += send;
                if let Some(end) = end {
                    break end;
                }
            }
        }
    };
    match end {
        End::Closed => {}
        // SO_LINGER 0: closing sends an RST instead of a FIN.
        End::Reset => {
            let _ = client.set_zero_linger();
        }
        // Forward nothing more; keep the connection until the gateway gives up on it.
        End::Stalled => while let Ok(1..) = client.read(&mut up).await {},
    }
}

const MODEL: &str = "smollm2-135m-instruct";

/// Answers that run to `max_tokens`, so that a fault lands mid-answer.
const LONG_ANSWERS: &[&str] = &["--answer-median-tokens", "1000000"];

/// A gateway whose first worker is `engines[0]` reached through `proxy`.
fn gateway_via(proxy: &FaultProxy, engines: &[&MockEngine], policy: &str, extra: &str) -> Gateway {
    let config = Gateway::config_for(engines, policy).replace(&engines[0].url, &proxy.url);
    Gateway::start(&format!("{extra}\n{config}"))
}

fn chat(content: &str, stream: bool, max_tokens: u32) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": content}]})
}

/// Status, the serving worker and the body of one request.
async fn post(url: &str, path: &str, body: &Value) -> (u16, String, String) {
    let r = client()
        .post(format!("{url}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let worker = r
        .headers()
        .get("x-switchyard-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    // Bounded: a hung stream fails the test instead of hanging it.
    let text = tokio::time::timeout(Duration::from_secs(60), r.text())
        .await
        .expect("the answer never ended")
        .unwrap_or_default();
    (status, worker, text)
}

/// Nothing booked on the gateway, nothing running on the engine, once the fault is over.
async fn released(gateway: &Gateway, engine: &MockEngine) -> bool {
    eventually(20, async || {
        engine.metric("vllm:num_requests_running").await == 0.0
            && metric_sum(
                &get_text(&format!("{}/metrics", gateway.url)).await,
                "switchyard_worker_in_flight",
            ) == 0.0
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_the_first_byte_is_retried_on_the_other_worker() {
    let (first, second) = (MockEngine::start(50.0, 4096), MockEngine::start(50.0, 4096));
    let proxy = FaultProxy::start(&first);
    // Health checks far apart: only the failed attempt itself can notice.
    let extra = "[server]\nhealth_interval = \"1h\"\n";
    let gateway = gateway_via(&proxy, &[&first, &second], "round-robin", extra);
    let mut workers = std::collections::BTreeSet::new();
    for i in 0..4 {
        let (status, worker, body) = post(
            &gateway.url,
            "/v1/chat/completions",
            &chat(&format!("warm {i}"), false, 4),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        workers.insert(worker);
    }
    assert_eq!(
        workers.len(),
        2,
        "both workers serve while nothing is wrong"
    );
    proxy.set(Fault::ResetBeforeResponse);
    for i in 0..6 {
        let (status, worker, body) = post(
            &gateway.url,
            "/v1/chat/completions",
            &chat(&format!("hi {i}"), i % 2 == 0, 4),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(worker, "1.0");
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_upstream_retries_total"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "switchyard_worker_healthy", &["worker=\"0.0\""]),
        0.0
    );
    assert!(released(&gateway, &first).await && released(&gateway, &second).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_mid_answer_ends_it_with_an_error_in_each_apis_own_shape() {
    let engine = MockEngine::start_with(5.0, 4096, LONG_ANSWERS);
    let proxy = FaultProxy::start(&engine);
    let gateway = gateway_via(&proxy, &[&engine], "kv-cost", "");
    proxy.set(Fault::ResetAfter(2_000));
    let messages = json!({"model": MODEL, "max_tokens": 300, "stream": true,
        "messages": [{"role": "user", "content": "a long story, please"}]});
    let responses = json!({"model": MODEL, "max_output_tokens": 300, "stream": true,
        "input": "a long story, please"});
    let cases = [
        (
            "/v1/chat/completions",
            chat("a long story", true, 300),
            "data: {\"error\"",
        ),
        ("/v1/messages", messages, "event: error"),
        ("/v1/responses", responses, "event: response.failed"),
    ];
    for (path, body, error) in cases {
        let (status, _, text) = post(&gateway.url, path, &body).await;
        assert_eq!(status, 200, "{path}: {text}");
        assert!(text.contains(error), "{path}: no `{error}` in {text}");
        assert!(text.contains("interrupted"), "{path}: {text}");
    }
    let (_, _, text) = post(
        &gateway.url,
        "/v1/chat/completions",
        &chat("again", true, 300),
    )
    .await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("\"finish_reason\":\""), "{text}");
    // Not streamed: the client gets the error itself, in its API's shape.
    let (status, _, text) =
        post(&gateway.url, "/v1/chat/completions", &chat("x", false, 300)).await;
    assert_eq!(status, 502, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{error}"
    );
    assert!(
        released(&gateway, &engine).await,
        "a broken answer left a booking"
    );
    // And the worker serves again once the network does.
    proxy.set(Fault::None);
    let (status, _, text) = post(&gateway.url, "/v1/chat/completions", &chat("ok", true, 20)).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_stalls_ends_after_the_idle_timeout_with_an_error() {
    let engine = MockEngine::start_with(5.0, 4096, LONG_ANSWERS);
    let proxy = FaultProxy::start(&engine);
    let extra = "[server]\nstream_idle_timeout = \"1s\"\n";
    let gateway = gateway_via(&proxy, &[&engine], "kv-cost", extra);
    proxy.set(Fault::StallAfter(2_000));
    let started = Instant::now();
    let (status, _, text) = post(
        &gateway.url,
        "/v1/chat/completions",
        &chat("story", true, 300),
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains("stream_idle_timeout"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let (status, _, text) = post(
        &gateway.url,
        "/v1/chat/completions",
        &chat("story", false, 300),
    )
    .await;
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("stream_idle_timeout"), "{text}");
    assert!(
        released(&gateway, &engine).await,
        "a stalled answer left a booking"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_byte_is_waited_for_and_not_retried() {
    let engine = MockEngine::start(50.0, 4096);
    let proxy = FaultProxy::start(&engine);
    // The idle timeout counts from the answer's start: a slow head is `request_timeout`'s.
    let extra = "[server]\nstream_idle_timeout = \"1s\"\nhealth_interval = \"1h\"\n";
    let gateway = gateway_via(&proxy, &[&engine], "kv-cost", extra);
    proxy.set(Fault::SlowFirstByte(Duration::from_millis(1_500)));
    for stream in [false, true] {
        let started = Instant::now();
        let (status, _, text) =
            post(&gateway.url, "/v1/chat/completions", &chat("hi", stream, 8)).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
        assert!(started.elapsed() >= Duration::from_millis(1_500));
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_upstream_retries_total"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_worker_costs_no_request_and_comes_back() {
    let (first, second) = (MockEngine::start(50.0, 4096), MockEngine::start(50.0, 4096));
    let proxy = FaultProxy::start(&first);
    let extra = "[server]\nhealth_interval = \"100ms\"\n";
    let gateway = gateway_via(&proxy, &[&first, &second], "round-robin", extra);
    let mut failed = Vec::new();
    for phase in 0..12 {
        // Down, up, down...: health checks and requests both meet it.
        proxy.set(if phase % 2 == 0 {
            Fault::ResetBeforeResponse
        } else {
            Fault::None
        });
        for i in 0..3 {
            let body = chat(&format!("phase {phase} request {i}"), i == 1, 4);
            let (status, _, text) = post(&gateway.url, "/v1/chat/completions", &body).await;
            if status != 200 {
                failed.push(format!("{phase}/{i}: {status} {text}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(failed.is_empty(), "{failed:?}");
    proxy.set(Fault::None);
    let back = eventually(20, async || {
        let (status, worker, _) = post(
            &gateway.url,
            "/v1/chat/completions",
            &chat("back?", false, 4),
        )
        .await;
        status == 200 && worker == "0.0"
    })
    .await;
    assert!(back, "the worker never came back once it was well");
    assert!(released(&gateway, &first).await && released(&gateway, &second).await);
}

/// A turn of about 20 blocks, its own after the first (`task` leads; the first block is the chat
/// template's default system prompt, which every turn shares): (status, body).
async fn context_turn(gateway: &Gateway, task: &str) -> (u16, String) {
    let body = chat(
        &format!("{task} {}", "with a long shared context ".repeat(60)),
        false,
        4,
    );
    let (status, _, body) = post(&gateway.url, "/v1/chat/completions", &body).await;
    (status, body)
}

/// What the gateway's index holds for the engine against what the engine says it holds, on
/// the device: (index, engine).
async fn index_and_engine(gateway: &Gateway, engine: &MockEngine) -> (f64, f64) {
    let ours = get_text(&format!("{}/metrics", gateway.url)).await;
    let theirs = get_text(&format!("{}/metrics", engine.url)).await;
    (
        sample(&ours, "switchyard_kv_index_blocks", &["tier=\"device\""]),
        metric_sum(&theirs, "mock_prefix_cache_blocks"),
    )
}

/// The blocks the index and the engine agree on (some), within 20 s; or the last counts seen.
async fn index_agrees(gateway: &Gateway, engine: &MockEngine) -> Result<f64, (f64, f64)> {
    let mut last = (0.0, 0.0);
    let agreed = eventually(20, async || {
        last = index_and_engine(gateway, engine).await;
        last.0 == last.1 && last.1 > 0.0
    })
    .await;
    if agreed { Ok(last.1) } else { Err(last) }
}

/// An engine that crashes and comes back on the same addresses (an empty cache, its events
/// numbered from 0 again): the gateway's index, which held the old engine's blocks, ends up
/// holding exactly what the new engine holds, and no request fails.
///
/// Before the fix the index kept the dead engine's blocks (58 against the new engine's 21):
/// the new engine's first events went out before the subscriber had reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_engine_restart_the_index_matches_what_the_engine_holds() {
    let mut engine = MockEngine::start(50.0, 4096);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let turn = async |task: &str| context_turn(&gateway, task).await.0;
    for task in ["first", "second", "third"] {
        assert_eq!(turn(task).await, 200);
    }
    let before = index_agrees(&gateway, &engine)
        .await
        .unwrap_or_else(|last| panic!("index vs engine blocks before the restart: {last:?}"));

    engine.restart();
    // The health check may not have seen the crash: a request to the dead engine is retried
    // until the new one answers, or meets it already up.
    let served = eventually(20, async || turn("after the restart").await == 200).await;
    assert!(served, "no request served after the restart");
    let after = index_agrees(&gateway, &engine)
        .await
        .unwrap_or_else(|last| {
            panic!("index vs engine blocks after the restart: {last:?} (before: {before})")
        });
    assert!(
        after < before,
        "the new engine holds only the turn after the restart: {after} vs {before}"
    );
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert!(
        metric_sum(&metrics, "switchyard_kv_events_clears_total") >= 1.0,
        "the reconnection started the rank over"
    );
}

/// Flip the engine's KV-event fault switches (`switchyard mock-engine --fault-switches`).
async fn event_faults(engine: &MockEngine, faults: Value) {
    let r = client()
        .post(format!("{}/debug/kv_events", engine.url))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
}

/// The engine's event stream loses batches while its replay socket answers nothing, under
/// concurrent traffic: every request is answered, the failed replay is counted and clears the
/// rank, and once the engine's cache has turned over the index holds exactly what the engine
/// holds (never a block it evicted); nothing stays booked. Once the replay socket answers
/// again, a later loss is recovered by replay without a clear.
///
/// The cache (128 blocks, a turn is ~20) is full before the fault, so the lost batches hold
/// evictions: without the clear the index keeps claiming the evicted blocks (253 against the
/// engine's 127). After the clear the index must learn the rank again under the template's
/// first block, which the engine keeps and never stores again (before that was fixed it stayed
/// at 0 against 127).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_events_with_the_replay_socket_down_under_load_clear_the_rank_and_cost_no_request() {
    let engine = MockEngine::start_with(50.0, 128, &["--fault-switches"]);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let turn = async |task: String| {
        let (status, body) = context_turn(&gateway, &task).await;
        assert_eq!(status, 200, "{task}: {body}");
    };
    let counter = async |name: &str| {
        let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
        metric_sum(&metrics, name)
    };
    for n in 0..8 {
        turn(format!("before the fault {n}")).await;
    }
    let full = index_agrees(&gateway, &engine)
        .await
        .unwrap_or_else(|last| panic!("index vs engine blocks before the fault: {last:?}"));
    assert!(
        full > 100.0,
        "the cache is not full before the fault: {full} blocks"
    );

    event_faults(&engine, json!({"lose_batches": 6, "replay": "silent"})).await;
    // 4 clients x 6 turns, each its own prompt of ~20 blocks: ~480 blocks through the full
    // cache while the gateway misses the first batches.
    let turn = &turn;
    let clients = (0..4).map(|client| async move {
        for n in 0..6 {
            turn(format!("client {client} task {n}")).await;
        }
    });
    futures::future::join_all(clients).await;
    // The subscriber gives up on the silent replay socket (2 s) and clears the rank.
    let failed = eventually(20, async || {
        counter("switchyard_kv_events_replay_failures_total").await >= 1.0
    })
    .await;
    assert!(failed, "no failed replay counted");
    assert!(counter("switchyard_kv_events_gaps_total").await >= 1.0);
    assert!(counter("switchyard_kv_events_clears_total").await >= 1.0);
    // A request or two more: the index learns again from live events and agrees with the
    // engine, whose cache holds only blocks stored after the clear.
    for n in 0..2 {
        turn(format!("after the load {n}")).await;
    }
    index_agrees(&gateway, &engine)
        .await
        .unwrap_or_else(|(index, held)| {
            panic!("after the lost batches the index holds {index} blocks, the engine {held}")
        });
    assert!(released(&gateway, &engine).await, "something stayed booked");

    // The replay socket answers again: the next loss is replayed, nothing more is cleared.
    let (clears, failures, replays) = (
        counter("switchyard_kv_events_clears_total").await,
        counter("switchyard_kv_events_replay_failures_total").await,
        counter("switchyard_kv_events_replays_total").await,
    );
    event_faults(&engine, json!({"lose_batches": 1, "replay": "answering"})).await;
    for n in 0..3 {
        turn(format!("after the fault {n}")).await;
    }
    let replayed = eventually(20, async || {
        counter("switchyard_kv_events_replays_total").await > replays
    })
    .await;
    assert!(replayed, "the later loss was never replayed");
    assert_eq!(
        counter("switchyard_kv_events_replay_failures_total").await,
        failures
    );
    assert_eq!(counter("switchyard_kv_events_clears_total").await, clears);
    index_agrees(&gateway, &engine)
        .await
        .unwrap_or_else(|last| panic!("index vs engine blocks after the replay: {last:?}"));
}
