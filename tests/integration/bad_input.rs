//! Bad input, dead workers and disconnecting clients: clear errors in OpenAI's shape, never a
//! panic, every rejection counted.

use crate::support::{Gateway, MockEngine, client, eventually, get_text, metric_sum};
use serde_json::{Value, json};
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct";

fn chat(content: &str) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4})
}

async fn post_raw(
    url: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let json =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("error body is not JSON: {text}"));
    (status, json, headers)
}

fn assert_openai_error(body: &Value, needle: &str) {
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an OpenAI error: {body}"));
    assert!(body["error"]["type"].is_string(), "{body}");
    assert!(
        message.contains(needle),
        "{message:?} should mention {needle:?}"
    );
}

/// A URL nothing listens on.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_are_counted() {
    let engine = MockEngine::start(50.0, 4096);
    let config = Gateway::config_for(&[&engine], "kv-cost") + "[server]\nmax_body_bytes = 4096\n";
    // `[server]` after `[[workers]]` is still a top-level table in TOML.
    let gateway = Gateway::start(&config);
    let url = &gateway.url;

    let (status, body, _) = post_raw(url, "{not json").await;
    assert_eq!(status, 400);
    assert_openai_error(&body, "invalid JSON");

    let (status, body, _) =
        post_raw(url, json!({"model": MODEL, "messages": "hi"}).to_string()).await;
    assert_eq!(status, 400);
    assert_openai_error(&body, "messages");

    let (status, body, _) = post_raw(
        url,
        json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(),
    )
    .await;
    assert_eq!(status, 404);
    assert_openai_error(&body, "gpt-9");

    let (status, body, _) = post_raw(url, chat(&"long ".repeat(2000)).to_string()).await;
    assert_eq!(status, 413);
    assert_openai_error(&body, "4096");

    let unknown = client()
        .get(format!("{url}/v2/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // A good request still works after all that.
    let (status, body, _) = post_raw(url, chat("hello").to_string()).await;
    assert_eq!(status, 200, "{body}");

    let metrics = get_text(&format!("{url}/metrics")).await;
    for reason in [
        "bad_request",
        "unknown_model",
        "too_large",
        "no_such_endpoint",
    ] {
        let line = format!("switchyard_rejected_total{{reason=\"{reason}\"}}");
        assert!(
            metric_sum(&metrics, &line) > 0.0,
            "{reason} not counted:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn engine_errors_pass_through_with_their_status() {
    let engine = MockEngine::start(50.0, 4096);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let mut body = chat("hello");
    body["max_tokens"] = json!(-5);
    let (status, error, _) = post_raw(&gateway.url, body.to_string()).await;
    let direct = client()
        .post(format!("{}/v1/chat/completions", engine.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        status,
        direct.status().as_u16(),
        "the engine's status is passed through"
    );
    assert!((400..500).contains(&status));
    assert!(error["error"].is_object(), "{error}");
}

#[tokio::test]
async fn no_healthy_worker_is_503_with_retry_after() {
    let config = format!("[[workers]]\nurl = \"{}\"\nkind = \"openai\"\n", dead_url());
    let gateway = Gateway::start(&config);
    let (status, body, headers) = post_raw(&gateway.url, chat("hello").to_string()).await;
    assert_eq!(status, 503, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert_openai_error(&body, "no healthy worker");
    let health = client()
        .get(format!("{}/health", gateway.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 503);
}

#[tokio::test]
async fn a_worker_that_dies_is_skipped_and_requests_retry_elsewhere() {
    let (doomed, survivor) = (MockEngine::start(50.0, 4096), MockEngine::start(50.0, 4096));
    // Health checks far apart: only the failed attempt itself can notice the death, once the
    // probes at start have seen both engines up.
    let config = Gateway::config_for(&[&doomed, &survivor], "round-robin")
        + "[server]\nhealth_interval = \"1h\"\n";
    let gateway = Gateway::start_logged(&config, "warn,switchyard_gateway::upstream=debug");
    let probed = gateway
        .proc
        .wait_for_line_since_start("health probes answered");
    assert!(probed.contains("passed=2"), "{probed}");
    let (status, _, _) = post_raw(&gateway.url, chat("warm up").to_string()).await;
    assert_eq!(status, 200);
    drop(doomed);
    for i in 0..6 {
        let (status, body, headers) =
            post_raw(&gateway.url, chat(&format!("hello {i}")).to_string()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers["x-switchyard-worker"], "1.0");
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_upstream_retries_total"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "switchyard_worker_healthy{worker=\"0.0\"}"),
        0.0
    );
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_the_engine_request() {
    let engine = MockEngine::start(1.0, 4096);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let mut body = chat("tell me a very long story");
    body["max_tokens"] = json!(4000);
    body["stream"] = json!(true);
    let mut response = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Read a little of the stream, then hang up.
    let first = tokio::time::timeout(Duration::from_secs(30), response.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    assert_eq!(engine.metric("vllm:num_requests_running").await, 1.0);
    drop(response);
    let released = eventually(20, async || {
        engine.metric("vllm:num_requests_running").await == 0.0
            && metric_sum(
                &get_text(&format!("{}/metrics", gateway.url)).await,
                "switchyard_worker_in_flight",
            ) == 0.0
    })
    .await;
    assert!(
        released,
        "the engine kept generating for a client that left"
    );
}

/// Beyond `[server] max_concurrent_requests`, a 503 with `Retry-After` in the client API's own
/// shape; a stream holds its place until it ends, then the next request gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_concurrency_limit_requests_are_shed_until_a_stream_ends() {
    let engine = MockEngine::start(1.0, 4096);
    let config = format!(
        "[server]\nmax_concurrent_requests = 2\n{}",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    let url = gateway.url.clone();
    let stream = json!({"model": MODEL, "max_tokens": 40, "stream": true,
        "messages": [{"role": "user", "content": "Tell me a story."}]});
    // Two streams in flight: their headers are back, their bodies still coming.
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&stream)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let (status, body, headers) = post_raw(&url, chat("One more?").to_string()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 2"),
        "{body}"
    );
    // Anthropic's API answers in its own shape.
    let r = client()
        .post(format!("{url}/v1/messages"))
        .json(&json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    // The streams end; their places free up.
    for r in open {
        assert!(r.text().await.unwrap().contains("[DONE]"));
    }
    let (status, body, _) = post_raw(&url, chat("Now?").to_string()).await;
    assert_eq!(status, 200, "{body}");
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("switchyard_rejected_total{reason=\"overloaded\"} 2"),
        "{metrics}"
    );
}

/// An engine that accepts connections and never answers (the fault that blocked every request
/// behind one hung backend in vLLM's production-stack router): requests sent to it time out and
/// are retried on the other worker before any byte reached the client, its health check takes it
/// out, and nothing else waits on it. The hung engine is a bare TCP listener: a fault, not a model
/// of an engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_never_answers_blocks_nothing() {
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hung.incoming().flatten() {
            held.push(stream); // kept open, never read, never answered
        }
    });
    let engine = MockEngine::start(50.0, 4096);
    let config = format!(
        "[server]\nrequest_timeout = \"3s\"\nhealth_interval = \"500ms\"\n\
         [router]\npolicy = \"round-robin\"\n\
         [[workers]]\nurl = \"{hung_url}\"\nkind = \"mock\"\n\
         [[workers]]\nurl = \"{}\"\nkind = \"mock\"\nkv_events = \"{}\"\nreplay = \"{}\"\n",
        engine.url, engine.kv_events, engine.replay
    );
    let gateway = Gateway::start(&config);
    let requests = (0..8).map(|i| {
        let url = gateway.url.clone();
        async move { post_raw(&url, chat(&format!("hung {i}")).to_string()).await }
    });
    for (status, body, headers) in futures::future::join_all(requests).await {
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers["x-switchyard-worker"], "1.0");
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_worker_healthy{worker=\"0.0\"}"),
        0.0,
        "{metrics}"
    );
}

/// `POST {url}{path}` with `body` and `headers`: status and JSON body.
async fn post_with(url: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = client().post(format!("{url}{path}")).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_apis_need_one_of_the_api_keys_and_say_so_in_their_own_shape() {
    let engine = MockEngine::start(100.0, 1024);
    let key_file = crate::support::TempFile::new("api-key", "from-a-file\n");
    let config = format!(
        "[server]\napi_keys = [{{ key = \"inline-key\" }}, {{ key_file = \"{}\" }}]\n{}",
        key_file.path.display(),
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    let url = gateway.url.as_str();
    let messages = json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]});

    // No key, or a wrong one: a 401 in each API's own error shape.
    let (status, body) = post_with(url, "/v1/chat/completions", &chat("hi"), &[]).await;
    assert_eq!(status, 401);
    assert_openai_error(&body, "API key");
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let wrong = [("authorization", "Bearer inline-ke")];
    let (status, _) = post_with(url, "/v1/chat/completions", &chat("hi"), &wrong).await;
    assert_eq!(status, 401);
    let (status, body) = post_with(url, "/v1/messages", &messages, &[("x-api-key", "nope")]).await;
    assert_eq!(status, 401);
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
    let models = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);

    // Either key, either header, any API.
    let bearer = [("authorization", "Bearer inline-key")];
    let (status, _) = post_with(url, "/v1/chat/completions", &chat("hi"), &bearer).await;
    assert_eq!(status, 200);
    let anthropic = [("x-api-key", "from-a-file")];
    let (status, body) = post_with(url, "/v1/messages", &messages, &anthropic).await;
    assert_eq!(status, 200, "{body}");
    // Operations endpoints stay open for probes and scrapers.
    let health = client().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("switchyard_rejected_total{reason=\"invalid_api_key\"} 3"),
        "{metrics}"
    );
}

