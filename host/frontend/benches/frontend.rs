//! Cost of the frontend on an agent conversation of growing length (Claude Code shape: system
//! blocks, tool calls and results): decode the request, render template messages, render the
//! engine body; streaming one reply through each encoder; relaying an engine's chat stream.
//! IDs: `frontend/<op>/<turns>`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use switchyard_frontend::{
    Api, ParsedEvent, ReplyEvent, ReplyMeta, UpstreamChatDecoder, chat, messages, responses,
    to_chat_request, to_template_messages,
};

/// A messages request with `turns` tool-using turns (~400 bytes of text per turn).
fn conversation(turns: usize) -> Value {
    let text = "The router keeps each session on the worker that holds its prefix. ".repeat(3);
    let mut history = vec![json!({"role": "user", "content": "Fix the failing test."})];
    for turn in 0..turns {
        let id = format!("toolu_{turn}");
        history.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": text, "signature": "sig"},
            {"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("/repo/src/f{turn}.rs")}},
        ]}));
        history.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": text},
        ]}));
    }
    json!({
        "model": "m", "max_tokens": 4096, "stream": true,
        "system": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "Reads a file.", "input_schema": {
            "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}],
        "messages": history,
    })
}

/// The same conversation as `conversation`, in chat completions' and the Responses API's shapes.
fn conversation_as(api: Api, turns: usize) -> Value {
    let text = "The router keeps each session on the worker that holds its prefix. ".repeat(3);
    let tools = json!([{"type": "function", "function": {"name": "Read", "description": "Reads a file.",
        "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}}]);
    let mut items = Vec::new();
    for turn in 0..turns {
        let id = format!("call_{turn}");
        let args = json!({"file_path": format!("/repo/src/f{turn}.rs")}).to_string();
        match api {
            Api::Responses => {
                items.push(json!({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}));
                items.push(json!({"type": "function_call", "call_id": id, "name": "Read", "arguments": args}));
                items.push(json!({"type": "function_call_output", "call_id": id, "output": text}));
            }
            _ => {
                items.push(json!({"role": "assistant", "content": null, "reasoning_content": text,
                    "tool_calls": [{"id": id, "type": "function", "function": {"name": "Read", "arguments": args}}]}));
                items.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
        }
    }
    match api {
        Api::Responses => {
            items.insert(
                0,
                json!({"role": "user", "content": "Fix the failing test."}),
            );
            let tool = &tools[0]["function"];
            json!({"model": "m", "stream": true, "store": false, "instructions": text, "input": items,
                   "tools": [{"type": "function", "name": tool["name"], "description": tool["description"],
                              "parameters": tool["parameters"]}]})
        }
        Api::Messages => conversation(turns),
        _ => {
            items.insert(
                0,
                json!({"role": "user", "content": "Fix the failing test."}),
            );
            items.insert(0, json!({"role": "system", "content": text}));
            json!({"model": "m", "stream": true, "messages": items, "tools": tools})
        }
    }
}

/// The reply meta of a Responses request about the size of the real Codex CLI's first one (0.171:
/// nine tools, 18.7 KB of tool definitions, which the response object echoes), with made-up
/// descriptions as long as each real tool's whole definition, so ~20 KB in all.
fn codex_sized_meta() -> ReplyMeta {
    let prose = "Runs a command in the workspace and returns its output. ";
    let tools: Vec<Value> = [1600, 819, 1425, 391, 11_111, 297, 785, 2196, 51]
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            json!({"type": "function", "name": format!("tool_{i}"), "strict": false,
                   "description": prose.repeat(bytes / prose.len()),
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                  "required": ["cmd"], "additionalProperties": false}})
        })
        .collect();
    let body = json!({"model": "m", "stream": true, "store": false, "tools": tools,
        "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "input": "Say hello."});
    responses::decode(&body)
        .expect("the bench request is valid")
        .reply_meta("r", 0)
}

fn reply_events() -> Vec<ReplyEvent> {
    let mut events: Vec<ReplyEvent> = (0..200)
        .map(|i| ReplyEvent::Output(ParsedEvent::Text(format!("token{i} "))))
        .collect();
    events.push(ReplyEvent::Output(ParsedEvent::ToolCallStart {
        index: 0,
        id: "call_0".into(),
        name: "Read".into(),
    }));
    events.extend((0..20).map(|_| {
        ReplyEvent::Output(ParsedEvent::ToolCallArguments {
            index: 0,
            delta: "{\"a\":".into(),
        })
    }));
    events
}

/// An engine's streamed chat answer as vLLM (and the gateway-anchor harness's fake backends)
/// write it: a role chunk, 64 one-token chunks, the finish chunk, usage and `[DONE]`.
fn engine_stream() -> Vec<String> {
    let head = r#"{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"fake-model","system_fingerprint":"fakebackend","choices":["#;
    let choice = |delta: &str, finish: &str| {
        format!(
            r#"{head}{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}]}}"#
        )
    };
    let mut chunks = vec![choice(r#"{"role":"assistant","content":""}"#, "null")];
    let words = [
        "The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.",
    ];
    chunks.extend((0..64).map(|i| {
        choice(
            &json!({"content": words[i % words.len()]}).to_string(),
            "null",
        )
    }));
    chunks.push(choice("{}", r#""stop""#));
    chunks.push(format!(
        r#"{head}],"usage":{{"prompt_tokens":2048,"completion_tokens":64,"total_tokens":2112}}}}"#
    ));
    chunks.push("[DONE]".into());
    chunks
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("frontend");
    for turns in [10, 100, 1000] {
        let body = conversation(turns);
        let bytes = body.to_string().len() as u64;
        group.throughput(Throughput::Bytes(bytes));
        group.bench_with_input(BenchmarkId::new("decode", turns), &body, |b, body| {
            b.iter(|| messages::decode(black_box(body)))
        });
        let conv = messages::decode(&body).expect("the bench conversation is valid");
        group.bench_with_input(
            BenchmarkId::new("template_messages", turns),
            &conv,
            |b, conv| b.iter(|| to_template_messages(black_box(conv))),
        );
        group.bench_with_input(BenchmarkId::new("chat_request", turns), &conv, |b, conv| {
            b.iter(|| to_chat_request(black_box(conv)))
        });
    }
    let events = reply_events();
    group.throughput(Throughput::Elements(events.len() as u64));
    for api in [Api::ChatCompletions, Api::Responses, Api::Messages] {
        group.bench_with_input(
            BenchmarkId::new("encode", format!("{api:?}")),
            &events,
            |b, events| {
                b.iter(|| {
                    let mut encoder = api.stream_encoder(ReplyMeta::new("r", 0, "m"));
                    let mut frames = 0;
                    for event in events {
                        frames += encoder.push(event).len();
                    }
                    frames + encoder.finish().len()
                })
            },
        );
    }
    // The same reply to a Codex-sized request: the response object, which echoes the request's
    // tools, opens and closes the stream.
    let codex = codex_sized_meta();
    group.bench_with_input(
        BenchmarkId::new("encode", "Responses-codex"),
        &events,
        |b, events| {
            b.iter(|| {
                let mut encoder = Api::Responses.stream_encoder(codex.clone());
                let mut frames = 0;
                for event in events {
                    frames += encoder.push(event).len();
                }
                frames + encoder.finish().len()
            })
        },
    );
    // The gateway's per-token work on a chat client's stream from a chat engine: each engine
    // chunk decoded into reply events and encoded again as the client's chunk.
    let chunks = engine_stream();
    group.throughput(Throughput::Elements(chunks.len() as u64));
    group.bench_with_input(
        BenchmarkId::new("relay", "ChatCompletions"),
        &chunks,
        |b, chunks| {
            b.iter(|| {
                let mut decoder = UpstreamChatDecoder::new("r");
                let mut encoder = Api::ChatCompletions.stream_encoder(ReplyMeta::new("r", 0, "m"));
                let mut bytes = 0;
                for chunk in chunks {
                    let events = decoder.decode_data(black_box(chunk)).expect("valid");
                    for event in &events {
                        bytes += encoder
                            .push(event)
                            .iter()
                            .map(|f| f.wire_len())
                            .sum::<usize>();
                    }
                }
                bytes + encoder.finish().len()
            })
        },
    );
    // One whole turn of the frontend alone (what a request costs besides tokenizing, routing and
    // the engine): body bytes -> IR -> template messages, then a 221-event reply streamed back.
    group.throughput(Throughput::Elements(1));
    for api in [Api::ChatCompletions, Api::Responses, Api::Messages] {
        let bytes = conversation_as(api, 100).to_string().into_bytes();
        group.bench_with_input(
            BenchmarkId::new("turn", format!("{api:?}")),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    let body = switchyard_frontend::parse_body(black_box(bytes)).expect("valid");
                    let conv = match api {
                        Api::Responses => responses::decode(&body).expect("valid").conversation,
                        Api::Messages => messages::decode(&body).expect("valid"),
                        _ => chat::decode(&body).expect("valid"),
                    };
                    let rendered = to_template_messages(&conv);
                    let mut encoder = api.stream_encoder(ReplyMeta::new("r", 0, "m"));
                    let mut frames = 0;
                    for event in &events {
                        frames += encoder.push(event).len();
                    }
                    (rendered, frames + encoder.finish().len())
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
