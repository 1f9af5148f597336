//! Python call lists as the `pythonic` format writes them, `[f(a=1, b="x"), g()]`: parsing (with
//! literals converted to JSON: `True`/`False`/`None`, tuples as arrays) and writing.

use serde_json::{Map, Number, Value};

/// Why text is not (yet) a call list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unparsed {
    /// The text ends inside the list: more input may complete it.
    Incomplete,
    /// The text cannot start a call list.
    Invalid,
}

/// One parsed call: name and keyword arguments.
pub(crate) type PyCall = (String, Map<String, Value>);

/// Parses a call list at the start of `text`; returns its length and calls.
pub(crate) fn parse_call_list(text: &str) -> Result<(usize, Vec<PyCall>), Unparsed> {
    let mut p = Parser {
        text,
        pos: 0,
        depth: 0,
    };
    let calls = p.call_list()?;
    Ok((p.pos, calls))
}

/// Checks that `text` starts like a call list, `[name(` (the rest is not looked at).
pub(crate) fn check_opening(text: &str) -> Result<(), Unparsed> {
    let mut p = Parser {
        text,
        pos: 0,
        depth: 0,
    };
    p.eat('[')?;
    p.ws();
    p.ident()?;
    while p.peek()? == '.' {
        p.pos += 1;
        p.ident()?;
    }
    p.eat('(')
}

/// Nesting deeper than this is rejected.
const MAX_DEPTH: usize = 128;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Result<char, Unparsed> {
        self.text[self.pos..]
            .chars()
            .next()
            .ok_or(Unparsed::Incomplete)
    }

    fn bump(&mut self) -> Result<char, Unparsed> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Ok(c)
    }

    fn ws(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }

    fn eat(&mut self, want: char) -> Result<(), Unparsed> {
        if self.bump()? == want {
            Ok(())
        } else {
            Err(Unparsed::Invalid)
        }
    }

    /// `[` call (`,` call)* `,`? `]`
    fn call_list(&mut self) -> Result<Vec<PyCall>, Unparsed> {
        self.eat('[')?;
        let mut calls = Vec::new();
        loop {
            self.ws();
            calls.push(self.call()?);
            self.ws();
            match self.bump()? {
                ']' => return Ok(calls),
                ',' => {
                    self.ws();
                    if self.peek()? == ']' {
                        self.pos += 1;
                        return Ok(calls);
                    }
                }
                _ => return Err(Unparsed::Invalid),
            }
        }
    }

    /// name `(` (key `=` literal (`,` key `=` literal)* `,`?)? `)`
    fn call(&mut self) -> Result<PyCall, Unparsed> {
        let mut name = self.ident()?.to_owned();
        while self.peek()? == '.' {
            self.pos += 1;
            name.push('.');
            name.push_str(self.ident()?);
        }
        self.eat('(')?;
        let mut args = Map::new();
        loop {
            self.ws();
            if self.peek()? == ')' {
                self.pos += 1;
                return Ok((name, args));
            }
            let key = self.ident()?.to_owned();
            self.ws();
            self.eat('=')?;
            self.ws();
            let value = self.literal()?;
            args.insert(key, value);
            self.ws();
            match self.bump()? {
                ')' => return Ok((name, args)),
                ',' => {}
                _ => return Err(Unparsed::Invalid),
            }
        }
    }

    /// `[A-Za-z_][A-Za-z0-9_]*`, which must be followed by something else.
    fn ident(&mut self) -> Result<&str, Unparsed> {
        let start = self.pos;
        let first = self.peek()?;
        if !(first.is_ascii_alphabetic() || first == '_') {
            return Err(Unparsed::Invalid);
        }
        while self
            .peek()
            .is_ok_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            self.pos += 1;
        }
        self.peek()?;
        Ok(&self.text[start..self.pos])
    }

    fn literal(&mut self) -> Result<Value, Unparsed> {
        if self.depth >= MAX_DEPTH {
            return Err(Unparsed::Invalid);
        }
        self.depth += 1;
        let value = match self.peek()? {
            '"' | '\'' => self.string().map(Value::String),
            '[' => self.sequence(']').map(Value::Array),
            '(' => self.sequence(')').map(Value::Array),
            '{' => self.dict().map(Value::Object),
            '-' | '.' | '0'..='9' => self.number(),
            _ => match self.ident()? {
                "True" => Ok(Value::Bool(true)),
                "False" => Ok(Value::Bool(false)),
                "None" => Ok(Value::Null),
                _ => Err(Unparsed::Invalid),
            },
        };
        self.depth -= 1;
        value
    }

    /// Items up to `close`, trailing comma allowed (lists and tuples).
    fn sequence(&mut self, close: char) -> Result<Vec<Value>, Unparsed> {
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.ws();
            if self.peek()? == close {
                self.pos += 1;
                return Ok(items);
            }
            items.push(self.literal()?);
            self.ws();
            match self.bump()? {
                ',' => {}
                c if c == close => return Ok(items),
                _ => return Err(Unparsed::Invalid),
            }
        }
    }

    fn dict(&mut self) -> Result<Map<String, Value>, Unparsed> {
        self.pos += 1;
        let mut map = Map::new();
        loop {
            self.ws();
            if self.peek()? == '}' {
                self.pos += 1;
                return Ok(map);
            }
            // Non-string keys become strings, as `json.dumps` writes them.
            let key = match self.literal()? {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null => "null".to_owned(),
                _ => return Err(Unparsed::Invalid),
            };
            self.ws();
            self.eat(':')?;
            self.ws();
            map.insert(key, self.literal()?);
            self.ws();
            match self.bump()? {
                ',' => {}
                '}' => return Ok(map),
                _ => return Err(Unparsed::Invalid),
            }
        }
    }

    fn number(&mut self) -> Result<Value, Unparsed> {
        let start = self.pos;
        while self.peek()?.is_ascii_digit() || matches!(self.peek()?, '-' | '+' | '.' | 'e' | 'E') {
            self.pos += 1;
        }
        let raw = &self.text[start..self.pos];
        // Python allows `1.` and `.5`; JSON wants a digit on both sides of the point.
        let mut json = raw.replace("-.", "-0.");
        if json.starts_with('.') {
            json.insert(0, '0');
        }
        if json.ends_with('.') {
            json.push('0');
        }
        match serde_json::from_str::<Number>(&json) {
            Ok(n) => Ok(Value::Number(n)),
            Err(_) => Err(Unparsed::Invalid),
        }
    }

    fn string(&mut self) -> Result<String, Unparsed> {
        let quote = self.bump()?;
        let mut out = String::new();
        loop {
            match self.bump()? {
                c if c == quote => return Ok(out),
                '\n' => return Err(Unparsed::Invalid),
                '\\' => self.escape(&mut out)?,
                c => out.push(c),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Result<(), Unparsed> {
        let c = self.bump()?;
        let simple = match c {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'v' => Some('\u{b}'),
            'a' => Some('\u{7}'),
            '0' => Some('\0'),
            '\\' | '\'' | '"' => Some(c),
            _ => None,
        };
        if let Some(ch) = simple {
            out.push(ch);
            return Ok(());
        }
        let digits = match c {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            '\n' => return Ok(()),
            _ => {
                // Python keeps unknown escapes as written.
                out.push('\\');
                out.push(c);
                return Ok(());
            }
        };
        let mut code = 0u32;
        for _ in 0..digits {
            let digit = self.bump()?.to_digit(16).ok_or(Unparsed::Invalid)?;
            code = code * 16 + digit;
        }
        if c == 'u' && (0xD800..0xDC00).contains(&code) {
            return self.low_surrogate(code, out);
        }
        out.push(char::from_u32(code).ok_or(Unparsed::Invalid)?);
        Ok(())
    }

    /// A `\uD8xx` high surrogate must be followed by a `\uDCxx` low one (as JSON writes
    /// characters outside the BMP).
    fn low_surrogate(&mut self, high: u32, out: &mut String) -> Result<(), Unparsed> {
        self.eat('\\')?;
        self.eat('u')?;
        let mut low = 0u32;
        for _ in 0..4 {
            low = low * 16 + self.bump()?.to_digit(16).ok_or(Unparsed::Invalid)?;
        }
        if !(0xDC00..0xE000).contains(&low) {
            return Err(Unparsed::Invalid);
        }
        let code = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
        out.push(char::from_u32(code).ok_or(Unparsed::Invalid)?);
        Ok(())
    }
}

/// Writes `value` as a Python literal (strings in JSON's double-quoted form, which Python reads
/// the same).
pub(crate) fn write_literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(_) => out.push_str(&value.to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_literal(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_literal(item, out);
            }
            out.push('}');
        }
    }
}

