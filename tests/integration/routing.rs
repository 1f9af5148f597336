//! KV-aware routing across mock-engine processes, judged by the engines' own KV events.

use crate::support::{Gateway, MockEngine, chat_text, client};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::KvIndex;
use switchyard_core::worker::Rank;
use switchyard_kv_events::ingest::WireFormat;
use switchyard_kv_events::subscriber::{SubscriberConfig, SubscriberStats, run_subscriber};
use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer};
use tokio_util::sync::CancellationToken;

const SESSIONS: usize = 16;
const TURNS: usize = 8;
const MODEL: &str = "smollm2-135m-instruct";
/// KV capacity per engine (blocks of 16): room for the sessions' histories once across the fleet
/// (~1,500 blocks per engine when each session stays home), not four times over, as a real fleet
/// under agent load. Spraying sessions over every engine then costs evictions, as it does in
/// production.
const KV_BLOCKS: u32 = 1792;

/// The test's own view of the engines' caches, built from their KV events alone.
struct Observer {
    index: Arc<Mutex<KvIndex>>,
    shutdown: CancellationToken,
}

impl Observer {
    fn watch(engines: &[&MockEngine]) -> Observer {
        let index = Arc::new(Mutex::new(KvIndex::new()));
        let shutdown = CancellationToken::new();
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        for (i, engine) in engines.iter().enumerate() {
            let config = SubscriberConfig {
                rank: Rank::new(i as u32, 0),
                block_size: 16,
                endpoint: engine.kv_events.clone(),
                replay_endpoint: Some(engine.replay.clone()),
                bind: false,
                topic: String::new(),
                format: WireFormat::Vllm,
                engine_names: None,
            };
            let stats = Arc::new(SubscriberStats::default());
            tokio::spawn(run_subscriber(config, tx.clone(), stats, shutdown.clone()));
        }
        let sink = index.clone();
        tokio::spawn(async move {
            while let Some(op) = rx.recv().await {
                sink.lock().unwrap().apply(&op);
            }
        });
        Observer { index, shutdown }
    }
}

