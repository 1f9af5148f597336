//! OpenAI `/v1/responses` requests.
//!
//! Input items map onto the IR's messages: `message` items by role (`developer` is `system`),
//! `function_call_output` items become tool messages, and consecutive assistant-side items
//! (`reasoning`, assistant `message`, `function_call`) merge into one assistant message, the shape
//! the same turn has in chat completions and Anthropic messages.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::error::ApiError;
use crate::fields::{self, Keys, Parts};
use crate::ir::{
    Block, CUSTOM_TOOL_INPUT, Conversation, Message, Role, Tool, ToolChoice, ToolOrigin,
};
use crate::json::Node;
use crate::reply::{Reply, ReplyMeta};
use crate::store::ResponseStore;

const KEYS: Keys = Keys {
    max_tokens: &["max_output_tokens"],
    stop: "stop",
};

/// Request fields the response object repeats, in the order OpenAI writes them.
const ECHOED: &[&str] = &[
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
];

/// A decoded `/v1/responses` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The conversation: `instructions` in `system`, the input items in `messages` (after
    /// [`ResponsesRequest::attach_history`], preceded by the stored history).
    pub conversation: Conversation,
    /// The response this one continues.
    pub previous_response_id: Option<String>,
    /// Store this response for a later `previous_response_id` (OpenAI's default: `true`).
    pub store: bool,
    /// Request fields the response object repeats (`tools`, `tool_choice`, `instructions`, ...),
    /// for [`crate::ReplyMeta::echo`].
    pub echo: Arc<Map<String, Value>>,
    /// `prompt_cache_key`: Codex sends its session id here; the gateway uses it as the session
    /// when no session header names one.
    pub prompt_cache_key: Option<String>,
    /// `reasoning.summary` was asked for: reasoning items carry a summary.
    pub reasoning_summary: bool,
    /// `include` has `reasoning.encrypted_content`: reasoning items carry it, for stateless
    /// clients (`store: false`) to send back.
    pub encrypted_reasoning: bool,
}

/// Tool types the Responses API runs on OpenAI's side. An engine cannot run them: they are left
/// out of the prompt (and counted) rather than failing a harness that always offers them.
const HOSTED_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "computer",
    "mcp",
    "local_shell",
    "shell",
    "tool_search",
];

/// Output item types of hosted tools. They are assistant-side records of work done elsewhere, with
/// nothing an engine's template can render; a conversation that carries them is still accepted.
const HOSTED_CALL_ITEMS: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "computer_call",
    "computer_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "tool_search_call",
    "tool_search_output",
];

/// The prefix of the `encrypted_content` Switchyard writes: the reasoning text, base64-encoded.
/// It is opaque to clients and comes back verbatim, so the next turn renders the same tokens.
const SEALED_PREFIX: &str = "swy1:";

/// Reasoning text as Switchyard's `encrypted_content`.
pub(crate) fn seal_reasoning(text: &str) -> String {
    format!("{SEALED_PREFIX}{}", BASE64.encode(text))
}

/// The reasoning text of an `encrypted_content` Switchyard wrote; `None` for anyone else's.
fn open_reasoning(sealed: &str) -> Option<String> {
    let data = sealed.strip_prefix(SEALED_PREFIX)?;
    String::from_utf8(BASE64.decode(data).ok()?).ok()
}

// === impl ResponsesRequest ===

impl ResponsesRequest {
    /// Puts the stored conversation of `previous_response_id` before this request's input.
    /// An unknown id is a 400 `previous_response_not_found`.
    pub fn attach_history(&mut self, store: &mut ResponseStore) -> Result<(), ApiError> {
        if let Some(id) = &self.previous_response_id {
            let history = store.get(id)?;
            self.conversation.messages.splice(0..0, history);
        }
        Ok(())
    }

    /// The meta of this request's reply: model, usage always, the echoed fields, how tools were
    /// declared and what reasoning items carry.
    pub fn reply_meta(&self, request_id: impl Into<String>, created: u64) -> ReplyMeta {
        ReplyMeta {
            echo: Arc::clone(&self.echo),
            tool_origins: self
                .conversation
                .tools
                .iter()
                .filter(|t| t.origin != ToolOrigin::Function)
                .map(|t| (t.name.clone(), t.origin.clone()))
                .collect(),
            reasoning_summary: self.reasoning_summary,
            encrypted_reasoning: self.encrypted_reasoning,
            ..ReplyMeta::for_conversation(request_id, created, &self.conversation)
        }
    }

