//! A tap on an engine's server-sent-event stream: forwards events unchanged, reads usage and how
//! the generation ended, and hides the usage chunk the gateway asked for when the client did not.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// Token usage an engine reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
}

impl Usage {
    /// Read OpenAI's `usage` object (`prompt_tokens_details.cached_tokens` for the cache).
    pub fn from_json(usage: &Value) -> Option<Usage> {
        let usage = usage.as_object()?;
        let field = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        Some(Usage {
            prompt_tokens: field(usage.get("prompt_tokens")),
            cached_tokens: field(
                usage
                    .get("prompt_tokens_details")
                    .and_then(|d| d.get("cached_tokens")),
            ),
            completion_tokens: field(usage.get("completion_tokens")),
        })
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The call id the client answers with.
    pub id: String,
    /// The tool's name.
    pub name: String,
}

/// How the first choice of a generation ended, read from the engine's chunks or body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finish {
    /// `stop`, `length`, `tool_calls`, ... (`None`: the engine never said).
    pub finish_reason: Option<String>,
    /// Tool calls, in the order the model made them.
    pub tool_calls: Vec<ToolCall>,
    /// The generated text, when capturing was asked for.
    pub text: String,
}

impl Finish {
    /// Read a non-streamed chat or completion response.
    pub fn from_response(body: &Value, capture_text: bool) -> Finish {
        let mut finish = Finish::default();
        let Some(choice) = first_choice(body) else {
            return finish;
        };
        finish.read_reason(choice);
        let message = choice.get("message");
        if capture_text {
            let text = message
                .and_then(|m| m.get("content"))
                .or(choice.get("text"));
            finish.text = text.and_then(Value::as_str).unwrap_or_default().into();
        }
        let calls = message.and_then(|m| m.get("tool_calls"));
        for call in calls.and_then(Value::as_array).into_iter().flatten() {
            finish.tool_calls.push(ToolCall {
                id: str_at(call, "/id").into(),
                name: str_at(call, "/function/name").into(),
            });
        }
        finish
    }

    /// Fold in one streamed chunk: tool calls arrive as deltas keyed by `index`, id and name in
    /// the first delta of each.
    fn read_chunk(&mut self, choice: &Value, capture_text: bool, call_slots: &mut Vec<u64>) {
        self.read_reason(choice);
        let delta = choice.get("delta");
        if capture_text {
            let text = delta.and_then(|d| d.get("content")).or(choice.get("text"));
            self.text += text.and_then(Value::as_str).unwrap_or_default();
        }
        let calls = delta.and_then(|d| d.get("tool_calls"));
        for call in calls.and_then(Value::as_array).into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let slot = match call_slots.iter().position(|&i| i == index) {
                Some(slot) => slot,
                None => {
                    call_slots.push(index);
                    self.tool_calls.push(ToolCall::default());
                    self.tool_calls.len() - 1
                }
            };
            let entry = &mut self.tool_calls[slot];
            for (field, pointer) in [(&mut entry.id, "/id"), (&mut entry.name, "/function/name")] {
                if field.is_empty() {
                    *field = str_at(call, pointer).into();
                }
            }
        }
    }

    fn read_reason(&mut self, choice: &Value) {
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.into());
        }
    }
}

