//! `pythonic` (Llama 3.2 and 4, ToolACE, …): calls as a Python list of calls with keyword
//! arguments, `[get_weather(city="SF", days=3), other(x=[1, 2])]`; literals become JSON
//! (`True`/`False`/`None`, tuples as arrays).
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/pythonic_tool_parser.py` and SGLang
//! `python/sglang/srt/function_call/pythonic_detector.py`, which take the whole output as the
//! list; here a list may also follow text. A `[` is held back until it is clear whether a call
//! list starts there (`[name(`), and a list's calls are released when its `]` arrives (arguments
//! in one delta per call).

use serde_json::Value;

use super::{ToolMachine, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;
use crate::pylit::{
    PyCall, Unparsed, check_opening, is_identifier, parse_call_list, write_literal,
};
use crate::stream::{Cursor, Emitter, Machine};

/// The `pythonic` parser.
#[derive(Debug, Default)]
pub(crate) struct Pythonic {
    /// The `[` at the start of the unconsumed input, while it may open a call list.
    candidate: Option<Candidate>,
}

/// A held `[`. Parsing the held text again on every chunk would be quadratic in the list's
/// length, so after the opening `[name(` is confirmed the list is parsed again only when a
/// bracket scan sees it close, or when the held text has doubled since the last try. Whether a
/// list parses is decided by its text alone, so when it is tried changes nothing but latency.
#[derive(Debug, Default)]
struct Candidate {
    opening_ok: bool,
    scan: BracketScan,
    /// Held length at which to parse again.
    parse_at: usize,
}

/// Tracks Python string and bracket state over the held text.
#[derive(Debug, Default)]
struct BracketScan {
    scanned: usize,
    depth: usize,
    quote: Option<char>,
    escaped: bool,
}

impl BracketScan {
    /// Scans what is new in `text`; returns whether a bracket closed the outermost one.
    fn closes(&mut self, text: &str) -> bool {
        let mut closed = false;
        for c in text[self.scanned..].chars() {
            match (self.quote, c) {
                (Some(_), _) if self.escaped => self.escaped = false,
                (Some(_), '\\') => self.escaped = true,
                (Some(q), c) if c == q => self.quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => self.quote = Some(c),
                (None, '[' | '(' | '{') => self.depth += 1,
                (None, ']' | ')' | '}') => {
                    self.depth = self.depth.saturating_sub(1);
                    closed |= self.depth == 0;
                }
                (None, _) => {}
            }
        }
        self.scanned = text.len();
        closed
    }
}

impl Pythonic {
    /// Decides on the held `[` if its text allows; `None` while more is needed.
    fn decide(
        candidate: &mut Candidate,
        held: &str,
        at_end: bool,
    ) -> Option<Result<(usize, Vec<PyCall>), Unparsed>> {
        if !candidate.opening_ok {
            match check_opening(held) {
                Ok(()) => candidate.opening_ok = true,
                Err(Unparsed::Incomplete) if !at_end => return None,
                Err(_) => return Some(Err(Unparsed::Invalid)),
            }
        }
        let closed = candidate.scan.closes(held);
        if !(closed || at_end || held.len() >= candidate.parse_at) {
            return None;
        }
        candidate.parse_at = held.len().saturating_mul(2);
        match parse_call_list(held) {
            Err(Unparsed::Incomplete) if !at_end => None,
            other => Some(other),
        }
    }
}

impl Machine for Pythonic {
    fn step(&mut self, cur: &mut Cursor<'_>) {
        let Some(candidate) = &mut self.candidate else {
            let (text, found) = cur.until(&["["]);
            cur.out.text(text);
            if found.is_some() {
                self.candidate = Some(Candidate::default());
            }
            return;
        };
        match Self::decide(candidate, cur.rest(), cur.at_end()) {
            None => cur.wait(),
            Some(Ok((len, calls))) => {
                self.candidate = None;
                cur.out.open_markup();
                cur.consume(len);
                for (name, args) in calls {
                    cur.out.start_call(name, None);
                    cur.out
                        .args(&crate::json::write(&Value::Object(args), false));
                    cur.out.commit();
                }
                cur.out.close_markup();
            }
            // Not a call list: the `[` is text, and scanning goes on after it.
            Some(Err(_)) => {
                self.candidate = None;
                let bracket = cur.consume(1);
                cur.out.text(bracket);
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        out.settle_markup();
    }
}

impl ToolMachine for Pythonic {}

/// Writes calls as a Python list.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let mut out = String::from("[");
    for (index, (name, args)) in checked_calls("pythonic", calls)?.into_iter().enumerate() {
        let fail = |reason: String| Unrepresentable {
            parser: "pythonic",
            index,
            name: name.to_owned(),
            reason,
        };
        if !is_identifier(name) {
            return Err(fail("the tool name is not a Python identifier".to_owned()));
        }
        if index > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
        out.push('(');
        for (i, (key, value)) in args.iter().enumerate() {
            if !is_identifier(key) {
                return Err(fail(format!(
                    "argument name {key:?} is not a Python identifier"
                )));
            }
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(key);
            out.push('=');
            write_literal(value, &mut out);
        }
        out.push(')');
    }
    out.push(']');
    Ok(out)
}