    /// What to store under this response's id: the whole conversation (without `instructions`,
    /// which do not carry over) followed by the reply.
    pub fn transcript(&self, reply: &Reply) -> Vec<Message> {
        let mut messages = self.conversation.messages.clone();
        let answer = reply.message();
        if !answer.blocks.is_empty() {
            messages.push(answer);
        }
        messages
    }
}

/// Decodes and validates a responses request body.
pub fn decode(body: &Value) -> Result<ResponsesRequest, ApiError> {
    let root = Node::root(body);
    let common = fields::common(&root, KEYS)?;
    fields::unsupported_flag(&root, "background")?;
    if let Some(c) = root.get("conversation") {
        return Err(c.error("not supported, use `previous_response_id`"));
    }
    let mut conv = common.into_conversation();
    conv.include_usage = true;
    if let Some(text) = root.opt_str("instructions")?.filter(|t| !t.is_empty()) {
        conv.system.push(Block::Text { text });
    }
    let previous_response_id = root.opt_str("previous_response_id")?;
    if let Some(tools) = root.get("tools") {
        for t in tools.items()? {
            tool(&t, &mut conv)?;
        }
    }
    match root.get("input") {
        Some(input) => input_items(&input, &mut conv.messages)?,
        None if previous_response_id.is_some() => {}
        None => return Err(root.required("input")?.error("missing required field")),
    }
    if let Some(choice) = root.get("tool_choice") {
        conv.tool_choice = tool_choice(&choice)?;
    }
    fields::check_tool_choice(&conv.tool_choice, &conv.tools)?;
    conv.parallel_tool_calls = root.opt_bool("parallel_tool_calls")?.unwrap_or(true);
    let mut reasoning_summary = false;
    if let Some(reasoning) = root.get("reasoning") {
        reasoning.object()?;
        conv.reasoning_effort = reasoning.opt_str("effort")?;
        reasoning_summary = reasoning.opt_str("summary")?.is_some_and(|s| s != "none");
    }
    let mut encrypted_reasoning = false;
    if let Some(include) = root.get("include") {
        for entry in include.items()? {
            encrypted_reasoning |= entry.str()? == "reasoning.encrypted_content";
        }
    }
    let prompt_cache_key = root.opt_str("prompt_cache_key")?.filter(|k| !k.is_empty());
    if let Some(text) = root.get("text") {
        text.object()?;
        if let Some(format) = text.get("format") {
            conv.response_format = text_format(&format)?;
        }
    }
    let store = root.opt_bool("store")?.unwrap_or(true);
    Ok(ResponsesRequest {
        echo: Arc::new(echo(body, &conv, store)),
        conversation: conv,
        previous_response_id,
        store,
        prompt_cache_key,
        reasoning_summary,
        encrypted_reasoning,
    })
}

/// One entry of `tools`: functions as they are, a namespace's functions flattened under
/// `namespace.name`, a custom tool as a function of one string, hosted tools dropped.
fn tool(node: &Node<'_, '_>, conv: &mut Conversation) -> Result<(), ApiError> {
    match node.tag()? {
        "function" => conv.tools.push(fields::tool(node, "parameters")?),
        "custom" => conv.tools.push(custom_tool(node)?),
        "namespace" => {
            let namespace = node.required("name")?.str()?;
            for inner in node.required("tools")?.items()? {
                let mut t = match inner.tag()? {
                    "function" => fields::tool(&inner, "parameters")?,
                    "custom" => custom_tool(&inner)?,
                    other => return Err(inner.bad_tag("unsupported namespace tool type", other)),
                };
                if t.origin == ToolOrigin::Function {
                    t.origin = ToolOrigin::Namespaced {
                        namespace: namespace.to_owned(),
                        name: t.name.clone(),
                    };
                }
                t.name = format!("{namespace}.{}", t.name);
                conv.tools.push(t);
            }
        }
        kind if HOSTED_TOOLS.contains(&kind) => conv.dropped_tools.push(kind.to_owned()),
        other => return Err(node.bad_tag("unsupported tool type", other)),
    }
    Ok(())
}

