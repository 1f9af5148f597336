//! Parsing cost per output byte, as a gateway streams it: text in small chunks (16 bytes, about
//! four tokens), through `OutputParser` with a reasoning and a tool-call parser.
//!
//! Fixture: 4 KiB of reasoning, 4 KiB of answer text, then eight calls whose arguments hold
//! 1 KiB of text each, written by `format_tool_calls` in each family's format.
//!
//! Bench IDs: `parsers/push/<tool parser>/16b`, throughput in bytes.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use serde_json::json;
use switchyard_parsers::{OutputParser, ToolCall, format_tool_calls};

const CHUNK: usize = 16;

fn output(tools: &str) -> (String, &'static str) {
    let prose = "The quick brown fox jumps over the lazy dog; ".repeat(92);
    let calls: Vec<ToolCall> = (0..8)
        .map(|i| ToolCall {
            name: format!("tool_{i}"),
            arguments: json!({"path": format!("src/file_{i}.rs"), "content": &prose[..1024], "line": i}),
        })
        .collect();
    let calls = format_tool_calls(tools, &calls).expect("formats known parsers");
    match tools {
        "harmony" => (
            format!(
                "<|channel|>analysis<|message|>{prose}<|end|><|start|>assistant<|channel|>commentary<|message|>{prose}<|end|><|start|>assistant{calls}"
            ),
            "gpt_oss",
        ),
        "kimi_k2" => (format!("◁think▷{prose}◁/think▷{prose}{calls}"), "kimi"),
        _ => (format!("{prose}</think>{prose}{calls}"), "deepseek_r1"),
    }
}

fn chunks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + CHUNK).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn push(c: &mut Criterion) {
    let mut group = c.benchmark_group("parsers/push");
    for tools in [
        "hermes",
        "qwen3_coder",
        "kimi_k2",
        "llama3_json",
        "pythonic",
        "harmony",
    ] {
        let (text, reasoning) = output(tools);
        let pieces = chunks(&text);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::new(tools, "16b"), &pieces, |b, pieces| {
            b.iter(|| {
                let mut parser = OutputParser::new(Some(reasoning), Some(tools), "call_")
                    .expect("known parsers");
                let mut events = 0;
                for piece in pieces {
                    events += parser.push(black_box(piece)).len();
                }
                events + parser.finish().len()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, push);
criterion_main!(benches);
