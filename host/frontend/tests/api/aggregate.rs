//! Non-streaming bodies, and their agreement with the streams.

use serde_json::{Value, json};
use switchyard_frontend::{Aggregator, Api, Block, ReplyEvent, Role};

use crate::encoders::{golden_response, stream};
use crate::support::{golden_events, meta, parsed};

fn aggregate(api: Api) -> Value {
    let mut aggregator = Aggregator::new(api, meta());
    for event in golden_events() {
        aggregator.push(&event);
    }
    aggregator.finish()
}

#[test]
fn chat_completion_body() {
    assert_eq!(
        aggregate(Api::ChatCompletions),
        json!({
            "id": "chatcmpl-req1", "object": "chat.completion", "created": 1_700_000_000, "model": "m",
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "Calling tools.", "reasoning_content": "Let me think.",
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
                ]}, "logprobs": null, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                      "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens_details": {"reasoning_tokens": 5}}
        })
    );
}

#[test]
fn completion_body() {
    let body = aggregate(Api::Completions);
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["id"], "cmpl-req1");
    assert_eq!(body["choices"][0]["text"], "Calling tools.");
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
}

#[test]
fn responses_body_is_the_streams_final_object() {
    assert_eq!(aggregate(Api::Responses), golden_response());
    let frames = parsed(&stream(Api::Responses, meta(), &golden_events()));
    assert_eq!(
        frames.last().unwrap().1["response"],
        aggregate(Api::Responses)
    );
}

#[test]
fn anthropic_message_body() {
    assert_eq!(
        aggregate(Api::Messages),
        json!({
            "id": "msg_req1", "type": "message", "role": "assistant", "model": "m",
            "content": [
                {"type": "thinking", "thinking": "Let me think.", "signature": ""},
                {"type": "text", "text": "Calling tools."},
                {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64, "output_tokens": 20}
        })
    );
}

#[test]
fn reply_message_for_the_store() {
    let mut aggregator = Aggregator::new(Api::Responses, meta());
    for event in golden_events() {
        aggregator.push(&event);
    }
    let message = aggregator.reply().message();
    assert_eq!(message.role, Role::Assistant);
    assert_eq!(
        message.blocks,
        vec![
            Block::Thinking {
                text: "Let me think.".into(),
                signature: None
            },
            Block::Text {
                text: "Calling tools.".into()
            },
            Block::ToolCall {
                id: "call_a".into(),
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            },
            Block::ToolCall {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: "{}".into()
            },
        ]
    );
}

/// A client rebuilding the reply from chat deltas gets the aggregated message, however the
/// engine split its output.
#[test]
fn chat_deltas_add_up_to_the_body() {
    use switchyard_frontend::ParsedEvent;
    let text = "The quick brown fox jumps over the lazy dog";
    for split in [1, 2, 3, 7, text.len()] {
        let mut events: Vec<ReplyEvent> = text
            .as_bytes()
            .chunks(split)
            .map(|c| ReplyEvent::Output(ParsedEvent::Text(String::from_utf8(c.to_vec()).unwrap())))
            .collect();
        events.extend(golden_events());
        let frames = parsed(&stream(Api::ChatCompletions, meta(), &events));
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut arguments = vec![String::new(); 2];
        for (_, data) in &frames {
            let Some(delta) = data.pointer("/choices/0/delta") else {
                continue;
            };
            content += delta["content"].as_str().unwrap_or_default();
            reasoning += delta["reasoning_content"].as_str().unwrap_or_default();
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().unwrap() as usize;
                arguments[index] += call["function"]["arguments"].as_str().unwrap_or_default();
            }
        }
        let mut aggregator = Aggregator::new(Api::ChatCompletions, meta());
        events.iter().for_each(|e| aggregator.push(e));
        let message = &aggregator.finish()["choices"][0]["message"];
        assert_eq!(content, message["content"].as_str().unwrap());
        assert_eq!(reasoning, message["reasoning_content"].as_str().unwrap());
        for (i, args) in arguments.iter().enumerate() {
            assert_eq!(
                args,
                message["tool_calls"][i]["function"]["arguments"]
                    .as_str()
                    .unwrap()
            );
        }
    }
}
