//! Request fields every API shares: model, stream, sampling, hints, passthrough fields, tools.

use serde_json::{Map, Value, json};

use crate::error::{ApiError, ErrorKind};
use crate::hints;
use crate::ir::{
    AgentHints, Block, CacheControl, Conversation, Sampling, Tool, ToolChoice, ToolOrigin,
};
use crate::json::Node;

/// Engine-specific request fields passed through to the engine unchanged (into
/// [`crate::Conversation::extra`]); everything else unknown is ignored.
pub const PASSTHROUGH_FIELDS: &[&str] = &[
    "chat_template_kwargs",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "logit_bias",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    // llama.cpp's GBNF grammar.
    "grammar",
];

/// Parses a request body: JSON, and an object.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(ErrorKind::InvalidRequest, format!("invalid JSON body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::new(
            ErrorKind::InvalidRequest,
            "the request body must be a JSON object",
        ));
    }
    Ok(body)
}

/// The fields of a request outside its conversation.
#[derive(Debug)]
pub(crate) struct Common {
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) sampling: Sampling,
    pub(crate) hints: AgentHints,
    /// `nvext.cache_control`.
    pub(crate) cache_control: Option<CacheControl>,
    pub(crate) extra: Map<String, Value>,
}

impl Common {
    /// A conversation with these fields and nothing else yet.
    pub(crate) fn into_conversation(self) -> Conversation {
        Conversation {
            model: self.model,
            stream: self.stream,
            sampling: self.sampling,
            hints: self.hints,
            cache_control: self.cache_control,
            extra: self.extra,
            ..Conversation::default()
        }
    }
}

/// Which keys an API uses for the fields whose names differ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    /// Length limit keys, first given wins (`max_completion_tokens` before `max_tokens`).
    pub(crate) max_tokens: &'static [&'static str],
    /// The stop strings key (`stop`, `stop_sequences`).
    pub(crate) stop: &'static str,
}

/// Reads the shared fields of a request body.
pub(crate) fn common(root: &Node<'_, '_>, keys: Keys) -> Result<Common, ApiError> {
    root.object()?;
    let model = root.required("model")?.str()?.to_owned();
    let stream = root.opt_bool("stream")?.unwrap_or(false);
    let (hints, cache_control) = hints::nvext(root)?;
    Ok(Common {
        model,
        stream,
        sampling: sampling(root, keys)?,
        hints,
        cache_control,
        extra: passthrough(root)?,
    })
}

fn sampling(root: &Node<'_, '_>, keys: Keys) -> Result<Sampling, ApiError> {
    let mut max_tokens = None;
    for key in keys.max_tokens {
        if let Some(node) = root.get(key) {
            let n = node.u32()?;
            if n == 0 {
                return Err(node.error("must be at least 1"));
            }
            max_tokens.get_or_insert(n);
        }
    }
    let top_k = match root.get("top_k") {
        None => None,
        Some(node) => match node.i64()? {
            // vLLM and SGLang spell "no top-k" as -1 (or 0).
            -1 | 0 => None,
            n => {
                Some(u32::try_from(n).map_err(|_| node.error("must be -1 or a positive integer"))?)
            }
        },
    };
    let temperature = root.opt_f64("temperature")?;
    if let Some(t) = temperature.filter(|t| *t < 0.0) {
        return Err(ApiError::invalid(
            "temperature",
            format_args!("must be non-negative, got {t}"),
        ));
    }
    let top_p = root.opt_f64("top_p")?;
    if let Some(p) = top_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(ApiError::invalid(
            "top_p",
            format_args!("must be between 0 and 1, got {p}"),
        ));
    }
    Ok(Sampling {
        max_tokens,
        temperature,
        top_p,
        top_k,
        min_p: root.opt_f64("min_p")?,
        stop: stop(root, keys.stop)?,
        seed: root.get("seed").map(|s| s.i64()).transpose()?,
        presence_penalty: root.opt_f64("presence_penalty")?,
        frequency_penalty: root.opt_f64("frequency_penalty")?,
        repetition_penalty: root.opt_f64("repetition_penalty")?,
    })
}

/// A stop field: one string or an array of strings.
fn stop(root: &Node<'_, '_>, key: &str) -> Result<Vec<String>, ApiError> {
    let Some(node) = root.get(key) else {
        return Ok(Vec::new());
    };
    if let Value::String(s) = node.value {
        return Ok(vec![s.clone()]);
    }
    let items = node
        .items()
        .map_err(|_| node.expected("a string or an array of strings"))?;
    items.map(|s| s.str().map(str::to_owned)).collect()
}

fn passthrough(root: &Node<'_, '_>) -> Result<Map<String, Value>, ApiError> {
    let mut extra = Map::new();
    for key in PASSTHROUGH_FIELDS {
        if let Some(node) = root.get(key) {
            if *key == "chat_template_kwargs" {
                node.object()?;
            }
            extra.insert((*key).to_owned(), node.value.clone());
        }
    }
    Ok(extra)
}

/// `n` (chat, completions): only one choice is supported.
pub(crate) fn single_choice(root: &Node<'_, '_>) -> Result<(), ApiError> {
    if let Some(n) = root.get("n")
        && n.u32()? > 1
    {
        return Err(n.error("n > 1 is not supported"));
    }
    Ok(())
}

/// A boolean feature this gateway does not offer: `true` is a 400, anything else is ignored.
pub(crate) fn unsupported_flag(root: &Node<'_, '_>, key: &str) -> Result<(), ApiError> {
    match root.opt_bool(key)? {
        Some(true) => Err(root.required(key)?.error("not supported")),
        _ => Ok(()),
    }
}

