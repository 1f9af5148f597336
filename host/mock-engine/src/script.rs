//! Scripted answers: a test tells the mock engine what to answer by ending the last message of
//! its conversation with directives, which reach the engine through every client API and both
//! upstream modes because they are part of the prompt text.
//!
//! - `[[mock:say TEXT]]` answers `TEXT` verbatim (it may contain `<think>` tags or tool-call
//!   markup, to exercise parsers);
//! - `[[mock:tool_call NAME {"json": "arguments"}]]` answers a call of tool `NAME`, written in the
//!   engine's tool-call format (`MockEngineConfig::tool_format`), as the model would.
//!
//! Several directives in a row are answered in order (two `tool_call`s are parallel calls). Only
//! directives at the very end of the prompt count (after them at most the chat template's own
//! scaffolding, such as `<|im_end|>\n<|im_start|>assistant\n`): a directive earlier in the history
//! was answered by an earlier turn.

use switchyard_parsers::ToolCall;

/// Most bytes of chat-template scaffolding allowed after the last directive.
const TRAILER_MAX: usize = 64;

const OPEN: &str = "[[mock:";
const CLOSE: &str = "]]";

/// A directive that cannot be answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScriptError {
    /// Not `say` or `tool_call`.
    #[error("unknown mock directive `{0}` (expected `say` or `tool_call`)")]
    Unknown(String),
    /// `tool_call` without a name or with arguments that are not a JSON object.
    #[error("mock directive `tool_call {0}`: expected `NAME {{json object}}`")]
    BadToolCall(String),
    /// The tool-call format is unknown, or cannot write the call.
    #[error(transparent)]
    Format(#[from] switchyard_parsers::ParserError),
}

/// The answer the directives at the end of `prompt` ask for, if any. `is_scaffolding` tells
/// whether the text after the last directive starts with the chat template's own markup (a
/// special token): text of another kind there means the directive is quoted inside a message,
/// as in a harness's title request (`"... [[mock:say x]]"`), and is not meant for this answer.
pub(crate) fn answer(
    prompt: &str,
    tool_format: &str,
    is_scaffolding: impl Fn(&str) -> bool,
) -> Result<Option<String>, ScriptError> {
    let directives = trailing_directives(prompt, is_scaffolding);
    if directives.is_empty() {
        return Ok(None);
    }
    let mut out = String::new();
    let mut calls = Vec::new();
    for directive in directives {
        let (verb, rest) = directive.split_once(' ').unwrap_or((directive, ""));
        match verb {
            "say" => {
                flush_calls(&mut out, &mut calls, tool_format)?;
                out.push_str(rest);
            }
            "tool_call" => calls.push(tool_call(rest)?),
            other => return Err(ScriptError::Unknown(other.to_owned())),
        }
    }
    flush_calls(&mut out, &mut calls, tool_format)?;
    Ok(Some(out))
}

fn flush_calls(
    out: &mut String,
    calls: &mut Vec<ToolCall>,
    tool_format: &str,
) -> Result<(), ScriptError> {
    if !calls.is_empty() {
        out.push_str(&switchyard_parsers::format_tool_calls(tool_format, calls)?);
        calls.clear();
    }
    Ok(())
}

fn tool_call(spec: &str) -> Result<ToolCall, ScriptError> {
    let bad = || ScriptError::BadToolCall(spec.to_owned());
    let (name, arguments) = spec.trim().split_once(' ').ok_or_else(bad)?;
    let arguments: serde_json::Value = serde_json::from_str(arguments.trim()).map_err(|_| bad())?;
    if name.is_empty() || !arguments.is_object() {
        return Err(bad());
    }
    Ok(ToolCall {
        name: name.to_owned(),
        arguments,
    })
}