/// A `custom` tool as the function the model sees: one string parameter carrying the freeform
/// input (its grammar, if any, is described to the model, not enforced).
fn custom_tool(node: &Node<'_, '_>) -> Result<Tool, ApiError> {
    let name = node.required("name")?.str()?;
    if name.is_empty() {
        return Err(node.required("name")?.error("must not be empty"));
    }
    let mut description = node.opt_str("description")?.unwrap_or_default();
    if let Some(format) = node.get("format").filter(|f| f.value.is_object())
        && format.opt_str("type")?.as_deref() == Some("grammar")
        && let Some(definition) = format.opt_str("definition")?
    {
        let syntax = format.opt_str("syntax")?.unwrap_or_else(|| "lark".into());
        description.push_str(&format!(
            "\n\nThe input follows this {syntax} grammar:\n{definition}"
        ));
    }
    Ok(Tool {
        name: name.to_owned(),
        description: (!description.is_empty()).then_some(description),
        parameters: json!({
            "type": "object",
            "properties": {CUSTOM_TOOL_INPUT: {"type": "string"}},
            "required": [CUSTOM_TOOL_INPUT],
        }),
        origin: ToolOrigin::Custom,
    })
}

fn echo(body: &Value, conv: &Conversation, store: bool) -> Map<String, Value> {
    let mut echo: Map<String, Value> = ECHOED
        .iter()
        .map(|k| {
            (
                (*k).to_owned(),
                body.get(*k).cloned().unwrap_or(Value::Null),
            )
        })
        .collect();
    echo.insert(
        "parallel_tool_calls".into(),
        conv.parallel_tool_calls.into(),
    );
    echo.insert("store".into(), store.into());
    for (key, default) in [("tools", json!([])), ("tool_choice", json!("auto"))] {
        if echo.get(key).is_none_or(Value::is_null) {
            echo.insert(key.into(), default);
        }
    }
    echo
}

fn input_items(input: &Node<'_, '_>, messages: &mut Vec<Message>) -> Result<(), ApiError> {
    if let Value::String(text) = input.value {
        messages.push(Message::text(Role::User, text.clone()));
        return Ok(());
    }
    let items = input
        .items()
        .map_err(|_| input.expected("a string or an array of input items"))?;
    for item in items {
        item.object()?;
        // Easy input messages may leave out `"type": "message"`.
        let kind = match item.get("type") {
            Some(t) => t.str()?,
            None if item.get("role").is_some() => "message",
            None => return Err(item.required("type")?.error("missing required field")),
        };
        match kind {
            "message" => message(&item, messages)?,
            "reasoning" => push_assistant(messages, reasoning(&item)?),
            "function_call" => push_assistant(messages, function_call(&item)?),
            "custom_tool_call" => push_assistant(messages, custom_tool_call(&item)?),
            "function_call_output" | "custom_tool_call_output" => messages.push(Message {
                role: Role::Tool,
                blocks: vec![Block::ToolResult {
                    call_id: item.required("call_id")?.str()?.to_owned(),
                    content: content(&item.required("output")?, Parts::TextAndImages)?,
                    is_error: false,
                }],
            }),
            "item_reference" => {
                return Err(item.type_error("item references are not supported, send the item"));
            }
            kind if HOSTED_CALL_ITEMS.contains(&kind) => {}
            other => return Err(item.bad_tag("unsupported input item type", other)),
        }
    }
    Ok(())
}

/// Appends an assistant-side block to the assistant message in progress, or starts one.
fn push_assistant(messages: &mut Vec<Message>, block: Block) {
    match messages.last_mut() {
        Some(last) if last.role == Role::Assistant => last.blocks.push(block),
        _ => messages.push(Message {
            role: Role::Assistant,
            blocks: vec![block],
        }),
    }
}

fn message(item: &Node<'_, '_>, messages: &mut Vec<Message>) -> Result<(), ApiError> {
    let role = item.required("role")?;
    let (role, parts) = match role.str()? {
        "user" => (Role::User, Parts::TextAndImages),
        "assistant" => (Role::Assistant, Parts::Text),
        "system" | "developer" => (Role::System, Parts::Text),
        other => return Err(role.error(format_args!("unknown role `{other}`"))),
    };
    let blocks = content(&item.required("content")?, parts)?;
    if role == Role::Assistant {
        for block in blocks {
            push_assistant(messages, block);
        }
        // An assistant message with no content still marks a turn.
        if !matches!(messages.last(), Some(m) if m.role == Role::Assistant) {
            messages.push(Message {
                role,
                blocks: Vec::new(),
            });
        }
    } else {
        messages.push(Message { role, blocks });
    }
    Ok(())
}

