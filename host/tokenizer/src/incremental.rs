//! Incremental tokenization per session: coding agents resend the whole conversation every turn,
//! so keep each session's last rendered prompt and its token ids, and when the next prompt extends
//! it, tokenize only from the last safe cut point before the first changed byte. The public
//! contract is on [`ModelTokenizer::encode_chat_incremental`] (`incremental.md`); `seams` holds
//! the argument for why a cut is exact, `cache` the bounded per-session store.

mod cache;
mod seams;

use std::sync::Arc;
use std::time::Instant;
use xxhash_rust::xxh3::xxh3_64;

pub use cache::{SessionCache, SessionCacheConfig, SessionCacheStats};
pub(crate) use seams::Seams;

use crate::{ChatTemplateInput, ModelTokenizer, TokenizerError};
use cache::{RecordedResult, Snapshot};

/// Token ids of a prompt encoded through a [`SessionCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalEncoding {
    /// The prompt's token ids: always equal to a full encode of the whole prompt.
    pub tokens: Vec<u32>,
    /// How many of the leading `tokens` came from the cache rather than the tokenizer.
    pub reused_tokens: usize,
    /// What the cache had for the session.
    pub outcome: CacheOutcome,
}

impl IncrementalEncoding {
    /// `snapshot`'s tokens, as `result` came by them.
    fn of(snapshot: &Snapshot, result: &RecordedResult) -> Self {
        Self {
            tokens: snapshot.tokens.clone(),
            reused_tokens: result.reused_tokens,
            outcome: result.outcome,
        }
    }
}

/// What the [`SessionCache`] could do for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The session's previous prompt shared a prefix up to a cut point: its tokens were reused.
    Hit,
    /// Nothing usable was cached for the session (new, expired, evicted, encoded by another
    /// model, the cache is off, or the model cannot be cut): a full pass.
    Miss,
    /// The previous prompt differs before its first usable cut point: a full pass.
    Fallback,
}

/// How much of a cached prompt's end a prompt that continues it may differ in: the generation
/// prompt, or a template that re-renders the last turn (a dropped reasoning span).
const CONTINUATION_SLACK_BYTES: usize = 256;

/// Leading bytes of a rendered prompt that name its [`content_key`].
pub const CONTENT_KEY_BYTES: usize = 1024;

