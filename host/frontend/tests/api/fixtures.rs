//! Real-world request shapes decode to the IR they mean.

use std::time::Duration;

use serde_json::json;
use switchyard_frontend::{
    AgentHints, Block, Role, ToolChoice, chat, messages, responses, to_chat_request,
    to_template_messages,
};

use crate::support::fixture;

fn roles(messages: &[switchyard_frontend::Message]) -> Vec<Role> {
    messages.iter().map(|m| m.role).collect()
}

#[test]
fn codex_responses_request() {
    let req = responses::decode(&fixture("codex_responses.json")).unwrap();
    assert!(!req.store);
    assert_eq!(req.previous_response_id, None);
    let conv = &req.conversation;
    assert!(conv.stream && conv.include_usage);
    assert!(!conv.parallel_tool_calls);
    assert_eq!(conv.reasoning_effort.as_deref(), Some("medium"));
    assert_eq!(
        conv.tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["shell", "update_plan"]
    );
    assert!(conv.system[0] == Block::Text { text: "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a user's computer.".into() });
    use Role::*;
    assert_eq!(
        roles(&conv.messages),
        [System, User, User, User, Assistant, Tool, Assistant, Tool]
    );
    // Reasoning + call merge into one assistant turn; the encrypted content rides as signature.
    assert_eq!(
        conv.messages[4].blocks,
        vec![
            Block::Thinking {
                text: "Let me run the test suite first.".into(),
                signature: Some("gAAAAABo-opaque".into())
            },
            Block::ToolCall {
                id: "call_Xk2".into(),
                name: "shell".into(),
                arguments: r#"{"command":["bash","-lc","cargo test"],"workdir":"/repo"}"#.into()
            },
        ]
    );
    // Without raw reasoning, the summary stands in.
    assert!(
        matches!(&conv.messages[6].blocks[0], Block::Thinking { text, .. } if text == "**Reading the parser**")
    );
    assert_eq!(conv.messages[6].blocks.len(), 3);

    let (template, _) = to_template_messages(conv);
    assert_eq!(
        template.len(),
        8,
        "instructions and the developer message make one system message"
    );
    assert_eq!(
        template[0]["content"],
        "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI on a user's computer.\n<permissions instructions>Approval policy is on-request.</permissions instructions>"
    );
    assert_eq!(
        template[4]["tool_calls"][0]["function"]["arguments"],
        json!({"command": ["bash", "-lc", "cargo test"], "workdir": "/repo"})
    );
    assert_eq!(template[5]["role"], "tool");
    assert_eq!(template[5]["tool_call_id"], "call_Xk2");
    assert_eq!(req.echo["store"], false);
    assert_eq!(req.echo["parallel_tool_calls"], false);
    assert_eq!(req.echo["tools"].as_array().unwrap().len(), 2);
}

#[test]
fn claude_code_messages_request() {
    let conv = messages::decode(&fixture("claude_code_messages.json")).unwrap();
    assert_eq!(conv.sampling.max_tokens, Some(32000));
    assert_eq!(conv.sampling.temperature, Some(1.0));
    assert_eq!(conv.thinking.unwrap().budget_tokens, Some(31999));
    assert!(conv.stream && conv.include_usage);
    assert_eq!(conv.system.len(), 2);
    // The last marker in prompt order (the reminder in the last user message) has a 1h TTL.
    assert_eq!(conv.cache_control.unwrap().ttl, Duration::from_secs(3600));
    use Role::*;
    assert_eq!(
        roles(&conv.messages),
        [User, Assistant, Tool, Assistant, Tool, Tool, User]
    );
    assert_eq!(
        conv.messages[1].blocks[0],
        Block::Thinking {
            text: "I should read the file first.".into(),
            signature: Some("EqQBCkYIBxgCKkBopaque".into())
        }
    );
    assert!(matches!(
        &conv.messages[3].blocks[0],
        Block::RedactedThinking { .. }
    ));
    assert!(
        matches!(&conv.messages[5].blocks[0], Block::ToolResult { call_id, is_error: true, .. } if call_id == "toolu_01C")
    );
    assert!(
        matches!(&conv.messages[1].blocks[2], Block::ToolCall { arguments, .. } if arguments == r#"{"file_path":"/repo/src/main.rs"}"#)
    );

    let (template, tools) = to_template_messages(&conv);
    assert_eq!(tools.unwrap().len(), 3);
    assert_eq!(
        template[0],
        json!({"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude.\nYou are an interactive CLI tool that helps users with software engineering tasks."})
    );
    assert_eq!(
        template[1]["content"].as_str().unwrap().lines().last(),
        Some("fix the bug in src/main.rs")
    );
    // Redacted thinking is never rendered; the turn is its two calls.
    assert_eq!(template[4]["content"], "");
    assert!(template[4].get("reasoning_content").is_none());
    assert_eq!(template[4]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(template.len(), 8);
}

#[test]
fn chat_parallel_tool_calls_request() {
    let conv = chat::decode(&fixture("chat_parallel_tools.json")).unwrap();
    assert_eq!(
        conv.hints,
        AgentHints {
            priority: Some(5),
            osl: Some(128),
            speculative_prefill: true
        }
    );
    assert_eq!(conv.cache_control.unwrap().ttl, Duration::from_secs(90));
    assert_eq!(conv.tool_choice, ToolChoice::Auto);
    use Role::*;
    assert_eq!(roles(&conv.messages), [System, User, Assistant, Tool, Tool]);
    assert_eq!(conv.messages[2].blocks.len(), 3);

    let body = to_chat_request(&conv);
    assert_eq!(
        body,
        json!({
            "model": "Qwen/Qwen3-8B",
            "messages": [
                {"role": "system", "content": "You are a weather assistant."},
                {"role": "user", "content": "What's the weather in Paris and Tokyo?"},
                {"role": "assistant", "content": "", "reasoning_content": "Two cities: call get_weather twice.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Tokyo\",\"unit\":\"c\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, cloudy"},
                {"role": "tool", "tool_call_id": "call_2", "content": "22 C, sunny"}
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "Current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
            }}],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "max_tokens": 512,
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "stop": ["<|im_end|>"],
            "stream": true,
            "stream_options": {"include_usage": true},
            "chat_template_kwargs": {"enable_thinking": true}
        })
    );
}

#[test]
fn a_chat_client_that_does_not_stream_still_gets_an_engine_stream() {
    let conv = chat::decode(
        &json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false}),
    )
    .unwrap();
    assert!(!conv.stream && !conv.include_usage);
    let body = to_chat_request(&conv);
    assert_eq!(body["stream"], true);
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none());
}
