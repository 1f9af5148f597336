//! Anthropic `/v1/messages` and `/v1/messages/count_tokens` requests.
//!
//! `tool_result` blocks of a user message become tool messages (one per result, in place), the
//! shape the same turn has in chat completions. `cache_control` markers on tools, system blocks
//! and content blocks set [`Conversation::cache_control`]: the marker of the longest prefix (the
//! last one in prompt order: tools, system, messages) wins, and `nvext.cache_control` wins over
//! all of them.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::fields::{self, Keys};
use crate::hints::CacheMarkers;
use crate::ir::{Block, Conversation, Message, Role, Thinking, ToolChoice};
use crate::json::Node;

const KEYS: Keys = Keys {
    max_tokens: &["max_tokens"],
    stop: "stop_sequences",
};

/// Decodes and validates a messages request body (`max_tokens` is required).
pub fn decode(body: &Value) -> Result<Conversation, ApiError> {
    decode_with(body, true)
}

/// Decodes a `/v1/messages/count_tokens` body: the same fields, without `max_tokens`.
pub fn decode_count_tokens(body: &Value) -> Result<Conversation, ApiError> {
    decode_with(body, false)
}

/// The `/v1/messages/count_tokens` answer.
pub fn count_tokens_body(input_tokens: u64) -> Value {
    json!({ "input_tokens": input_tokens })
}

fn decode_with(body: &Value, generating: bool) -> Result<Conversation, ApiError> {
    let root = Node::root(body);
    let common = fields::common(&root, KEYS)?;
    if generating {
        root.required("max_tokens")?;
    }
    let mut conv = common.into_conversation();
    let nvext_cache = conv.cache_control.take();
    conv.include_usage = true;
    let mut markers = CacheMarkers::default();

    // Prompt order (tools, system, messages) decides which cache marker covers the most.
    if let Some(tools) = root.get("tools") {
        for t in tools.items()? {
            t.object()?;
            // Typed tools are Anthropic's own (server tools such as `web_search_20250305`, and
            // client tools whose schema only Anthropic's models know): no engine can serve them,
            // so they are left out of the prompt and counted.
            if let Some(kind) = t.get("type").map(|k| k.str()).transpose()?
                && kind != "custom"
            {
                conv.dropped_tools.push(kind.to_owned());
                continue;
            }
            markers.visit(&t)?;
            t.required("input_schema")?;
            conv.tools.push(fields::tool(&t, "input_schema")?);
        }
    }
    if let Some(choice) = root.get("tool_choice") {
        conv.tool_choice = tool_choice(&choice)?;
        if choice.opt_bool("disable_parallel_tool_use")? == Some(true) {
            conv.parallel_tool_calls = false;
        }
    }
    fields::check_tool_choice(&conv.tool_choice, &conv.tools)?;
    if let Some(system) = root.get("system") {
        conv.system = system_blocks(&system, &mut markers)?;
    }
    let list = root.required("messages")?;
    for m in list.items()? {
        message(&m, &mut markers, &mut conv.messages)?;
    }
    if list.array()?.is_empty() {
        return Err(list.error("must not be empty"));
    }
    if let Some(thinking) = root.get("thinking") {
        conv.thinking = match thinking.tag()? {
            "enabled" => Some(Thinking {
                budget_tokens: Some(thinking.required("budget_tokens")?.u32()?),
            }),
            "adaptive" => Some(Thinking {
                budget_tokens: None,
            }),
            "disabled" => None,
            other => return Err(thinking.bad_tag("unknown thinking type", other)),
        };
    }
    if let Some(metadata) = root.get("metadata") {
        metadata.object()?;
    }
    conv.cache_control = markers.resolve(nvext_cache);
    Ok(conv)
}

fn system_blocks(node: &Node<'_, '_>, markers: &mut CacheMarkers) -> Result<Vec<Block>, ApiError> {
    if let Value::String(text) = node.value {
        return Ok(fields::non_empty_text(text));
    }
    let items = node
        .items()
        .map_err(|_| node.expected("a string or an array of text blocks"))?;
    let mut blocks = Vec::new();
    for b in items {
        match b.tag()? {
            "text" => {
                markers.visit(&b)?;
                blocks.push(text_block(&b)?);
            }
            other => return Err(b.bad_tag("unsupported system block type", other)),
        }
    }
    Ok(blocks)
}

