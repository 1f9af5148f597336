//! OpenAI `/v1/chat/completions` requests.

use serde_json::Value;

use crate::error::ApiError;
use crate::fields::{self, Keys, Parts};
use crate::ir::{Block, Conversation, Message, Role, ToolChoice};
use crate::json::Node;

const KEYS: Keys = Keys {
    max_tokens: &["max_completion_tokens", "max_tokens"],
    stop: "stop",
};

/// Decodes and validates a chat completions request body.
pub fn decode(body: &Value) -> Result<Conversation, ApiError> {
    let root = Node::root(body);
    let common = fields::common(&root, KEYS)?;
    fields::single_choice(&root)?;
    fields::unsupported_flag(&root, "logprobs")?;
    let mut conv = common.into_conversation();

    let list = root.required("messages")?;
    for m in list.items()? {
        conv.messages.push(message(&m)?);
    }
    if conv.messages.is_empty() {
        return Err(list.error("must not be empty"));
    }
    if let Some(tools) = root.get("tools") {
        for t in tools.items()? {
            match t.tag()? {
                "function" => conv
                    .tools
                    .push(fields::tool(&t.required("function")?, "parameters")?),
                other => return Err(t.bad_tag("unsupported tool type", other)),
            }
        }
    }
    if let Some(choice) = root.get("tool_choice") {
        conv.tool_choice = tool_choice(&choice)?;
    }
    fields::check_tool_choice(&conv.tool_choice, &conv.tools)?;
    conv.parallel_tool_calls = root.opt_bool("parallel_tool_calls")?.unwrap_or(true);
    conv.response_format = root
        .get("response_format")
        .map(|f| fields::response_format(&f))
        .transpose()?
        .flatten();
    conv.reasoning_effort = root.opt_str("reasoning_effort")?;
    if let Some(options) = root.get("stream_options") {
        options.object()?;
        conv.include_usage = options.opt_bool("include_usage")?.unwrap_or(false);
    }
    Ok(conv)
}

fn message(node: &Node<'_, '_>) -> Result<Message, ApiError> {
    node.object()?;
    let role = node.required("role")?;
    let (role, blocks) = match role.str()? {
        "system" | "developer" => (
            Role::System,
            content(&node.required("content")?, Parts::Text)?,
        ),
        "user" => (
            Role::User,
            content(&node.required("content")?, Parts::TextAndImages)?,
        ),
        "assistant" => (Role::Assistant, assistant(node)?),
        "tool" => {
            let call_id = node.required("tool_call_id")?.str()?.to_owned();
            let content = content(&node.required("content")?, Parts::Text)?;
            let result = Block::ToolResult {
                call_id,
                content,
                is_error: false,
            };
            (Role::Tool, vec![result])
        }
        "function" => return Err(role.error("the `function` role is not supported, use `tool`")),
        other => return Err(role.error(format_args!("unknown role `{other}`"))),
    };
    Ok(Message { role, blocks })
}

fn assistant(node: &Node<'_, '_>) -> Result<Vec<Block>, ApiError> {
    if node.get("function_call").is_some() {
        return Err(node
            .required("function_call")?
            .error("not supported, use `tool_calls`"));
    }
    let mut blocks = Vec::new();
    // vLLM's field, and the newer name some servers use.
    for key in ["reasoning_content", "reasoning"] {
        if let Some(text) = node.opt_str(key)?.filter(|t| !t.is_empty()) {
            blocks.push(Block::Thinking {
                text,
                signature: None,
            });
            break;
        }
    }
    if let Some(c) = node.get("content") {
        blocks.extend(content(&c, Parts::Text)?);
    }
    if let Some(calls) = node.get("tool_calls") {
        for call in calls.items()? {
            blocks.push(tool_call(&call)?);
        }
    }
    Ok(blocks)
}

fn tool_call(node: &Node<'_, '_>) -> Result<Block, ApiError> {
    node.object()?;
    if let Some(kind) = node.opt_str("type")?.filter(|k| k != "function") {
        return Err(node.bad_tag("unsupported tool call type", &kind));
    }
    let function = node.required("function")?;
    function.object()?;
    let arguments = match function.get("arguments") {
        None => String::from("{}"),
        Some(args) => fields::arguments(&args)?,
    };
    Ok(Block::ToolCall {
        id: node.required("id")?.str()?.to_owned(),
        name: function.required("name")?.str()?.to_owned(),
        arguments,
    })
}

/// `content`: a string, or an array of this API's parts.
fn content(node: &Node<'_, '_>, accepts: Parts) -> Result<Vec<Block>, ApiError> {
    fields::content(node, |part| content_part(part, accepts))
}

fn content_part(part: &Node<'_, '_>, accepts: Parts) -> Result<Block, ApiError> {
    match part.tag()? {
        "text" => Ok(Block::Text {
            text: part.required("text")?.str()?.to_owned(),
        }),
        "refusal" => Ok(Block::Text {
            text: part.required("refusal")?.str()?.to_owned(),
        }),
        "image_url" if accepts == Parts::TextAndImages => {
            let image = part.required("image_url")?;
            let url = match image.value {
                Value::String(url) => url.clone(),
                _ => image.required("url")?.str()?.to_owned(),
            };
            Ok(Block::Image { url })
        }
        kind @ ("image_url" | "input_audio" | "file" | "video_url" | "audio_url") => {
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
        "function" => {
            let name = node.required("function")?.required("name")?.str()?;
            Ok(ToolChoice::Named(name.to_owned()))
        }
        other => Err(node.bad_tag("unsupported tool_choice type", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field() {
        let base = |messages: Value| json!({"model": "m", "messages": messages});
        let cases = [
            (base(json!([])), "messages"),
            (base(json!({})), "messages"),
            (base(json!([1])), "messages[0]"),
            (
                base(json!([{"role": "robot", "content": "x"}])),
                "messages[0].role",
            ),
            (base(json!([{"role": "user"}])), "messages[0].content"),
            (
                base(json!([{"role": "user", "content": [{"type": "foo"}]}])),
                "messages[0].content[0].type",
            ),
            (
                base(json!([{"role": "user", "content": [{"type": "input_audio"}]}])),
                "messages[0].content[0].type",
            ),
            (
                base(
                    json!([{"role": "system", "content": [{"type": "image_url", "image_url": "x"}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                base(
                    json!([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": 3}}]}]),
                ),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                base(json!([{"role": "tool", "content": "x"}])),
                "messages[0].tool_call_id",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}),
                "n",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "code_interpreter"}]}),
                "tools[0].type",
            ),
        ];
        for (body, param) in cases {
            let err = decode(&body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
            assert!(err.message.starts_with(param), "{err}");
        }
        let n =
            decode(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}));
        assert_eq!(n.unwrap_err().message, "n: n > 1 is not supported");
    }
}