fn reasoning(item: &Node<'_, '_>) -> Result<Block, ApiError> {
    // The raw reasoning when given, else what Switchyard sealed, else the summary.
    let signature = item.opt_str("encrypted_content")?;
    let mut text = joined_texts(item, "content", "reasoning_text")?;
    if text.is_empty()
        && let Some(opened) = signature.as_deref().and_then(open_reasoning)
    {
        text = opened;
    }
    if text.is_empty() {
        text = joined_texts(item, "summary", "summary_text")?;
    }
    Ok(Block::Thinking { text, signature })
}

/// The `text` of each `{type: kind, text}` in the array `key`, joined with "\n".
fn joined_texts(item: &Node<'_, '_>, key: &str, kind: &str) -> Result<String, ApiError> {
    let Some(list) = item.get(key) else {
        return Ok(String::new());
    };
    let mut texts = Vec::new();
    for part in list.items()? {
        match part.tag()? {
            t if t == kind => texts.push(part.required("text")?.str()?),
            other => return Err(part.bad_tag("unknown part type", other)),
        }
    }
    Ok(texts.join("\n"))
}

fn function_call(item: &Node<'_, '_>) -> Result<Block, ApiError> {
    let arguments = fields::arguments(&item.required("arguments")?)?;
    Ok(Block::ToolCall {
        id: item.required("call_id")?.str()?.to_owned(),
        name: call_name(item)?,
        arguments,
    })
}

/// A `custom_tool_call` as the function call the model made: its input as the one argument.
fn custom_tool_call(item: &Node<'_, '_>) -> Result<Block, ApiError> {
    let input = item.required("input")?.str()?;
    Ok(Block::ToolCall {
        id: item.required("call_id")?.str()?.to_owned(),
        name: call_name(item)?,
        arguments: json!({ CUSTOM_TOOL_INPUT: input }).to_string(),
    })
}

/// The name a call item's tool has for the model: `namespace.name` for a namespaced one, as in the
/// tools it was offered.
fn call_name(item: &Node<'_, '_>) -> Result<String, ApiError> {
    let name = item.required("name")?.str()?;
    Ok(match item.opt_str("namespace")?.filter(|n| !n.is_empty()) {
        Some(namespace) => format!("{namespace}.{name}"),
        None => name.to_owned(),
    })
}

/// `content`: a string, or an array of this API's parts.
fn content(node: &Node<'_, '_>, accepts: Parts) -> Result<Vec<Block>, ApiError> {
    fields::content(node, |part| content_part(part, accepts))
}

fn content_part(part: &Node<'_, '_>, accepts: Parts) -> Result<Block, ApiError> {
    match part.tag()? {
        "input_text" | "output_text" => Ok(Block::Text {
            text: part.required("text")?.str()?.to_owned(),
        }),
        "refusal" => Ok(Block::Text {
            text: part.required("refusal")?.str()?.to_owned(),
        }),
        "input_image" if accepts == Parts::TextAndImages => match part.get("image_url") {
            Some(url) => Ok(Block::Image {
                url: url.str()?.to_owned(),
            }),
            None => Err(part
                .required("image_url")?
                .error("missing required field (file ids are not supported)")),
        },
        kind @ ("input_image" | "input_file" | "input_audio") => {
            Err(part.bad_tag("unsupported content part type", kind))
        }
        other => Err(part.bad_tag("unknown content part type", other)),
    }
}

fn tool_choice(node: &Node<'_, '_>) -> Result<ToolChoice, ApiError> {
    if let Value::String(mode) = node.value {
        return fields::tool_choice_mode(node, mode);
    }
    match node.tag()? {
        "function" => Ok(ToolChoice::Named(node.required("name")?.str()?.to_owned())),
        other => Err(node.bad_tag("unsupported tool_choice type", other)),
    }
}

