//! KV hints to real llama.cpp engines through slot save / restore (`kv_hints = "llama-slots"`).
//!
//! Two `llama-server`s (SmolLM2-135M on CPU) share one `--slot-save-path`. A session's turn ends
//! in a tool call on server A; the demote-on-tool-call policy demotes the session, which saves
//! A's slot to the shared directory and frees the slot. A then dies; the session's next turn is
//! routed to B, which restores the file before the request is forwarded. B's own counters
//! (`llamacpp:prompt_tokens_total`, the tokens it prefilled) show the prompt came from the
//! restored cache; the same prompt prefilled cold on B is the yardstick for the time saved.

use crate::llama::{LlamaServer, engine_paths};
use crate::support::{Gateway, client, eventually, get_text, metric_sum, sample};
use serde_json::{Value, json};
use std::time::Instant;

const MODEL: &str = "smollm2-135m-instruct";

/// `(prompt tokens prefilled, prefill seconds)` a llama-server has counted so far.
async fn prefill_counters(url: &str) -> (f64, f64) {
    let text = get_text(&format!("{url}/metrics")).await;
    (
        metric_sum(&text, "llamacpp:prompt_tokens_total"),
        metric_sum(&text, "llamacpp:prompt_seconds_total"),
    )
}

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"]
            }
        }
    }])
}

/// A ~2K-token agent prompt: a system prompt with tool docs, then the task.
fn first_messages() -> Vec<Value> {
    let system: String = (0..120)
        .map(|i| format!("Tool {i} reads file number {i} and returns its text. "))
        .collect();
    vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Run the test suite with bash, then summarise it."}),
    ]
}

/// A turn that ends in a `bash` call. A 135M model does not call tools when asked (llama.cpp's
/// `tool_choice: "required"` does not force one with SmolLM2's template), so llama.cpp's own
/// grammar makes it write the call, which the gateway's hermes parser reads (`tokens` mode).
fn body(messages: &[Value]) -> Value {
    json!({
        "model": MODEL,
        "messages": messages,
        "tools": tools(),
        "grammar": "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"bash\\\", \\\"arguments\\\": {\\\"command\\\": \\\"make test\\\"}}\\n</tool_call>\"",
        "max_tokens": 96,
        "temperature": 0,
    })
}

/// Two llama-servers sharing one `--slot-save-path` behind a gateway whose workers take
/// `llama-slots` hints, with `extra` (TOML tables) in its config.
struct TwoServers {
    dir: std::path::PathBuf,
    engines: [LlamaServer; 2],
    gateway: Gateway,
}

impl TwoServers {
    async fn start(name: &str, extra: &str) -> TwoServers {
        let (server, model) = engine_paths();
        let dir = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir_arg = dir.to_string_lossy().to_string();
        // No host-RAM prompt cache (`--cache-ram 0`): a cache hit can only come from a slot.
        let flags = [
            "--slot-save-path",
            &dir_arg,
            "--metrics",
            "--cache-ram",
            "0",
        ];
        let engines = [
            LlamaServer::start_with(&server, &model, &flags),
            LlamaServer::start_with(&server, &model, &flags),
        ];
        for e in &engines {
            e.wait_healthy().await;
        }
        let mut config = format!("[server]\nhealth_interval = \"250ms\"\n{extra}");
        for e in &engines {
            config += &format!(
                "[[workers]]\nurl = \"{}\"\nkind = \"openai\"\nupstream = \"tokens\"\nkv_hints = \"llama-slots\"\n",
                e.url
            );
        }
        let gateway = Gateway::start(&config);
        TwoServers {
            dir,
            engines,
            gateway,
        }
    }

    /// A turn of session `agent-1`: the worker that served it, the reply and the time taken.
    async fn chat(&self, messages: &[Value]) -> (String, Value, std::time::Duration) {
        let started = Instant::now();
        let r = client()
            .post(format!("{}/v1/chat/completions", self.gateway.url))
            .header("x-session-id", "agent-1")
            .json(&body(messages))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let worker = r.headers()["x-switchyard-worker"]
            .to_str()
            .unwrap()
            .to_string();
        let reply: Value = r.json().await.unwrap();
        (worker, reply, started.elapsed())
    }