/// `text` without the leading whitespace and closing tags (`</tool_response>`) a template wraps
/// a message's content in.
fn without_closing_tags(mut text: &str) -> &str {
    loop {
        text = text.trim_start();
        let Some(tag) = text.strip_prefix("</") else {
            return text;
        };
        match tag.find('>') {
            Some(end)
                if tag[..end]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                text = &tag[end + 1..];
            }
            _ => return text,
        }
    }
}

/// The bodies of the run of directives that ends the prompt, in order.
fn trailing_directives(prompt: &str, is_scaffolding: impl Fn(&str) -> bool) -> Vec<&str> {
    let mut found = Vec::new();
    let Some(last_close) = prompt.rfind(CLOSE) else {
        return found;
    };
    let trailer = without_closing_tags(&prompt[last_close + CLOSE.len()..]);
    if trailer.len() > TRAILER_MAX || !(trailer.is_empty() || is_scaffolding(trailer)) {
        return found;
    }
    let mut end = last_close;
    while let Some(open) = prompt[..end].rfind(OPEN) {
        found.push(&prompt[open + OPEN.len()..end]);
        // Another directive only if nothing but whitespace separates it from this one.
        let before = prompt[..open].trim_end();
        if !before.ends_with(CLOSE) {
            break;
        }
        end = before.len() - CLOSE.len();
    }
    found.reverse();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAIL: &str = "<|im_end|>\n<|im_start|>assistant\n";

    fn answer(prompt: &str, tool_format: &str) -> Result<Option<String>, ScriptError> {
        super::answer(prompt, tool_format, |t| t.starts_with("<|"))
    }
    #[test]
    fn say_answers_verbatim() {
        let prompt = format!("user: hi [[mock:say <think>hmm</think>Hello!]]{TAIL}");
        assert_eq!(
            answer(&prompt, "hermes").unwrap().as_deref(),
            Some("<think>hmm</think>Hello!")
        );
    }

    #[test]
    fn tool_calls_are_written_in_the_engine_format() {
        let prompt = format!(
            "weather? [[mock:tool_call get_weather {{\"city\": \"Paris\"}}]] \
             [[mock:tool_call get_time {{\"tz\": \"CET\"}}]]{TAIL}"
        );
        let text = answer(&prompt, "hermes").unwrap().unwrap();
        let mut parser = switchyard_parsers::OutputParser::new(None, Some("hermes"), "c").unwrap();
        let mut events = parser.push(&text);
        events.extend(parser.finish());
        let names: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                switchyard_parsers::ParsedEvent::ToolCallStart { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["get_weather", "get_time"]);
    }

    #[test]
    fn directives_earlier_in_the_history_are_ignored() {
        let prompt = format!(
            "[[mock:say old]]{TAIL}old<|im_end|>\n<|im_start|>user\nand now a long question{TAIL}"
        );
        assert_eq!(answer(&prompt, "hermes").unwrap(), None);
        assert_eq!(answer("no directive at all", "hermes").unwrap(), None);
        // Quoted in a message (a harness's title request), it is not for this answer.
        let quoted = format!("Title for: \"[[mock:tool_call f {{\\\"a\\\": 1}}]]\"{TAIL}");
        assert_eq!(answer(&quoted, "hermes").unwrap(), None);
        // Inside a tool result, wrapped in the template's own tags, it is.
        let wrapped = format!("<tool_response>\n18C [[mock:say Sunny.]]\n</tool_response>{TAIL}");
        assert_eq!(
            answer(&wrapped, "hermes").unwrap().as_deref(),
            Some("Sunny.")
        );
    }

    #[test]
    fn bad_directives_are_errors() {
        assert!(matches!(
            answer("[[mock:sing la]]", "hermes"),
            Err(ScriptError::Unknown(_))
        ));
        assert!(matches!(
            answer("[[mock:tool_call f [1]]]", "hermes"),
            Err(ScriptError::BadToolCall(_))
        ));
        assert!(matches!(
            answer("[[mock:tool_call f {}]]", "no-such-format"),
            Err(ScriptError::Format(_))
        ));
    }
}
