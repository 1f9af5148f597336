//! `switchyard replay`: send a trace to a live OpenAI-compatible endpoint (our gateway or an
//! engine) and measure it from the client side.
//!
//! Prompts are the simulator's synthetic token ids ([`switchyard_sim::tokens::prompt`]), so equal
//! hash ids give equal token blocks and the endpoint's prefix caches see exactly the trace's prefix
//! structure. Sessions run closed loop: a request starts its recorded gap (divided by the speed-up)
//! after the previous one finished; sub-agents start after the parent request that spawned them,
//! and a joining one holds its parent's next request back until it is done.

mod report;

use anyhow::{Context, bail};
use clap::Args;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_gateway::sse::SseTap;
use switchyard_sim::tokens;
use switchyard_sim::workload::{self, Format, TraceRequest, Workload};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Base URL of the endpoint, e.g. http://127.0.0.1:8000 (our gateway or an engine).
    #[arg(long)]
    target: String,
    /// Trace file (or directory of Claude Code traces).
    #[arg(long)]
    trace: PathBuf,
    /// Trace format; detected when absent.
    #[arg(long)]
    format: Option<Format>,
    /// Model name to send; default: the first model the target lists.
    #[arg(long)]
    model: Option<String>,
    /// Divide arrival times and gaps by this.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Root sessions in flight at most (sub-agents run in their root's slot); default: no limit.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Send at most this many requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// Token ids the target's model accepts: a synthetic id at or above this is folded into
    /// 1,000 up to it (equal blocks stay equal; the ids below 1,000, where models keep their
    /// special tokens, are left out). The default, 32,000, is below every common chat model's
    /// vocabulary (Llama 2's and Mistral's are 32,000); an engine refuses an id outside its own.
    #[arg(long, default_value_t = 32_000, value_parser = clap::value_parser!(u32).range(2_000..))]
    vocab_size: u32,
    /// Write the report as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write a Chrome trace-event timeline (opens in Perfetto).
    #[arg(long)]
    timeline: Option<PathBuf>,
}

/// One request as the client saw it; times are since the replay started.
#[derive(Debug, Clone, Default)]
struct Measured {
    session: usize,
    request: usize,
    /// When the session became ready for it (the previous finish, or the session's start).
    ready: Duration,
    sent: Duration,
    first_token: Option<Duration>,
    ended: Duration,
    /// Gaps between streamed events with tokens (0 for events that arrived together).
    itl: Vec<Duration>,
    /// `x-switchyard-worker` of the answer, when the target is our gateway.
    worker: Option<String>,
    error: Option<String>,
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
}

