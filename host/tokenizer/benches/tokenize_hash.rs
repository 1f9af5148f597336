//! Cost of turning a ~32K-token agent conversation into block hashes: render the chat template,
//! tokenize, hash 16-token blocks; and each step alone.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use switchyard_core::hash::BlockHasher;
use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer};

const TARGET_TOKENS: usize = 32 * 1024;
const BLOCK_SIZE: usize = 16;

const WORDS: &[&str] = &[
    "the", "router", "prefix", "cache", "worker", "request", "latency", "token", "block", "hash",
    "engine", "queue", "batch", "decode", "prefill", "memory", "eviction", "policy", "index",
    "config", "error", "retry", "timeout", "stream", "client", "server", "metric", "budget",
    "schedule", "migrate", "replica", "shard", "tenant", "adapter", "model", "context",
];

/// Deterministic pseudo-random numbers (64-bit LCG), so every run hashes the same conversation.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound
    }

    fn sentence(&mut self, words: usize) -> String {
        let words: Vec<&str> = (0..words).map(|_| WORDS[self.next(WORDS.len())]).collect();
        format!("{}.", words.join(" "))
    }
}

fn tools() -> Vec<Value> {
    ["read_file", "write_file", "run_tests", "search_code", "list_dir", "git_diff"]
        .iter()
        .map(|name| {
            json!({"type": "function", "function": {
                "name": name,
                "description": format!("{name}: operate on the workspace and return the result as text."),
                "parameters": {"type": "object", "properties": {
                    "path": {"type": "string", "description": "Path relative to the repository root."},
                    "pattern": {"type": "string", "description": "Optional glob or regex."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                }, "required": ["path"]},
            }})
        })
        .collect()
}

/// One agent step: the user's request, the assistant's tool call, the tool's output.
fn turn(rng: &mut Lcg, step: usize) -> [Value; 3] {
    let request = (0..3)
        .map(|_| rng.sentence(12))
        .collect::<Vec<_>>()
        .join(" ");
    let code: String = (0..20)
        .map(|line| {
            let n = rng.next(10_000);
            format!(
                "    let {}_{line} = {}({n}, \"{}\");\n",
                WORDS[rng.next(WORDS.len())],
                WORDS[rng.next(WORDS.len())],
                rng.sentence(3)
            )
        })
        .collect();
    [
        json!({"role": "user", "content": format!("Step {step}: {request}")}),
        json!({"role": "assistant", "content": format!(
            "<tool_call>{{\"name\": \"read_file\", \"arguments\": {{\"path\": \"src/module_{step}.rs\"}}}}</tool_call>"
        )}),
        json!({"role": "tool", "content": format!("fn step_{step}() {{\n{code}}}\n")}),
    ]
}

/// A long system prompt with the tool definitions, then agent turns until about 32K tokens.
fn conversation(tokenizer: &ModelTokenizer, tools: &[Value]) -> Vec<Value> {
    let mut rng = Lcg(42);
    let guidelines = (0..40)
        .map(|_| rng.sentence(20))
        .collect::<Vec<_>>()
        .join("\n");
    let tool_text: Vec<String> = tools.iter().map(Value::to_string).collect();
    let system = format!(
        "You are a coding agent.\n{guidelines}\n# Tools\n{}",
        tool_text.join("\n")
    );
    let mut messages = vec![json!({"role": "system", "content": system})];
    let rendered = |messages: &[Value]| {
        let input = ChatTemplateInput {
            messages,
            tools: Some(tools),
            ..Default::default()
        };
        tokenizer.encode_chat(&input).expect("encodes").len()
    };
    // Grow a few turns at a time, then trim to the first length past the target.
    while rendered(&messages) < TARGET_TOKENS {
        for _ in 0..8 {
            let step = messages.len() / 3;
            messages.extend(turn(&mut rng, step));
        }
    }
    while rendered(&messages[..messages.len() - 3]) >= TARGET_TOKENS {
        messages.truncate(messages.len() - 3);
    }
    messages
}

fn bench(c: &mut Criterion) {
    let tokenizer = ModelTokenizer::embedded_default().expect("embedded model loads");
    let hasher = BlockHasher::new(BLOCK_SIZE);
    let tools = tools();
    let messages = conversation(&tokenizer, &tools);
    let input = ChatTemplateInput {
        messages: &messages,
        tools: Some(&tools),
        add_generation_prompt: true,
        extra: None,
    };
    let text = tokenizer.render_chat(&input).expect("renders");
    let ids = tokenizer.encode(&text, false).expect("encodes");
    eprintln!(
        "conversation: {} messages, {} bytes, {} tokens, {} blocks",
        messages.len(),
        text.len(),
        ids.len(),
        ids.len() / BLOCK_SIZE
    );

    let mut group = c.benchmark_group("conversation_32k");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("render_tokenize_hash", |b| {
        b.iter(|| hasher.sequence(&tokenizer.encode_chat(black_box(&input)).expect("encodes")))
    });
    group.bench_function("render", |b| {
        b.iter(|| tokenizer.render_chat(black_box(&input)).expect("renders"))
    });
    group.bench_function("tokenize", |b| {
        b.iter(|| tokenizer.encode(black_box(&text), false).expect("encodes"))
    });
    group.bench_function("hash", |b| b.iter(|| hasher.sequence(black_box(&ids))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
