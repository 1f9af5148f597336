//! Calls whose arguments are written one parameter per tag (Qwen3-Coder, MiniMax M2, GLM 4.5/4.7):
//! `[BLOCK_OPEN] CALL_OPEN name (KEY_OPEN key KEY_CLOSE [VALUE_OPEN] value VALUE_CLOSE)*
//! CALL_CLOSE [BLOCK_CLOSE]`. A value is JSON if it parses as JSON, else a string. The arguments
//! object is emitted a parameter at a time: `{"a": 1` when `a` closes, `, "b": 2` when `b` does,
//! `}` when the call closes.

use serde_json::Value;

use super::{ToolMachine, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::stream::{Cursor, Emitter, Expect, Machine};

/// The tags of one parameter-per-tag format.
#[derive(Debug, Clone, Copy)]
pub(crate) struct XmlSyntax {
    /// Tags around one or more calls, if the format has them.
    pub(crate) block: Option<(&'static str, &'static str)>,
    /// Whether a call may also appear without the block (Qwen3-Coder).
    pub(crate) bare_calls: bool,
    pub(crate) call_open: &'static str,
    /// What ends the name (consumed); `None`: the name runs to the first parameter or the end of
    /// the call (GLM).
    pub(crate) name_close: Option<&'static str>,
    pub(crate) call_close: &'static str,
    pub(crate) key_open: &'static str,
    pub(crate) key_close: &'static str,
    pub(crate) value_open: Option<&'static str>,
    pub(crate) value_close: &'static str,
    pub(crate) trim: Trim,
    /// How the chat template writes calls.
    pub(crate) layout: Layout,
}

/// How a format's chat template lays calls out (for [`write_calls`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Between parts: `"\n"` or nothing.
    pub(crate) sep: &'static str,
    /// Around each value (Qwen3-Coder puts values on their own lines).
    pub(crate) value_pad: &'static str,
    /// Names and keys in double quotes (MiniMax's attributes).
    pub(crate) quoted: bool,
    /// One block per call (Qwen3-Coder) rather than one for all (MiniMax).
    pub(crate) block_per_call: bool,
}

/// How the text of a value is trimmed before it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trim {
    /// One newline on each side (Qwen3-Coder writes values on their own lines).
    OneNewline,
    /// All surrounding whitespace.
    Whitespace,
}

/// A parser for one parameter-per-tag format.
#[derive(Debug)]
pub(crate) struct XmlParams {
    syntax: &'static XmlSyntax,
    state: State,
    /// Whether the current call came inside a block.
    in_block: bool,
    /// Parameters of the current call so far.
    params: usize,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Text,
    /// Inside a block, between calls.
    Block,
    Name(String),
    /// The name was read; the call starts once a parameter or the call's end follows (so that a
    /// tag-like phrase in prose never starts a call).
    NameEnd(String),
    /// Inside a call, between parameters.
    Call,
    Key(String),
    ValueOpen(String),
    Value(String, String),
}

impl XmlParams {
    pub(crate) fn new(syntax: &'static XmlSyntax) -> Self {
        Self {
            syntax,
            state: State::Text,
            in_block: false,
            params: 0,
        }
    }

    fn text(&mut self, cur: &mut Cursor<'_>) -> State {
        let s = self.syntax;
        let opens: Vec<&str> = s
            .block
            .map(|b| b.0)
            .into_iter()
            .chain(s.bare_calls.then_some(s.call_open))
            .collect();
        let Some(tag) = cur.text_until_markup(&opens) else {
            return State::Text;
        };
        self.in_block = s.block.is_some_and(|b| b.0 == opens[tag]);
        if self.in_block {
            State::Block
        } else {
            self.call_started()
        }
    }

    fn call_started(&mut self) -> State {
        self.params = 0;
        State::Name(String::new())
    }

    /// Reads the name up to its end. A name is one line: a newline before the end (a `<tool_call>`
    /// in prose, say) makes the markup malformed at once instead of holding the text back.
    fn name(&mut self, cur: &mut Cursor<'_>, mut name: String) -> State {
        let s = self.syntax;
        let ends = match s.name_close {
            Some(close) => vec![close, "\n"],
            None => vec![s.key_open, s.call_close, "\n"],
        };
        let (piece, found) = cur.until(&ends);
        name.push_str(piece);
        let Some(end) = found else {
            return State::Name(name);
        };
        match s.name_close {
            Some(close) if ends[end] == close => {
                cur.consume(close.len());
            }
            Some(_) => return fail(cur),
            // GLM-4.5 ends the name with a newline; a blank first line is no name yet.
            None if ends[end] == "\n" && name.trim().is_empty() => {
                name.push_str(cur.consume(1));
                return State::Name(name);
            }
            None => {}
        }
        State::NameEnd(name)
    }

