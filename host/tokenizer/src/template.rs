//! Chat templates, rendered with minijinja the way Hugging Face `apply_chat_template` renders them
//! with Jinja2.

use std::fmt::Write as _;
use std::io;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

use crate::error::{RaisedByTemplate, TokenizerError};

/// Name of the template used when no other applies (a single-string `chat_template` gets it too).
pub(crate) const DEFAULT_TEMPLATE: &str = "default";
/// Name of the template Hugging Face prefers when the request has tools.
pub(crate) const TOOL_USE_TEMPLATE: &str = "tool_use";

/// One chat request, as the chat template sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatTemplateInput<'a> {
    /// OpenAI-style messages as sent by clients, passed to the template unchanged.
    pub messages: &'a [serde_json::Value],
    /// Tool definitions; the template sees `none` when absent.
    pub tools: Option<&'a [serde_json::Value]>,
    /// Whether to end with the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs`: extra template variables (e.g. `enable_thinking`).
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// A Jinja environment configured like Hugging Face's, holding one model's named templates.
pub(crate) fn environment(
    templates: Vec<(String, String)>,
) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    // Jinja2 built-ins missing from minijinja, and Python's str/dict/list methods.
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    for (name, source) in templates {
        env.add_template_owned(name, source)?;
    }
    Ok(env)
}

/// Renders `input` with the template Hugging Face would pick: `tool_use` when the request has
/// tools and the model has one, else `default`.
pub(crate) fn render(
    env: &Environment<'static>,
    model: &str,
    special_tokens: &[(&'static str, String)],
    input: &ChatTemplateInput<'_>,
) -> Result<String, TokenizerError> {
    if input.messages.is_empty() {
        return Err(TokenizerError::EmptyConversation);
    }
    let template = input
        .tools
        .and_then(|_| env.get_template(TOOL_USE_TEMPLATE).ok())
        .or_else(|| env.get_template(DEFAULT_TEMPLATE).ok())
        .ok_or_else(|| TokenizerError::NoChatTemplate(model.to_owned()))?;

    // Later entries win: chat_template_kwargs override special tokens, as in Hugging Face.
    let special_tokens = special_tokens
        .iter()
        .map(|(name, token)| ((*name).to_owned(), Value::from(token.as_str())));
    let extra = input
        .extra
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.clone(), Value::from_serialize(value)));
    let fixed = [
        ("messages", Value::from_serialize(input.messages)),
        ("tools", Value::from_serialize(input.tools)),
        (
            "add_generation_prompt",
            Value::from(input.add_generation_prompt),
        ),
    ]
    .map(|(name, value)| (name.to_owned(), value));
    let context: Value = special_tokens.chain(extra).chain(fixed).collect();
    Ok(template.render(context)?)
}

/// `raise_exception(message)`: the template rejects the request.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedByTemplate(message)))
}

/// `strftime_now(format)`: the local time, formatted like Python's `datetime.now().strftime`.
fn strftime_now(format: &str) -> Result<String, Error> {
    let mut out = String::new();
    // chrono reports an unknown specifier as a formatting error rather than panicking.
    write!(out, "{}", chrono::Local::now().format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("invalid strftime format {format:?}"),
        )
    })?;
    Ok(out)
}

/// `tojson` as Hugging Face overrides it: Python's `json.dumps(value, ensure_ascii=False,
/// indent=indent)`, so no HTML escaping, and `", "` / `": "` separators unless indented.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let written = match indent {
        Some(width) => {
            let indent = " ".repeat(width);
            let formatter = PrettyFormatter::with_indent(indent.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, formatter,
            ))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonCompactFormatter,
        )),
    };
    written.map_err(|err| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(err)
    })?;
    String::from_utf8(out).map(Value::from).map_err(|err| {
        Error::new(ErrorKind::InvalidOperation, "JSON is not UTF-8").with_source(err)
    })
}

/// The separators of Python's `json.dumps` without `indent`: `", "` and `": "`.
struct PythonCompactFormatter;

impl Formatter for PythonCompactFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}
