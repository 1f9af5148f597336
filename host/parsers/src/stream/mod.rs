//! The machinery every parser runs on. A parser is a [`Machine`]: a state machine that consumes
//! as much of the buffered input as it can decide on through a [`Cursor`] and reports what it
//! found to an [`Emitter`]. The [`Driver`] keeps what the machine could not decide on yet (a
//! partial tag, an unfinished header) and feeds it again with the next chunk, so the events are
//! the same however the text is split.

mod emitter;
pub(crate) mod tags;

pub(crate) use emitter::{Emitter, merge_into};

use crate::ParsedEvent;
use tags::{Found, is_partial, search};

/// A parser's state machine.
pub(crate) trait Machine: Send + std::fmt::Debug {
    /// Consumes what can be decided from `cur`, or calls [`Cursor::wait`] when nothing can be
    /// decided before more input arrives. The driver calls it again while input is left.
    fn step(&mut self, cur: &mut Cursor<'_>);

    /// The input ended and every step has run: settle whatever is still open.
    fn finish(&mut self, out: &mut Emitter);
}

/// Input of one [`Machine::step`]: the unconsumed text and the emitter.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    input: &'a str,
    pos: usize,
    at_end: bool,
    /// Whether the last step asked for more input.
    waiting: bool,
    pub(crate) out: &'a mut Emitter,
}

/// What [`Cursor::expect`] saw after skipping whitespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// `tags[i]` is there (consumed by `expect`, not by `lookahead`).
    Tag(usize),
    /// Not enough input to tell.
    More,
    /// Something else is there (left unconsumed).
    Mismatch,
}

// === impl Cursor ===

impl<'a> Cursor<'a> {
    fn new(input: &'a str, at_end: bool, out: &'a mut Emitter) -> Self {
        Self {
            input,
            pos: 0,
            at_end,
            waiting: false,
            out,
        }
    }

    /// The unconsumed input.
    pub(crate) fn rest(&self) -> &'a str {
        &self.input[self.pos..]
    }

    /// Whether no more input will come after [`Cursor::rest`].
    pub(crate) fn at_end(&self) -> bool {
        self.at_end
    }

    /// Tells the driver that the machine cannot go on before more input arrives.
    pub(crate) fn wait(&mut self) {
        self.waiting = true;
    }

    /// Consumes `len` bytes (rounded up to a char boundary) and returns them; open markup
    /// records them.
    pub(crate) fn consume(&mut self, len: usize) -> &'a str {
        let mut end = (self.pos + len).min(self.input.len());
        while !self.input.is_char_boundary(end) {
            end += 1;
        }
        let taken = &self.input[self.pos..end];
        self.pos = end;
        self.out.record(taken);
        taken
    }

    /// Consumes everything left.
    pub(crate) fn consume_all(&mut self) -> &'a str {
        self.consume(self.input.len() - self.pos)
    }

    /// Consumes text up to the earliest of `tags`, or all of it that cannot be the start of one,
    /// and returns it with the index of the tag found (left unconsumed). Asks for more input when
    /// no tag was found.
    pub(crate) fn until(&mut self, tags: &[&str]) -> (&'a str, Option<usize>) {
        match search(self.rest(), tags, self.at_end) {
            Found::Tag { at, tag } => (self.consume(at), Some(tag)),
            Found::Nothing { safe } => {
                self.wait();
                (self.consume(safe), None)
            }
        }
    }

    /// Emits text up to the earliest of `tags`; if one is found, opens markup and consumes it,
    /// returning its index (the usual way out of a parser's text state).
    pub(crate) fn text_until_markup(&mut self, tags: &[&str]) -> Option<usize> {
        let (text, found) = self.until(tags);
        self.out.text(text);
        let tag = found?;
        self.out.open_markup();
        self.consume(tags[tag].len());
        Some(tag)
    }

    /// Consumes leading whitespace.
    pub(crate) fn skip_ws(&mut self) {
        let rest = self.rest();
        self.consume(rest.len() - rest.trim_start().len());
    }

    /// Skips whitespace, then consumes the longest of `tags` that follows.
    pub(crate) fn expect(&mut self, tags: &[&str]) -> Expect {
        let seen = self.lookahead(tags);
        if let Expect::Tag(i) = seen {
            self.consume(tags[i].len());
        }
        seen
    }

    /// Skips whitespace, then tells which of `tags` follows (the longest), consuming nothing more.
    pub(crate) fn lookahead(&mut self, tags: &[&str]) -> Expect {
        self.skip_ws();
        let rest = self.rest();
        let matched = (0..tags.len())
            .filter(|&i| !tags[i].is_empty() && rest.starts_with(tags[i]))
            .max_by_key(|&i| tags[i].len());
        if let Some(i) = matched {
            Expect::Tag(i)
        } else if rest.is_empty() || (!self.at_end && is_partial(rest, tags)) {
            self.wait();
            Expect::More
        } else {
            Expect::Mismatch
        }
    }

    /// Skips whitespace and returns the char after it (left unconsumed); asks for more input if
    /// there is none yet.
    pub(crate) fn peek_after_ws(&mut self) -> Option<char> {
        self.skip_ws();
        let next = self.rest().chars().next();
        if next.is_none() {
            self.wait();
        }
        next
    }
}

/// Runs a [`Machine`] over chunks of text.
#[derive(Debug)]
pub(crate) struct Driver<M> {
    pending: String,
    machine: M,
    out: Emitter,
}

/// Steps that consume nothing in a row before the driver stops a machine that fails to make
/// progress (a state change without consuming is normal; a long run of them is a bug).
const STALL_LIMIT: usize = 32;

// === impl Driver ===

impl<M: Machine> Driver<M> {
    pub(crate) fn new(machine: M, out: Emitter) -> Self {
        Self {
            pending: String::new(),
            machine,
            out,
        }
    }

    fn run(&mut self, at_end: bool) {
        let input = std::mem::take(&mut self.pending);
        let mut cur = Cursor::new(&input, at_end, &mut self.out);
        let mut stalled = 0;
        while !cur.rest().is_empty() {
            let before = cur.pos;
            cur.waiting = false;
            self.machine.step(&mut cur);
            if cur.waiting {
                break;
            }
            stalled = if cur.pos == before { stalled + 1 } else { 0 };
            if stalled > STALL_LIMIT {
                break;
            }
        }
        let used = cur.pos;
        self.pending = input[used..].to_owned();
    }

    /// Parses the next chunk and returns what it decided.
    pub(crate) fn feed(&mut self, text: &str) -> Vec<ParsedEvent> {
        self.pending.push_str(text);
        self.run(false);
        self.out.drain()
    }

    /// Parses what is still held back as the end of the output and settles open markup.
    pub(crate) fn end(&mut self) -> Vec<ParsedEvent> {
        self.run(true);
        self.machine.finish(&mut self.out);
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.out.fail_markup();
            self.out.text(&rest);
        }
        self.out.drain()
    }
}
