//! Arguments given as a bare JSON object, streamed as the model writes them, and the header that
//! precedes them in several formats (`NAME<sep>`, `functions.NAME:0<begin>`, `NAME[ARGS]`).

use crate::json::{JsonScanner, Scan};
use crate::stream::Cursor;

/// Where a sub-parser stands after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// All input consumed; more is needed.
    Pending,
    /// The part it parses is complete (what follows is left unconsumed).
    Complete,
    /// The input is not of the expected form (the offending char is left unconsumed).
    Invalid,
}

/// A JSON object of arguments, streamed to the current call as argument deltas.
#[derive(Debug, Default)]
pub(crate) struct ArgsStream {
    scanner: Option<JsonScanner>,
}

impl ArgsStream {
    pub(crate) fn step(&mut self, cur: &mut Cursor<'_>) -> Progress {
        let scanner = match &mut self.scanner {
            Some(scanner) => scanner,
            None => match cur.peek_after_ws() {
                None => return Progress::Pending,
                Some('{') => self.scanner.insert(JsonScanner::default()),
                Some(_) => return Progress::Invalid,
            },
        };
        let (len, scan) = scanner.feed_str(cur.rest());
        let piece = cur.consume(len);
        cur.out.args(piece);
        match scan {
            Scan::More => {
                cur.wait();
                Progress::Pending
            }
            Scan::Done | Scan::DoneBefore => Progress::Complete,
            Scan::Invalid => Progress::Invalid,
        }
    }
}

/// What a call header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallHead {
    pub(crate) name: String,
    pub(crate) id: Option<String>,
}

/// How to find and read the header before a call's JSON arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadSyntax {
    /// The header ends at the first of these; each is consumed, except `{`, which opens the
    /// arguments.
    pub(crate) ends: &'static [&'static str],
    /// Reads the header text (`None`: malformed).
    pub(crate) parse: fn(&str) -> Option<CallHead>,
}

/// A header, then JSON arguments: starts the call once the header is read.
#[derive(Debug)]
pub(crate) enum HeadedArgs {
    Head(String),
    Args(ArgsStream),
}

impl HeadedArgs {
    pub(crate) fn new() -> Self {
        Self::Head(String::new())
    }

    pub(crate) fn step(&mut self, syntax: &HeadSyntax, cur: &mut Cursor<'_>) -> Progress {
        if let Self::Head(head) = self {
            let (piece, found) = cur.until(syntax.ends);
            head.push_str(piece);
            let Some(end) = found.map(|i| syntax.ends[i]) else {
                return Progress::Pending;
            };
            if end != "{" {
                cur.consume(end.len());
            }
            let Some(CallHead { name, id }) = (syntax.parse)(head) else {
                return Progress::Invalid;
            };
            cur.out.start_call(name, id);
            *self = Self::Args(ArgsStream::default());
        }
        match self {
            Self::Args(args) => args.step(cur),
            Self::Head(_) => Progress::Pending,
        }
    }
}

/// A tool name as the formats allow it: non-empty and without whitespace or markup characters.
pub(crate) fn plain_name(name: &str) -> Option<String> {
    let name = name.trim();
    let ok = !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '<' | '>' | '{' | '}' | '[' | ']' | '"'));
    ok.then(|| name.to_owned())
}
