//! One turn of a coding agent's session: a ~100K-token history plus one tool call and its result
//! (~500 new tokens). The full pass (render + tokenize everything) against the incremental pass
//! through a `SessionCache` primed with the previous turn, and the parts of each: rendering alone
//! (not incremental), tokenizing alone, and a cache miss (a full pass that also keeps the prompt).
//!
//! After criterion, a back-to-back pass times each variant right after the full pass, several
//! rounds, and prints the median ratios: the figures to compare across runs on a noisy machine.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use switchyard_tokenizer::{CacheOutcome, ChatTemplateInput, ModelTokenizer, SessionCache};

const HISTORY_TOKENS: usize = 100_000;
const NEW_TOKENS: usize = 500;
const SESSION: &str = "agent-session";
const ROUNDS: usize = 15;

const WORDS: &[&str] = &[
    "router", "prefix", "cache", "worker", "request", "latency", "token", "block", "hash",
    "engine", "queue", "batch", "decode", "prefill", "memory", "eviction", "policy", "index",
    "config", "error", "retry", "timeout", "stream", "client", "server", "metric", "budget",
    "schedule", "replica", "shard", "tenant", "adapter", "model", "context", "session", "frame",
];
const TOOLS: &[&str] = &[
    "read_file",
    "edit_file",
    "run_tests",
    "grep",
    "list_dir",
    "git_diff",
];

/// Deterministic pseudo-random numbers (64-bit LCG): every run builds the same conversation.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound
    }

    fn word(&mut self) -> &'static str {
        WORDS[self.next(WORDS.len())]
    }

    fn sentence(&mut self, words: usize) -> String {
        let words: Vec<&str> = (0..words).map(|_| self.word()).collect();
        format!("{}.", words.join(" "))
    }

    /// A line of Rust-like code at some indentation.
    fn code_line(&mut self, step: usize) -> String {
        let indent = "    ".repeat(1 + self.next(3));
        match self.next(5) {
            0 => format!(
                "{indent}let {}_{step} = self.{}.get(&{})?;",
                self.word(),
                self.word(),
                self.next(10_000)
            ),
            1 => format!(
                "{indent}if {}.len() > {} {{ return Err(Error::{}(\"{}\")); }}",
                self.word(),
                self.next(512),
                self.word().to_uppercase(),
                self.sentence(3)
            ),
            2 => format!("{indent}// {}", self.sentence(8)),
            3 => format!(
                "{indent}for ({}, {}) in {}.iter().enumerate() {{",
                self.word(),
                self.word(),
                self.word()
            ),
            _ => format!("{indent}}}"),
        }
    }
}

fn tools() -> Vec<Value> {
    TOOLS
        .iter()
        .map(|name| {
            json!({"type": "function", "function": {
                "name": name,
                "description": format!("{name}: operate on the workspace and return the result as text."),
                "parameters": {"type": "object", "properties": {
                    "path": {"type": "string", "description": "Path relative to the repository root."},
                    "pattern": {"type": "string", "description": "Optional glob or regex."},
                }, "required": ["path"]},
            }})
        })
        .collect()
}

/// One agent step: the assistant's note and tool call, then the tool's code-like output of
/// `lines` lines.
fn step(rng: &mut Lcg, step: usize, lines: usize) -> [Value; 2] {
    let tool = TOOLS[rng.next(TOOLS.len())];
    let path = format!("src/{}/{}_{step}.rs", rng.word(), rng.word());
    let call = format!(
        "{}\n<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {{\"path\": \"{path}\"}}}}\n</tool_call>",
        rng.sentence(10)
    );
    let code: Vec<String> = (0..lines).map(|_| rng.code_line(step)).collect();
    let result = format!("{path}:\nimpl {} {{\n{}\n}}\n", rng.word(), code.join("\n"));
    [
        json!({"role": "assistant", "content": call}),
        json!({"role": "tool", "content": result}),
    ]
}

fn input<'a>(messages: &'a [Value], tools: &'a [Value]) -> ChatTemplateInput<'a> {
    ChatTemplateInput {
        messages,
        tools: Some(tools),
        add_generation_prompt: true,
        extra: None,
    }
}

/// The history (about `HISTORY_TOKENS`), and the history plus one step of about `NEW_TOKENS`.
fn conversation(tokenizer: &ModelTokenizer, tools: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let mut rng = Lcg(7);
    let guidelines: Vec<String> = (0..30).map(|_| rng.sentence(16)).collect();
    let system = format!(
        "You are a coding agent working in a Rust repository.\n{}\n# Tools\n{}",
        guidelines.join("\n"),
        tools
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut history = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": format!("Fix the failing tests. {}", rng.sentence(20))}),
    ];
    let tokens = |messages: &[Value]| {
        tokenizer
            .encode_chat(&input(messages, tools))
            .expect("encodes")
            .len()
    };
    while tokens(&history) < HISTORY_TOKENS {
        for _ in 0..16 {
            let n = history.len();
            let lines = 10 + rng.next(40);
            history.extend(step(&mut rng, n, lines));
            if rng.next(6) == 0 {
                history.push(json!({"role": "user", "content": rng.sentence(25)}));
            }
        }
    }
    let base = tokens(&history);
    // The new turn: grow the tool output until the turn adds about NEW_TOKENS.
    let mut lines = 1;
    loop {
        let mut next = history.clone();
        next.extend(step(&mut Lcg(99), history.len(), lines));
        if tokens(&next) - base >= NEW_TOKENS {
            return (history, next);
        }
        lines += 2;
    }
}

