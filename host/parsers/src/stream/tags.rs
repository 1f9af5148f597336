//! Incremental tag matching, shared by every parser: find the earliest complete tag in buffered
//! text, or else say how much of the text can be released because no tag can start in it.

/// What [`search`] found in buffered text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// `tags[tag]` starts at byte `at`.
    Tag { at: usize, tag: usize },
    /// No complete tag; the first `safe` bytes cannot be part of one.
    Nothing { safe: usize },
}

/// Finds the earliest occurrence of any of `tags` in `text` (the longest tag wins a tie). Without
/// one, everything but a trailing partial tag is safe; at the end of input everything is.
pub(crate) fn search(text: &str, tags: &[&str], at_end: bool) -> Found {
    let mut best: Option<(usize, usize)> = None;
    for (i, tag) in tags.iter().enumerate() {
        if tag.is_empty() {
            continue;
        }
        if let Some(at) = text.find(tag) {
            let better = match best {
                None => true,
                Some((b, bi)) => at < b || (at == b && tag.len() > tags[bi].len()),
            };
            if better {
                best = Some((at, i));
            }
        }
    }
    match best {
        Some((at, tag)) => Found::Tag { at, tag },
        None if at_end => Found::Nothing { safe: text.len() },
        None => Found::Nothing {
            safe: text.len() - partial_suffix(text, tags),
        },
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of one of `tags`: the part that
/// must be held back because the next chunk may complete a tag.
pub(crate) fn partial_suffix(text: &str, tags: &[&str]) -> usize {
    let longest = tags.iter().map(|t| t.len()).max().unwrap_or(0);
    let mut start = text.len().saturating_sub(longest.saturating_sub(1));
    while start < text.len() {
        if text.is_char_boundary(start) && is_partial(&text[start..], tags) {
            return text.len() - start;
        }
        start += 1;
    }
    0
}

/// Whether `text` is a proper prefix of one of `tags`, so more input could complete it.
pub(crate) fn is_partial(text: &str, tags: &[&str]) -> bool {
    tags.iter()
        .any(|t| t.len() > text.len() && t.starts_with(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_tag_wins_and_ties_go_to_the_longest() {
        assert_eq!(
            search("ab<x>cd<y>", &["<y>", "<x>"], false),
            Found::Tag { at: 2, tag: 1 }
        );
        assert_eq!(
            search("<ab>", &["<a", "<ab>"], false),
            Found::Tag { at: 0, tag: 1 }
        );
    }

    #[test]
    fn a_trailing_partial_tag_is_held_back_until_the_end() {
        assert_eq!(
            search("hello <tool", &["<tool_call>"], false),
            Found::Nothing { safe: 6 }
        );
        assert_eq!(
            search("hello <tool", &["<tool_call>"], true),
            Found::Nothing { safe: 11 }
        );
        assert_eq!(
            search("hello <x", &["<tool_call>"], false),
            Found::Nothing { safe: 8 }
        );
    }

    #[test]
    fn holdback_respects_char_boundaries() {
        let tag = "<｜tool▁calls▁begin｜>";
        let text = format!("é{}", &tag[..4]);
        assert_eq!(partial_suffix(&text, &[tag]), 4);
        assert_eq!(partial_suffix("ééé", &[tag]), 0);
    }
}
