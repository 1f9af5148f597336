//! The IR rendered for engines: a chat completions body (`chat` upstream mode) and the messages a
//! chat template sees (`tokens` mode, and routing).
//!
//! Rendering is canonical: a conversation reaches the same messages whichever API it came
//! through. The rules:
//! - `system` (Anthropic `system`, Responses `instructions`) and the leading system/developer
//!   messages become one system message;
//! - the text blocks of a message join with `"\n"` (as vLLM joins text parts for string-content
//!   templates); a message's content is that string, or a list of parts when it has images;
//! - an assistant message is `{role, content, reasoning_content?, tool_calls?}`: content is the
//!   joined text (`""` when none), reasoning the joined thinking blocks (left out when empty;
//!   signatures and redacted thinking are never rendered);
//! - each tool result is its own `{role: "tool", tool_call_id, content}` message, in place;
//! - tool call arguments are a JSON object in template messages (as Hugging Face templates expect,
//!   and as vLLM hands them to templates) and compact JSON text in a chat body; arguments that are
//!   not a JSON object are passed as the text the client sent (`""` counts as `{}`).

use serde_json::{Map, Value, json};

use crate::ir::{Block, Completion, Conversation, Prompt, Role, Sampling, Tool, ToolChoice};

/// Where the rendered messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A chat template (Hugging Face conventions).
    Template,
    /// A chat completions request body.
    Chat,
}

/// The conversation as a chat template's `messages` and `tools` (`None` when there are none), in
/// the Hugging Face convention.
pub fn to_template_messages(conv: &Conversation) -> (Vec<Value>, Option<Vec<Value>>) {
    let tools = (!conv.tools.is_empty()).then(|| tools(&conv.tools));
    (messages(conv, Target::Template), tools)
}

/// The conversation as an OpenAI chat completions request for an engine (`chat` upstream mode):
/// always streaming, with usage, whatever the client asked (the gateway re-encodes the stream).
pub fn to_chat_request(conv: &Conversation) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), conv.model.clone().into());
    body.insert("messages".into(), messages(conv, Target::Chat).into());
    if !conv.tools.is_empty() {
        body.insert("tools".into(), tools(&conv.tools).into());
        body.insert("tool_choice".into(), tool_choice(&conv.tool_choice));
        body.insert(
            "parallel_tool_calls".into(),
            conv.parallel_tool_calls.into(),
        );
    }
    sampling(&conv.sampling, &mut body);
    if let Some(format) = &conv.response_format {
        body.insert("response_format".into(), format.clone());
    }
    if let Some(effort) = &conv.reasoning_effort {
        body.insert("reasoning_effort".into(), effort.clone().into());
    }
    finish_engine_body(&mut body, &conv.extra);
    Value::Object(body)
}

/// A completions request for an engine: always streaming, with usage.
pub fn to_completion_request(completion: &Completion) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), completion.model.clone().into());
    let prompt = match &completion.prompt {
        Prompt::Text(text) => Value::from(text.clone()),
        Prompt::Tokens(ids) => Value::from(ids.clone()),
    };
    body.insert("prompt".into(), prompt);
    sampling(&completion.sampling, &mut body);
    finish_engine_body(&mut body, &completion.extra);
    Value::Object(body)
}

fn finish_engine_body(body: &mut Map<String, Value>, extra: &Map<String, Value>) {
    body.insert("stream".into(), true.into());
    body.insert("stream_options".into(), json!({"include_usage": true}));
    for (key, value) in extra {
        if !body.contains_key(key) {
            body.insert(key.clone(), value.clone());
        }
    }
}

fn sampling(s: &Sampling, body: &mut Map<String, Value>) {
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            body.insert(key.into(), value);
        }
    };
    put("max_tokens", s.max_tokens.map(Value::from));
    put("temperature", s.temperature.map(Value::from));
    put("top_p", s.top_p.map(Value::from));
    put("top_k", s.top_k.map(Value::from));
    put("min_p", s.min_p.map(Value::from));
    put("stop", (!s.stop.is_empty()).then(|| s.stop.clone().into()));
    put("seed", s.seed.map(Value::from));
    put("presence_penalty", s.presence_penalty.map(Value::from));
    put("frequency_penalty", s.frequency_penalty.map(Value::from));
    put("repetition_penalty", s.repetition_penalty.map(Value::from));
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => "auto".into(),
        ToolChoice::None => "none".into(),
        ToolChoice::Required => "required".into(),
        ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

fn tools(tools: &[Tool]) -> Vec<Value> {
    tools
        .iter()
        .map(|t| {
            let mut function = Map::new();
            function.insert("name".into(), t.name.clone().into());
            if let Some(description) = &t.description {
                function.insert("description".into(), description.clone().into());
            }
            function.insert("parameters".into(), t.parameters.clone());
            json!({"type": "function", "function": function})
        })
        .collect()
}