/// Puts `cache` back in the state after the previous turn (`previous` cached for `SESSION`).
fn restore(tokenizer: &ModelTokenizer, cache: &SessionCache, previous: &str) {
    let now = Instant::now();
    tokenizer
        .encode_incremental(cache, SESSION, previous.to_owned(), now)
        .expect("encodes");
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn bench(c: &mut Criterion) {
    let tokenizer = ModelTokenizer::embedded_default().expect("embedded model loads");
    let tools = tools();
    let (history, next) = conversation(&tokenizer, &tools);
    let previous_input = input(&history, &tools);
    let next_input = input(&next, &tools);
    let previous_text = tokenizer.render_chat(&previous_input).expect("renders");
    let next_text = tokenizer.render_chat(&next_input).expect("renders");
    let full = tokenizer.encode(&next_text, false).expect("encodes");

    let cache = SessionCache::default();
    restore(&tokenizer, &cache, &previous_text);
    let turn = tokenizer
        .encode_chat_incremental(&cache, SESSION, &next_input, Instant::now())
        .expect("encodes");
    assert_eq!(turn.tokens, full, "incremental must equal the full pass");
    assert_eq!(turn.outcome, CacheOutcome::Hit);
    eprintln!(
        "turn: {} messages, {} bytes, {} tokens ({} new); incremental reused {} and encoded {}",
        next.len(),
        next_text.len(),
        full.len(),
        full.len()
            - tokenizer
                .encode(&previous_text, false)
                .expect("encodes")
                .len(),
        turn.reused_tokens,
        full.len() - turn.reused_tokens
    );

    // Each variant, timed one call at a time with the cache put back between calls.
    let full_pass = || {
        black_box(
            tokenizer
                .encode_chat(black_box(&next_input))
                .expect("encodes"),
        )
    };
    let full_tokenize = || {
        black_box(
            tokenizer
                .encode(black_box(&next_text), false)
                .expect("encodes"),
        )
    };
    let render = || {
        black_box(
            tokenizer
                .render_chat(black_box(&next_input))
                .expect("renders"),
        )
    };
    let incremental = || {
        restore(&tokenizer, &cache, &previous_text);
        let start = Instant::now();
        let out = tokenizer
            .encode_chat_incremental(&cache, SESSION, black_box(&next_input), Instant::now())
            .expect("encodes");
        let elapsed = start.elapsed();
        debug_assert_eq!(out.outcome, CacheOutcome::Hit);
        black_box(out);
        elapsed
    };
    let incremental_tokenize = || {
        restore(&tokenizer, &cache, &previous_text);
        let text = next_text.clone();
        let start = Instant::now();
        let out = tokenizer
            .encode_incremental(&cache, SESSION, black_box(text), Instant::now())
            .expect("encodes");
        let elapsed = start.elapsed();
        black_box(out);
        elapsed
    };
    let miss = || {
        cache.remove(SESSION);
        let start = Instant::now();
        let out = tokenizer
            .encode_chat_incremental(&cache, SESSION, black_box(&next_input), Instant::now())
            .expect("encodes");
        let elapsed = start.elapsed();
        debug_assert_eq!(out.outcome, CacheOutcome::Miss);
        black_box(out);
        elapsed
    };
    let timed = |f: &dyn Fn() -> Duration, iters: u64| (0..iters).map(|_| f()).sum::<Duration>();
    let plain = |f: &dyn Fn()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };

    let mut group = c.benchmark_group("tokenizer/incremental/100k+500");
    group.sample_size(10);
    group.bench_function("full", |b| b.iter(full_pass));
    group.bench_function("full_tokenize", |b| b.iter(full_tokenize));
    group.bench_function("render", |b| b.iter(render));
    group.bench_function("incremental", |b| {
        b.iter_custom(|iters| timed(&incremental, iters))
    });
    group.bench_function("incremental_tokenize", |b| {
        b.iter_custom(|iters| timed(&incremental_tokenize, iters))
    });
    group.bench_function("miss", |b| b.iter_custom(|iters| timed(&miss, iters)));
    group.finish();

    // Back to back: each variant right after the baseline, median of the ratios.
    let mut ratios: [Vec<f64>; 5] = Default::default();
    for _ in 0..ROUNDS {
        let base = plain(&|| {
            full_pass();
        })
        .as_secs_f64();
        let times = [
            plain(&|| {
                full_tokenize();
            }),
            plain(&|| {
                render();
            }),
            incremental(),
            incremental_tokenize(),
            miss(),
        ];
        for (ratio, time) in ratios.iter_mut().zip(times) {
            ratio.push(time.as_secs_f64() / base);
        }
    }
    let names = [
        "full_tokenize",
        "render",
        "incremental",
        "incremental_tokenize",
        "miss",
    ];
    eprintln!("back-to-back median ratio to `full` over {ROUNDS} rounds:");
    for (name, ratio) in names.iter().zip(ratios) {
        eprintln!("  {name:<22} {:.4}", median(ratio));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