/// Whether `name` can be a Python keyword-argument name.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_calls_with_python_literals() {
        let text = r#"[get_weather(city="SF", days=3), other(x=[1, 2.5], y={'k': (True, None)}, z='it\'s'),]"#;
        let (len, calls) = parse_call_list(text).unwrap();
        assert_eq!(len, text.len());
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(
            Value::Object(calls[0].1.clone()),
            json!({"city": "SF", "days": 3})
        );
        assert_eq!(
            Value::Object(calls[1].1.clone()),
            json!({"x": [1, 2.5], "y": {"k": [true, null]}, "z": "it's"})
        );
    }

    #[test]
    fn tells_incomplete_from_invalid() {
        for text in [
            "[", "[get", "[f(", "[f(a=", "[f(a=\"x", "[f(a=1", "[f(a=Tr", "[f()",
        ] {
            assert_eq!(
                parse_call_list(text).err(),
                Some(Unparsed::Incomplete),
                "{text}"
            );
        }
        for text in [
            "[1, 2]",
            "[note](x)",
            "[f(1)]",
            "[f(a=b)]",
            "[f(a=\"x\ny\")]",
            "[f(a=1 b=2)]",
        ] {
            assert_eq!(
                parse_call_list(text).err(),
                Some(Unparsed::Invalid),
                "{text}"
            );
        }
    }

    #[test]
    fn openings_are_checked_without_the_rest() {
        assert_eq!(check_opening("[ get_weather(city="), Ok(()));
        assert_eq!(check_opening("[a.b("), Ok(()));
        assert_eq!(check_opening("[get"), Err(Unparsed::Incomplete));
        assert_eq!(check_opening("[see also]"), Err(Unparsed::Invalid));
        assert_eq!(check_opening("[1]"), Err(Unparsed::Invalid));
    }

    #[test]
    fn written_literals_read_back() {
        let value =
            json!({"s": "q\"uo'te\\ é 😀\n", "n": [-1, 2.5, 1e100], "o": {"a b": null, "t": true}});
        let mut text = String::from("[f(v=");
        write_literal(&value, &mut text);
        text.push_str(")]");
        let (_, calls) = parse_call_list(&text).unwrap();
        assert_eq!(calls[0].1["v"], value);
    }
}
