//! Calls written as JSON objects that carry the name and the arguments,
//! `{"name": "f", "arguments": {..}}` (hermes, llama3_json, mistral's older form), alone or in a
//! list. The arguments object is streamed as it arrives once the name is known.

use serde_json::{Map, Value};

use super::args::Progress;
use crate::json::{JsonScanner, Scan};
use crate::stream::{Cursor, Expect};

/// The keys of one envelope flavour.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EnvelopeKeys {
    /// The key of the tool name.
    pub(crate) name: &'static str,
    /// Keys that may hold the arguments (one of them at most may appear).
    pub(crate) args: &'static [&'static str],
}

/// One envelope object.
#[derive(Debug)]
pub(crate) struct Envelope {
    keys: EnvelopeKeys,
    at: Spot,
    name: Option<String>,
    args_seen: bool,
    /// Arguments that arrived before the name (the call cannot start without it).
    early_args: String,
}

#[derive(Debug)]
enum Spot {
    Open,
    Member { first: bool },
    Key(Capture),
    Colon(String),
    ValueStart(String),
    Value(Role, Capture),
    Next,
}

/// What a member's value is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Name,
    /// An arguments object, streamed.
    Args,
    /// Arguments given as a JSON string holding the object, or `null`.
    ArgsText,
    Ignored,
}

/// A JSON value being scanned, with its text.
#[derive(Debug, Default)]
struct Capture {
    scanner: JsonScanner,
    text: String,
}

// === impl Envelope ===

impl Envelope {
    pub(crate) fn new(keys: EnvelopeKeys) -> Self {
        Self {
            keys,
            at: Spot::Open,
            name: None,
            args_seen: false,
            early_args: String::new(),
        }
    }

    pub(crate) fn step(&mut self, cur: &mut Cursor<'_>) -> Progress {
        loop {
            let spot = std::mem::replace(&mut self.at, Spot::Next);
            match self.advance(spot, cur) {
                Ok(next) => self.at = next,
                Err((stay, progress)) => {
                    self.at = stay;
                    return progress;
                }
            }
        }
    }

    /// One move: the next spot, or where to stay and what to report.
    fn advance(&mut self, spot: Spot, cur: &mut Cursor<'_>) -> Result<Spot, (Spot, Progress)> {
        let pending = |spot| Err((spot, Progress::Pending));
        let invalid = |spot| Err((spot, Progress::Invalid));
        match spot {
            Spot::Open => match cur.expect(&["{"]) {
                Expect::Tag(_) => Ok(Spot::Member { first: true }),
                Expect::More => pending(Spot::Open),
                Expect::Mismatch => invalid(Spot::Open),
            },
            Spot::Member { first } => match cur.peek_after_ws() {
                None => pending(spot),
                Some('"') => Ok(Spot::Key(Capture::default())),
                Some('}') if first => {
                    cur.consume(1);
                    Err((Spot::Next, self.close(cur)))
                }
                Some(_) => invalid(spot),
            },
            Spot::Key(mut capture) => match capture.feed(cur) {
                Scan::More => pending(Spot::Key(capture)),
                Scan::Done => match serde_json::from_str::<String>(&capture.text) {
                    Ok(key) => Ok(Spot::Colon(key)),
                    Err(_) => invalid(Spot::Next),
                },
                Scan::DoneBefore | Scan::Invalid => invalid(Spot::Next),
            },
            Spot::Colon(key) => match cur.expect(&[":"]) {
                Expect::Tag(_) => Ok(Spot::ValueStart(key)),
                Expect::More => pending(Spot::Colon(key)),
                Expect::Mismatch => invalid(Spot::Colon(key)),
            },
            Spot::ValueStart(key) => {
                match cur.peek_after_ws().map(|first| self.role(&key, first)) {
                    None => pending(Spot::ValueStart(key)),
                    Some(Some(role)) => Ok(Spot::Value(role, Capture::default())),
                    Some(None) => invalid(Spot::ValueStart(key)),
                }
            }
            Spot::Value(role, mut capture) => {
                let before = capture.text.len();
                let scan = capture.feed(cur);
                if role == Role::Args {
                    self.emit_args(cur, &capture.text[before..]);
                }
                match scan {
                    Scan::More => pending(Spot::Value(role, capture)),
                    Scan::Invalid => invalid(Spot::Next),
                    Scan::Done | Scan::DoneBefore if self.value_done(cur, role, &capture.text) => {
                        Ok(Spot::Next)
                    }
                    Scan::Done | Scan::DoneBefore => invalid(Spot::Next),
                }
            }
            Spot::Next => match cur.expect(&[",", "}"]) {
                Expect::Tag(0) => Ok(Spot::Member { first: false }),
                Expect::Tag(_) => Err((Spot::Next, self.close(cur))),
                Expect::More => pending(Spot::Next),
                Expect::Mismatch => invalid(Spot::Next),
            },
        }
    }

