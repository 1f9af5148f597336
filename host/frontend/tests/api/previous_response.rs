//! `previous_response_id`: a response stored after streaming continues in the next request.

use serde_json::json;
use switchyard_frontend::{
    Api, ParsedEvent, ReplyEvent, ReplyMeta, ResponseStore, responses, to_template_messages,
};

#[test]
fn a_chain_of_responses_renders_like_one_full_request() {
    let mut store = ResponseStore::new(16, 1 << 20);

    // Turn 1: the model calls a tool.
    let mut first = responses::decode(&json!({
        "model": "m", "instructions": "Old instructions.", "input": "What is in a.txt?",
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
    }))
    .unwrap();
    first.attach_history(&mut store).unwrap();
    assert!(first.store, "OpenAI stores by default");
    let mut encoder = Api::Responses.stream_encoder(ReplyMeta::new("r1", 1, "m"));
    for event in [
        ReplyEvent::Output(ParsedEvent::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "read".into(),
        }),
        ReplyEvent::Output(ParsedEvent::ToolCallArguments {
            index: 0,
            delta: "{\"path\":\"a.txt\"}".into(),
        }),
    ] {
        encoder.push(&event);
    }
    encoder.finish();
    let first_id = Api::Responses.object_id("r1");
    assert!(
        store
            .insert(first_id.clone(), first.transcript(encoder.reply()))
            .stored
    );

    // Turn 2: the tool's output, continuing turn 1 with new instructions.
    let mut second = responses::decode(&json!({
        "model": "m", "instructions": "New instructions.", "previous_response_id": first_id,
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "alpha"}],
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
    }))
    .unwrap();
    second.attach_history(&mut store).unwrap();

    let full = responses::decode(&json!({
        "model": "m", "instructions": "New instructions.",
        "input": [
            {"role": "user", "content": "What is in a.txt?"},
            {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{\"path\":\"a.txt\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "alpha"}
        ],
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
    }))
    .unwrap();
    assert_eq!(
        to_template_messages(&second.conversation),
        to_template_messages(&full.conversation)
    );
    // Instructions do not carry over.
    let (messages, _) = to_template_messages(&second.conversation);
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "New instructions."})
    );
    assert_eq!(messages.len(), 4);
}

#[test]
fn unknown_previous_response_is_a_400() {
    let mut store = ResponseStore::new(4, 1 << 20);
    let mut req =
        responses::decode(&json!({"model": "m", "previous_response_id": "resp_gone"})).unwrap();
    let err = req.attach_history(&mut store).unwrap_err();
    assert_eq!(err.status, 400);
    assert_eq!(
        Api::Responses.error_body(&err),
        json!({"error": {"message": "previous_response_id: previous response with id 'resp_gone' not found",
                         "type": "invalid_request_error", "param": "previous_response_id",
                         "code": "previous_response_not_found"}})
    );
}