    fn start(&mut self, cur: &mut Cursor<'_>, name: &str) -> State {
        match super::args::plain_name(unquote(name)) {
            Some(name) => {
                cur.out.start_call(name, None);
                State::Call
            }
            None => fail(cur),
        }
    }

    /// A parameter's value is complete: emit `{"key": value` or `, "key": value`.
    fn param(&mut self, cur: &mut Cursor<'_>, key: &str, raw: &str) {
        let value = read_value(raw, self.syntax.trim);
        let key = Value::String(unquote(key.trim()).to_owned());
        let lead = if self.params == 0 { "{" } else { ", " };
        self.params += 1;
        cur.out.args(&format!(
            "{lead}{}: {}",
            crate::json::write(&key, false),
            crate::json::write(&value, false)
        ));
    }

    fn call_closed(&mut self, cur: &mut Cursor<'_>) -> State {
        cur.out.args(if self.params == 0 { "{}" } else { "}" });
        if self.in_block {
            cur.out.commit();
            State::Block
        } else {
            cur.out.close_markup();
            State::Text
        }
    }
}

fn fail(cur: &mut Cursor<'_>) -> State {
    cur.out.fail_markup();
    State::Text
}

impl Machine for XmlParams {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        let s = self.syntax;
        self.state = match std::mem::take(&mut self.state) {
            State::Text => self.text(cur),
            State::Block => {
                let close = s.block.map(|b| b.1).unwrap_or_default();
                match cur.expect(&[s.call_open, close]) {
                    Expect::Tag(0) => self.call_started(),
                    Expect::Tag(_) => {
                        cur.out.close_markup();
                        State::Text
                    }
                    Expect::More => State::Block,
                    Expect::Mismatch => fail(cur),
                }
            }
            State::Name(name) => self.name(cur, name),
            State::NameEnd(name) => match cur.lookahead(&[s.key_open, s.call_close]) {
                Expect::Tag(_) => self.start(cur, &name),
                Expect::More => State::NameEnd(name),
                Expect::Mismatch => fail(cur),
            },
            State::Call => match cur.expect(&[s.key_open, s.call_close]) {
                Expect::Tag(0) => State::Key(String::new()),
                Expect::Tag(_) => self.call_closed(cur),
                Expect::More => State::Call,
                Expect::Mismatch => fail(cur),
            },
            State::Key(mut key) => {
                let (piece, found) = cur.until(&[s.key_close]);
                key.push_str(piece);
                if found.is_none() {
                    State::Key(key)
                } else {
                    cur.consume(s.key_close.len());
                    if s.value_open.is_some() {
                        State::ValueOpen(key)
                    } else {
                        State::Value(key, String::new())
                    }
                }
            }
            State::ValueOpen(key) => match cur.expect(&[s.value_open.unwrap_or_default()]) {
                Expect::Tag(_) => State::Value(key, String::new()),
                Expect::More => State::ValueOpen(key),
                Expect::Mismatch => fail(cur),
            },
            State::Value(key, mut value) => {
                // A missing closing tag is forgiven when the next parameter or the call's end
                // follows (as vLLM does for Qwen3-Coder).
                let (piece, found) = cur.until(&[s.value_close, s.key_open, s.call_close]);
                value.push_str(piece);
                match found {
                    None => State::Value(key, value),
                    Some(end) => {
                        if end == 0 {
                            cur.consume(s.value_close.len());
                        }
                        self.param(cur, &key, &value);
                        State::Call
                    }
                }
            }
        };
    }

    fn finish(&mut self, out: &mut Emitter) {
        out.settle_markup();
    }
}

impl ToolMachine for XmlParams {}

/// `"name"` or `'name'` → `name` (MiniMax quotes attribute values).
fn unquote(text: &str) -> &str {
    let text = text.trim();
    for quote in ['"', '\''] {
        if let Some(inner) = text.strip_prefix(quote).and_then(|t| t.strip_suffix(quote)) {
            return inner;
        }
    }
    text
}