/// Which content parts a message accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parts {
    /// Text only (system, developer and assistant messages).
    Text,
    /// Text and images (user messages, tool results).
    TextAndImages,
}

/// Message content: a string (empty: no blocks) or an array of parts, each read by `part`.
pub(crate) fn content(
    node: &Node<'_, '_>,
    mut part: impl FnMut(&Node<'_, '_>) -> Result<Block, ApiError>,
) -> Result<Vec<Block>, ApiError> {
    if let Value::String(text) = node.value {
        return Ok(non_empty_text(text));
    }
    let parts = node
        .items()
        .map_err(|_| node.expected("a string or an array of content parts"))?;
    parts.map(|p| part(&p)).collect()
}

/// A text block, unless the text is empty.
pub(crate) fn non_empty_text(text: &str) -> Vec<Block> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![Block::Text {
            text: text.to_owned(),
        }]
    }
}

/// A tool definition: `node` holds `name`, `description` and the schema under `schema_key`.
/// Tool-call arguments: JSON text, or (Hugging Face style) a JSON object, kept as its text.
pub(crate) fn arguments(node: &Node<'_, '_>) -> Result<String, ApiError> {
    match node.value {
        Value::String(s) => Ok(s.clone()),
        Value::Object(_) => Ok(node.value.to_string()),
        _ => Err(node.expected("a JSON string")),
    }
}

pub(crate) fn tool(node: &Node<'_, '_>, schema_key: &str) -> Result<Tool, ApiError> {
    node.object()?;
    let name = node.required("name")?.str()?;
    if name.is_empty() {
        return Err(node.required("name")?.error("must not be empty"));
    }
    let parameters = match node.get(schema_key) {
        Some(schema) => {
            schema.object()?;
            schema.value.clone()
        }
        // OpenAI: no parameters means a function without arguments.
        None => json!({"type": "object", "properties": {}}),
    };
    Ok(Tool {
        name: name.to_owned(),
        description: node.opt_str("description")?,
        parameters,
        origin: ToolOrigin::Function,
    })
}

/// A string `tool_choice` (`auto`, `none`, `required`), shared by chat and responses.
pub(crate) fn tool_choice_mode(node: &Node<'_, '_>, mode: &str) -> Result<ToolChoice, ApiError> {
    match mode {
        "auto" => Ok(ToolChoice::Auto),
        "none" => Ok(ToolChoice::None),
        "required" => Ok(ToolChoice::Required),
        other => Err(node.error(format_args!(
            "unknown tool_choice `{other}`, expected `auto`, `none`, `required` or a function"
        ))),
    }
}

/// A named tool choice must name one of the tools.
pub(crate) fn check_tool_choice(choice: &ToolChoice, tools: &[Tool]) -> Result<(), ApiError> {
    match choice {
        ToolChoice::Named(name) if !tools.iter().any(|t| t.name == *name) => {
            Err(ApiError::invalid(
                "tool_choice",
                format_args!("no tool named `{name}` in `tools`"),
            ))
        }
        _ => Ok(()),
    }
}

/// Chat completions' `response_format` (also the shape of the Responses API's `text.format`
/// once converted): `text` means none.
pub(crate) fn response_format(node: &Node<'_, '_>) -> Result<Option<Value>, ApiError> {
    match node.tag()? {
        "text" => Ok(None),
        "json_object" => Ok(Some(node.value.clone())),
        "json_schema" => {
            node.required("json_schema")?.object()?;
            Ok(Some(node.value.clone()))
        }
        other => Err(node.bad_tag("unsupported response_format type", other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: Keys = Keys {
        max_tokens: &["max_completion_tokens", "max_tokens"],
        stop: "stop",
    };

    #[test]
    fn shared_fields() {
        let body = json!({
            "model": "m", "stream": true, "max_tokens": 10, "max_completion_tokens": 20,
            "temperature": 0.5, "top_k": -1, "stop": "END", "seed": -7,
            "chat_template_kwargs": {"enable_thinking": false}, "unknown": {"x": 1},
        });
        let c = common(&Node::root(&body), CHAT).unwrap();
        assert_eq!(c.model, "m");
        assert!(c.stream);
        assert_eq!(c.sampling.max_tokens, Some(20));
        assert_eq!(c.sampling.top_k, None);
        assert_eq!(c.sampling.stop, vec!["END".to_owned()]);
        assert_eq!(c.sampling.seed, Some(-7));
        assert_eq!(
            Value::Object(c.extra),
            json!({"chat_template_kwargs": {"enable_thinking": false}})
        );
    }

    #[test]
    fn wrong_types_name_the_field() {
        let cases = [
            (json!({}), "model"),
            (json!({"model": 1}), "model"),
            (json!({"model": "m", "stream": "yes"}), "stream"),
            (json!({"model": "m", "max_tokens": 0}), "max_tokens"),
            (json!({"model": "m", "max_tokens": 1.5}), "max_tokens"),
            (json!({"model": "m", "temperature": -1}), "temperature"),
            (json!({"model": "m", "top_p": 2}), "top_p"),
            (json!({"model": "m", "top_k": -2}), "top_k"),
            (json!({"model": "m", "stop": [1]}), "stop[0]"),
            (json!({"model": "m", "stop": {}}), "stop"),
            (
                json!({"model": "m", "chat_template_kwargs": []}),
                "chat_template_kwargs",
            ),
        ];
        for (body, param) in cases {
            let err = common(&Node::root(&body), CHAT).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }

    #[test]
    fn parse_body_rejects_non_objects() {
        assert!(parse_body(b"{").is_err());
        assert!(parse_body(b"[1]").is_err());
        assert!(parse_body(b"{\"a\":1}").is_ok());
    }
}
