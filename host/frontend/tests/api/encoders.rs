//! Golden streams: the golden reply through each API's encoder, frame by frame.

use serde_json::{Value, json};
use switchyard_frontend::{
    Api, ApiError, ErrorKind, FinishReason, ParsedEvent, ReplyEvent, ReplyMeta, SseFrame, Usage,
};

use crate::support::{golden_events, meta, parsed};

/// Streams `events` through `api`'s encoder: start, each event, finish.
pub(crate) fn stream(api: Api, meta: ReplyMeta, events: &[ReplyEvent]) -> Vec<SseFrame> {
    let mut encoder = api.stream_encoder(meta);
    let mut frames = encoder.start();
    for event in events {
        frames.extend(encoder.push(event));
    }
    frames.extend(encoder.finish());
    // Ended: nothing more comes out.
    assert!(encoder.push(&events[0]).is_empty());
    assert!(encoder.finish().is_empty());
    frames
}

fn chunk(delta: Value, finish_reason: Value) -> (Option<&'static str>, Value) {
    (
        None,
        json!({"id": "chatcmpl-req1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "m",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]}),
    )
}

#[test]
fn chat_completion_chunks() {
    let frames = stream(Api::ChatCompletions, meta(), &golden_events());
    let call_start = |index: u32, id: &str, name: &str| json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]});
    let args = |index: u32, args: &str| json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]});
    let expected = vec![
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"reasoning_content": "Let me"}), Value::Null),
        chunk(json!({"reasoning_content": " think."}), Value::Null),
        chunk(json!({"content": "Calling"}), Value::Null),
        chunk(json!({"content": " tools."}), Value::Null),
        chunk(call_start(0, "call_a", "get_weather"), Value::Null),
        chunk(args(0, "{\"city\":"), Value::Null),
        chunk(args(0, "\"Paris\"}"), Value::Null),
        chunk(call_start(1, "call_b", "get_time"), Value::Null),
        chunk(args(1, "{}"), Value::Null),
        chunk(json!({}), json!("tool_calls")),
        (
            None,
            json!({"id": "chatcmpl-req1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
                      "prompt_tokens_details": {"cached_tokens": 64},
                      "completion_tokens_details": {"reasoning_tokens": 5}}}),
        ),
        (None, json!("[DONE]")),
    ];
    assert_eq!(parsed(&frames), expected);
    assert_eq!(frames.last().unwrap().to_string(), "data: [DONE]\n\n");
}

#[test]
fn chat_without_include_usage_has_no_usage_chunk() {
    let meta = ReplyMeta {
        include_usage: false,
        ..meta()
    };
    let frames = parsed(&stream(Api::ChatCompletions, meta, &golden_events()));
    assert_eq!(frames.len(), 12);
    assert!(frames.iter().all(|(_, data)| data.get("usage").is_none()));
}