/// The cache key of a prompt sent without a session id: a hash of its first
/// [`CONTENT_KEY_BYTES`] (a content address). Resending the same conversation, or another that
/// starts the same way, finds the prompts kept under it. Two conversations that share the key
/// only share the [`SessionCacheConfig::prompts_per_session`] slots: the cache compares the text
/// itself, so a shared key can cost reuse, never correctness.
pub fn content_key(text: &str) -> String {
    let mut end = text.len().min(CONTENT_KEY_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("~content:{:016x}", xxh3_64(&text.as_bytes()[..end]))
}

// === impl ModelTokenizer ===

impl ModelTokenizer {
    #[doc = include_str!("incremental.md")]
    pub fn encode_chat_incremental(
        &self,
        cache: &SessionCache,
        session: &str,
        input: &ChatTemplateInput<'_>,
        now: Instant,
    ) -> Result<IncrementalEncoding, TokenizerError> {
        let text = self.render_chat(input)?;
        self.encode_incremental(cache, session, text, now)
    }

    /// [`encode_chat_incremental`](Self::encode_chat_incremental) for a request without a
    /// session id, keyed by the rendered prompt's [`content_key`]: clients that resend their
    /// conversation (every OpenAI-compatible client does) reuse its tokens without naming a
    /// session.
    pub fn encode_chat_by_content(
        &self,
        cache: &SessionCache,
        input: &ChatTemplateInput<'_>,
        now: Instant,
    ) -> Result<IncrementalEncoding, TokenizerError> {
        let text = self.render_chat(input)?;
        self.encode_incremental(cache, &content_key(&text), text, now)
    }

    /// The tokens of `text` if `cache` holds this very prompt under `session` (a client that
    /// resends its conversation, a retry), recorded as a hit; `None` otherwise, leaving the
    /// cache as it was. No tokenizer runs: a caller can afford it where a tokenizer pass would
    /// be too slow, and call [`encode_incremental`](Self::encode_incremental) on `None`.
    pub fn encode_if_cached(
        &self,
        cache: &SessionCache,
        session: &str,
        text: &str,
        now: Instant,
    ) -> Option<IncrementalEncoding> {
        let inner = &*self.inner;
        inner.seams.as_ref().filter(|_| cache.enabled())?;
        let same = cache
            .lookup(session, inner.id, now)
            .into_iter()
            .find(|p| p.text == text && !p.tokens.is_empty())?;
        let result = RecordedResult::hit(same.tokens.len());
        let encoding = IncrementalEncoding::of(&same, &result);
        cache.record(session, Some(&same), Some(Arc::clone(&same)), now, result);
        Some(encoding)
    }

    /// [`encode`](Self::encode)`(&text, false)` through `cache`, for a prompt already rendered:
    /// see [`encode_chat_incremental`](Self::encode_chat_incremental).
    pub fn encode_incremental(
        &self,
        cache: &SessionCache,
        session: &str,
        text: String,
        now: Instant,
    ) -> Result<IncrementalEncoding, TokenizerError> {
        let inner = &*self.inner;
        let Some(seams) = inner.seams.as_ref().filter(|_| cache.enabled()) else {
            let tokens = self.encode(&text, false)?;
            let result = RecordedResult {
                outcome: CacheOutcome::Miss,
                reused_tokens: 0,
                encoded_tokens: tokens.len(),
            };
            cache.record(session, None, None, now, result);
            return Ok(IncrementalEncoding {
                tokens,
                reused_tokens: 0,
                outcome: CacheOutcome::Miss,
            });
        };

        // The prompt this one shares most with: the conversation, or one of the session's side
        // requests.
        let previous = cache
            .lookup(session, inner.id, now)
            .into_iter()
            .map(|p| (common_prefix_len(p.text.as_bytes(), text.as_bytes()), p))
            .max_by_key(|(shared, _)| *shared);
        // It is superseded only if this prompt continues it; otherwise both are kept.
        let replaces = previous
            .as_ref()
            .filter(|(shared, p)| *shared + CONTINUATION_SLACK_BYTES >= p.text.len())
            .map(|(_, p)| Arc::clone(p));
        let (snapshot, result) = match previous.map(|(_, p)| p) {
            // The same prompt again (a retry): nothing to encode.
            Some(previous) if previous.text == text && !previous.tokens.is_empty() => {
                let result = RecordedResult::hit(previous.tokens.len());
                (previous, result)
            }
            Some(previous) => match self.encode_after_cut(seams, &previous, text)? {
                Ok(extended) => extended,
                Err(text) => self.encode_whole(seams, text, CacheOutcome::Fallback)?,
            },
            None => self.encode_whole(seams, text, CacheOutcome::Miss)?,
        };
        let encoding = IncrementalEncoding::of(&snapshot, &result);
        cache.record(session, replaces.as_ref(), Some(snapshot), now, result);
        Ok(encoding)
    }

    /// Whether this model's prompts can be encoded incrementally at all: it has added tokens that
    /// are safe cut points (see [`encode_chat_incremental`](Self::encode_chat_incremental)).
    /// Without any, every request is a full pass.
    pub fn supports_incremental(&self) -> bool {
        self.inner.seams.is_some()
    }

    /// Encodes `text` reusing `previous`'s tokens up to its last cut point within their shared
    /// prefix; gives `text` back if there is none.
    fn encode_after_cut(
        &self,
        seams: &Seams,
        previous: &Snapshot,
        text: String,
    ) -> Result<Result<(Arc<Snapshot>, RecordedResult), String>, TokenizerError> {
        let shared = common_prefix_len(previous.text.as_bytes(), text.as_bytes());
        let Some(index) = seams.last_cut(&previous.anchors, text.as_bytes(), shared) else {
            return Ok(Err(text));
        };
        // The anchor is within the shared prefix, so at a char boundary of `text` too; checked
        // access anyway, falling back rather than panicking.
        let cut = previous.anchors.get(index).copied();
        let parts = cut.and_then(|cut| {
            let prefix = previous.tokens.get(..cut.token)?;
            let kept = previous.anchors.get(..index)?;
            Some((cut, prefix, kept))
        });
        // A cut at the first token reuses nothing: that is a full pass.
        let Some((cut, prefix, kept)) = parts.filter(|(cut, ..)| cut.token > 0) else {
            return Ok(Err(text));
        };
        let Some(suffix) = text.get(cut.start..) else {
            return Ok(Err(text));
        };
        let encoding = self
            .inner
            .tokenizer
            .encode(suffix, false)
            .map_err(TokenizerError::Tokenizer)?;
        let mut tokens = Vec::with_capacity(prefix.len() + encoding.len());
        tokens.extend_from_slice(prefix);
        tokens.extend_from_slice(encoding.get_ids());
        let mut anchors = kept.to_vec();
        seams.collect_anchors(
            suffix,
            encoding.get_ids(),
            encoding.get_offsets(),
            cut.start,
            cut.token,
            &mut anchors,
        );
        let result = RecordedResult {
            outcome: CacheOutcome::Hit,
            reused_tokens: prefix.len(),
            encoded_tokens: encoding.len(),
        };
        let snapshot = Snapshot {
            model_id: self.inner.id,
            text,
            tokens,
            anchors,
        };
        Ok(Ok((Arc::new(snapshot), result)))
    }

    /// A full pass, with the byte offsets that locate the cut points for the next turn.
    fn encode_whole(
        &self,
        seams: &Seams,
        text: String,
        outcome: CacheOutcome,
    ) -> Result<(Arc<Snapshot>, RecordedResult), TokenizerError> {
        let encoding = self
            .inner
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(TokenizerError::Tokenizer)?;
        let mut anchors = Vec::new();
        seams.collect_anchors(
            &text,
            encoding.get_ids(),
            encoding.get_offsets(),
            0,
            0,
            &mut anchors,
        );
        let result = RecordedResult {
            outcome,
            reused_tokens: 0,
            encoded_tokens: encoding.len(),
        };
        let snapshot = Snapshot {
            model_id: self.inner.id,
            text,
            tokens: encoding.get_ids().to_vec(),
            anchors,
        };
        Ok((Arc::new(snapshot), result))
    }
}

/// Length of the longest common prefix of `a` and `b`, comparing in blocks (memcmp) first.
fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 256;
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let equal_blocks = a
        .chunks(BLOCK)
        .zip(b.chunks(BLOCK))
        .take_while(|(x, y)| x == y)
        .count();
    let start = (equal_blocks * BLOCK).min(len);
    let rest = a[start..]
        .iter()
        .zip(&b[start..])
        .take_while(|(x, y)| x == y)
        .count();
    start + rest
}

#[cfg(test)]
mod tests;
