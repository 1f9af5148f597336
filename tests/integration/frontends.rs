//! The three client APIs, driven by the official Python SDKs (`openai`, `anthropic`) against the
//! gateway and mock engines, in both upstream modes and with the engines' answers streamed or
//! whole (`[server] engine_stream`): `tests/python/frontends.py` checks each API's shapes (the
//! SDKs' typed models refuse anything else), streaming and not, a tool-call round trip in each,
//! usage, the Responses store, and that one conversation is the same tokens through all three.

use crate::support::{Gateway, MockEngine, client, get_text, metric_sum};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const CHECKS: &[&str] = &[
    "ok chat",
    "ok chat stream",
    "ok chat tool round trip",
    "ok responses",
    "ok responses stream",
    "ok responses tool round trip",
    "ok messages",
    "ok messages stream",
    "ok messages tool round trip",
    "ok messages error shape",
    "ok same tokens through three APIs",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn has_sdks(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A python3 that can import `openai` and `anthropic`: the system's (CI installs them), else a
/// venv at `target/pyenv` where they are installed once.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let system = PathBuf::from("python3");
        if has_sdks(&system) {
            return system;
        }
        let venv = workspace().join("target/pyenv");
        let python = venv.join("bin/python");
        if !has_sdks(&python) {
            if !python.exists() {
                let made = Command::new("python3")
                    .arg("-m")
                    .arg("venv")
                    .arg(&venv)
                    .status();
                assert!(made.is_ok_and(|s| s.success()), "python3 -m venv failed");
            }
            let installed = Command::new(&python)
                .args(["-m", "pip", "install", "-q", "openai", "anthropic"])
                .status();
            assert!(
                installed.is_ok_and(|s| s.success()),
                "pip install openai anthropic failed: this test needs PyPI access"
            );
        }
        python
    })
}

async fn conformance(mode: &str, engine_stream: &str) {
    let engines = [
        MockEngine::start(200.0, 4096),
        MockEngine::start(200.0, 4096),
    ];
    // The mock engine's model thinks in `<think>` tags and calls tools in hermes format.
    let mut config = format!(
        "[server]\nengine_stream = \"{engine_stream}\"\n\
         [model]\nreasoning_parser = \"qwen3\"\ntool_parser = \"hermes\"\n"
    );
    config += &Gateway::config_for(&engines.iter().collect::<Vec<_>>(), "kv-cost").replace(
        "kind = \"mock\"\n",
        &format!("kind = \"mock\"\nupstream = \"{mode}\"\n"),
    );
    let gateway = Gateway::start(&config);
    let models: Value =
        serde_json::from_str(&get_text(&format!("{}/v1/models", gateway.url)).await).unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_owned();
    let script = workspace().join("tests/python/frontends.py");
    let url = gateway.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([&url, &model, "16"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{mode} mode, {engine_stream}:\n{stdout}\n{stderr}"
    );
    for check in CHECKS {
        assert!(
            stdout.lines().any(|l| l == *check),
            "{mode}, {engine_stream}: missing `{check}`:\n{stdout}"
        );
    }
    // Only a streamed engine answer has a first token to time: with whole answers, the
    // non-streaming requests are answered but not timed.
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    let answered = metric_sum(&metrics, "switchyard_request_duration_seconds_count");
    let timed = metric_sum(&metrics, "switchyard_ttft_seconds_count");
    if engine_stream == "always" {
        assert_eq!(timed, answered, "{metrics}");
    } else {
        assert!(0.0 < timed && timed < answered, "{metrics}");
    }
}

#[tokio::test]
async fn official_sdks_conform_in_tokens_mode() {
    conformance("tokens", "always").await;
}

#[tokio::test]
async fn official_sdks_conform_in_chat_mode() {
    conformance("chat", "always").await;
}

/// The engine's whole answer for a client that does not stream, read by the gateway's own
/// parsers (tokens mode) or the engine's (chat mode).
#[tokio::test]
async fn official_sdks_conform_with_whole_engine_answers() {
    conformance("tokens", "as-client").await;
    conformance("chat", "as-client").await;
}

#[tokio::test]
async fn malformed_requests_get_400s_in_their_own_apis_shape() {
    let engine = MockEngine::start(200.0, 1024);
    let gateway = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": "hi"}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "n": 2, "messages": [{"role": "user", "content": "hi"}]}),
            "n",
        ),
        ("/v1/responses", json!({"model": "m", "input": 42}), "input"),
        (
            "/v1/messages",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            "max_tokens",
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                   "nvext": {"cache_control": {"type": "ephemeral", "ttl": "forever"}}}),
            "ttl",
        ),
        // The model's template is text-only: an image is named, not Jinja's type error.
        (
            "/v1/chat/completions",
            json!({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
            "the conversation has an image",
        ),
        (
            "/v1/messages",
            json!({"model": "smollm2-135m-instruct", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                 "data": "AAAA"}}]}]}),
            "the conversation has an image",
        ),
    ];
    for (path, body, field) in cases {
        let r = client()
            .post(format!("{}{path}", gateway.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path} {body}");
        let error: Value = r.json().await.unwrap();
        let message = if path == "/v1/messages" {
            assert_eq!(error["type"], "error", "{error}");
            error["error"]["message"].as_str().unwrap().to_owned()
        } else {
            error["error"]["message"].as_str().unwrap().to_owned()
        };
        assert!(
            message.contains(field),
            "{path}: `{message}` should name `{field}`"
        );
    }
    let garbage = client()
        .post(format!("{}/v1/messages", gateway.url))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);
    let error: Value = garbage.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
}