/// The choice with index 0 (other choices of `n > 1` are not traced).
fn first_choice(body: &Value) -> Option<&Value> {
    body.get("choices")?
        .as_array()?
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The largest SSE event an engine may send (a token delta is bytes; a whole tool call's
/// arguments, kilobytes): bounds what one stream can make the gateway hold.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

/// An engine sent an event larger than [`MAX_EVENT_BYTES`] (or one that never ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the engine sent a server-sent event over {MAX_EVENT_BYTES} bytes")]
pub struct EventTooLarge;

/// Cuts a byte stream at event boundaries (a blank line), scanning each byte once.
#[derive(Debug, Default)]
struct Events {
    pending: BytesMut,
    /// How far `pending` is known to hold no boundary.
    scanned: usize,
}

impl Events {
    fn push(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// The next complete event, with its terminator.
    fn next(&mut self) -> Result<Option<BytesMut>, EventTooLarge> {
        // A boundary may straddle the previous chunk's end: look back up to 3 bytes.
        let from = self.scanned.saturating_sub(3);
        match event_end(&self.pending[from..]) {
            Some(end) => {
                self.scanned = 0;
                Ok(Some(self.pending.split_to(from + end)))
            }
            None if self.pending.len() > MAX_EVENT_BYTES => Err(EventTooLarge),
            None => {
                self.scanned = self.pending.len();
                Ok(None)
            }
        }
    }

    /// Whatever is left: an unterminated last event.
    fn rest(&mut self) -> BytesMut {
        self.scanned = 0;
        self.pending.split()
    }
}

/// Splits a byte stream into SSE events and inspects each one.
#[derive(Debug, Default)]
pub struct SseTap {
    events: Events,
    hide_usage_chunk: bool,
    usage: Option<Usage>,
    capture_text: bool,
    finish: Finish,
    /// Stream `index` of each entry of `finish.tool_calls`.
    call_slots: Vec<u64>,
    token_events: u64,
    /// The message of an error event, as engines send one after their `200` when a request
    /// fails mid-stream (llama.cpp: `data: {"error": {"message": ...}}`).
    error: Option<String>,
}

impl SseTap {
    /// A tap; `hide_usage_chunk` drops the usage-only chunk (the client did not ask for it).
    pub fn new(hide_usage_chunk: bool) -> Self {
        Self {
            hide_usage_chunk,
            ..Self::default()
        }
    }

    /// Also collect the generated text (for traces that include content).
    pub fn capturing_text(mut self) -> Self {
        self.capture_text = true;
        self
    }

    /// Usage seen so far.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// The first error event's message, if the engine sent one.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Events that carried a choice (generated tokens or the finish) so far.
    pub fn token_events(&self) -> u64 {
        self.token_events
    }

    /// How the generation ended, as far as the stream said; leaves the tap's copy empty.
    pub fn take_finish(&mut self) -> Finish {
        std::mem::take(&mut self.finish)
    }

    /// Feed bytes from the engine; returns the complete events to forward. An event too large
    /// to hold is forwarded uninspected as far as it has come.
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.events.push(chunk);
        let mut out = BytesMut::new();
        loop {
            match self.events.next() {
                Ok(Some(event)) => {
                    if self.inspect(&event) {
                        out.extend_from_slice(&event);
                    }
                }
                Ok(None) => break,
                Err(EventTooLarge) => out.extend_from_slice(&self.events.rest()),
            }
        }
        out.freeze()
    }

    /// The stream ended: whatever is left (an unterminated last event) is forwarded as is.
    pub fn finish(&mut self) -> Bytes {
        let rest = self.events.rest();
        if self.inspect(&rest) {
            rest.freeze()
        } else {
            Bytes::new()
        }
    }

    /// Records usage and the finish; returns whether to forward the event.
    fn inspect(&mut self, event: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(event) else {
            return true;
        };
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let Ok(json) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            // `{"error": {...}}` (llama.cpp, SGLang) or `{"object": "error", ...}` (older vLLM).
            let error = match json.get("error") {
                Some(error) if !error.is_null() => Some(error),
                _ => (json.get("object").and_then(Value::as_str) == Some("error")).then_some(&json),
            };
            if let Some(error) = error.filter(|_| self.error.is_none()) {
                let message = error.get("message").and_then(Value::as_str);
                self.error = Some(message.map_or_else(|| error.to_string(), str::to_owned));
            }
            if let Some(choice) = first_choice(&json) {
                self.token_events += 1;
                self.finish
                    .read_chunk(choice, self.capture_text, &mut self.call_slots);
            }
            if let Some(usage) = json.get("usage").and_then(Usage::from_json) {
                self.usage = Some(usage);
                let usage_only = json
                    .get("choices")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
                if usage_only && self.hide_usage_chunk {
                    return false;
                }
            }
        }
        true
    }
}

/// Splits an engine's byte stream into the `data` of its server-sent events.
#[derive(Debug, Default)]
pub struct SseReader {
    events: Events,
}

impl SseReader {
    /// Feed bytes; returns the `data` of every event they complete, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, EventTooLarge> {
        self.events.push(chunk);
        let mut out = Vec::new();
        while let Some(event) = self.events.next()? {
            out.extend(event_data(&event));
        }
        Ok(out)
    }

    /// The stream ended: the data of an unterminated last event, if any.
    pub fn finish(&mut self) -> Option<String> {
        event_data(&self.events.rest())
    }
}

/// The `data` of one event (its `data:` lines joined with newlines), if it has any.
fn event_data(event: &[u8]) -> Option<String> {
    // Valid UTF-8 (every engine's) is checked by the fast validator and borrowed.
    let text = match std::str::from_utf8(event) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(event),
    };
    let mut data: Option<String> = None;
    for line in text.lines() {
        let Some(line) = line.strip_prefix("data:") else {
            continue;
        };
        let line = line.strip_prefix(' ').unwrap_or(line);
        match &mut data {
            None => data = Some(line.to_owned()),
            Some(data) => {
                data.push('\n');
                data.push_str(line);
            }
        }
    }
    data
}

