//! Where parsers put their events: merges neighbours, numbers calls, and keeps the raw text of
//! open tool-call markup so a call that turns out malformed can be returned as text.

use crate::ParsedEvent;
use crate::call::{CallEmission, CallIds};

/// Collects the events of one parser.
#[derive(Debug)]
pub(crate) struct Emitter {
    ready: Vec<ParsedEvent>,
    ids: CallIds,
    emission: CallEmission,
    next_index: usize,
    markup: Option<Markup>,
}

/// Tool-call markup being parsed: its raw text since the last commit and, in
/// [`CallEmission::Complete`] mode, the events held until then.
#[derive(Debug)]
struct Markup {
    raw: String,
    held: Vec<ParsedEvent>,
    call: Option<usize>,
    /// `next_index` at the last commit, to give back the indexes of dropped calls.
    committed_index: usize,
    committed_calls: bool,
}

// === impl Emitter ===

impl Emitter {
    pub(crate) fn new(ids: CallIds, emission: CallEmission) -> Self {
        Self {
            ready: Vec::new(),
            ids,
            emission,
            next_index: 0,
            markup: None,
        }
    }

    /// An emitter for reasoning parsers, which make no calls.
    pub(crate) fn plain() -> Self {
        Self::new(CallIds::default(), CallEmission::Streaming)
    }

    pub(crate) fn text(&mut self, text: &str) {
        if !text.is_empty() {
            self.emit(ParsedEvent::Text(text.to_owned()));
        }
    }

    pub(crate) fn reasoning(&mut self, text: &str) {
        if !text.is_empty() {
            self.emit(ParsedEvent::Reasoning(text.to_owned()));
        }
    }

    fn emit(&mut self, event: ParsedEvent) {
        match &mut self.markup {
            Some(markup) if self.emission == CallEmission::Complete => {
                merge_into(&mut markup.held, event);
            }
            _ => merge_into(&mut self.ready, event),
        }
    }

    /// Tool-call markup starts: from here on the consumed text is kept until a commit.
    pub(crate) fn open_markup(&mut self) {
        if self.markup.is_none() {
            self.markup = Some(Markup {
                raw: String::new(),
                held: Vec::new(),
                call: None,
                committed_index: self.next_index,
                committed_calls: false,
            });
        }
    }

    /// Keeps consumed text while markup is open (the cursor calls this for everything it consumes).
    pub(crate) fn record(&mut self, text: &str) {
        if let Some(markup) = &mut self.markup {
            markup.raw.push_str(text);
        }
    }

    /// A call starts (opening markup if needed); `id` is the model's, else `{prefix}{index}`.
    pub(crate) fn start_call(&mut self, name: String, id: Option<String>) {
        self.open_markup();
        let index = self.next_index;
        self.next_index += 1;
        let id = id.unwrap_or_else(|| self.ids.id(index));
        if let Some(markup) = &mut self.markup {
            markup.call = Some(index);
        }
        self.emit(ParsedEvent::ToolCallStart { index, id, name });
    }

    /// More arguments of the current call (ignored outside a call).
    pub(crate) fn args(&mut self, delta: &str) {
        let call = self.markup.as_ref().and_then(|m| m.call);
        if let (Some(index), false) = (call, delta.is_empty()) {
            self.emit(ParsedEvent::ToolCallArguments {
                index,
                delta: delta.to_owned(),
            });
        }
    }

    /// Everything since the last commit is well formed: release it, forget its raw text.
    pub(crate) fn commit(&mut self) {
        let next_index = self.next_index;
        let Some(markup) = &mut self.markup else {
            return;
        };
        markup.raw.clear();
        markup.committed_calls |= markup.call.take().is_some();
        markup.committed_index = next_index;
        for event in std::mem::take(&mut markup.held) {
            merge_into(&mut self.ready, event);
        }
    }

    /// The markup ended well formed.
    pub(crate) fn close_markup(&mut self) {
        self.commit();
        self.markup = None;
    }

