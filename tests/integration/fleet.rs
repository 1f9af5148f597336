//! A dynamic fleet through the admin API: a mock engine added with `POST /admin/workers` gets
//! requests, its KV events are indexed (a repeated prompt goes back to it once its booking has
//! expired, and the gateway counts its event batches), a reload of the file keeps it, and after
//! `DELETE /admin/workers` it gets no more traffic.

use crate::support::{Gateway, MockEngine, client, eventually, get_text, metric_sum};
use serde_json::{Value, json};
use std::time::Duration;

const WRITER: &str = "fleet-writer";

/// A prompt of many KV blocks, one per `topic`.
fn prompt(topic: usize) -> String {
    let words: Vec<String> = (0..160).map(|i| format!("w{topic}x{i}")).collect();
    format!("Topic {topic}. {}", words.join(" "))
}

/// The worker (`x-switchyard-worker`) that served one chat request with `content`.
async fn served_by(url: &str, content: &str) -> String {
    let body = json!({"model": "smollm2-135m-instruct", "max_tokens": 32,
        "messages": [{"role": "user", "content": content}]});
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.headers()["x-switchyard-worker"]
        .to_str()
        .unwrap()
        .to_string()
}

async fn admin(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = client().request(method, url).bearer_auth(WRITER);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The gateway's count of KV-event batches from `worker` (`worker.dp_rank`).
async fn event_batches(gateway: &Gateway, worker: &str) -> f64 {
    let text = get_text(&format!("{}/metrics", gateway.url)).await;
    let label = format!("worker=\"{worker}\"");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&label)).collect();
    metric_sum(&lines.join("\n"), "switchyard_kv_events_messages_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_through_the_admin_api_serves_until_it_is_removed() {
    let resident = MockEngine::start(20.0, 4096);
    let added = MockEngine::start(20.0, 4096);
    // Bookings expire fast, so that only the index (fed by KV events) can explain a repeated
    // prompt going back to the worker that computed it.
    let config =
        Gateway::config_for(&[&resident], "kv-cost").replacen(
            "[router]\n",
            "[router]\nbooking_ttl = \"100ms\"\n",
            1,
        ) + &format!("[policies]\nadmin_tokens = [{{ role = \"write\", token = \"{WRITER}\" }}]\n");
    let gateway = Gateway::start_logged(&config, "info");
    let workers = format!("{}/admin/workers", gateway.url);

    let entry = json!({"url": added.url, "kind": "mock", "kv_events": added.kv_events,
        "replay": added.replay});
    let (status, member) = admin(reqwest::Method::POST, &workers, Some(entry.clone())).await;
    assert_eq!(status, 201, "{member}");
    assert_eq!(member["source"], "admin");
    assert_eq!(member["id"], 1);
    let (status, _) = admin(reqwest::Method::POST, &workers, Some(entry)).await;
    assert_eq!(status, 409, "the same URL twice");

    // Its event stream connects (it joined cold and subscribed).
    let connected = eventually(20, async || {
        let (_, list) = admin(reqwest::Method::GET, &workers, None).await;
        list["workers"][1]["ranks"][0]["events"]["connected"] == json!(true)
    })
    .await;
    assert!(connected, "the added worker's KV events never connected");

    // Requests reach it: a burst of different prompts spreads over both workers by load.
    let url = gateway.url.clone();
    let burst = (0..8).map(|topic| {
        let url = url.clone();
        tokio::spawn(async move { (topic, served_by(&url, &prompt(topic)).await) })
    });
    let mut on_added = None;
    for placed in futures::future::join_all(burst).await {
        let (topic, worker) = placed.unwrap();
        if worker == "1.0" {
            on_added = Some(topic);
        }
    }
    let topic = on_added.expect("no request reached the added worker");
    assert!(added.metric("vllm:request_success_total").await >= 1.0);
    // Its KV events are indexed: batches counted, and the same prompt, with no booking left to
    // predict it, goes back to the worker that holds its prefix.
    let indexed = eventually(20, async || event_batches(&gateway, "1.0").await > 0.0).await;
    assert!(indexed, "no KV events from the added worker");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        assert_eq!(served_by(&gateway.url, &prompt(topic)).await, "1.0");
    }

    // A reload of the file (its aliases change) keeps the admin's worker.
    std::fs::write(
        &gateway.config.path,
        format!("[model]\naliases = [\"claude-*\"]\n{config}"),
    )
    .unwrap();
    let line = gateway.proc.wait_for_line("configuration reloaded");
    assert!(
        line.contains("model.aliases") && !line.contains("workers"),
        "{line}"
    );
    let (_, list) = admin(reqwest::Method::GET, &workers, None).await;
    let sources: Vec<&Value> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["source"])
        .collect();
    assert_eq!(sources, [&json!("config"), &json!("admin")], "{list}");

    // The file's worker cannot be deleted through the API; the admin's can.
    let delete = |url: &str| {
        format!(
            "{workers}?url={}",
            url.replace(':', "%3A").replace('/', "%2F")
        )
    };
    let (status, _) = admin(reqwest::Method::DELETE, &delete(&resident.url), None).await;
    assert_eq!(status, 409);
    let (status, removed) = admin(reqwest::Method::DELETE, &delete(&added.url), None).await;
    assert_eq!(status, 200, "{removed}");
    let (status, _) = admin(reqwest::Method::DELETE, &delete(&added.url), None).await;
    assert_eq!(status, 404);

    // No more traffic to it, not even for the prompt it holds.
    let before = added.metric("vllm:request_success_total").await;
    for topic in [topic, topic, 100, 101, 102] {
        assert_eq!(served_by(&gateway.url, &prompt(topic)).await, "0.0");
    }
    assert_eq!(added.metric("vllm:request_success_total").await, before);
    let (_, list) = admin(reqwest::Method::GET, &workers, None).await;
    assert_eq!(list["workers"].as_array().unwrap().len(), 1, "{list}");
}