/// Length of the first complete event (including its blank-line terminator, `\n\n` or
/// `\r\n\r\n`), if any: one pass over the line feeds. At a line feed, a CRLF blank line ending
/// there ends before an LF one starting there, so the first match is the earliest end.
fn event_end(buf: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', buf).find_map(|i| {
        if i >= 3 && &buf[i - 3..=i] == b"\r\n\r\n" {
            Some(i + 1)
        } else if buf.get(i + 1) == Some(&b'\n') {
            Some(i + 2)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The one-pass search finds the same end as searching for each terminator separately
        /// and taking the earlier one, on line-ending soup.
        #[test]
        fn event_end_is_the_earliest_terminator(
            buf in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a')], 0..64)
        ) {
            let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
            let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
            let expected = match (lf, crlf) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            prop_assert_eq!(event_end(&buf), expected);
        }
    }

    const STREAM: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
        "data: [DONE]\n\n"
    );

    fn run(tap: &mut SseTap, split: usize) -> String {
        let bytes = STREAM.as_bytes();
        let mut out = Vec::new();
        for piece in bytes.chunks(split) {
            out.extend_from_slice(&tap.feed(piece));
        }
        out.extend_from_slice(&tap.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn reader_yields_each_events_data_at_any_split() {
        for split in 1..STREAM.len() {
            let mut reader = SseReader::default();
            let mut data = Vec::new();
            for piece in STREAM.as_bytes().chunks(split) {
                data.extend(reader.push(piece).unwrap());
            }
            data.extend(reader.finish());
            assert_eq!(data.len(), 3, "split {split}");
            assert_eq!(data[2], "[DONE]");
            assert!(data[0].starts_with("{\"choices\""));
        }
        let mut reader = SseReader::default();
        assert_eq!(
            reader
                .push(b": keep-alive\n\nevent: x\ndata: a\ndata: b\n\ndata: tail")
                .unwrap(),
            ["a\nb"]
        );
        assert_eq!(reader.finish().as_deref(), Some("tail"));
    }

    /// An engine that never ends its event cannot make the gateway hold more than the bound:
    /// the reader gives up, the tap passes the bytes on.
    #[test]
    fn an_event_that_never_ends_is_bounded() {
        let line = vec![b'x'; 64 << 10];
        let mut reader = SseReader::default();
        let mut tap = SseTap::new(false);
        let mut forwarded = 0;
        let mut failed = false;
        reader.push(b"data: ").unwrap();
        for _ in 0..(MAX_EVENT_BYTES / line.len() + 2) {
            failed |= reader.push(&line) == Err(EventTooLarge);
            forwarded += tap.feed(&line).len();
        }
        assert!(failed, "the reader held the whole event");
        assert!(
            forwarded >= MAX_EVENT_BYTES,
            "the tap held {forwarded} back"
        );
        // Ordinary events around a boundary split one byte at a time still come out.
        let mut reader = SseReader::default();
        let mut data = Vec::new();
        for byte in b"data: a\r\n\r\ndata: b\n\n" {
            data.extend(reader.push(&[*byte]).unwrap());
        }
        assert_eq!(data, ["a", "b"]);
    }

    #[test]
    fn forwards_verbatim_at_any_split() {
        for split in 1..STREAM.len() {
            let mut tap = SseTap::new(false);
            assert_eq!(run(&mut tap, split), STREAM, "split {split}");
            assert_eq!(
                tap.usage(),
                Some(Usage {
                    prompt_tokens: 40,
                    cached_tokens: 32,
                    completion_tokens: 2
                })
            );
        }
    }

    /// llama.cpp answers `200` and then reports a failed request as an event.
    #[test]
    fn keeps_the_message_of_an_error_event() {
        let mut tap = SseTap::new(false);
        let event =
            "data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\"}}\n\n";
        assert_eq!(tap.feed(event.as_bytes()), event.as_bytes());
        tap.feed(event.replace("Context", "Other").as_bytes());
        assert_eq!(tap.error(), Some("Context size has been exceeded."));
        assert_eq!(tap.token_events(), 0);
        let mut tap = SseTap::new(false);
        tap.feed(b"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}],\"error\":null}\n\n");
        assert_eq!(tap.error(), None, "a null error is none");
        tap.feed(b"data: {\"object\":\"error\",\"message\":\"bad\"}\n\n");
        assert_eq!(tap.error(), Some("bad"));
    }

    #[test]
    fn hides_the_usage_chunk_the_client_did_not_ask_for() {
        let mut tap = SseTap::new(true);
        let out = run(&mut tap, 7);
        assert!(!out.contains("usage"));
        assert!(out.contains("[DONE]") && out.contains("\"hi\""));
        assert_eq!(tap.usage().map(|u| u.cached_tokens), Some(32));
    }

    #[test]
    fn reads_finish_reason_text_and_streamed_tool_calls() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Let me look.\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"function\":{\"name\":\"grep\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let mut tap = SseTap::new(false).capturing_text();
        tap.feed(stream.as_bytes());
        assert_eq!(tap.token_events(), 5);
        let finish = tap.take_finish();
        assert_eq!(finish.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(finish.text, "Let me look.");
        let names: Vec<_> = finish
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(names, [("call_1", "read_file"), ("call_2", "grep")]);
    }

    #[test]
    fn reads_a_non_streamed_response() {
        let chat: Value = serde_json::from_str(
            r#"{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"content":"ok",
                "tool_calls":[{"id":"c9","type":"function","function":{"name":"bash","arguments":"{}"}}]}}]}"#,
        )
        .unwrap();
        let finish = Finish::from_response(&chat, false);
        assert_eq!(finish.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(finish.text, "");
        assert_eq!(finish.tool_calls[0].name, "bash");
        let completion: Value = serde_json::from_str(
            r#"{"choices":[{"index":0,"text":"abc","finish_reason":"length"}]}"#,
        )
        .unwrap();
        let finish = Finish::from_response(&completion, true);
        assert_eq!(
            (finish.finish_reason.as_deref(), finish.text.as_str()),
            (Some("length"), "abc")
        );
    }
}