fn message(
    node: &Node<'_, '_>,
    markers: &mut CacheMarkers,
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    node.object()?;
    let role_node = node.required("role")?;
    let role = match role_node.str()? {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        // Claude Code sends system messages after the first user turn (agent and skill
        // listings); they render in place, as system turns.
        "system" => Role::System,
        other => {
            return Err(role_node.error(format_args!(
                "unknown role `{other}`, expected `user`, `assistant` or `system`"
            )));
        }
    };
    let content = node.required("content")?;
    let blocks = fields::content(&content, |b| block(b, role, markers))?;
    if role != Role::User {
        out.push(Message { role, blocks });
        return Ok(());
    }
    // Tool results leave the user message as tool messages, in place.
    let mut pending = Vec::new();
    for b in blocks {
        if matches!(b, Block::ToolResult { .. }) {
            if !pending.is_empty() {
                out.push(Message {
                    role,
                    blocks: std::mem::take(&mut pending),
                });
            }
            out.push(Message {
                role: Role::Tool,
                blocks: vec![b],
            });
        } else {
            pending.push(b);
        }
    }
    if !pending.is_empty() || !matches!(out.last(), Some(m) if m.role == Role::Tool) {
        out.push(Message {
            role,
            blocks: pending,
        });
    }
    Ok(())
}

fn block(node: &Node<'_, '_>, role: Role, markers: &mut CacheMarkers) -> Result<Block, ApiError> {
    let kind = node.tag()?;
    markers.visit(node)?;
    match (kind, role) {
        ("text", _) => text_block(node),
        ("image", Role::User) => image(node),
        ("tool_result", Role::User) => {
            let content = match node.get("content") {
                None => Vec::new(),
                Some(c) => fields::content(&c, |b| {
                    markers.visit(b)?;
                    match b.tag()? {
                        "text" => text_block(b),
                        "image" => image(b),
                        other => Err(b.bad_tag("unsupported tool result block type", other)),
                    }
                })?,
            };
            Ok(Block::ToolResult {
                call_id: node.required("tool_use_id")?.str()?.to_owned(),
                content,
                is_error: node.opt_bool("is_error")?.unwrap_or(false),
            })
        }
        ("thinking", Role::Assistant) => Ok(Block::Thinking {
            text: node.required("thinking")?.str()?.to_owned(),
            signature: node.opt_str("signature")?.filter(|s| !s.is_empty()),
        }),
        ("redacted_thinking", Role::Assistant) => Ok(Block::RedactedThinking {
            data: node.required("data")?.str()?.to_owned(),
        }),
        ("tool_use", Role::Assistant) => {
            let input = node.required("input")?;
            input.object()?;
            Ok(Block::ToolCall {
                id: node.required("id")?.str()?.to_owned(),
                name: node.required("name")?.str()?.to_owned(),
                arguments: input.value.to_string(),
            })
        }
        ("image" | "tool_result" | "thinking" | "redacted_thinking" | "tool_use", _) => Err(node
            .type_error(format_args!(
                "`{kind}` blocks are not allowed in {} messages",
                role.as_str()
            ))),
        (
            "document"
            | "search_result"
            | "server_tool_use"
            | "web_search_tool_result"
            | "container_upload"
            | "mcp_tool_use"
            | "mcp_tool_result",
            _,
        ) => Err(node.bad_tag("unsupported content block type", kind)),
        (other, _) => Err(node.bad_tag("unknown content block type", other)),
    }
}

fn text_block(node: &Node<'_, '_>) -> Result<Block, ApiError> {
    Ok(Block::Text {
        text: node.required("text")?.str()?.to_owned(),
    })
}

fn image(node: &Node<'_, '_>) -> Result<Block, ApiError> {
    let source = node.required("source")?;
    let url = match source.tag()? {
        "base64" => format!(
            "data:{};base64,{}",
            source.required("media_type")?.str()?,
            source.required("data")?.str()?
        ),
        "url" => source.required("url")?.str()?.to_owned(),
        other => return Err(source.bad_tag("unsupported image source type", other)),
    };
    Ok(Block::Image { url })
}

