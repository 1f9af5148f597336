//! Where a rendered prompt can be cut so that the tokens of the two parts, concatenated, are the
//! tokens of the whole.
//!
//! Hugging Face `tokenizers` first splits the raw text on the added tokens that match the raw text
//! (`normalized: false`; an Aho-Corasick scan, leftmost-longest, resuming after each match), then
//! normalizes, pre-tokenizes and encodes each piece between them on its own. So the token ids of
//! the pieces before an added-token match depend only on the text before it, and a fresh scan
//! started exactly at a match finds that match and every later one again. The cut points
//! ("anchors") are the starts of such matches; this module decides which tokens may be anchors,
//! finds them in an encoding, and checks that an anchor of the previous text is still a match in a
//! new text that shares only a prefix with it.
//!
//! The cut is at the *start* of the added token, and the token is encoded again with the suffix:
//! the suffix's first piece is then the added token itself, so a pre-tokenizer that treats the
//! piece at offset 0 specially (Metaspace `prepend_scheme: first`) sees no piece at offset 0.

use std::collections::{HashMap, HashSet};

use tokenizers::{ModelWrapper, Tokenizer};

/// A cut point in a text: an anchor token's byte range and its index in the text's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchor {
    /// Byte offset where the anchor token's text starts.
    pub(crate) start: usize,
    /// Byte offset just past the anchor token's text.
    pub(crate) end: usize,
    /// Index of the anchor token in the text's token ids.
    pub(crate) token: usize,
}

/// One model's added tokens, as far as cutting a prompt goes.
pub(crate) struct Seams {
    /// Text of each added token usable as a cut point, by id.
    anchors: HashMap<u32, Box<str>>,
    /// `is_anchor[id]`: a cheap filter before the map, run once per token of an encoding.
    is_anchor: Vec<bool>,
    /// Text of every added token that the tokenizer matches on the raw text: a match of one of
    /// them across the end of the shared prefix would change the split before it.
    patterns: HashSet<Box<[u8]>>,
    /// The distinct byte lengths of `patterns`, ascending.
    pattern_lens: Vec<usize>,
}

// === impl Seams ===

impl Seams {
    /// The cut points of `tokenizer`, or why it cannot be cut at all (then every request is a
    /// full pass).
    pub(crate) fn new(tokenizer: &Tokenizer) -> Result<Self, &'static str> {
        if tokenizer.get_encode_special_tokens() {
            // Special tokens are then skipped matches whose text is encoded as plain text.
            return Err("encode_special_tokens is set");
        }
        if let ModelWrapper::BPE(bpe) = tokenizer.get_model()
            && bpe.dropout.is_some_and(|p| p > 0.0)
        {
            return Err("BPE dropout makes encoding random");
        }
        let added = tokenizer.get_added_tokens_decoder();
        let raw: Vec<_> = added
            .iter()
            .filter(|(_, token)| !token.normalized)
            .collect();
        if raw.iter().any(|(_, token)| token.single_word) {
            // A discarded `single_word` match leaves an added token's text in plain text, where
            // an anchor id found in the encoding could come from the model, not from a split.
            return Err("an added token is single_word");
        }
        let mut anchors = HashMap::new();
        for &(&id, token) in &raw {
            let content = token.content.as_str();
            // lstrip/rstrip widen the match by the whitespace around it, which depends on text
            // past the shared prefix; a leading space could be taken by a neighbour's rstrip.
            // `token_to_id` is the id the tokenizer's own scan assigns to this text.
            let usable = !token.lstrip
                && !token.rstrip
                && content.chars().next().is_some_and(|c| !c.is_whitespace())
                && tokenizer.token_to_id(content) == Some(id);
            if usable {
                anchors.insert(id, Box::from(content));
            }
        }
        if anchors.is_empty() {
            return Err("no added token can be a cut point");
        }
        let patterns: HashSet<Box<[u8]>> = raw
            .iter()
            .map(|(_, token)| Box::from(token.content.as_bytes()))
            .collect();
        let mut pattern_lens: Vec<usize> = patterns.iter().map(|p| p.len()).collect();
        pattern_lens.sort_unstable();
        pattern_lens.dedup();
        let max_id = anchors.keys().copied().max().unwrap_or(0);
        let mut is_anchor = vec![false; usize::try_from(max_id).map_or(0, |id| id + 1)];
        for &id in anchors.keys() {
            if let Some(slot) = usize::try_from(id)
                .ok()
                .and_then(|id| is_anchor.get_mut(id))
            {
                *slot = true;
            }
        }
        Ok(Self {
            anchors,
            is_anchor,
            patterns,
            pattern_lens,
        })
    }

    /// Appends the anchors of an encoding of `text` (which starts at byte `base_byte` of the whole
    /// prompt and whose first token is token `base_token` of it) to `out`.
    ///
    /// A token counts only if its offsets cover exactly its own text, which is how a token split
    /// off by the added-token scan looks.
    pub(crate) fn collect_anchors(
        &self,
        text: &str,
        ids: &[u32],
        offsets: &[(usize, usize)],
        base_byte: usize,
        base_token: usize,
        out: &mut Vec<Anchor>,
    ) {
        for (index, (&id, &(start, end))) in ids.iter().zip(offsets).enumerate() {
            let flagged = usize::try_from(id)
                .ok()
                .and_then(|id| self.is_anchor.get(id))
                .copied()
                .unwrap_or(false);
            if !flagged {
                continue;
            }
            let Some(content) = self.anchors.get(&id) else {
                continue;
            };
            if text.get(start..end) == Some(&**content) {
                out.push(Anchor {
                    start: base_byte + start,
                    end: base_byte + end,
                    token: base_token + index,
                });
            }
        }
    }

    /// The index in `anchors` (the previous text's, ascending) of the last anchor at which `text`
    /// can be cut, given that `text` and the previous text share their first `shared` bytes.
    ///
    /// An anchor qualifies if it lies within the shared prefix and no added token's text starts
    /// at or before it and runs past the shared prefix in `text`: such a match could exist in
    /// `text` but not in the previous text and win the leftmost-longest scan over the anchor or a
    /// match before it. Anything else the scan decides up to the anchor reads only shared bytes.
    pub(crate) fn last_cut(&self, anchors: &[Anchor], text: &[u8], shared: usize) -> Option<usize> {
        anchors
            .iter()
            .rposition(|anchor| anchor.end <= shared && !self.crosses(text, shared, anchor.start))
    }

    /// Whether an added token's text occurs in `text` starting at or before `start` and ending
    /// past `shared`.
    fn crosses(&self, text: &[u8], shared: usize, start: usize) -> bool {
        let longest = self.pattern_lens.last().copied().unwrap_or(0);
        // Only starts within `longest` bytes of `shared` can reach past it.
        let first = (shared + 1).saturating_sub(longest);
        (first..=start).any(|at| {
            self.pattern_lens
                .iter()
                .filter(|&&len| at + len > shared)
                .any(|&len| {
                    text.get(at..at + len)
                        .is_some_and(|window| self.patterns.contains(window))
                })
        })
    }
}
