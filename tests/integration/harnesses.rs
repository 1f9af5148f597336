//! The real coding-agent CLIs against `switchyard serve` (embedded default): Claude Code, Codex
//! and OpenCode from npm (pinned in tests/harnesses/package.json, installed into
//! target/harnesses by tests/harnesses/install.sh), each run non-interactively in a private home
//! with a dummy key and telemetry off, on 127.0.0.1 only.
//!
//! Each test asserts on what the gateway saw (its trace, with request bodies, and its request
//! counters by harness and status), not only on the CLI's exit code. A mock engine answers a
//! prompt that ends with `[[mock:tool_call NAME {args}]]` with that call in the model's format,
//! so a real tool round trip runs: the harness executes the tool and sends its result back.

use crate::support::{Proc, TempFile, get_text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use switchyard_gateway::trace::{TraceLine, read_trace, record::EventType};

/// How long one CLI run may take before it is killed (and the test fails).
const RUN_LIMIT: Duration = Duration::from_secs(90);

/// What the tool in the round-trip tests prints: the next request must carry it back. The command
/// that prints it ([`TOOL_COMMAND`]) does not contain it, so only a real tool result can.
const TOOL_OUTPUT: &str = "switchyard-tool-ok";
const TOOL_COMMAND: &str = "printf switchyard-%s-ok tool";

/// The folder of the installed CLIs, installing them once per test process.
fn harness_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/harnesses/install.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run tests/harnesses/install.sh (needs node and npm)");
        assert!(out.status.success(), "installing the harness CLIs failed");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The gateway on the embedded default, tracing requests with their bodies.
struct Served {
    url: String,
    trace: PathBuf,
    _proc: Proc,
    _config: TempFile,
}

impl Served {
    fn start(extra_toml: &str) -> Served {
        let holder = TempFile::new("switchyard.toml", "");
        let trace = holder.path.with_file_name("trace");
        let config = format!(
            "{extra_toml}\n[trace]\npath = \"{}/\"\ninclude_content = true\n",
            trace.display()
        );
        std::fs::write(&holder.path, config).unwrap();
        let path = holder.path.to_string_lossy().into_owned();
        let proc = Proc::switchyard(&["serve", "--config", &path, "--port", "0"]);
        let url = proc.wait_for("behind ");
        Served {
            url,
            trace,
            _proc: proc,
            _config: holder,
        }
    }

    /// The traced requests, once at least `count` are there.
    async fn requests(&self, count: usize) -> Vec<TraceLine> {
        for _ in 0..200 {
            let lines: Vec<TraceLine> = read_trace(&self.trace)
                .unwrap_or_default()
                .into_iter()
                .filter(|l| l.event_type == EventType::RequestEnd)
                .collect();
            if lines.len() >= count {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let files: Vec<_> = std::fs::read_dir(&self.trace)
            .map(|d| d.map(|e| e.map(|e| e.path())).collect::<Vec<_>>())
            .unwrap_or_default();
        panic!(
            "the gateway never traced {count} requests: {:?}; files {files:?}",
            read_trace(&self.trace).map(|l| l.len())
        );
    }

    /// `switchyard_requests_total` samples of `harness` as `(endpoint, status, count)`.
    async fn answered(&self, harness: &str) -> Vec<(String, u16, f64)> {
        let metrics = get_text(&format!("{}/metrics", self.url)).await;
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix("switchyard_requests_total{"))
            .filter(|l| l.contains(&format!("harness=\"{harness}\"")))
            .map(|l| {
                let label = |name: &str| {
                    let start = l.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                    l[start..].split('"').next().unwrap().to_owned()
                };
                let count = l.rsplit(' ').next().unwrap().parse().unwrap();
                (label("endpoint"), label("status").parse().unwrap(), count)
            })
            .collect()
    }

    /// Every request of `harness` was answered with a 200, and there were some.
    async fn assert_all_ok(&self, harness: &str) {
        let answered = self.answered(harness).await;
        assert!(!answered.is_empty(), "no {harness} requests counted");
        assert!(
            answered.iter().all(|(_, status, _)| *status == 200),
            "{harness}: {answered:?}"
        );
    }
}

/// A private home, config and working directory for one CLI run.
struct Sandbox {
    _holder: TempFile,
    home: PathBuf,
    work: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let holder = TempFile::new("keep", "");
        let root = holder.path.parent().unwrap().to_path_buf();
        let (home, work) = (root.join("home"), root.join("work"));
        for dir in [&home, &work] {
            std::fs::create_dir_all(dir).unwrap();
        }
        Sandbox {
            _holder: holder,
            home,
            work,
        }
    }

    /// `bin` from the harness folder, confined to this sandbox: no inherited environment but
    /// `PATH`, so no real key or config of the machine leaks in.
    fn command(&self, bin: &str) -> Command {
        let mut cmd = Command::new(harness_bin().join(bin));
        cmd.current_dir(&self.work)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("XDG_DATA_HOME", self.home.join(".local/share"))
            .env("XDG_CACHE_HOME", self.home.join(".cache"))
            .env("XDG_STATE_HOME", self.home.join(".local/state"))
            .env("TERM", "dumb")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        cmd
    }
}

/// Runs `cmd` to the end, killing it past [`RUN_LIMIT`].
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the harness CLI");
        let deadline = Instant::now() + RUN_LIMIT;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn assert_success(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The request bodies the gateway traced, in order.
fn bodies(lines: &[TraceLine]) -> Vec<&Value> {
    lines
        .iter()
        .filter_map(|l| l.content.as_ref().map(|c| &c.request))
        .collect()
}

/// Some traced body carries `TOOL_OUTPUT` as a tool result: a JSON object of type `kind` (or with
/// role `kind`) that holds it.
fn assert_tool_result_came_back(lines: &[TraceLine], kind: &str) {
    fn holds(value: &Value, kind: &str) -> bool {
        match value {
            Value::Object(map) => {
                let tagged = [map.get("type"), map.get("role")]
                    .into_iter()
                    .flatten()
                    .any(|t| t == kind);
                (tagged && value.to_string().contains(TOOL_OUTPUT))
                    || map.values().any(|v| holds(v, kind))
            }
            Value::Array(items) => items.iter().any(|v| holds(v, kind)),
            _ => false,
        }
    }
    let found = bodies(lines).iter().any(|body| holds(body, kind));
    assert!(found, "no {kind} with {TOOL_OUTPUT} reached the gateway");
}

// === Claude Code ===

/// `claude -p PROMPT` against `served`, printing JSON; with `--model` unless `model` is `None`
/// (then Claude Code picks its own default).
fn claude(sandbox: &Sandbox, served: &Served, model: Option<&str>, prompt: &str) -> Command {
    let mut cmd = sandbox.command("claude");
    cmd.env("ANTHROPIC_BASE_URL", &served.url)
        .env("ANTHROPIC_API_KEY", "dummy")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .args(["-p", prompt, "--output-format", "json"])
        .args(["--allowedTools", "Bash", "Agent"]);
    if let Some(model) = model {
        cmd.args(["--model", model]);
    }
    cmd
}

/// Claude Code's own model names mapped onto the served model, as a config for other engines
/// writes it (the embedded default maps them anyway).
const CLAUDE_ALIASES: &str = "[model]\naliases = [\"claude-*\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_completes_a_turn_and_a_tool_round_trip() {
    // The embedded default as a newcomer starts it, no aliases configured, and Claude Code as
    // installed: its own default model name. It sends its environment as a system message after
    // the user turn.
    let served = Served::start("");
    let sandbox = Sandbox::new();
    let out = run(claude(&sandbox, &served, None, "Say hello.")).await;
    let result: Value = serde_json::from_str(&assert_success(&out, "unscripted turn")).unwrap();
    assert_eq!(result["is_error"], false, "{result}");
    let session = result["session_id"].as_str().unwrap().to_owned();

    let prompt = format!(
        "Run this. [[mock:tool_call Bash {{\"command\": \"{TOOL_COMMAND}\", \"description\": \"Print a marker\"}}]]"
    );
    let out = run(claude(
        &sandbox,
        &served,
        Some("claude-sonnet-4-5"),
        &prompt,
    ))
    .await;
    let result: Value = serde_json::from_str(&assert_success(&out, "tool round trip")).unwrap();
    assert_eq!(result["is_error"], false, "{result}");

    let lines = served.requests(3).await;
    let first = bodies(&lines)[0];
    let roles: Vec<&str> = first["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(roles.contains(&"system"), "{roles:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.agent_context.session_id.as_deref() == Some(session.as_str())),
        "session {session} not traced"
    );
    assert_tool_result_came_back(&lines, "tool_result");
    // Unscripted turns end the way a model ends them, not at an output limit.
    assert!(lines.iter().all(|l| {
        let finish = &l
            .request
            .as_ref()
            .unwrap()
            .finish_reason_metadata
            .finish_reason;
        finish != "length"
    }));
    served.assert_all_ok("claude-code").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_subagents_are_recorded_with_their_parent() {
    let served = Served::start(CLAUDE_ALIASES);
    let sandbox = Sandbox::new();
    let prompt = "Delegate this. [[mock:tool_call Agent {\"description\": \"Look around\", \"prompt\": \"Say what you see.\", \"subagent_type\": \"general-purpose\"}]]";
    let out = run(claude(&sandbox, &served, Some("claude-sonnet-4-5"), prompt)).await;
    let result: Value = serde_json::from_str(&assert_success(&out, "subagent run")).unwrap();
    let root = result["session_id"].as_str().unwrap().to_owned();
    let lines = served.requests(3).await;
    let sub = lines
        .iter()
        .find(|l| l.agent_context.parent_session_id.is_some())
        .expect("a subagent request");
    assert_eq!(
        sub.agent_context.parent_session_id.as_deref(),
        Some(root.as_str())
    );
    assert_ne!(sub.agent_context.session_id.as_deref(), Some(root.as_str()));
    served.assert_all_ok("claude-code").await;
}

/// Two Claude Code sessions with different first prompts against a fresh gateway configured with
/// `extra_toml`: `(shared prefix tokens, tokens of it the second session found cached, its prompt
/// tokens)`, from the gateway's trace.
async fn second_session_reuse(extra_toml: &str) -> (u64, u64, u64) {
    let served = Served::start(&format!("{CLAUDE_ALIASES}{extra_toml}"));
    let sandbox = Sandbox::new();
    for prompt in ["Say hello.", "Now say goodbye, please."] {
        let out = run(claude(&sandbox, &served, Some("claude-sonnet-4-5"), prompt)).await;
        let result: Value = serde_json::from_str(&assert_success(&out, "a session")).unwrap();
        assert_eq!(result["is_error"], false, "{result}");
    }
    let lines = served.requests(2).await;
    let mut firsts: Vec<&TraceLine> = Vec::new();
    for line in &lines {
        let session = &line.agent_context.session_id;
        if !firsts
            .iter()
            .any(|f| &f.agent_context.session_id == session)
        {
            firsts.push(line);
        }
    }
    assert!(firsts.len() >= 2, "two sessions expected: {firsts:?}");
    let (a, b) = (
        firsts[0].request.as_ref().unwrap(),
        firsts[1].request.as_ref().unwrap(),
    );
    let shared_blocks = a
        .replay
        .input_sequence_hashes
        .iter()
        .zip(&b.replay.input_sequence_hashes)
        .take_while(|(x, y)| x == y)
        .count() as u64;
    let shared = shared_blocks * u64::from(a.replay.trace_block_size);
    (shared, b.cached_tokens, b.input_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_sessions_share_the_system_prompt_cache() {
    // Claude Code's first system line carries a per-prompt `cc_version=...` suffix; stripped by
    // default, the system prompt and tools lead both sessions' prompts token for token.
    let (shared, cached, prompt) = second_session_reuse("").await;
    assert!(shared * 2 > prompt, "shared {shared} of {prompt}");
    assert!(
        cached * 10 >= shared * 9,
        "cached {cached} of a shared prefix of {shared} tokens"
    );
    // Kept, that line makes the prompts differ from their first block on.
    let (_, cached_kept, _) =
        second_session_reuse("[frontend]\nvolatile_system_lines = []\n").await;
    assert!(
        cached_kept * 10 < shared,
        "cached {cached_kept} with the line kept"
    );
    eprintln!(
        "claude code, second session's first request: {cached} of {prompt} prompt tokens cached \
         (shared prefix {shared}); {cached_kept} with the billing line kept"
    );
}

// === Codex ===

/// `codex exec PROMPT` against `served` through a `responses` provider.
fn codex(sandbox: &Sandbox, served: &Served, prompt: &str) -> Command {
    let codex_home = sandbox.home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    let config = format!(
        "model = \"smollm2-135m-instruct\"\nmodel_provider = \"switchyard\"\n\n\
         [model_providers.switchyard]\nname = \"Switchyard\"\nbase_url = \"{}/v1\"\n\
         wire_api = \"responses\"\nenv_key = \"SWITCHYARD_API_KEY\"\n",
        served.url
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let mut cmd = sandbox.command("codex");
    cmd.env("CODEX_HOME", &codex_home)
        .env("SWITCHYARD_API_KEY", "dummy")
        .args([
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
        ])
        .arg(prompt);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_completes_a_turn_and_a_tool_round_trip() {
    let served = Served::start("");
    let sandbox = Sandbox::new();
    assert_success(
        &run(codex(&sandbox, &served, "Say hello.")).await,
        "unscripted turn",
    );
    let prompt =
        format!("Run this. [[mock:tool_call exec_command {{\"cmd\": \"{TOOL_COMMAND}\"}}]]");
    assert_success(
        &run(codex(&sandbox, &served, &prompt)).await,
        "tool round trip",
    );

    let lines = served.requests(3).await;
    let first = bodies(&lines)[0];
    // Codex offers a namespace and a hosted tool; both were accepted.
    let kinds: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["type"].as_str())
        .collect();
    assert!(kinds.contains(&"namespace"), "{kinds:?}");
    assert!(
        lines.iter().all(|l| l.agent_context.session_id.is_some()),
        "every Codex request names its session"
    );
    assert_tool_result_came_back(&lines, "function_call_output");
    assert!(lines.iter().all(|l| {
        l.request
            .as_ref()
            .unwrap()
            .finish_reason_metadata
            .finish_reason
            != "length"
    }));
    served.assert_all_ok("codex").await;
    let metrics = get_text(&format!("{}/metrics", served.url)).await;
    assert!(
        metrics.contains("switchyard_dropped_tools_total{kind=\"web_search\"}"),
        "the hosted web_search tool is counted as dropped"
    );
}

// === OpenCode ===

/// `opencode run WORDS...` against `served` through the OpenAI-compatible provider. OpenCode
/// joins its arguments shell-quoted (`"Say hello."` for one argument with a space), so a prompt
/// is passed word by word.
fn opencode(sandbox: &Sandbox, served: &Served, words: &[&str]) -> Command {
    let dir = sandbox.home.join(".config/opencode");
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"switchyard": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Switchyard",
            "options": {"baseURL": format!("{}/v1", served.url), "apiKey": "dummy"},
            "models": {"smollm2-135m-instruct": {"name": "SmolLM2 (mock)"}},
        }},
        "model": "switchyard/smollm2-135m-instruct",
        "autoupdate": false,
        "share": "disabled",
        "permission": {"bash": "allow", "edit": "allow"},
    });
    std::fs::write(dir.join("opencode.json"), config.to_string()).unwrap();
    let mut cmd = sandbox.command("opencode");
    cmd.env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
        .arg("run")
        .args(words);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_completes_a_turn_and_a_tool_round_trip() {
    let served = Served::start("");
    let sandbox = Sandbox::new();
    let hello = opencode(&sandbox, &served, &["Say", "hello."]);
    assert_success(&run(hello).await, "unscripted turn");
    // JSON escapes keep the arguments free of spaces.
    let call = format!(
        "{{\"command\":\"{}\",\"description\":\"marker\"}}]]",
        TOOL_COMMAND.replace(' ', "\\u0020")
    );
    let round_trip = opencode(
        &sandbox,
        &served,
        &["Run", "this.", "[[mock:tool_call", "bash", &call],
    );
    assert_success(&run(round_trip).await, "tool round trip");
    let lines = served.requests(3).await;
    assert!(
        lines.iter().all(|l| l.agent_context.session_id.is_some()),
        "every OpenCode request names its session"
    );
    assert_tool_result_came_back(&lines, "tool");
    served.assert_all_ok("opencode").await;
}
