//! Stored responses for the Responses API's `previous_response_id`.
//!
//! A bounded in-memory map from response id to the conversation up to and including that
//! response (as IR messages), evicting the least recently used entries beyond a count and a byte
//! budget. Pure and synchronous: the gateway owns one behind a mutex.

use std::collections::{BTreeMap, HashMap};

use crate::error::ApiError;
use crate::ir::{Block, Message};

/// Fixed cost counted per message and per block on top of their text, for the bookkeeping the
/// text lengths do not show.
const OVERHEAD_BYTES: u64 = 64;

/// Response id -> conversation, bounded by entry count and approximate bytes (LRU).
#[derive(Debug)]
pub struct ResponseStore {
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    /// Recency stamps, oldest first.
    recency: BTreeMap<u64, String>,
    entries: HashMap<String, Entry>,
    next_stamp: u64,
}

#[derive(Debug)]
struct Entry {
    messages: Vec<Message>,
    bytes: u64,
    stamp: u64,
}

// === impl ResponseStore ===

impl ResponseStore {
    /// A store of at most `max_entries` responses and about `max_bytes` of conversation.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        Self {
            max_entries,
            max_bytes,
            bytes: 0,
            recency: BTreeMap::new(),
            entries: HashMap::new(),
            next_stamp: 0,
        }
    }

    /// Stores the conversation of `response_id`, evicting the least recently used entries to make
    /// room. Returns `false` (and stores nothing) when it alone exceeds the byte budget.
    pub fn insert(&mut self, response_id: String, messages: Vec<Message>) -> bool {
        self.remove(&response_id);
        let bytes = conversation_bytes(&messages) + response_id.len() as u64;
        if bytes > self.max_bytes || self.max_entries == 0 {
            return false;
        }
        while self.entries.len() >= self.max_entries || self.bytes + bytes > self.max_bytes {
            let Some((_, oldest)) = self.recency.pop_first() else {
                break;
            };
            if let Some(entry) = self.entries.remove(&oldest) {
                self.bytes -= entry.bytes;
            }
        }
        let stamp = self.stamp();
        self.recency.insert(stamp, response_id.clone());
        self.bytes += bytes;
        self.entries.insert(
            response_id,
            Entry {
                messages,
                bytes,
                stamp,
            },
        );
        true
    }

    /// The conversation stored under `response_id` (marking it recently used), or a 400
    /// `previous_response_not_found` as OpenAI answers.
    pub fn get(&mut self, response_id: &str) -> Result<Vec<Message>, ApiError> {
        let stamp = self.stamp();
        let Some(entry) = self.entries.get_mut(response_id) else {
            return Err(ApiError::invalid(
                "previous_response_id",
                format_args!("previous response with id '{response_id}' not found"),
            )
            .with_code("previous_response_not_found"));
        };
        self.recency.remove(&entry.stamp);
        self.recency.insert(stamp, response_id.to_owned());
        entry.stamp = stamp;
        Ok(entry.messages.clone())
    }

    /// Forgets `response_id`; `true` if it was stored.
    pub fn remove(&mut self, response_id: &str) -> bool {
        let Some(entry) = self.entries.remove(response_id) else {
            return false;
        };
        self.recency.remove(&entry.stamp);
        self.bytes -= entry.bytes;
        true
    }

    /// Number of stored responses.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Approximate bytes held (text plus a fixed overhead per message and block).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

fn conversation_bytes(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| OVERHEAD_BYTES + blocks_bytes(&m.blocks))
        .sum()
}

fn blocks_bytes(blocks: &[Block]) -> u64 {
    blocks
        .iter()
        .map(|b| {
            let text = match b {
                Block::Text { text } => text.len(),
                Block::Thinking { text, signature } => {
                    text.len() + signature.as_ref().map_or(0, String::len)
                }
                Block::RedactedThinking { data } => data.len(),
                Block::ToolCall {
                    id,
                    name,
                    arguments,
                } => id.len() + name.len() + arguments.len(),
                Block::ToolResult {
                    call_id, content, ..
                } => call_id.len() + blocks_bytes(content) as usize,
                Block::Image { url } => url.len(),
            };
            OVERHEAD_BYTES + text as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Role;

    fn conversation(text: &str) -> Vec<Message> {
        vec![Message::text(Role::User, text)]
    }

    #[test]
    fn unknown_id_is_previous_response_not_found() {
        let mut store = ResponseStore::new(4, 1 << 20);
        let err = store.get("resp_nope").unwrap_err();
        assert_eq!(err.status, 400);
        assert_eq!(err.code.as_deref(), Some("previous_response_not_found"));
        assert_eq!(err.param.as_deref(), Some("previous_response_id"));
    }

    #[test]
    fn evicts_least_recently_used_by_count() {
        let mut store = ResponseStore::new(2, 1 << 20);
        assert!(store.insert("a".into(), conversation("first")));
        assert!(store.insert("b".into(), conversation("second")));
        // Reading `a` makes `b` the least recently used.
        assert_eq!(store.get("a").unwrap(), conversation("first"));
        assert!(store.insert("c".into(), conversation("third")));
        assert_eq!(store.len(), 2);
        assert!(store.get("b").is_err());
        assert!(store.get("a").is_ok() && store.get("c").is_ok());
    }

    #[test]
    fn evicts_by_bytes_and_refuses_oversized() {
        let one = conversation_bytes(&conversation(&"x".repeat(100))) + 1;
        let mut store = ResponseStore::new(100, one * 2);
        for id in ["a", "b", "c"] {
            assert!(store.insert(id.into(), conversation(&"x".repeat(100))));
        }
        assert_eq!(store.len(), 2);
        assert!(store.bytes() <= one * 2);
        assert!(store.get("a").is_err());
        assert!(!store.insert("big".into(), conversation(&"x".repeat(1000))));
        assert_eq!(store.len(), 2, "an oversized entry evicts nothing");
    }

    #[test]
    fn reinsert_replaces_and_remove_frees() {
        let mut store = ResponseStore::new(10, 1 << 20);
        store.insert("a".into(), conversation("one"));
        store.insert("a".into(), conversation("two"));
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap(), conversation("two"));
        assert!(store.remove("a"));
        assert!(store.is_empty());
        assert_eq!(store.bytes(), 0);
    }
}