fn tool_choice(node: &Node<'_, '_>) -> Result<ToolChoice, ApiError> {
    match node.tag()? {
        "auto" => Ok(ToolChoice::Auto),
        "any" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        "tool" => Ok(ToolChoice::Named(node.required("name")?.str()?.to_owned())),
        other => Err(node.bad_tag("unknown tool_choice type", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn body(messages: Value) -> Value {
        json!({"model": "m", "max_tokens": 64, "messages": messages})
    }

    #[test]
    fn tool_results_split_out_in_place() {
        let conv = decode(&body(json!([
            {"role": "user", "content": [
                {"type": "text", "text": "before"},
                {"type": "tool_result", "tool_use_id": "a", "content": "A"},
                {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "B"}], "is_error": true},
                {"type": "text", "text": "after"},
            ]},
        ])))
        .unwrap();
        let roles: Vec<Role> = conv.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Tool, Role::Tool, Role::User]);
        assert_eq!(
            conv.messages[2].blocks,
            vec![Block::ToolResult {
                call_id: "b".into(),
                content: vec![Block::Text { text: "B".into() }],
                is_error: true
            }]
        );
    }

    #[test]
    fn longest_prefix_cache_marker_wins() {
        let marked = |ttl: &str| json!({"type": "ephemeral", "ttl": ttl});
        let mut b = body(json!([
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": marked("10m")}]},
        ]));
        b["system"] = json!([{"type": "text", "text": "sys", "cache_control": marked("1h")}]);
        b["tools"] = json!([{"name": "t", "input_schema": {"type": "object"}, "cache_control": marked("30s")}]);
        let conv = decode(&b).unwrap();
        assert_eq!(conv.cache_control.unwrap().ttl, Duration::from_secs(600));
        b["nvext"] = json!({"cache_control": {"type": "ephemeral", "ttl": "2h"}});
        assert_eq!(
            decode(&b).unwrap().cache_control.unwrap().ttl,
            Duration::from_secs(7200)
        );
        b["messages"][0]["content"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": 5});
        assert_eq!(
            decode(&b).unwrap_err().param.as_deref(),
            Some("messages[0].content[0].cache_control.ttl")
        );
    }

    #[test]
    fn system_messages_render_in_place() {
        // Claude Code's shape: a system message (agent and skill listings) after the user turn.
        let b = body(json!([
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Agents", "cache_control": {"type": "ephemeral"}}]},
        ]));
        for conv in [decode(&b).unwrap(), decode_count_tokens(&b).unwrap()] {
            assert_eq!(conv.messages[1], Message::text(Role::System, "# Agents"));
            assert!(conv.cache_control.is_some());
            let (messages, _) = crate::to_template_messages(&conv);
            let roles: Vec<&str> = messages
                .iter()
                .map(|m| m["role"].as_str().unwrap())
                .collect();
            assert_eq!(roles, ["user", "system"]);
        }
        let bad = body(
            json!([{"role": "system", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
        );
        assert_eq!(
            decode(&bad).unwrap_err().param.as_deref(),
            Some("messages[0].content[0].type")
        );
    }

    #[test]
    fn count_tokens_does_not_need_max_tokens() {
        let b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(decode(&b).unwrap_err().param.as_deref(), Some("max_tokens"));
        assert_eq!(decode_count_tokens(&b).unwrap().messages.len(), 1);
        assert_eq!(count_tokens_body(7), json!({"input_tokens": 7}));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (body(json!([])), "messages"),
            (
                body(json!([{"role": "developer", "content": "x"}])),
                "messages[0].role",
            ),
            (
                body(
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                body(
                    json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]),
                ),
                "messages[0].content[0].input",
            ),
            (
                body(json!([{"role": "user", "content": [{"type": "document"}]}])),
                "messages[0].content[0].type",
            ),
            (
                body(
                    json!([{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]),
                ),
                "messages[0].content[0].source.type",
            ),
            (
                body(
                    json!([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
                ),
                "messages[0].content[0].tool_use_id",
            ),
            (
                body(json!([{"role": "assistant", "content": [{"type": "thinking"}]}])),
                "messages[0].content[0].thinking",
            ),
        ];
        for (b, param) in cases {
            let err = decode(&b).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{b}: {err}");
        }
        let mut b = body(json!([{"role": "user", "content": "x"}]));
        b["thinking"] = json!({"type": "enabled"});
        assert_eq!(
            decode(&b).unwrap_err().param.as_deref(),
            Some("thinking.budget_tokens")
        );
        b["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
        assert_eq!(
            decode(&b).unwrap().thinking.unwrap().budget_tokens,
            Some(2048)
        );
        b["tool_choice"] = json!({"type": "tool", "name": "missing"});
        assert_eq!(
            decode(&b).unwrap_err().param.as_deref(),
            Some("tool_choice")
        );
        b["tool_choice"] = json!({"type": "any", "disable_parallel_tool_use": true});
        let conv = decode(&b).unwrap();
        assert_eq!(conv.tool_choice, ToolChoice::Required);
        assert!(!conv.parallel_tool_calls);
        // Anthropic's own tools cannot run on an engine: dropped and reported, never a 400.
        b["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        let conv = decode(&b).unwrap();
        assert!(conv.tools.is_empty());
        assert_eq!(conv.dropped_tools, ["web_search_20250305"]);
        b["tools"] = json!([{"name": "t"}]);
        assert_eq!(
            decode(&b).unwrap_err().param.as_deref(),
            Some("tools[0].input_schema")
        );
    }
}
