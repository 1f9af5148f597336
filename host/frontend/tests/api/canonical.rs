//! The same 3-turn tool-using conversation through each API renders byte-identical template
//! messages and engine messages.

use serde_json::{Value, json};
use switchyard_frontend::{chat, messages, responses, to_chat_request, to_template_messages};

fn chat_body() -> Value {
    json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": null, "reasoning_content": "I should call ls.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
            {"role": "assistant", "content": "Two files: a.txt and b.txt."},
            {"role": "user", "content": [{"type": "text", "text": "Read both."}]},
            {"role": "assistant", "content": "Reading them.", "reasoning_content": "Two reads in parallel.",
             "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a.txt\"}"}},
                {"id": "call_3", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"b.txt\"}"}}
             ]},
            {"role": "tool", "tool_call_id": "call_2", "content": "alpha"},
            {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "beta"}]},
            {"role": "assistant", "content": "a.txt says alpha, b.txt says beta."},
            {"role": "user", "content": "Thanks!"}
        ],
        "tools": [
            {"type": "function", "function": {"name": "ls", "description": "List files.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
            {"type": "function", "function": {"name": "read", "description": "Read a file.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
        ]
    })
}

fn responses_body() -> Value {
    let user = |text: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]});
    let assistant = |text: &str| json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]});
    let reasoning = |text: &str| json!({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]});
    let call = |id: &str, name: &str, args: &str| json!({"type": "function_call", "call_id": id, "name": name, "arguments": args});
    let output =
        |id: &str, out: &str| json!({"type": "function_call_output", "call_id": id, "output": out});
    json!({
        "model": "m",
        "instructions": "You are a coding agent.",
        "input": [
            {"role": "developer", "content": "Be brief."},
            user("List the files."),
            reasoning("I should call ls."),
            call("call_1", "ls", "{\"path\":\".\"}"),
            output("call_1", "a.txt\nb.txt"),
            assistant("Two files: a.txt and b.txt."),
            user("Read both."),
            reasoning("Two reads in parallel."),
            assistant("Reading them."),
            call("call_2", "read", "{\"path\":\"a.txt\"}"),
            call("call_3", "read", "{\"path\": \"b.txt\"}"),
            output("call_2", "alpha"),
            output("call_3", "beta"),
            assistant("a.txt says alpha, b.txt says beta."),
            {"role": "user", "content": "Thanks!"}
        ],
        "tools": [
            {"type": "function", "name": "ls", "description": "List files.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            {"type": "function", "name": "read", "description": "Read a file.", "strict": false,
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
        ],
        "store": false
    })
}

fn messages_body() -> Value {
    json!({
        "model": "m",
        "max_tokens": 1024,
        "system": [
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call ls.", "signature": "sig1"},
                {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"path": "."}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt\nb.txt"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Two files: a.txt and b.txt."}]},
            {"role": "user", "content": [{"type": "text", "text": "Read both."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two reads in parallel.", "signature": "sig2"},
                {"type": "text", "text": "Reading them."},
                {"type": "tool_use", "id": "call_2", "name": "read", "input": {"path": "a.txt"}},
                {"type": "tool_use", "id": "call_3", "name": "read", "input": {"path": "b.txt"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "alpha"}]},
                {"type": "tool_result", "tool_use_id": "call_3", "content": "beta"}
            ]},
            {"role": "assistant", "content": "a.txt says alpha, b.txt says beta."},
            {"role": "user", "content": [{"type": "text", "text": "Thanks!", "cache_control": {"type": "ephemeral"}}]}
        ],
        "tools": [
            {"name": "ls", "description": "List files.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            {"name": "read", "description": "Read a file.",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
        ]
    })
}

/// What every API must render, written out once.
fn expected_template_messages() -> Value {
    let call = |id: &str, name: &str, path: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": {"path": path}}});
    json!([
        {"role": "system", "content": "You are a coding agent.\nBe brief."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "", "reasoning_content": "I should call ls.", "tool_calls": [call("call_1", "ls", ".")]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "Two files: a.txt and b.txt."},
        {"role": "user", "content": "Read both."},
        {"role": "assistant", "content": "Reading them.", "reasoning_content": "Two reads in parallel.",
         "tool_calls": [call("call_2", "read", "a.txt"), call("call_3", "read", "b.txt")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "alpha"},
        {"role": "tool", "tool_call_id": "call_3", "content": "beta"},
        {"role": "assistant", "content": "a.txt says alpha, b.txt says beta."},
        {"role": "user", "content": "Thanks!"}
    ])
}

#[test]
fn one_conversation_three_apis_identical_template_messages() {
    let via_chat = chat::decode(&chat_body()).unwrap();
    let via_responses = responses::decode(&responses_body()).unwrap().conversation;
    let via_messages = messages::decode(&messages_body()).unwrap();

    let rendered: Vec<String> = [&via_chat, &via_responses, &via_messages]
        .iter()
        .map(|conv| {
            let (messages, tools) = to_template_messages(conv);
            serde_json::to_string(&json!({"messages": messages, "tools": tools})).unwrap()
        })
        .collect();
    assert_eq!(rendered[0], rendered[1], "chat vs responses");
    assert_eq!(rendered[0], rendered[2], "chat vs messages");

    let (messages, tools) = to_template_messages(&via_chat);
    assert_eq!(Value::from(messages), expected_template_messages());
    let tools = tools.unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(
        tools[0],
        json!({"type": "function", "function": {"name": "ls", "description": "List files.",
               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
    );
}

#[test]
fn one_conversation_three_apis_identical_engine_messages() {
    let engine_messages = |conv: &switchyard_frontend::Conversation| {
        let body = to_chat_request(conv);
        serde_json::to_string(&json!([body["messages"], body["tools"]])).unwrap()
    };
    let via_chat = engine_messages(&chat::decode(&chat_body()).unwrap());
    let via_responses =
        engine_messages(&responses::decode(&responses_body()).unwrap().conversation);
    let via_messages = engine_messages(&messages::decode(&messages_body()).unwrap());
    assert_eq!(via_chat, via_responses);
    assert_eq!(via_chat, via_messages);
    // Engine bodies carry arguments as compact JSON text.
    assert!(
        via_chat.contains(r#""arguments":"{\"path\":\"a.txt\"}""#),
        "{via_chat}"
    );
}