    /// Turn 1 of `messages`, a ~2K-token prompt ending in a tool call: where it ran.
    async fn first_turn(&self, messages: &[Value]) -> FirstTurn {
        let (home, reply, wall) = self.chat(messages).await;
        assert_eq!(
            reply["choices"][0]["finish_reason"], "tool_calls",
            "{reply}"
        );
        let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(prompt > 1500, "a ~2K prompt, got {prompt}");
        let a = usize::from(home.starts_with('1'));
        FirstTurn {
            other: format!("{}.0", 1 - a),
            home,
            a,
            b: 1 - a,
            reply,
            prompt,
            wall,
        }
    }

    /// A turn as [`chat`](Self::chat), with what server `on`'s counters say it prefilled.
    async fn measured_chat(&self, on: usize, messages: &[Value]) -> Measured {
        let before = prefill_counters(&self.engines[on].url).await;
        let (worker, reply, wall) = self.chat(messages).await;
        let after = prefill_counters(&self.engines[on].url).await;
        let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
        let prefilled = (after.0 - before.0) as u64;
        Measured {
            worker,
            prompt,
            prefilled,
            cached: prompt.saturating_sub(prefilled),
            prefill_ms: (after.1 - before.1) * 1000.0,
            wall,
        }
    }

    /// The session files in the slot directory.
    fn slot_files(&self) -> Vec<std::fs::DirEntry> {
        std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|f| f.file_name().to_string_lossy().starts_with("switchyard-"))
            .collect()
    }

    /// `switchyard_kv_hint_actions_total` for `action` on `worker` with `outcome`.
    async fn hint_actions(&self, action: &str, worker: &str, outcome: &str) -> f64 {
        sample(
            &get_text(&format!("{}/metrics", self.gateway.url)).await,
            "switchyard_kv_hint_actions_total",
            &[
                &format!("action=\"{action}\""),
                &format!("worker=\"{worker}\""),
                &format!("outcome=\"{outcome}\""),
            ],
        )
    }
}

/// Turn 1 of a session: it ran on server `a` (worker `home`); `b` is the other (`other`).
struct FirstTurn {
    home: String,
    other: String,
    a: usize,
    b: usize,
    reply: Value,
    prompt: u64,
    wall: std::time::Duration,
}

/// A turn and what one server prefilled for it.
struct Measured {
    worker: String,
    prompt: u64,
    prefilled: u64,
    /// Prompt tokens read from the cache.
    cached: u64,
    prefill_ms: f64,
    wall: std::time::Duration,
}