#[test]
fn completions_chunks() {
    let events = [
        ReplyEvent::Output(ParsedEvent::Text("Hello".into())),
        ReplyEvent::Output(ParsedEvent::Reasoning("hidden".into())),
        ReplyEvent::Output(ParsedEvent::Text(" world".into())),
        ReplyEvent::Finish {
            reason: FinishReason::Length,
        },
    ];
    let frames = parsed(&stream(Api::Completions, meta(), &events));
    let text = |text: &str, finish: Value| {
        (
            None,
            json!({"id": "cmpl-req1", "object": "text_completion", "created": 1_700_000_000, "model": "m",
                      "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]}),
        )
    };
    assert_eq!(
        frames,
        vec![
            text("Hello", Value::Null),
            text(" world", Value::Null),
            text("", json!("length")),
            (
                None,
                json!({"id": "cmpl-req1", "object": "text_completion", "created": 1_700_000_000, "model": "m", "choices": [],
                          "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}})
            ),
            (None, json!("[DONE]")),
        ]
    );
}

fn final_response() -> Value {
    json!({
        "id": "resp_req1", "object": "response", "created_at": 1_700_000_000, "status": "completed",
        "error": null, "incomplete_details": null, "model": "m",
        "output": [
            {"id": "rs_req1_0", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Let me think."}], "status": "completed"},
            {"id": "msg_req1_1", "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Calling tools.", "annotations": [], "logprobs": []}]},
            {"id": "fc_req1_2", "type": "function_call", "status": "completed", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"id": "fc_req1_3", "type": "function_call", "status": "completed", "call_id": "call_b", "name": "get_time", "arguments": "{}"}
        ],
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
                  "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5}, "total_tokens": 120}
    })
}

pub(crate) fn golden_response() -> Value {
    final_response()
}

#[test]
fn responses_events() {
    let frames = parsed(&stream(Api::Responses, meta(), &golden_events()));
    let opening = json!({
        "id": "resp_req1", "object": "response", "created_at": 1_700_000_000, "status": "in_progress",
        "error": null, "incomplete_details": null, "model": "m", "output": [],
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "usage": null
    });
    let rs = |extra: Value| {
        merge(
            json!({"item_id": "rs_req1_0", "output_index": 0, "content_index": 0}),
            extra,
        )
    };
    let msg = |extra: Value| {
        merge(
            json!({"item_id": "msg_req1_1", "output_index": 1, "content_index": 0}),
            extra,
        )
    };
    let fc = |n: u32, extra: Value| {
        merge(
            json!({"item_id": format!("fc_req1_{n}"), "output_index": n}),
            extra,
        )
    };
    let text_part = |text: &str| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    let done_output = final_response()["output"].clone();
    let expected: Vec<(&str, Value)> = vec![
        ("response.created", json!({"response": opening})),
        ("response.in_progress", json!({"response": opening})),
        (
            "response.output_item.added",
            json!({"output_index": 0, "item": {"id": "rs_req1_0", "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}}),
        ),
        (
            "response.content_part.added",
            rs(json!({"part": {"type": "reasoning_text", "text": ""}})),
        ),
        (
            "response.reasoning_text.delta",
            rs(json!({"delta": "Let me"})),
        ),
        (
            "response.reasoning_text.delta",
            rs(json!({"delta": " think."})),
        ),
        (
            "response.reasoning_text.done",
            rs(json!({"text": "Let me think."})),
        ),
        (
            "response.content_part.done",
            rs(json!({"part": {"type": "reasoning_text", "text": "Let me think."}})),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 0, "item": done_output[0]}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 1, "item": {"id": "msg_req1_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        (
            "response.content_part.added",
            msg(json!({"part": text_part("")})),
        ),
        (
            "response.output_text.delta",
            msg(json!({"delta": "Calling", "logprobs": []})),
        ),
        (
            "response.output_text.delta",
            msg(json!({"delta": " tools.", "logprobs": []})),
        ),
        (
            "response.output_text.done",
            msg(json!({"text": "Calling tools.", "logprobs": []})),
        ),
        (
            "response.content_part.done",
            msg(json!({"part": text_part("Calling tools.")})),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 1, "item": done_output[1]}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 2, "item": {"id": "fc_req1_2", "type": "function_call", "status": "in_progress", "call_id": "call_a", "name": "get_weather", "arguments": ""}}),
        ),
        (
            "response.function_call_arguments.delta",
            fc(2, json!({"delta": "{\"city\":"})),
        ),
        (
            "response.function_call_arguments.delta",
            fc(2, json!({"delta": "\"Paris\"}"})),
        ),
        (
            "response.function_call_arguments.done",
            fc(
                2,
                json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}),
            ),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 2, "item": done_output[2]}),
        ),
        (
            "response.output_item.added",
            json!({"output_index": 3, "item": {"id": "fc_req1_3", "type": "function_call", "status": "in_progress", "call_id": "call_b", "name": "get_time", "arguments": ""}}),
        ),
        (
            "response.function_call_arguments.delta",
            fc(3, json!({"delta": "{}"})),
        ),
        (
            "response.function_call_arguments.done",
            fc(3, json!({"name": "get_time", "arguments": "{}"})),
        ),
        (
            "response.output_item.done",
            json!({"output_index": 3, "item": done_output[3]}),
        ),
        ("response.completed", json!({"response": final_response()})),
    ];
    assert_eq!(frames.len(), expected.len());
    for (n, ((event, data), (kind, fields))) in frames.iter().zip(expected).enumerate() {
        let mut want = merge(json!({"type": kind}), fields);
        want["sequence_number"] = n.into();
        assert_eq!(*event, Some(kind), "frame {n}");
        assert_eq!(*data, want, "frame {n}");
    }
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