/// Ranks whose events show at least `blocks` blocks of the prefix `hashes`, waiting briefly for
/// events still in flight.
async fn holders(index: &Mutex<KvIndex>, hashes: &[SequenceHash], blocks: u32) -> Vec<Rank> {
    for _ in 0..40 {
        let found: Vec<Rank> = index
            .lock()
            .unwrap()
            .find_matches(hashes)
            .into_iter()
            .filter(|(_, o)| o.device >= blocks)
            .map(|(r, _)| r)
            .collect();
        if !found.is_empty() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Vec::new()
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn system_prompt() -> String {
    let tools: Vec<String> = (0..6)
        .map(|i| format!("tool_{i}(path: string, pattern: string) searches files; "))
        .collect();
    format!("You are a coding agent. Tools: {}", tools.concat())
}

/// One agent turn. The first carries the session's own context (files the agent read, ~2K tokens),
/// later ones a ~500-token tool result: most of each prompt was sent before, as with coding agents.
fn user_turn(session: usize, turn: usize) -> String {
    let words = if turn == 0 { 280 } else { 70 };
    let text: Vec<String> = (0..words)
        .map(|w| format!("s{session}t{turn}w{}", (w * 7 + session * 13 + turn) % 97))
        .collect();
    format!("Step {turn}: tool output follows. {}", text.join(" "))
}

/// Tool execution between turns: 0.5 s to 3 s, scattered but fixed per (session, turn) so
/// runs repeat and sessions drift out of step, as real agents do (Claude Code's median is ~10 s;
/// shorter keeps the test quick). Long enough against a turn's time on a busy machine that a
/// holder is rarely busy with two other sessions at once: the cost then rightly trades the
/// prefix for load, and the share below would measure the machine rather than the routing.
fn think_time(session: usize, turn: usize) -> Duration {
    let spread = (session as u64 * 7919 + turn as u64 * 104_729).wrapping_mul(2_654_435_761) % 2500;
    Duration::from_millis(500 + spread)
}

#[derive(Default)]
struct RunStats {
    later_turns: usize,
    on_prefix_holder: usize,
    /// Later turns whose previous prompt no engine held in full any more (evicted).
    no_holder: usize,
    /// The later turns sent away from their prefix (`s{session}t{turn}->{worker}`): the cost
    /// trades a prefix for load when the holder is busy.
    elsewhere: Vec<String>,
}

/// Run every session's turns (sessions concurrently, turns in order), alternating streaming.
async fn run_sessions(gateway: &Gateway, observer: Option<&Observer>) -> RunStats {
    let tokenizer = ModelTokenizer::embedded_default().unwrap();
    let hasher = BlockHasher::new(16);
    let stats = Arc::new(Mutex::new(RunStats::default()));
    let mut tasks = Vec::new();
    for session in 0..SESSIONS {
        let url = format!("{}/v1/chat/completions", gateway.url);
        let tokenizer = tokenizer.clone();
        let stats = stats.clone();
        let observer_view = observer.map(|o| o.index.clone());
        tasks.push(tokio::spawn(async move {
            let mut messages = vec![json!({"role": "system", "content": system_prompt()})];
            let mut previous_blocks: Option<Vec<SequenceHash>> = None;
            for turn in 0..TURNS {
                messages.push(json!({"role": "user", "content": user_turn(session, turn)}));
                let stream = turn % 2 == 1;
                // Who holds the previous turn's prompt, by the engines' events? (allow for the
                // tokenizer merging across the turn boundary: the last block may differ)
                let holders = match (&observer_view, &previous_blocks) {
                    (Some(index), Some(prev)) => {
                        let need = (prev.len() as u32).saturating_sub(1).max(1);
                        Some(holders(index, prev, need).await)
                    }
                    _ => None,
                };
                let body = json!({"model": MODEL, "messages": messages, "max_tokens": 24, "stream": stream});
                let response = client().post(&url).json(&body).send().await.unwrap();
                assert_eq!(response.status(), 200, "session {session} turn {turn}");
                let worker = response.headers()["x-switchyard-worker"].to_str().unwrap().to_string();
                let text = chat_text(&response.text().await.unwrap(), stream);
                assert!(!text.is_empty(), "empty answer");
                if let Some(holders) = holders {
                    let mut s = stats.lock().unwrap();
                    s.later_turns += 1;
                    s.no_holder += holders.is_empty() as usize;
                    if holders.iter().any(|r| r.to_string() == worker) {
                        s.on_prefix_holder += 1;
                    } else {
                        s.elsewhere.push(format!("s{session}t{turn}->{worker}"));
                    }
                }
                let prompt = tokenizer
                    .encode_chat(&ChatTemplateInput { messages: &messages, tools: None, add_generation_prompt: true, extra: None })
                    .unwrap();
                previous_blocks = Some(hasher.sequence(&prompt));
                messages.push(json!({"role": "assistant", "content": text}));
                // The agent runs its tool before the next turn.
                tokio::time::sleep(think_time(session, turn)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(stats).ok().unwrap().into_inner().unwrap()
}

async fn prefix_hits(engines: &[&MockEngine]) -> f64 {
    let mut total = 0.0;
    for e in engines {
        total += e.metric("vllm:prefix_cache_hits_total").await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kv_routing_follows_the_prefix_and_beats_round_robin() {
    // KV-aware run, judged by an independent observer of the engines' events.
    let kv_engines: Vec<MockEngine> = (0..4).map(|_| MockEngine::start(20.0, KV_BLOCKS)).collect();
    let refs: Vec<&MockEngine> = kv_engines.iter().collect();
    let observer = Observer::watch(&refs);
    let gateway = Gateway::start(&Gateway::config_for(&refs, "kv-cost"));
    let kv = run_sessions(&gateway, Some(&observer)).await;
    let kv_hits = prefix_hits(&refs).await;
    drop(gateway);

    // The same conversations (the mock's answers are deterministic) over fresh engines, round robin.
    let rr_engines: Vec<MockEngine> = (0..4).map(|_| MockEngine::start(20.0, KV_BLOCKS)).collect();
    let rr_refs: Vec<&MockEngine> = rr_engines.iter().collect();
    let gateway = Gateway::start(&Gateway::config_for(&rr_refs, "round-robin"));
    run_sessions(&gateway, None).await;
    let rr_hits = prefix_hits(&rr_refs).await;

    eprintln!(
        "later turns on a prefix holder: {}/{} ({} with no holder; elsewhere: {:?}); prefix-hit tokens kv {kv_hits} vs round robin {rr_hits}",
        kv.on_prefix_holder, kv.later_turns, kv.no_holder, kv.elsewhere
    );
    assert_eq!(kv.later_turns, SESSIONS * (TURNS - 1));
    let share = kv.on_prefix_holder as f64 / kv.later_turns as f64;
    assert!(
        share >= 0.9,
        "only {:.0}% of later turns reached a worker holding their prefix",
        share * 100.0
    );
    assert!(rr_hits > 0.0, "round robin still shares the system prompt");
    assert!(
        kv_hits >= 2.0 * rr_hits,
        "prefix-hit tokens: kv {kv_hits} vs round robin {rr_hits}"
    );
}

/// One identical prompt sent again and again at concurrency 1, streaming or not, with no session
/// header: each request finds the previous one finished, so all stay on the worker that holds the
/// prefix (issue 13 saw streaming ones spread over four fake backends without KV events; with
/// engines that publish events they do not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_stays_on_its_worker_streaming_or_not() {
    let engines: Vec<MockEngine> = (0..4).map(|_| MockEngine::start(50.0, 4096)).collect();
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let gateway = Gateway::start(&Gateway::config_for(&refs, "kv-cost"));
    let http = client();
    let prompt = "Summarise the repository layout and its build. ".repeat(60);
    for stream in [false, true] {
        let mut served = std::collections::BTreeMap::<String, u32>::new();
        for _ in 0..12 {
            let body = json!({"model": MODEL, "max_tokens": 8, "stream": stream,
                "messages": [{"role": "user", "content": prompt}]});
            let r = http
                .post(format!("{}/v1/chat/completions", gateway.url))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let worker = r.headers()["x-switchyard-worker"]
                .to_str()
                .unwrap()
                .to_owned();
            chat_text(&r.text().await.unwrap(), stream);
            *served.entry(worker).or_default() += 1;
        }
        // The first request may land anywhere; after it, the prefix holder wins every time.
        assert!(
            served.values().any(|&n| n >= 11),
            "stream={stream}: {served:?}"
        );
    }
}

/// What the gateway's metrics showed of worker 0 while one request ran: whether its prefill
/// load was seen booked, then ended while the request still ran; the TTFTs and the whole
/// answers recorded.
struct PrefillSeen {
    booked: bool,
    ended_in_flight: bool,
    ttfts: f64,
    whole_answers: f64,
}

/// A chat request with a prompt of ~3,000 tokens of its own (by `seed`).
fn long_prompt(seed: u32, max_tokens: u32, stream: bool) -> serde_json::Value {
    let prompt = (0..1500).map(|i| format!("w{i}")).collect::<Vec<_>>();
    let prompt = format!("s{seed} {}", prompt.join(" "));
    json!({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": prompt}]})
}

/// `config` with its workers' KV events taken out.
fn without_kv_events(config: &str) -> String {
    config
        .lines()
        .filter(|l| !l.starts_with("kv_events") && !l.starts_with("replay"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Send one long-prompt, long-answer request that does not stream through `gateway` (its own
/// prompt, by `seed`), watching the router's view of worker 0 in the metrics while it runs.
async fn watch_prefill(gateway: &Gateway, seed: u32) -> PrefillSeen {
    let body = long_prompt(seed, 100, false);
    let url = format!("{}/v1/chat/completions", gateway.url);
    let request = tokio::spawn(async move { client().post(url).json(&body).send().await });
    let (mut booked, mut ended_in_flight) = (false, false);
    while !request.is_finished() {
        let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
        let worker = ["worker=\"0.0\""];
        let in_flight = crate::support::sample(&metrics, "switchyard_worker_in_flight", &worker);
        let prefill = crate::support::sample(&metrics, "switchyard_worker_prefill_tokens", &worker);
        booked |= in_flight == 1.0 && prefill > 0.0;
        ended_in_flight |= booked && in_flight == 1.0 && prefill == 0.0;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let response = request.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert!(!chat_text(&response.text().await.unwrap(), false).is_empty());
    let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
    PrefillSeen {
        booked,
        ended_in_flight,
        ttfts: crate::support::metric_sum(&metrics, "switchyard_ttft_seconds_count"),
        whole_answers: crate::support::metric_sum(
            &metrics,
            "switchyard_engine_whole_answers_total",
        ),
    }
}

/// A client that does not stream, at the default `engine_stream = "auto"`: a worker that
/// publishes KV events answers it whole (no first token, so no TTFT), and the stored event of
/// the prompt's last block ends its prefill load in the router's view long before the answer
/// is done. A worker without events is asked to stream, and its first token does the same,
/// until the router has learnt the worker's prefill pace from three of them: then it answers
/// whole too, and the load ends when the pace says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answers_prefill_ends_at_the_engines_stored_event() {
    // Half real time: the prefill of ~3,000 tokens takes about 0.1 s, the answer over 1 s.
    let engine = MockEngine::start_with(0.5, 4096, &["--answer-median-tokens", "100000"]);
    let with_events = Gateway::start(&Gateway::config_for(&[&engine], "kv-cost"));
    let connected = crate::support::eventually(20, async || {
        let metrics = crate::support::get_text(&format!("{}/metrics", with_events.url)).await;
        crate::support::metric_sum(&metrics, "switchyard_kv_events_connected") == 1.0
    })
    .await;
    assert!(connected, "the engine's KV events never connected");
    let seen = watch_prefill(&with_events, 0).await;
    assert!(seen.booked && seen.ended_in_flight, "with events");
    assert_eq!(seen.ttfts, 0.0, "a whole answer has no first token to time");
    assert_eq!(seen.whole_answers, 1.0);
    drop(with_events);

    let config = without_kv_events(&Gateway::config_for(&[&engine], "kv-cost"));
    let without_events = Gateway::start(&config);
    for seed in 1..=4 {
        let seen = watch_prefill(&without_events, seed).await;
        assert!(
            seen.booked && seen.ended_in_flight,
            "without events, {seed}"
        );
        assert_eq!(
            seen.ttfts,
            f64::from(seed.min(3)),
            "the engine streamed for the router's sake until it knew the pace"
        );
        assert_eq!(seen.whole_answers, f64::from(seed.saturating_sub(3)));
    }
}

/// With a router queue, a prefill load that ends at the pace's prediction lets the next request
/// go then, not when the whole answer is done: two long requests sent together run side by
/// side although one prefill fills the worker's queue threshold. (`as-client`, so that no
/// first token ends the loads instead: the pace is learnt from clients that stream.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_predicted_prefill_end_lets_the_router_queue_go() {
    let engine = MockEngine::start_with(0.5, 4096, &["--answer-median-tokens", "100000"]);
    let config = String::from("[server]\nengine_stream = \"as-client\"\n")
        + "[queue]\nmax_prefill_tokens = 1000\n"
        + &without_kv_events(&Gateway::config_for(&[&engine], "kv-cost"));
    let gateway = Gateway::start(&config);
    let url = format!("{}/v1/chat/completions", gateway.url);
    // Three streaming clients teach the router the worker's prefill pace.
    for seed in 0..3 {
        let response = client()
            .post(&url)
            .json(&long_prompt(seed, 4, true))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap();
    }
    let requests: Vec<_> = (10..12)
        .map(|seed| {
            let (url, body) = (url.clone(), long_prompt(seed, 100, false));
            tokio::spawn(async move { client().post(url).json(&body).send().await })
        })
        .collect();
    let mut side_by_side = false;
    while !requests.iter().all(|r| r.is_finished()) {
        let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
        let worker = ["worker=\"0.0\""];
        side_by_side |=
            crate::support::sample(&metrics, "switchyard_worker_in_flight", &worker) == 2.0;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for request in requests {
        assert_eq!(request.await.unwrap().unwrap().status(), 200);
    }
    let metrics = crate::support::get_text(&format!("{}/metrics", gateway.url)).await;
    assert_eq!(
        crate::support::metric_sum(&metrics, "switchyard_router_queue_enqueued_total"),
        1.0,
        "one waited"
    );
    assert!(
        side_by_side,
        "the second waited for the first's whole answer"
    );
}
