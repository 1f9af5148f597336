//! OpenAI `/v1/completions` requests: a raw prompt, no chat template.

use serde_json::Value;

use crate::error::ApiError;
use crate::fields::{self, Keys};
use crate::ir::{Completion, Prompt};
use crate::json::Node;

const KEYS: Keys = Keys {
    max_tokens: &["max_tokens"],
    stop: "stop",
};

/// Decodes and validates a completions request body.
pub fn decode(body: &Value) -> Result<Completion, ApiError> {
    let root = Node::root(body);
    let common = fields::common(&root, KEYS)?;
    fields::single_choice(&root)?;
    fields::unsupported_flag(&root, "echo")?;
    if let Some(best_of) = root.get("best_of")
        && best_of.u32()? > 1
    {
        return Err(best_of.error("best_of > 1 is not supported"));
    }
    for key in ["logprobs", "suffix"] {
        if let Some(node) = root.get(key) {
            return Err(node.error("not supported"));
        }
    }
    let include_usage = match root.get("stream_options") {
        Some(options) => {
            options.object()?;
            options.opt_bool("include_usage")?.unwrap_or(false)
        }
        None => false,
    };
    Ok(Completion {
        model: common.model,
        prompt: prompt(&root.required("prompt")?)?,
        sampling: common.sampling,
        stream: common.stream,
        include_usage,
        hints: common.hints,
        cache_control: common.cache_control,
        extra: common.extra,
    })
}

/// `prompt`: a string, token ids, or a batch of one of those.
fn prompt(node: &Node<'_, '_>) -> Result<Prompt, ApiError> {
    const EXPECTED: &str = "a string, an array of token ids, or a one-element array of those";
    let prompt = match node.value {
        Value::String(text) => Prompt::Text(text.clone()),
        Value::Array(items) => match items.first() {
            Some(Value::String(_) | Value::Array(_)) => {
                if items.len() > 1 {
                    return Err(node.error("batches of more than one prompt are not supported"));
                }
                let mut only = node.items()?;
                match only.next() {
                    Some(first) => return prompt(&first),
                    None => return Err(node.error("must not be empty")),
                }
            }
            _ => Prompt::Tokens(node.items()?.map(|id| id.u32()).collect::<Result<_, _>>()?),
        },
        _ => return Err(node.expected(EXPECTED)),
    };
    let empty = match &prompt {
        Prompt::Text(t) => t.is_empty(),
        Prompt::Tokens(t) => t.is_empty(),
    };
    if empty {
        return Err(node.error("must not be empty"));
    }
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompts() {
        let decode_prompt =
            |p: Value| decode(&json!({"model": "m", "prompt": p})).map(|c| c.prompt);
        assert_eq!(
            decode_prompt(json!("hi")).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            decode_prompt(json!(["hi"])).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            decode_prompt(json!([1, 2])).unwrap(),
            Prompt::Tokens(vec![1, 2])
        );
        assert_eq!(
            decode_prompt(json!([[1, 2]])).unwrap(),
            Prompt::Tokens(vec![1, 2])
        );
        let param = |p: Value| decode_prompt(p).unwrap_err().param.unwrap();
        assert_eq!(param(json!(["a", "b"])), "prompt");
        assert_eq!(param(json!([1, -2])), "prompt[1]");
        assert_eq!(param(json!([[1, "x"]])), "prompt[0][1]");
        assert_eq!(param(json!([])), "prompt");
        assert_eq!(param(json!("")), "prompt");
        assert_eq!(param(json!({})), "prompt");
    }

    #[test]
    fn unsupported_options_are_400s() {
        for (key, value) in [
            ("echo", json!(true)),
            ("n", json!(3)),
            ("best_of", json!(2)),
            ("logprobs", json!(1)),
            ("suffix", json!("x")),
        ] {
            let mut body = json!({"model": "m", "prompt": "p"});
            body[key] = value;
            assert_eq!(decode(&body).unwrap_err().param.as_deref(), Some(key));
        }
        let c = decode(&json!({"model": "m", "prompt": "p", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 5})).unwrap();
        assert!(c.stream && c.include_usage);
        assert_eq!(c.sampling.max_tokens, Some(5));
    }
}