#[test]
fn responses_echo_request_fields_and_report_incomplete() {
    let mut meta = meta();
    let echo = std::sync::Arc::make_mut(&mut meta.echo);
    echo.insert("tools".into(), json!([{"type": "function", "name": "f"}]));
    echo.insert("store".into(), json!(false));
    echo.insert("instructions".into(), json!("be brief"));
    let events = [
        ReplyEvent::Output(ParsedEvent::Text("partial".into())),
        ReplyEvent::Finish {
            reason: FinishReason::Length,
        },
    ];
    let frames = parsed(&stream(Api::Responses, meta, &events));
    let (event, last) = frames.last().unwrap();
    assert_eq!(*event, Some("response.incomplete"));
    let response = &last["response"];
    assert_eq!(response["status"], "incomplete");
    assert_eq!(
        response["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(
        response["tools"],
        json!([{"type": "function", "name": "f"}])
    );
    assert_eq!(response["store"], false);
    assert_eq!(response["instructions"], "be brief");
    assert_eq!(frames[0].1["response"]["instructions"], "be brief");
}

#[test]
fn anthropic_message_events() {
    let frames = parsed(&stream(Api::Messages, meta(), &golden_events()));
    let block =
        |kind: &'static str, fields: Value| (Some(kind), merge(json!({"type": kind}), fields));
    let start = |n: u32, content_block: Value| {
        block(
            "content_block_start",
            json!({"index": n, "content_block": content_block}),
        )
    };
    let delta =
        |n: u32, delta: Value| block("content_block_delta", json!({"index": n, "delta": delta}));
    let stop = |n: u32| block("content_block_stop", json!({"index": n}));
    let expected = vec![
        block(
            "message_start",
            json!({"message": {
            "id": "msg_req1", "type": "message", "role": "assistant", "model": "m", "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 100, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}}}),
        ),
        block("ping", json!({})),
        start(
            0,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
        ),
        delta(0, json!({"type": "thinking_delta", "thinking": "Let me"})),
        delta(0, json!({"type": "thinking_delta", "thinking": " think."})),
        stop(0),
        start(1, json!({"type": "text", "text": ""})),
        delta(1, json!({"type": "text_delta", "text": "Calling"})),
        delta(1, json!({"type": "text_delta", "text": " tools."})),
        stop(1),
        start(
            2,
            json!({"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}),
        ),
        delta(
            2,
            json!({"type": "input_json_delta", "partial_json": "{\"city\":"}),
        ),
        delta(
            2,
            json!({"type": "input_json_delta", "partial_json": "\"Paris\"}"}),
        ),
        stop(2),
        start(
            3,
            json!({"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}}),
        ),
        delta(3, json!({"type": "input_json_delta", "partial_json": "{}"})),
        stop(3),
        block(
            "message_delta",
            json!({
            "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64, "output_tokens": 20}}),
        ),
        block("message_stop", json!({})),
    ];
    assert_eq!(frames, expected);
}

#[test]
fn anthropic_stop_sequence() {
    let events = [
        ReplyEvent::Output(ParsedEvent::Text("x".into())),
        ReplyEvent::Finish {
            reason: FinishReason::StopSequence("END".into()),
        },
        ReplyEvent::Usage(Usage {
            prompt_tokens: 5,
            completion_tokens: 1,
            cached_tokens: 0,
            reasoning_tokens: None,
        }),
    ];
    let frames = parsed(&stream(Api::Messages, meta(), &events));
    let message_delta = &frames[frames.len() - 2].1;
    assert_eq!(
        message_delta["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
    );
}

#[test]
fn failures_end_each_stream_in_its_shape() {
    let error = ApiError::new(ErrorKind::Upstream, "engine went away");
    let text = ReplyEvent::Output(ParsedEvent::Text("par".into()));
    let fail = |api: Api| {
        let mut encoder = api.stream_encoder(meta());
        let mut frames = encoder.push(&text);
        frames.extend(encoder.fail(&error));
        assert!(encoder.finish().is_empty(), "nothing after a failure");
        parsed(&frames)
    };
    let chat = fail(Api::ChatCompletions);
    assert_eq!(
        chat[chat.len() - 2].1["error"]["message"],
        "engine went away"
    );
    assert_eq!(chat.last().unwrap().1, "[DONE]");

    let responses = fail(Api::Responses);
    let (event, last) = responses.last().unwrap();
    assert_eq!(*event, Some("response.failed"));
    assert_eq!(last["response"]["status"], "failed");
    assert_eq!(
        last["response"]["error"],
        json!({"code": "server_error", "message": "engine went away"})
    );

    let messages = fail(Api::Messages);
    assert_eq!(
        messages.last().unwrap(),
        &(
            Some("error"),
            json!({"type": "error", "error": {"type": "api_error", "message": "engine went away"}})
        )
    );
}

#[test]
fn an_empty_reply_still_ends_well_formed() {
    for api in [
        Api::ChatCompletions,
        Api::Completions,
        Api::Responses,
        Api::Messages,
    ] {
        let mut encoder = api.stream_encoder(meta());
        let frames = parsed(&encoder.finish());
        let (_, last) = frames.last().unwrap();
        match api {
            Api::ChatCompletions | Api::Completions => assert_eq!(last, "[DONE]"),
            Api::Responses => assert_eq!(last["response"]["status"], "completed"),
            Api::Messages => assert_eq!(last["type"], "message_stop"),
        }
    }
}

/// A Codex turn: namespaced and custom calls go back in Codex's shapes, reasoning carries its
/// summary and sealed content, and those items sent back as the next input decode to the same
/// conversation the model produced.
#[test]
fn responses_items_round_trip_codex_tools_and_reasoning() {
    let request = switchyard_frontend::responses::decode(&json!({
    "model": "m", "input": "go", "store": false,
    "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
    "tools": [
        {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [
            {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
        {"type": "custom", "name": "apply_patch", "description": "Patch."},
    ]}))
    .unwrap();
    let out = ReplyEvent::Output;
    let events = [
        out(ParsedEvent::Reasoning("Plan it.".into())),
        out(ParsedEvent::ToolCallStart {
            index: 0,
            id: "c1".into(),
            name: "multi_agent_v1.spawn_agent".into(),
        }),
        out(ParsedEvent::ToolCallArguments {
            index: 0,
            delta: "{\"task\":\"look\"}".into(),
        }),
        out(ParsedEvent::ToolCallStart {
            index: 1,
            id: "c2".into(),
            name: "apply_patch".into(),
        }),
        out(ParsedEvent::ToolCallArguments {
            index: 1,
            delta: "{\"input\":\"*** Begin Patch\"}".into(),
        }),
        ReplyEvent::Finish {
            reason: FinishReason::ToolCalls,
        },
    ];
    let frames = parsed(&stream(Api::Responses, request.reply_meta("r", 0), &events));
    let (_, last) = frames.last().unwrap();
    let output = last["response"]["output"].as_array().unwrap().clone();
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["summary"][0]["text"], "Plan it.");
    assert!(output[0]["encrypted_content"].is_string());
    assert_eq!(
        (
            &output[1]["type"],
            &output[1]["namespace"],
            &output[1]["name"]
        ),
        (
            &json!("function_call"),
            &json!("multi_agent_v1"),
            &json!("spawn_agent")
        )
    );
    assert_eq!(
        (&output[2]["type"], &output[2]["input"]),
        (&json!("custom_tool_call"), &json!("*** Begin Patch"))
    );
    assert!(
        frames
            .iter()
            .any(|(e, _)| *e == Some("response.custom_tool_call_input.done"))
    );

    // Codex sends the items back without the reasoning text (summary and sealed content only).
    let mut input = vec![json!({"role": "user", "content": "go"})];
    input.extend(output.iter().cloned());
    input[1].as_object_mut().unwrap().remove("content");
    let next = switchyard_frontend::responses::decode(
        &json!({"model": "m", "input": input, "tools": request.echo["tools"]}),
    )
    .unwrap();
    let answer = &next.conversation.messages[1];
    let reply_blocks: Vec<_> = answer.blocks.iter().collect();
    assert!(
        matches!(reply_blocks[0], switchyard_frontend::Block::Thinking { text, .. } if text == "Plan it.")
    );
    assert!(
        matches!(reply_blocks[1], switchyard_frontend::Block::ToolCall { name, .. } if name == "multi_agent_v1.spawn_agent")
    );
    assert!(
        matches!(reply_blocks[2], switchyard_frontend::Block::ToolCall { name, arguments, .. }
        if name == "apply_patch" && arguments == r#"{"input":"*** Begin Patch"}"#)
    );
}