/// `key` is refused in Anthropic's shape too, while the key `free` is served.
async fn held_back_alone(url: &str, key: &str) {
    let messages = json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, body) = post_with(url, "/v1/messages", &messages, &[("x-api-key", key)]).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    let free = [("authorization", "Bearer free")];
    let (status, _) = post_with(url, "/v1/chat/completions", &chat("hi"), &free).await;
    assert_eq!(status, 200, "another key is not held back");
}

/// A key with `max_in_flight` gets a 429 with `Retry-After` beyond it, in its API's shape, while
/// other keys are served; its place frees when its stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_beyond_its_in_flight_limit_waits_and_other_keys_do_not() {
    let engine = MockEngine::start_with(1.0, 4096, &["--answer-median-tokens", "1000000"]);
    let config = format!(
        "[server]\napi_keys = [{{ key = \"capped\", max_in_flight = 1 }}, {{ key = \"free\" }}]\n{}",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    let url = gateway.url.as_str();
    let capped = [("authorization", "Bearer capped")];
    let mut long = chat("tell me a very long story");
    long["max_tokens"] = json!(4000);
    long["stream"] = json!(true);
    let mut stream = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer capped")
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert!(
        stream.chunk().await.unwrap().is_some(),
        "the stream started"
    );

    let refused = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer capped")
        .json(&chat("one more"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_openai_error(&body, "limit of 1 requests in flight");
    held_back_alone(url, "capped").await;

    drop(stream);
    // The gateway notices the client gone at its next chunk: a try before that is refused too.
    let mut refused_again = 0;
    let freed = eventually(20, async || {
        let status = post_with(url, "/v1/chat/completions", &chat("again"), &capped)
            .await
            .0;
        refused_again += u32::from(status == 429);
        status == 200
    })
    .await;
    assert!(
        freed,
        "the key's place never came back after its stream ended"
    );
    let metrics = get_text(&format!("{url}/metrics")).await;
    let rejected = format!(
        "switchyard_rejected_total{{reason=\"key_limit\"}} {}",
        2 + refused_again
    );
    assert!(metrics.contains(&rejected), "{rejected}:\n{metrics}");
}

/// A key with `tokens_per_minute` is let in until it overdraws; then a 429 with a
/// `Retry-After` of the seconds its refill needs, in its API's shape, while other keys are
/// served. What the key used is counted from the prompt and the completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_its_tokens_per_minute_is_told_when_to_come_back() {
    let engine = MockEngine::start(1.0, 4096);
    let config = format!(
        "[server]\napi_keys = [{{ key = \"metered\", tokens_per_minute = 120 }}, {{ key = \"free\" }}]\n{}",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    let url = gateway.url.as_str();
    let metered = [("authorization", "Bearer metered")];
    // Well over the 120 tokens the minute allows: let in (the bucket was full), then in debt.
    let mut big = chat(&"the quick brown fox jumps over the lazy dog ".repeat(40));
    big["max_tokens"] = json!(8);
    let (status, body) = post_with(url, "/v1/chat/completions", &big, &metered).await;
    assert_eq!(status, 200, "{body}");
    let used = body["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used > 300, "the prompt is what overdraws: {body}");

    let refused = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("authorization", "Bearer metered")
        .json(&chat("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // 2 tokens a second pay back (used - 120) tokens of debt.
    let debt = used - 120;
    assert!(
        (debt / 2..=debt / 2 + 2).contains(&retry_after),
        "Retry-After {retry_after} for a debt of {debt} tokens at 2/s"
    );
    let body: Value = refused.json().await.unwrap();
    assert_openai_error(&body, "120 tokens per minute");
    held_back_alone(url, "metered").await;
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("switchyard_rejected_total{reason=\"key_tokens\"} 2"),
        "{metrics}"
    );
}

/// TCP connections established to `port` on this machine, counted from the client's side
/// (`/proc/net/tcp`: the remote port is `port`, the state `01`, ESTABLISHED).
fn connections_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(2).is_some_and(|r| r.ends_with(&remote)) && fields.get(3) == Some(&"01")
        })
        .count()
}

/// Answers one after another share one kept connection to the engine, and `/metrics` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_in_turn_reuse_one_engine_connection() {
    let engine = MockEngine::start(20.0, 4096);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    for turn in 0..5 {
        let (status, body, _) =
            post_raw(&gateway.url, chat(&format!("Turn {turn}.")).to_string()).await;
        assert_eq!(status, 200, "{body}");
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    let count = |name| metric_sum(&metrics, name);
    assert_eq!(
        count("switchyard_upstream_connections_opened_total"),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        count("switchyard_upstream_connections_reused_total"),
        4.0,
        "{metrics}"
    );
}

/// After a burst of concurrent streams the gateway keeps at most `upstream_max_idle_per_engine`
/// idle answer connections to the engine (the others are closed as their answers end), where
/// without the cap it keeps one per stream of the burst for the idle timeout (90 s). The health
/// probes have a pool (and a connection) of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_engine_connections_are_capped_after_a_burst() {
    const BURST: usize = 12;
    let engine = MockEngine::start(20.0, 4096);
    let port: u16 = engine.url.rsplit(':').next().unwrap().parse().unwrap();
    let burst = async |url: &str| {
        let stream = json!({"model": MODEL, "max_tokens": 32, "stream": true,
            "messages": [{"role": "user", "content": "Tell me a story."}]});
        let requests = (0..BURST).map(|_| async {
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&stream)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            // Every header is back before any body is read: the streams overlap.
            r
        });
        let open = futures::future::join_all(requests).await;
        for r in open {
            assert!(r.text().await.unwrap().contains("[DONE]"));
        }
    };

    // Without the cap: the burst's connections stay open, idle (the burst did open many).
    let uncapped = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    burst(&uncapped.url).await;
    let kept = connections_to(port);
    assert!(kept > 2, "{kept} connections after a burst of {BURST}");
    drop(uncapped);
    assert!(eventually(10, async || connections_to(port) == 0).await);

    let capped = Gateway::start(&format!(
        "[server]\nupstream_max_idle_per_engine = 2\n{}",
        Gateway::config_for(&[&engine], "kv-cost")
    ));
    burst(&capped.url).await;
    assert!(
        eventually(10, async || connections_to(port) <= 2 + 1).await,
        "{} connections kept with a cap of 2 (and a probe's)",
        connections_to(port)
    );
    // The gateway still serves after closing them.
    let (status, body, _) = post_raw(&capped.url, chat("Still there?").to_string()).await;
    assert_eq!(status, 200, "{body}");
}
