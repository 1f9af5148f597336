//! A tap on an engine's server-sent-event stream: forwards events unchanged, reads usage, and
//! hides the usage chunk the gateway asked for when the client did not.

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

/// Splits a byte stream into SSE events and inspects each one.
#[derive(Debug, Default)]
pub struct SseTap {
    pending: BytesMut,
    hide_usage_chunk: bool,
    usage: Option<Usage>,
}

impl SseTap {
    /// A tap; `hide_usage_chunk` drops the usage-only chunk (the client did not ask for it).
    pub fn new(hide_usage_chunk: bool) -> Self {
        Self {
            hide_usage_chunk,
            ..Self::default()
        }
    }

    /// Usage seen so far.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Feed bytes from the engine; returns the complete events to forward.
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = event_end(&self.pending) {
            let event = self.pending.split_to(end);
            if self.inspect(&event) {
                out.extend_from_slice(&event);
            }
        }
        out.freeze()
    }

    /// The stream ended: whatever is left (an unterminated last event) is forwarded as is.
    pub fn finish(&mut self) -> Bytes {
        let rest = self.pending.split();
        if self.inspect(&rest) {
            rest.freeze()
        } else {
            Bytes::new()
        }
    }

    /// Records usage; returns whether to forward the event.
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

/// Length of the first complete event (including its blank-line terminator), if any.
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn hides_the_usage_chunk_the_client_did_not_ask_for() {
        let mut tap = SseTap::new(true);
        let out = run(&mut tap, 7);
        assert!(!out.contains("usage"));
        assert!(out.contains("[DONE]") && out.contains("\"hi\""));
        assert_eq!(tap.usage().map(|u| u.cached_tokens), Some(32));
    }
}