    /// The role of a member's value from its key and first char (`None`: not allowed).
    fn role(&self, key: &str, first: char) -> Option<Role> {
        if key == self.keys.name {
            return (first == '"' && self.name.is_none()).then_some(Role::Name);
        }
        if self.keys.args.contains(&key) {
            return match (self.args_seen, first) {
                (true, _) => None,
                (false, '{') => Some(Role::Args),
                (false, '"' | 'n') => Some(Role::ArgsText),
                (false, _) => None,
            };
        }
        Some(Role::Ignored)
    }

    /// A member's value is complete; `false` if it is not what its key needs.
    fn value_done(&mut self, cur: &mut Cursor<'_>, role: Role, text: &str) -> bool {
        match role {
            Role::Name => {
                let Ok(name) = serde_json::from_str::<String>(text) else {
                    return false;
                };
                let Some(name) = super::args::plain_name(&name) else {
                    return false;
                };
                cur.out.start_call(name.clone(), None);
                self.name = Some(name);
                let early = std::mem::take(&mut self.early_args);
                cur.out.args(&early);
            }
            Role::Args => self.args_seen = true,
            Role::ArgsText => {
                let args = match serde_json::from_str::<Option<String>>(text) {
                    Ok(None) => "{}".to_owned(),
                    Ok(Some(inner))
                        if serde_json::from_str::<Map<String, Value>>(&inner).is_ok() =>
                    {
                        inner
                    }
                    _ => return false,
                };
                self.args_seen = true;
                self.emit_args(cur, &args);
            }
            Role::Ignored => {}
        }
        true
    }

    fn emit_args(&mut self, cur: &mut Cursor<'_>, piece: &str) {
        if self.name.is_some() {
            cur.out.args(piece);
        } else {
            self.early_args.push_str(piece);
        }
    }

    /// The object closed: it must have named the tool; no arguments means `{}`.
    fn close(&mut self, cur: &mut Cursor<'_>) -> Progress {
        if self.name.is_none() {
            return Progress::Invalid;
        }
        if !self.args_seen {
            self.args_seen = true;
            cur.out.args("{}");
        }
        Progress::Complete
    }
}

// === impl Capture ===

impl Capture {
    fn feed(&mut self, cur: &mut Cursor<'_>) -> Scan {
        let (len, scan) = self.scanner.feed_str(cur.rest());
        self.text.push_str(cur.consume(len));
        if scan == Scan::More {
            cur.wait();
        }
        scan
    }
}

/// How envelopes are listed: `[a, b]` (mistral) or `a; b` (llama3_json).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListSyntax {
    pub(crate) open: Option<&'static str>,
    pub(crate) separator: &'static str,
    pub(crate) close: Option<&'static str>,
}

/// A list of envelopes; each call is committed as soon as its envelope closes.
#[derive(Debug)]
pub(crate) struct EnvelopeList {
    syntax: ListSyntax,
    keys: EnvelopeKeys,
    at: ListSpot,
}

#[derive(Debug)]
enum ListSpot {
    Open,
    Item(Envelope),
    AfterItem,
}

// === impl EnvelopeList ===

impl EnvelopeList {
    pub(crate) fn new(syntax: ListSyntax, keys: EnvelopeKeys) -> Self {
        let at = if syntax.open.is_some() {
            ListSpot::Open
        } else {
            ListSpot::Item(Envelope::new(keys))
        };
        Self { syntax, keys, at }
    }

    pub(crate) fn step(&mut self, cur: &mut Cursor<'_>) -> Progress {
        loop {
            let next = match &mut self.at {
                ListSpot::Open => match cur.expect(&[self.syntax.open.unwrap_or_default()]) {
                    Expect::Tag(_) => ListSpot::Item(Envelope::new(self.keys)),
                    Expect::More => return Progress::Pending,
                    Expect::Mismatch => return Progress::Invalid,
                },
                ListSpot::Item(envelope) => match envelope.step(cur) {
                    Progress::Complete => {
                        cur.out.commit();
                        ListSpot::AfterItem
                    }
                    other => return other,
                },
                ListSpot::AfterItem => match self.syntax.close {
                    Some(close) => match cur.expect(&[self.syntax.separator, close]) {
                        Expect::Tag(0) => ListSpot::Item(Envelope::new(self.keys)),
                        Expect::Tag(_) => return Progress::Complete,
                        Expect::More => return Progress::Pending,
                        Expect::Mismatch => return Progress::Invalid,
                    },
                    // Without a closing bracket the list ends at whatever is not a separator.
                    None => match cur.expect(&[self.syntax.separator]) {
                        Expect::Tag(_) => ListSpot::Item(Envelope::new(self.keys)),
                        Expect::More => return Progress::Pending,
                        Expect::Mismatch => return Progress::Complete,
                    },
                },
            };
            self.at = next;
        }
    }
}