impl Drop for TwoServers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tool's result appended to `messages` after `first`, a turn that called it.
fn tool_result(messages: &mut Vec<Value>, first: &Value) {
    let assistant = first["choices"][0]["message"].clone();
    let call_id = assistant["tool_calls"][0]["id"].clone();
    messages.push(assistant);
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "ok: 12 passed"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_session_is_restored_on_another_llama_server_instead_of_prefilled() {
    let mut pair = TwoServers::start(
        "slots",
        "[policies]\nkv_hints = \"native:demote-on-tool-call:unseen_tool_time=30s:demote_to=disk\"\n",
    )
    .await;
    // Turn 1 ends in a tool call. The policy expects the tool to take 30 s: it demotes the
    // session, and the gateway saves its slot on A to the shared directory and frees it.
    let mut messages = first_messages();
    let FirstTurn {
        home,
        other,
        a,
        b,
        reply: first,
        prompt: first_prompt,
        wall: first_wall,
    } = pair.first_turn(&messages).await;
    let (a_prefilled, a_seconds) = prefill_counters(&pair.engines[a].url).await;
    let demoted = eventually(30, async || {
        pair.hint_actions("demote", &home, "accepted").await >= 1.0
    })
    .await;
    assert!(
        demoted,
        "the demote was never accepted: {}",
        get_text(&format!("{}/metrics", pair.gateway.url)).await
    );
    let files = pair.slot_files();
    assert_eq!(files.len(), 1, "one slot file for the session");
    let file_bytes = files[0].metadata().unwrap().len();
    assert!(
        file_bytes > 1_000_000,
        "the file holds real KV: {file_bytes} bytes"
    );

    // A dies while the tool runs: the gateway marks it unhealthy.
    pair.engines[a].kill();
    let down = eventually(30, async || {
        sample(
            &get_text(&format!("{}/metrics", pair.gateway.url)).await,
            "switchyard_worker_healthy",
            &[&format!("worker=\"{home}\"")],
        ) == 0.0
    })
    .await;
    assert!(down, "worker {home} never marked unhealthy");

    // Turn 2 (the tool's result) goes to B, which restores the session's slot file first.
    tool_result(&mut messages, &first);
    let second = pair.measured_chat(b, &messages).await;
    assert_eq!(second.worker, other, "turn 2 went to the healthy server");
    let (second_prompt, prefilled, cached) = (second.prompt, second.prefilled, second.cached);
    let (prefill_ms, second_wall) = (second.prefill_ms, second.wall);
    assert!(
        pair.hint_actions("prefetch", &other, "accepted").await >= 1.0,
        "the restore on B was not accepted: {}",
        get_text(&format!("{}/metrics", pair.gateway.url)).await
    );
    assert!(
        cached * 10 >= first_prompt * 9,
        "B prefilled {prefilled} of {second_prompt} tokens: only {cached} came from the restored \
         slot (turn 1 had {first_prompt})"
    );

    // The yardstick: the same prompt prefilled cold on B (no cache, another slot).
    let mut cold = body(&messages);
    cold.as_object_mut().unwrap().remove("grammar");
    cold["cache_prompt"] = false.into();
    cold["id_slot"] = 1.into();
    let started = Instant::now();
    let control: Value = client()
        .post(format!("{}/v1/chat/completions", pair.engines[b].url))
        .json(&cold)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cold_wall = started.elapsed();
    let cold_prefill_ms = control["timings"]["prompt_ms"].as_f64().unwrap_or(0.0);
    let cold_n = control["timings"]["prompt_n"].as_u64().unwrap_or(1).max(1);
    eprintln!(
        "turn 1 on A: {first_prompt} prompt tokens, {a_prefilled} prefilled in {:.0} ms \
         ({first_wall:?} end to end); slot file {file_bytes} bytes",
        a_seconds * 1000.0
    );
    eprintln!(
        "turn 2 on B, restored: {second_prompt} prompt tokens, {cached} from the restored slot, \
         {prefilled} prefilled in {prefill_ms:.0} ms ({second_wall:?} end to end, restore included)"
    );
    eprintln!(
        "turn 2 on B, cold: {cold_n} prefilled in {cold_prefill_ms:.0} ms ({cold_wall:?} end to \
         end): prefill time saved {:.0} ms",
        cold_prefill_ms - prefill_ms
    );
    assert!(
        cold_n > 1500,
        "the control prefilled its whole prompt: {control}"
    );
    // The same number of tokens, cold, at the control's rate.
    let cold_prefill_ms = cold_prefill_ms * second_prompt as f64 / cold_n as f64;
    assert!(
        prefill_ms < cold_prefill_ms / 2.0,
        "restored prefill {prefill_ms:.0} ms vs cold {cold_prefill_ms:.0} ms"
    );
}

/// A llama-server is drained, then stopped, while a session waits on its tool (no policy, so no
/// demote wrote a file): the drain saved the session's slot to the shared directory, so its next
/// turn is restored on the other server instead of prefilled there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_llama_server_hands_its_sessions_kv_over_before_it_stops() {
    let mut pair = TwoServers::start(
        "drain",
        "[policies]\nadmin_tokens = [{ role = \"write\", token = \"writer\" }]\n",
    )
    .await;
    let mut messages = first_messages();
    let first = pair.first_turn(&messages).await;
    assert!(pair.slot_files().is_empty(), "no policy demoted anything");

    // The operator drains A to restart it: it gets nothing new, and the gateway saves the
    // sessions its slots hold.
    let drained: Value = client()
        .post(format!("{}/admin/workers/drain", pair.gateway.url))
        .query(&[("url", &pair.engines[first.a].url)])
        .bearer_auth("writer")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(drained["draining"], true, "{drained}");
    let saved = eventually(30, async || {
        pair.hint_actions("demote", &first.home, "clipped").await >= 1.0
    })
    .await;
    assert!(
        saved,
        "the drain never saved A's slot (counted as a clipped demote)"
    );
    assert_eq!(
        pair.slot_files().len(),
        1,
        "A's slot saved to the session's file"
    );
    // Saved: A can go.
    pair.engines[first.a].kill();

    tool_result(&mut messages, &first.reply);
    let second = pair.measured_chat(first.b, &messages).await;
    assert_eq!(second.worker, first.other, "turn 2 went to the server left");
    let Measured {
        prompt,
        prefilled,
        cached,
        ..
    } = second;
    eprintln!(
        "turn 2 on B after A was drained and stopped: {prompt} prompt tokens, {cached} from A's \
         slot saved at the drain, {prefilled} prefilled in {:.0} ms ({:?} end to end)",
        second.prefill_ms, second.wall
    );
    assert!(
        cached * 10 >= first.prompt * 9,
        "B prefilled {prefilled} of {prompt} tokens: only {cached} came from A's slot (turn 1 \
         had {})",
        first.prompt
    );
    assert!(
        pair.hint_actions("prefetch", &first.other, "accepted")
            .await
            >= 1.0,
        "the restore on B is counted"
    );
}