pub(crate) async fn run(args: ReplayArgs, stop: CancellationToken) -> anyhow::Result<()> {
    if !(args.speedup.is_finite() && args.speedup > 0.0) {
        bail!("--speedup must be a positive number");
    }
    if args.concurrency == Some(0) {
        bail!("--concurrency must be positive");
    }
    let (path, format) = (args.trace.clone(), args.format);
    let workload = tokio::task::spawn_blocking(move || workload::load(&path, format))
        .await?
        .with_context(|| format!("loading {}", args.trace.display()))?;
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()?;
    let target = args.target.trim_end_matches('/').to_string();
    let model = match args.model.clone() {
        Some(model) => model,
        None => first_model(&client, &target).await?,
    };
    let replay = Arc::new(Replay {
        children: workload.spawn_tree().children,
        url: format!("{target}/v1/completions"),
        client,
        model: model.clone(),
        speedup: args.speedup,
        vocab_size: args.vocab_size,
        budget: args.max_requests.unwrap_or(usize::MAX),
        sent: AtomicUsize::new(0),
        results: Mutex::new(Vec::new()),
        epoch: Instant::now(),
        tasks: TaskTracker::new(),
        stop,
        workload,
    });
    let slots = Arc::new(Semaphore::new(
        args.concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    ));
    let spawned: HashSet<usize> = replay.children.values().flatten().copied().collect();
    for (s, session) in replay.workload.sessions.iter().enumerate() {
        if spawned.contains(&s) {
            continue; // started by its parent
        }
        let (replay, slots, start) = (replay.clone(), slots.clone(), session.start);
        replay.tasks.clone().spawn(async move {
            if !replay.sleep_until(start).await {
                return;
            }
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            let ready = replay.now();
            replay.session(s, ready).await;
        });
    }
    replay.tasks.close();
    replay.tasks.wait().await;
    let wall = replay.now();
    let mut results = std::mem::take(&mut *replay.lock_results());
    results.sort_by_key(|m| m.sent);
    let meta = report::Meta {
        target: &target,
        trace: &args.trace,
        model: &model,
        speedup: args.speedup,
        wall,
    };
    let summary = report::summary(&results, &meta)?;
    println!("{}", report::table(&summary));
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.timeline {
        let doc = report::timeline(&results, &replay.workload);
        std::fs::write(path, serde_json::to_vec(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if replay.stop.is_cancelled() {
        bail!("interrupted");
    }
    Ok(())
}

async fn first_model(client: &reqwest::Client, target: &str) -> anyhow::Result<String> {
    let models: Value = client
        .get(format!("{target}/v1/models"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("asking {target} for its models (or pass --model)"))?
        .json()
        .await?;
    models["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .context("the target lists no models; pass --model")
}

/// Everything the session tasks share.
struct Replay {
    workload: Workload,
    children: HashMap<(usize, usize), Vec<usize>>,
    client: reqwest::Client,
    url: String,
    model: String,
    speedup: f64,
    vocab_size: u32,
    budget: usize,
    sent: AtomicUsize,
    results: Mutex<Vec<Measured>>,
    epoch: Instant,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Replay {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn lock_results(&self) -> std::sync::MutexGuard<'_, Vec<Measured>> {
        self.results.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn scaled(&self, d: Duration) -> Duration {
        d.div_f64(self.speedup)
    }

    /// Sleep until `at` (trace time, scaled) since the start; false when interrupted.
    async fn sleep_until(&self, at: Duration) -> bool {
        let deadline = tokio::time::Instant::from_std(self.epoch + self.scaled(at));
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// Sleep `gap` (trace time, scaled); false when interrupted.
    async fn sleep(&self, gap: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(self.scaled(gap)) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// Run session `s` from `ready` on: its requests in order, spawning (and joining) children.
    fn session(
        self: Arc<Self>,
        s: usize,
        ready: Duration,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let mut ready = ready;
            for (k, request) in self.workload.sessions[s].requests.iter().enumerate() {
                if !self.sleep(request.gap).await {
                    return;
                }
                if self.sent.fetch_add(1, Ordering::Relaxed) >= self.budget {
                    return;
                }
                let measured = tokio::select! {
                    m = self.send(s, k, request) => m,
                    () = self.stop.cancelled() => return,
                };
                let measured = Measured { ready, ..measured };
                ready = measured.ended;
                self.lock_results().push(measured);
                let mut joins = Vec::new();
                for &c in self.children.get(&(s, k)).into_iter().flatten() {
                    let child = self.workload.sessions[c].clone();
                    let replay = self.clone();
                    let handle = self.tasks.spawn(async move {
                        if replay.sleep(child.start).await {
                            let ready = replay.now();
                            replay.session(c, ready).await;
                        }
                    });
                    if child.spawn.is_some_and(|sp| sp.join) {
                        joins.push(handle);
                    }
                }
                if !joins.is_empty() {
                    futures::future::join_all(joins).await;
                    ready = self.now();
                }
            }
        })
    }

    /// Send request `k` of session `s`, streaming, and time it.
    async fn send(&self, s: usize, k: usize, request: &TraceRequest) -> Measured {
        let session = &self.workload.sessions[s];
        let salt = ((s as u64) << 32) | k as u64;
        let mut prompt = tokens::prompt(
            &request.hash_ids,
            self.workload.block_size,
            request.input_tokens,
            salt,
        );
        const FIRST: u32 = 1_000;
        let vocab = self.vocab_size;
        for t in prompt.iter_mut().filter(|t| **t >= vocab) {
            *t = FIRST + (*t - FIRST) % (vocab - FIRST);
        }
        let body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": request.output_tokens.max(1),
            // Generate the recorded length, not until the model would stop.
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let mut http = self
            .client
            .post(&self.url)
            .header("x-dynamo-session-id", &session.id)
            .json(&body);
        if let Some(parent) = &session.parent {
            http = http.header("x-dynamo-parent-session-id", parent);
        }
        if k + 1 == session.requests.len() {
            http = http.header("x-dynamo-session-final", "true");
        }
        let sent = self.now();
        let mut m = Measured {
            session: s,
            request: k,
            sent,
            input_tokens: prompt.len() as u64,
            ..Measured::default()
        };
        if let Err(e) = self.stream(http, &mut m).await {
            m.error = Some(format!("{e:#}"));
        }
        m.ended = self.now();
        m
    }

    async fn stream(&self, http: reqwest::RequestBuilder, m: &mut Measured) -> anyhow::Result<()> {
        let response = http.send().await?;
        m.worker = response
            .headers()
            .get("x-switchyard-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("{status}: {}", body.chars().take(200).collect::<String>());
        }
        let mut tap = SseTap::new(false);
        let mut chunks = response.bytes_stream();
        let mut last = None;
        while let Some(chunk) = chunks.next().await {
            let before = tap.token_events();
            tap.feed(&chunk?);
            let events = tap.token_events() - before;
            if events == 0 {
                continue;
            }
            let now = self.now();
            match last {
                None => m.first_token = Some(now),
                Some(prev) => m.itl.push(now.saturating_sub(prev)),
            }
            m.itl
                .extend(std::iter::repeat_n(Duration::ZERO, events as usize - 1));
            last = Some(now);
        }
        tap.finish();
        if let Some(usage) = tap.usage() {
            m.input_tokens = usage.prompt_tokens;
            m.cached_tokens = usage.cached_tokens;
            m.output_tokens = usage.completion_tokens;
        }
        if let Some(error) = tap.error() {
            bail!("the engine's stream ended in an error: {error}");
        }
        if m.first_token.is_none() {
            bail!("the stream carried no tokens");
        }
        Ok(())
    }
}
