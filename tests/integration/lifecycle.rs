//! The gateway's own lifecycle: a graceful stop that cannot hang on a stream that never ends.
//! (A rolling restart behind Envoy with no failed request is in `envoy.rs`.)

use crate::support::{Gateway, MockEngine, client};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_drain_timeout_is_cut_and_the_gateway_exits() {
    // Slow engines (a tenth of real speed): a 2,000-token answer would take minutes.
    let engine = MockEngine::start(0.1, 4096);
    let config = format!(
        "[server]\ndrain_timeout = \"1s\"\n{}",
        Gateway::config_for(&[&engine], "kv-cost")
    );
    let gateway = Gateway::start(&config);
    let body = json!({"model": "smollm2-135m-instruct", "max_tokens": 2000, "stream": true,
        "messages": [{"role": "user", "content": "Write a very long story."}]});
    let response = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let signalled = Instant::now();
    gateway.proc.terminate();
    // The client sees its stream end without [DONE] once the deadline passes...
    let text = response.text().await.unwrap_or_default();
    assert!(!text.contains("[DONE]"), "the stream was not cut: {text}");
    // ...and the gateway exits cleanly by itself, after the deadline and not long after it.
    let mut gateway = gateway;
    let status =
        tokio::task::spawn_blocking(move || gateway.proc.exited_within(Duration::from_secs(20)))
            .await
            .unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(signalled.elapsed() >= Duration::from_secs(1));
}