/// A demote the engine cannot carry out (no `--slot-save-path`: llama-server refuses slot saves)
/// comes back to the policy as rejected, and demote-on-tool-call then cancels the prefetch it
/// had planned for the tool's return: nothing left the device, so there is nothing to bring back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_demote_reaches_the_policy_which_drops_its_prefetch() {
    let (server, model) = engine_paths();
    let engine = LlamaServer::start_with(&server, &model, &["--metrics"]);
    engine.wait_healthy().await;
    // The tool is predicted to take 3 s (past the 2 s threshold): demote now, prefetch at 2.5 s.
    let config = format!(
        "[policies]\n\
         kv_hints = \"native:demote-on-tool-call:unseen_tool_time=3s:prefetch_lead=500ms\"\n\
         [[workers]]\nurl = \"{}\"\nkind = \"openai\"\nupstream = \"tokens\"\nkv_hints = \"llama-slots\"\n",
        engine.url
    );
    let gateway = Gateway::start(&config);
    let r = client()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .header("x-session-id", "agent-refused")
        .json(&body(&first_messages()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let reply: Value = r.json().await.unwrap();
    assert_eq!(
        reply["choices"][0]["finish_reason"], "tool_calls",
        "{reply}"
    );
    let metrics_url = format!("{}/metrics", gateway.url);
    let hint_actions = async |action: &str, outcome: &str| {
        sample(
            &get_text(&metrics_url).await,
            "switchyard_kv_hint_actions_total",
            &[
                &format!("action=\"{action}\""),
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    let refused = eventually(30, async || hint_actions("demote", "rejected").await >= 1.0).await;
    assert!(
        refused,
        "the demote was not refused: {}",
        get_text(&metrics_url).await
    );
    // Well past the planned prefetch (the tool's result never comes).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let text = get_text(&metrics_url).await;
    let prefetches = sample(
        &text,
        "switchyard_kv_hint_actions_total",
        &["action=\"prefetch\""],
    );
    assert_eq!(prefetches, 0.0, "a prefetch after a refused demote: {text}");
}