    /// The markup since the last commit is malformed (or must pass through untouched): its raw
    /// text becomes plain text. In `Complete` mode its calls are dropped and their indexes reused.
    pub(crate) fn fail_markup(&mut self) {
        let Some(markup) = self.markup.take() else {
            return;
        };
        if self.emission == CallEmission::Complete {
            self.next_index = markup.committed_index;
        }
        for event in markup.held {
            if !matches!(
                event,
                ParsedEvent::ToolCallStart { .. } | ParsedEvent::ToolCallArguments { .. }
            ) {
                merge_into(&mut self.ready, event);
            }
        }
        if !markup.raw.is_empty() {
            merge_into(&mut self.ready, ParsedEvent::Text(markup.raw));
        }
    }

    /// The input ended between calls: markup whose calls were all committed and that has only
    /// whitespace left (a missing closing tag) ends well; anything else is returned as text.
    pub(crate) fn settle_markup(&mut self) {
        match &self.markup {
            Some(m) if m.committed_calls && m.call.is_none() && m.raw.trim().is_empty() => {
                self.close_markup();
            }
            Some(_) => self.fail_markup(),
            None => {}
        }
    }

    pub(crate) fn drain(&mut self) -> Vec<ParsedEvent> {
        std::mem::take(&mut self.ready)
    }
}

/// Appends `event`, merging it into the last one when both are text, both reasoning, or both
/// arguments of the same call; empty pieces are dropped.
pub(crate) fn merge_into(events: &mut Vec<ParsedEvent>, event: ParsedEvent) {
    use ParsedEvent::{Reasoning, Text, ToolCallArguments};
    match (events.last_mut(), event) {
        (_, Text(s) | Reasoning(s)) if s.is_empty() => {}
        (_, ToolCallArguments { delta, .. }) if delta.is_empty() => {}
        (Some(Text(last)), Text(s)) | (Some(Reasoning(last)), Reasoning(s)) => last.push_str(&s),
        (
            Some(ToolCallArguments {
                index: a,
                delta: last,
            }),
            ToolCallArguments { index: b, delta },
        ) if *a == b => {
            last.push_str(&delta);
        }
        (_, event) => events.push(event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(index: usize) -> ParsedEvent {
        ParsedEvent::ToolCallStart {
            index,
            id: format!("c{index}"),
            name: "f".into(),
        }
    }

    #[test]
    fn neighbours_of_one_kind_merge() {
        let mut events = Vec::new();
        merge_into(&mut events, ParsedEvent::Text("a".into()));
        merge_into(&mut events, ParsedEvent::Text("b".into()));
        merge_into(&mut events, ParsedEvent::Reasoning("r".into()));
        merge_into(&mut events, ParsedEvent::Text(String::new()));
        assert_eq!(
            events,
            vec![
                ParsedEvent::Text("ab".into()),
                ParsedEvent::Reasoning("r".into())
            ]
        );
    }

    #[test]
    fn complete_mode_drops_a_failed_call_and_reuses_its_index() {
        let mut out = Emitter::new(CallIds::new("c"), CallEmission::Complete);
        out.open_markup();
        out.record("<x>");
        out.start_call("f".into(), None);
        out.args("{}");
        out.close_markup();
        out.open_markup();
        out.record("<x>{bad");
        out.start_call("g".into(), None);
        out.fail_markup();
        out.start_call("h".into(), None);
        out.close_markup();
        let events = out.drain();
        assert_eq!(events[0], start(0));
        assert_eq!(events[2], ParsedEvent::Text("<x>{bad".into()));
        assert_eq!(
            events[3],
            ParsedEvent::ToolCallStart {
                index: 1,
                id: "c1".into(),
                name: "h".into()
            }
        );
    }

    #[test]
    fn streaming_mode_releases_at_once_and_returns_raw_text_on_failure() {
        let mut out = Emitter::new(CallIds::new("c"), CallEmission::Streaming);
        out.open_markup();
        out.record("<x>{");
        out.start_call("f".into(), None);
        assert_eq!(out.drain(), vec![start(0)]);
        out.fail_markup();
        assert_eq!(out.drain(), vec![ParsedEvent::Text("<x>{".into())]);
    }
}
