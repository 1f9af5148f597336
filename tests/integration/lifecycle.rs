//! The gateway's own lifecycle: a graceful stop that cannot hang on a stream that never ends, and
//! configuration reloads under traffic, and what it stored outliving a crash.
//! (A rolling restart behind Envoy with no failed request is in `envoy.rs`.)

use crate::support::{Gateway, MockEngine, Proc, TempFile, client, eventually};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_the_drain_timeout_ends_with_an_error_and_the_gateway_exits() {
    // A slow engine (a tenth of real speed) whose answers run to their limit: a 2,000-token
    // answer would take minutes.
    let engine = MockEngine::start_with(0.1, 4096, &["--answer-median-tokens", "1000000"]);
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
    // Once the deadline passes the stream ends, unfinished, with an error event in its API's
    // shape...
    let text = response.text().await.unwrap_or_default();
    assert!(
        !text.contains("\"finish_reason\":\""),
        "the stream finished: {text}"
    );
    assert!(text.contains("shutting down"), "no error event: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // ...and the gateway exits cleanly by itself, after the deadline and not long after it.
    let mut gateway = gateway;
    let status =
        tokio::task::spawn_blocking(move || gateway.proc.exited_within(Duration::from_secs(20)))
            .await
            .unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(signalled.elapsed() >= Duration::from_secs(1));
}

/// The status a chat request for `model` gets.
async fn status_of(url: &str, model: &str) -> u16 {
    let body = json!({"model": model, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hello!"}]});
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// Configuration reloads under traffic: a change of the file takes effect without a restart, a
/// file that does not validate changes nothing (and the log names what is wrong), SIGHUP reloads
/// too, a change that needs a restart is said to; no request fails meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_reloads_under_traffic_and_a_bad_one_changes_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let engine = MockEngine::start(20.0, 4096);
    let base = Gateway::config_for(&[&engine], "kv-cost");
    let gateway = Gateway::start_logged(&base, "info");
    let url = gateway.url.clone();
    // Traffic under the served model's name the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let lanes: Vec<_> = (0..3)
        .map(|_| {
            let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
            let url = url.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = if status_of(&url, "smollm2-135m-instruct").await == 200 {
                        &served
                    } else {
                        &failed
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    assert_eq!(
        status_of(&url, "claude-sonnet-4-5").await,
        404,
        "no alias yet"
    );

    // The file changes: the alias is in force without a restart.
    let aliased = format!("[model]\naliases = [\"claude-*\"]\n{base}");
    std::fs::write(&gateway.config.path, &aliased).unwrap();
    let line = gateway.proc.wait_for_line("configuration reloaded");
    assert!(line.contains("model.aliases"), "{line}");
    assert_eq!(status_of(&url, "claude-sonnet-4-5").await, 200);

    // A file that does not validate: refused, named, and the alias stays.
    std::fs::write(
        &gateway.config.path,
        format!("[server]\nmax_body_byte = 1\n{aliased}"),
    )
    .unwrap();
    let line = gateway.proc.wait_for_line("configuration not reloaded");
    assert!(line.contains("max_body_byte"), "{line}");
    assert_eq!(status_of(&url, "claude-sonnet-4-5").await, 200);

    // A second engine joins the fleet; then the first leaves: from then on every request is
    // served by the newcomer, and the one that left is no longer probed or listed.
    let other = MockEngine::start(20.0, 4096);
    let listed = Gateway::config_for(&[&other], "kv-cost");
    let second = &listed[listed.find("[[workers]]").unwrap()..];
    std::fs::write(&gateway.config.path, format!("{aliased}{second}")).unwrap();
    let line = gateway.proc.wait_for_line("configuration reloaded");
    assert!(line.contains("workers"), "{line}");
    let both = eventually(20, async || {
        other.metric("vllm:request_success_total").await > 0.0
    })
    .await;
    assert!(both, "the engine that joined never got a request");
    let first = &base[..base.find("[[workers]]").unwrap()];
    std::fs::write(
        &gateway.config.path,
        format!("[model]\naliases = [\"claude-*\"]\n{first}{second}"),
    )
    .unwrap();
    let line = gateway.proc.wait_for_line("configuration reloaded");
    assert!(line.contains("workers"), "{line}");
    for _ in 0..10 {
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&json!({"model": "claude-x", "max_tokens": 4,
                "messages": [{"role": "user", "content": "Who serves?"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-switchyard-worker"], "1.0");
    }
    let metrics = crate::support::get_text(&format!("{url}/metrics")).await;
    assert!(
        metrics.contains("switchyard_worker_healthy{worker=\"0.0\"} 0"),
        "{metrics}"
    );

    // SIGHUP reads the file again; a change that shaped state at start says it needs a restart.
    std::fs::write(
        &gateway.config.path,
        format!("[frontend]\nresponse_store_entries = 10\n[model]\naliases = [\"claude-*\"]\n{first}{second}"),
    )
    .unwrap();
    let line = gateway.proc.wait_for_line("in force only after a restart");
    assert!(line.contains("frontend"), "{line}");
    gateway.proc.hang_up();
    let line = gateway.proc.wait_for_line("configuration reloaded");
    assert!(line.contains("SIGHUP"), "{line}");

    stop.store(true, Ordering::Relaxed);
    for lane in lanes {
        lane.await.unwrap();
    }
    let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
    assert!(
        metrics.contains("switchyard_config_reloads_total{outcome=\"refused\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "{} served",
        served.load(Ordering::Relaxed)
    );
    assert!(served.load(Ordering::Relaxed) > 0);
}

/// One Responses API turn (non-streaming), continuing `previous` when given: its id and its
/// prompt's size in tokens.
async fn respond(url: &str, previous: Option<&str>, input: &str) -> (u16, serde_json::Value) {
    let mut body = json!({"model": "smollm2-135m-instruct", "max_output_tokens": 8,
        "input": input});
    if let Some(id) = previous {
        body["previous_response_id"] = id.into();
    }
    let r = client()
        .post(format!("{url}/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_survive_a_kill_and_a_torn_last_line() {
    let engine = MockEngine::start(20.0, 4096);
    let holder = TempFile::new("keep", "");
    let dir = holder.path.parent().unwrap().join("responses");
    let config = format!(
        "[frontend]\nresponse_store_dir = \"{}\"\n{}",
        dir.display(),
        Gateway::config_for(&[&engine], "kv-cost")
    );
    // A conversation of five chained turns, then SIGKILL: no drain, no flush at exit.
    let mut gateway = Gateway::start(&config);
    let mut ids = Vec::new();
    let mut prompt_tokens = Vec::new();
    for turn in 0..5 {
        let (status, body) = respond(
            &gateway.url,
            ids.last().map(String::as_str),
            &format!("turn {turn}: tell me more about the harbour"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        ids.push(body["id"].as_str().unwrap().to_owned());
        prompt_tokens.push(body["usage"]["input_tokens"].as_u64().unwrap());
    }
    gateway.proc.kill();
    // What a crash in the middle of a write would leave after the whole lines: one cut short.
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    segments.sort();
    let newest = segments.last().expect("a journal segment");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(newest)
        .unwrap();
    std::io::Write::write_all(&mut file, br#"{"v":1,"id":"resp_torn","messa"#).unwrap();
    drop(file);

    // Started on the same file, its log read from the first line (the store is read before the
    // listener opens).
    let path = gateway.config.path.to_string_lossy().to_string();
    let restarted = Proc::switchyard_logged(&["serve", "--config", &path, "--port", "0"], "info");
    let said = restarted.wait_for_line("cut off when the gateway stopped");
    assert!(said.contains("lines=1"), "{said}");
    let url = restarted.wait_for("gateway on ");
    // Every stored turn continues, with its whole history in the prompt.
    for (turn, id) in ids.iter().enumerate() {
        let (status, body) = respond(&url, Some(id), "and then?").await;
        assert_eq!(status, 200, "turn {turn}: {body}");
        let tokens = body["usage"]["input_tokens"].as_u64().unwrap();
        assert!(
            tokens > prompt_tokens[turn],
            "turn {turn}: {tokens} prompt tokens, the stored turn had {}",
            prompt_tokens[turn]
        );
    }
    let (status, body) = respond(&url, Some("resp_torn"), "hi").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "previous_response_not_found");
}