/// `text.format` in chat completions' `response_format` shape.
fn text_format(format: &Node<'_, '_>) -> Result<Option<Value>, ApiError> {
    match format.tag()? {
        "json_schema" => {
            let mut schema = Map::new();
            schema.insert("name".into(), format.required("name")?.str()?.into());
            format.required("schema")?.object()?;
            for key in ["description", "schema", "strict"] {
                if let Some(v) = format.get(key) {
                    schema.insert(key.into(), v.value.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => fields::response_format(format),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_becomes_response_format() {
        let body = json!({"model": "m", "input": "x", "text": {"format": {
            "type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}}});
        let req = decode(&body).unwrap();
        assert_eq!(
            req.conversation.response_format,
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})
            )
        );
        let plain =
            decode(&json!({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}))
                .unwrap();
        assert_eq!(plain.conversation.response_format, None);
    }

    #[test]
    fn echo_has_defaults() {
        let req = decode(
            &json!({"model": "m", "input": "x", "store": false, "instructions": "be brief"}),
        )
        .unwrap();
        assert_eq!(req.echo["tools"], json!([]));
        assert_eq!(req.echo["tool_choice"], "auto");
        assert_eq!(req.echo["store"], false);
        assert_eq!(req.echo["instructions"], "be brief");
        assert!(!req.store);
        assert!(req.conversation.include_usage);
    }

    #[test]
    fn codex_tools_flatten_map_or_drop() {
        let body = json!({"model": "m", "input": [
            {"type": "function_call", "call_id": "c1", "namespace": "multi_agent_v1", "name": "spawn_agent", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "spawned"},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
        ], "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [
                {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch", "description": "Patch files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
            {"type": "web_search", "external_web_access": false},
        ], "prompt_cache_key": "sess-1", "reasoning": {"summary": "auto"},
           "include": ["reasoning.encrypted_content"], "store": false});
        let req = decode(&body).unwrap();
        let conv = &req.conversation;
        let names: Vec<&str> = conv.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["exec_command", "multi_agent_v1.spawn_agent", "apply_patch"]
        );
        assert_eq!(conv.tools[2].origin, ToolOrigin::Custom);
        assert!(
            conv.tools[2]
                .description
                .as_ref()
                .unwrap()
                .contains("start: x")
        );
        assert_eq!(conv.dropped_tools, ["web_search"]);
        assert_eq!(req.prompt_cache_key.as_deref(), Some("sess-1"));
        assert!(req.reasoning_summary && req.encrypted_reasoning);
        let Block::ToolCall { name, .. } = &conv.messages[0].blocks[0] else {
            panic!("{:?}", conv.messages[0]);
        };
        assert_eq!(name, "multi_agent_v1.spawn_agent");
        let Block::ToolCall { arguments, .. } = &conv.messages[2].blocks[0] else {
            panic!("{:?}", conv.messages[2]);
        };
        assert_eq!(arguments, r#"{"input":"*** Begin Patch"}"#);
        assert_eq!(
            conv.messages.len(),
            4,
            "the hosted call item renders nothing"
        );
        let meta = req.reply_meta("r", 0);
        assert_eq!(
            meta.tool_origin("multi_agent_v1.spawn_agent"),
            &ToolOrigin::Namespaced {
                namespace: "multi_agent_v1".into(),
                name: "spawn_agent".into()
            }
        );
        assert_eq!(meta.tool_origin("exec_command"), &ToolOrigin::Function);
    }

    #[test]
    fn sealed_reasoning_comes_back_as_the_same_text() {
        let sealed = seal_reasoning("let me think <about> it");
        let body = json!({"model": "m", "input": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}], "encrypted_content": sealed},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "theirs"}], "encrypted_content": "gAAAA"},
        ]});
        let conv = decode(&body).unwrap().conversation;
        let texts: Vec<&str> = conv.messages[0]
            .blocks
            .iter()
            .map(|b| match b {
                Block::Thinking { text, .. } => text.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, ["let me think <about> it", "theirs"]);
    }

    #[test]
    fn errors_name_the_field() {
        let base = |input: Value| json!({"model": "m", "input": input});
        let cases = [
            (json!({"model": "m"}), "input"),
            (base(json!(5)), "input"),
            (base(json!([{"content": "x"}])), "input[0].type"),
            (
                base(json!([{"type": "message", "role": "tool", "content": "x"}])),
                "input[0].role",
            ),
            (
                base(json!([{"role": "user", "content": [{"type": "input_file"}]}])),
                "input[0].content[0].type",
            ),
            (
                base(
                    json!([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
                ),
                "input[0].content[0].image_url",
            ),
            (
                base(json!([{"type": "function_call", "call_id": "c", "name": "f"}])),
                "input[0].arguments",
            ),
            (
                base(json!([{"type": "function_call_output", "output": "x"}])),
                "input[0].call_id",
            ),
            (
                base(json!([{"type": "item_reference", "id": "x"}])),
                "input[0].type",
            ),
            (
                base(json!([{"type": "reasoning", "summary": [{"type": "weird"}]}])),
                "input[0].summary[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "hologram"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]}),
                "tools[0].tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function"}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "input": "x", "reasoning": "high"}),
                "reasoning",
            ),
            (json!({"model": "m", "input": "x", "store": "no"}), "store"),
            (
                json!({"model": "m", "input": "x", "background": true}),
                "background",
            ),
        ];
        for (body, param) in cases {
            let err = decode(&body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }
}