fn messages(conv: &Conversation, target: Target) -> Vec<Value> {
    let mut out = Vec::with_capacity(conv.messages.len() + 1);
    let leading = conv
        .messages
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    let system: Vec<&Block> = conv
        .system
        .iter()
        .chain(conv.messages[..leading].iter().flat_map(|m| &m.blocks))
        .collect();
    if system.iter().any(|b| matches!(b, Block::Text { .. })) {
        out.push(json!({"role": "system", "content": content(system, target)}));
    }
    for message in &conv.messages[leading..] {
        match message.role {
            Role::System => out.push(json!({
                "role": "system",
                "content": content(message.blocks.iter(), target),
            })),
            Role::Assistant => out.push(assistant(&message.blocks, target)),
            Role::User | Role::Tool => {
                // Tool results are tool messages in place; anything else is the user's.
                let mut pending: Vec<&Block> = Vec::new();
                let mut any_result = false;
                for block in &message.blocks {
                    if let Block::ToolResult {
                        call_id,
                        content: c,
                        ..
                    } = block
                    {
                        flush_user(&mut pending, &mut out, target);
                        out.push(json!({
                            "role": "tool",
                            "tool_call_id": call_id,
                            "content": content(c, target),
                        }));
                        any_result = true;
                    } else {
                        pending.push(block);
                    }
                }
                if !pending.is_empty() || (message.role == Role::User && !any_result) {
                    out.push(json!({"role": "user", "content": content(pending, target)}));
                }
            }
        }
    }
    out
}

fn flush_user(pending: &mut Vec<&Block>, out: &mut Vec<Value>, target: Target) {
    if !pending.is_empty() {
        out.push(json!({"role": "user", "content": content(pending.drain(..), target)}));
    }
}

fn assistant(blocks: &[Block], target: Target) -> Value {
    let mut message = json!({"role": "assistant", "content": content(blocks, target)});
    let reasoning: Vec<&str> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Thinking { text, .. } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.join("\n").into();
    }
    let calls: Vec<Value> = blocks
        .iter()
        .filter_map(|b| match b {
            Block::ToolCall {
                id,
                name,
                arguments,
            } => Some(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments_for(arguments, target)},
            })),
            _ => None,
        })
        .collect();
    if !calls.is_empty() {
        message["tool_calls"] = calls.into();
    }
    message
}

fn arguments_for(arguments: &str, target: Target) -> Value {
    let parsed = if arguments.trim().is_empty() {
        Some(Value::Object(Map::new()))
    } else {
        serde_json::from_str::<Value>(arguments)
            .ok()
            .filter(Value::is_object)
    };
    match (parsed, target) {
        (Some(object), Target::Template) => object,
        (Some(object), Target::Chat) => object.to_string().into(),
        (None, _) => arguments.into(),
    }
}

/// A message's text and images: one string joined with "\n" when all text, else a list of parts
/// (adjacent text joined the same way).
fn content<'a>(blocks: impl IntoIterator<Item = &'a Block>, target: Target) -> Value {
    enum Part<'a> {
        Text(String),
        Image(&'a str),
    }
    let mut parts: Vec<Part<'a>> = Vec::new();
    for block in blocks {
        match block {
            Block::Text { text } => match parts.last_mut() {
                Some(Part::Text(joined)) => {
                    joined.push('\n');
                    joined.push_str(text);
                }
                _ => parts.push(Part::Text(text.clone())),
            },
            Block::Image { url } => parts.push(Part::Image(url)),
            _ => {}
        }
    }
    match parts.as_slice() {
        [] => Value::from(""),
        [Part::Text(text)] => Value::from(text.clone()),
        _ => parts
            .into_iter()
            .map(|p| match (p, target) {
                (Part::Text(text), _) => json!({"type": "text", "text": text}),
                (Part::Image(url), Target::Template) => json!({"type": "image", "url": url}),
                (Part::Image(url), Target::Chat) => {
                    json!({"type": "image_url", "image_url": {"url": url}})
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Message;

    #[test]
    fn arguments_per_target() {
        assert_eq!(
            arguments_for(r#"{"a": 1}"#, Target::Template),
            json!({"a": 1})
        );
        assert_eq!(
            arguments_for(r#"{"a": 1}"#, Target::Chat),
            json!(r#"{"a":1}"#)
        );
        assert_eq!(arguments_for("", Target::Template), json!({}));
        assert_eq!(arguments_for("{\"a\":", Target::Template), json!("{\"a\":"));
        assert_eq!(arguments_for("[1]", Target::Chat), json!("[1]"));
    }

    #[test]
    fn images_make_a_part_list() {
        let conv = Conversation {
            messages: vec![Message {
                role: Role::User,
                blocks: vec![
                    Block::Text { text: "a".into() },
                    Block::Text { text: "b".into() },
                    Block::Image {
                        url: "data:image/png;base64,AA".into(),
                    },
                ],
            }],
            ..Conversation::default()
        };
        let (template, tools) = to_template_messages(&conv);
        assert_eq!(tools, None);
        assert_eq!(
            template,
            vec![json!({"role": "user", "content": [
                {"type": "text", "text": "a\nb"},
                {"type": "image", "url": "data:image/png;base64,AA"},
            ]})]
        );
        let chat = to_chat_request(&conv);
        assert_eq!(
            chat["messages"][0]["content"][1],
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}})
        );
        assert_eq!(chat["stream"], true);
        assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn completion_request() {
        let completion = Completion {
            model: "m".into(),
            prompt: Prompt::Tokens(vec![1, 2, 3]),
            sampling: Sampling {
                max_tokens: Some(4),
                ..Sampling::default()
            },
            ..Completion::default()
        };
        assert_eq!(
            to_completion_request(&completion),
            json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "stream": true,
                   "stream_options": {"include_usage": true}})
        );
    }
}