/// A parameter's text as a JSON value: JSON if it parses, else the string.
fn read_value(raw: &str, trim: Trim) -> Value {
    let text = match trim {
        Trim::Whitespace => raw.trim(),
        Trim::OneNewline => {
            let text = raw.strip_prefix('\n').unwrap_or(raw);
            text.strip_suffix('\n').unwrap_or(text)
        }
    };
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Writes a value so that [`read_value`] gives it back: a string as it is when that is
/// unambiguous, else (and for every other value) JSON; `<` is escaped only where the text would
/// otherwise contain a tag that ends the value.
fn write_value(value: &Value, syntax: &XmlSyntax) -> String {
    let ends = [syntax.value_close, syntax.key_open, syntax.call_close];
    let safe = |text: &str| !ends.iter().any(|end| text.contains(end));
    if let Value::String(text) = value {
        let plain = safe(text)
            && serde_json::from_str::<Value>(text).is_err()
            && (syntax.trim == Trim::OneNewline || text.trim() == text);
        if plain {
            return text.clone();
        }
    }
    let json = crate::json::write(value, false);
    if safe(&json) {
        json
    } else {
        crate::json::write(value, true)
    }
}

/// Writes calls as the format's chat template does.
pub(crate) fn write_calls(
    syntax: &XmlSyntax,
    parser: &'static str,
    calls: &[ToolCall],
) -> Result<String, Unrepresentable> {
    let layout = &syntax.layout;
    let quote = |s: &str| {
        if layout.quoted {
            format!("\"{s}\"")
        } else {
            s.to_owned()
        }
    };
    let mut written = Vec::new();
    for (index, (name, args)) in checked_calls(parser, calls)?.into_iter().enumerate() {
        let mut call = format!(
            "{}{}{}{}",
            syntax.call_open,
            quote(name),
            syntax.name_close.unwrap_or_default(),
            layout.sep
        );
        for (key, value) in args {
            if !plain_key(key) {
                return Err(Unrepresentable {
                    parser,
                    index,
                    name: name.to_owned(),
                    reason: format!("parameter name {key:?} cannot be written in a tag"),
                });
            }
            let pad = layout.value_pad;
            call.push_str(&format!(
                "{}{}{}{}{pad}{}{pad}{}{}",
                syntax.key_open,
                quote(key),
                syntax.key_close,
                syntax.value_open.unwrap_or_default(),
                write_value(value, syntax),
                syntax.value_close,
                layout.sep,
            ));
        }
        call.push_str(syntax.call_close);
        written.push(call);
    }
    let sep = layout.sep;
    Ok(match syntax.block {
        Some((open, close)) if layout.block_per_call => written
            .iter()
            .map(|call| format!("{open}{sep}{call}{sep}{close}"))
            .collect::<Vec<_>>()
            .join(sep),
        Some((open, close)) => format!("{open}{sep}{}{sep}{close}", written.join(sep)),
        None => written.join(sep),
    })
}

/// Whether a parameter name can be written between the format's tags.
fn plain_key(key: &str) -> bool {
    !key.is_empty() && key.trim() == key && !key.contains(['<', '>', '"', '\''])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_read_as_json_else_as_strings() {
        assert_eq!(read_value("\n42\n", Trim::OneNewline), json!(42));
        assert_eq!(
            read_value("\nSan Francisco\n", Trim::OneNewline),
            json!("San Francisco")
        );
        assert_eq!(
            read_value("\n\n x \n\n", Trim::OneNewline),
            json!("\n x \n")
        );
        assert_eq!(
            read_value(" {\"a\": [1]} ", Trim::Whitespace),
            json!({"a": [1]})
        );
        assert_eq!(read_value(" null ", Trim::Whitespace), json!(null));
    }

    #[test]
    fn written_values_read_back() {
        let syntax = |trim| XmlSyntax {
            block: None,
            bare_calls: true,
            call_open: "<f=",
            name_close: Some(">"),
            call_close: "</f>",
            key_open: "<p=",
            key_close: ">",
            value_open: None,
            value_close: "</p>",
            trim,
            layout: Layout {
                sep: "",
                value_pad: "",
                quoted: false,
                block_per_call: false,
            },
        };
        let values = [
            json!("42"),
            json!(" padded "),
            json!("a</p>b"),
            json!("x<y"),
            json!(""),
            json!([1, "<p=x>"]),
        ];
        for value in values {
            for trim in [Trim::OneNewline, Trim::Whitespace] {
                let written = write_value(&value, &syntax(trim));
                assert!(
                    !written.contains("</p>") && !written.contains("<p="),
                    "{written}"
                );
                let framed = if trim == Trim::OneNewline {
                    format!("\n{written}\n")
                } else {
                    written
                };
                assert_eq!(read_value(&framed, trim), value);
            }
        }
        assert_eq!(write_value(&json!("x<y"), &syntax(Trim::Whitespace)), "x<y");
    }
}
