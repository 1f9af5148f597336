//! JSON for parsers and formatters: an incremental validator that tells, char by char, whether
//! text is still a valid prefix of one JSON value and where that value ends (so arguments can be
//! streamed as they arrive and the closing tag after them found), and the writer formatters use.

use serde_json::Value;

/// What [`JsonScanner::feed`] decided about a char.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Still inside the value.
    More,
    /// The char completed the value.
    Done,
    /// The value (a number) ended just before this char, which is not part of it.
    DoneBefore,
    /// The char cannot continue a valid value.
    Invalid,
}

/// Validates one JSON value (RFC 8259, strict) incrementally.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonScanner {
    /// Open containers, innermost last: `true` for an object.
    stack: Vec<bool>,
    expect: Expect,
    lex: Lex,
    done: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Expect {
    #[default]
    Value,
    /// After `[`.
    ValueOrClose,
    /// After `{`.
    KeyOrClose,
    /// After `,` in an object.
    Key,
    Colon,
    CommaOrClose,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Lex {
    #[default]
    Between,
    Str {
        key: bool,
        escape: Escape,
    },
    Num(Num),
    Word {
        word: &'static str,
        at: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    /// Hex digits of a `\u` escape still to come.
    Hex(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

/// Nesting deeper than this is rejected (no model writes it; it bounds memory).
const MAX_DEPTH: usize = 512;

// === impl JsonScanner ===

impl JsonScanner {
    /// Feeds chars of `text` until the value ends or turns invalid; returns the bytes that belong
    /// to the value (the completing char included, an invalid one not) and the last decision.
    pub(crate) fn feed_str(&mut self, text: &str) -> (usize, Scan) {
        for (at, c) in text.char_indices() {
            match self.feed(c) {
                Scan::More => {}
                Scan::Done => return (at + c.len_utf8(), Scan::Done),
                other => return (at, other),
            }
        }
        (text.len(), Scan::More)
    }

    /// Feeds one char.
    pub(crate) fn feed(&mut self, c: char) -> Scan {
        if self.done {
            return Scan::Invalid;
        }
        match self.lex {
            Lex::Between => self.structural(c),
            Lex::Str { key, escape } => self.string(c, key, escape),
            Lex::Num(num) => match num.next(c) {
                Some(next) => {
                    self.lex = Lex::Num(next);
                    Scan::More
                }
                None if num.is_complete() => {
                    self.lex = Lex::Between;
                    match self.value_ended() {
                        Scan::Done => Scan::DoneBefore,
                        _ => self.structural(c),
                    }
                }
                None => Scan::Invalid,
            },
            Lex::Word { word, at } => {
                if word[at..].starts_with(c) {
                    if at + 1 == word.len() {
                        self.lex = Lex::Between;
                        self.value_ended()
                    } else {
                        self.lex = Lex::Word { word, at: at + 1 };
                        Scan::More
                    }
                } else {
                    Scan::Invalid
                }
            }
        }
    }

    fn structural(&mut self, c: char) -> Scan {
        if matches!(c, ' ' | '\t' | '\n' | '\r') {
            return Scan::More;
        }
        match self.expect {
            Expect::Value | Expect::ValueOrClose => match c {
                ']' if self.expect == Expect::ValueOrClose => self.close(false),
                '{' | '[' if self.stack.len() >= MAX_DEPTH => Scan::Invalid,
                '{' => {
                    self.stack.push(true);
                    self.expect = Expect::KeyOrClose;
                    Scan::More
                }
                '[' => {
                    self.stack.push(false);
                    self.expect = Expect::ValueOrClose;
                    Scan::More
                }
                '"' => {
                    self.lex = Lex::Str {
                        key: false,
                        escape: Escape::None,
                    };
                    Scan::More
                }
                '-' => self.number(Num::Minus),
                '0' => self.number(Num::Zero),
                '1'..='9' => self.number(Num::Int),
                't' => self.word("true"),
                'f' => self.word("false"),
                'n' => self.word("null"),
                _ => Scan::Invalid,
            },
            Expect::KeyOrClose | Expect::Key => match c {
                '"' => {
                    self.lex = Lex::Str {
                        key: true,
                        escape: Escape::None,
                    };
                    Scan::More
                }
                '}' if self.expect == Expect::KeyOrClose => self.close(true),
                _ => Scan::Invalid,
            },
            Expect::Colon if c == ':' => {
                self.expect = Expect::Value;
                Scan::More
            }
            Expect::CommaOrClose => match (c, self.stack.last()) {
                (',', Some(&object)) => {
                    self.expect = if object { Expect::Key } else { Expect::Value };
                    Scan::More
                }
                ('}', Some(true)) => self.close(true),
                (']', Some(false)) => self.close(false),
                _ => Scan::Invalid,
            },
            Expect::Colon => Scan::Invalid,
        }
    }

    fn string(&mut self, c: char, key: bool, escape: Escape) -> Scan {
        let escape = match escape {
            Escape::None => match c {
                '"' => {
                    self.lex = Lex::Between;
                    if key {
                        self.expect = Expect::Colon;
                        return Scan::More;
                    }
                    return self.value_ended();
                }
                '\\' => Escape::Backslash,
                c if (c as u32) < 0x20 => return Scan::Invalid,
                _ => Escape::None,
            },
            Escape::Backslash => match c {
                '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Escape::None,
                'u' => Escape::Hex(4),
                _ => return Scan::Invalid,
            },
            Escape::Hex(left) if c.is_ascii_hexdigit() => {
                if left == 1 {
                    Escape::None
                } else {
                    Escape::Hex(left - 1)
                }
            }
            Escape::Hex(_) => return Scan::Invalid,
        };
        self.lex = Lex::Str { key, escape };
        Scan::More
    }

    fn number(&mut self, start: Num) -> Scan {
        self.lex = Lex::Num(start);
        Scan::More
    }

    fn word(&mut self, word: &'static str) -> Scan {
        self.lex = Lex::Word { word, at: 1 };
        Scan::More
    }

    fn close(&mut self, object: bool) -> Scan {
        match self.stack.pop() {
            Some(open) if open == object => self.value_ended(),
            _ => Scan::Invalid,
        }
    }

    fn value_ended(&mut self) -> Scan {
        if self.stack.is_empty() {
            self.done = true;
            Scan::Done
        } else {
            self.expect = Expect::CommaOrClose;
            Scan::More
        }
    }
}

// === impl Num ===

impl Num {
    fn next(self, c: char) -> Option<Self> {
        let digit = c.is_ascii_digit();
        Some(match (self, c) {
            (Self::Minus, '0') => Self::Zero,
            (Self::Minus, _) if digit => Self::Int,
            (Self::Int, _) if digit => Self::Int,
            (Self::Zero | Self::Int, '.') => Self::Dot,
            (Self::Dot | Self::Frac, _) if digit => Self::Frac,
            (Self::Zero | Self::Int | Self::Frac, 'e' | 'E') => Self::Exp,
            (Self::Exp, '+' | '-') => Self::ExpSign,
            (Self::Exp | Self::ExpSign | Self::ExpDigits, _) if digit => Self::ExpDigits,
            _ => return None,
        })
    }

    fn is_complete(self) -> bool {
        matches!(self, Self::Zero | Self::Int | Self::Frac | Self::ExpDigits)
    }
}

/// Writes JSON the way Python's `json.dumps` does (`", "` and `": "`), which is what chat
/// templates' `tojson` produces; with `escape_lt`, `<` inside strings is written `\u003c` so the
/// text can never contain a closing tag.
pub(crate) fn write(value: &Value, escape_lt: bool) -> String {
    use serde::Serialize;
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, PyStyle { escape_lt });
    match value.serialize(&mut ser) {
        // Serializing a `Value` into memory cannot fail, and the output is UTF-8.
        Ok(()) => String::from_utf8(buf).unwrap_or_else(|_| value.to_string()),
        Err(_) => value.to_string(),
    }
}

#[derive(Debug)]
struct PyStyle {
    escape_lt: bool,
}

impl serde_json::ser::Formatter for PyStyle {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        // Members are separated as array items are.
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.escape_lt {
            return writer.write_all(fragment.as_bytes());
        }
        for (i, part) in fragment.split('<').enumerate() {
            if i > 0 {
                writer.write_all(b"\\u003c")?;
            }
            writer.write_all(part.as_bytes())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` whole; returns the decision and the bytes that belong to the value.
    fn scan(text: &str) -> (Scan, usize) {
        let (len, scan) = JsonScanner::default().feed_str(text);
        (scan, len)
    }

    #[test]
    fn complete_values_end_where_they_end() {
        let doc = r#"{"a": [1, -2.5e3, true, null, {"b": "x\"y\u00e9"}]}"#;
        assert_eq!(scan(&format!("{doc} tail")), (Scan::Done, doc.len()));
        assert_eq!(scan(r#""s""#), (Scan::Done, 3));
        assert_eq!(scan("12,"), (Scan::DoneBefore, 2));
        assert_eq!(scan("[]"), (Scan::Done, 2));
        assert_eq!(scan("{}"), (Scan::Done, 2));
    }

    #[test]
    fn prefixes_ask_for_more() {
        for text in [
            r#"{"a": "#,
            r#"{"a": "b\"#,
            r#"{"a": tr"#,
            "[1, 2",
            "{\"a\": 1.5e",
            "-",
        ] {
            assert_eq!(scan(text).0, Scan::More, "{text}");
        }
    }

    #[test]
    fn invalid_json_is_caught_at_the_first_bad_char() {
        assert_eq!(scan(r#"{"a": 1,}"#), (Scan::Invalid, 8));
        assert_eq!(scan(r#"{'a': 1}"#), (Scan::Invalid, 1));
        assert_eq!(scan("{\"a\": \"line\nbreak\"}"), (Scan::Invalid, 11));
        assert_eq!(scan(r#"{"a" 1}"#), (Scan::Invalid, 5));
        assert_eq!(scan("[01]"), (Scan::Invalid, 2));
        assert_eq!(scan(r#"{"a": tru }"#), (Scan::Invalid, 9));
        assert_eq!(scan("[1}"), (Scan::Invalid, 2));
        assert_eq!(scan(r#""\x""#), (Scan::Invalid, 2));
    }

    #[test]
    fn the_scanner_agrees_with_serde_on_complete_documents() {
        let cases = [
            r#"{"a":{"b":[{"c":null}]},"d":"\ud83d\ude00"}"#,
            r#"{"a":1e5,"b":-0.0,"c":[],"d":{}}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":"\u12"}"#,
            r#"[true,false,nul]"#,
        ];
        for case in cases {
            let ours = scan(case) == (Scan::Done, case.len());
            let serde = serde_json::from_str::<Value>(case).is_ok();
            assert_eq!(ours, serde, "{case}");
        }
    }

    #[test]
    fn writes_like_python_and_can_hide_angle_brackets() {
        let value = serde_json::json!({"a": [1, "x<y"], "b": {"c": null}});
        assert_eq!(
            write(&value, false),
            r#"{"a": [1, "x<y"], "b": {"c": null}}"#
        );
        assert_eq!(
            write(&value, true),
            r#"{"a": [1, "x\u003cy"], "b": {"c": null}}"#
        );
    }
}