/// `nvext.agent_hints.speculative_prefill` warms the next turn: once the answer ends, the history
/// plus the answer is sent ahead to the same worker, so the next turn finds all of it cached.
/// `nvext.cache_control` reaches the mock engine as a pin.
#[tokio::test]
async fn agent_hints_warm_the_next_turn_and_pin_the_prefix() {
    let engine = MockEngine::start(200.0, 4096);
    let config = Gateway::config_for(&[&engine], "kv-cost").replace(
        "kind = \"mock\"\n",
        "kind = \"mock\"\nupstream = \"tokens\"\n",
    );
    let gateway = Gateway::start(&config);
    let answer: String = (0..60).map(|i| format!("step {i} done. ")).collect();
    let first = vec![json!({"role": "user", "content": format!("Plan it. [[mock:say {answer}]]")})];
    let chat = |messages: &Vec<Value>, nvext: Value| {
        client()
            .post(format!("{}/v1/chat/completions", gateway.url))
            .header("x-dynamo-session-id", "warm-1")
            .json(&json!({"model": "smollm2-135m-instruct", "max_tokens": 400,
                          "messages": messages, "nvext": nvext}))
            .send()
    };
    let nvext = json!({"agent_hints": {"speculative_prefill": true},
                       "cache_control": {"type": "ephemeral", "ttl": "1h"}});
    let reply: Value = chat(&first, nvext).await.unwrap().json().await.unwrap();
    let content = reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(content, answer);
    let sent = crate::support::eventually(20, async || {
        let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
        metric_sum(
            &metrics,
            "switchyard_speculative_prefills_total{outcome=\"sent\"}",
        ) == 1.0
    })
    .await;
    assert!(sent, "the speculative prefill was not sent");
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_cache_pins_total{outcome=\"sent\"}"),
        1.0
    );
    // The next turn: the answer, then the user's reply. Everything up to the end of the answer
    // (its closing template tokens included) was computed ahead.
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": content}));
    next.push(json!({"role": "user", "content": "Go on."}));
    let reply: Value = chat(&next, json!({})).await.unwrap().json().await.unwrap();
    let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Only the new user turn (and the partial block before it) is left to compute.
    assert!(prompt - cached <= 32, "cached {cached} of {prompt}");
    // The engine served three requests: the turn, the prefill sent ahead, the next turn.
    assert_eq!(engine.metric("vllm:request_success_total").await, 3.0);
}
