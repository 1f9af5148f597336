//! Extension columns: one value per row of a record (session, rank) packed into a single
//! `extensions` entry, so trial signals reach policies before they earn a typed WIT field
//! (wit/README.md, "Evolution rules").
//!
//! The value is one CSV row: fields separated by `,`, in the record's row order. An empty
//! unquoted field is *unknown* (`None`); a field that is empty or contains `,` or `"` is written
//! in double quotes with `"` doubled, so `""` is a known empty string. `3.1,,"a,b"` is
//! `[Some("3.1"), None, Some("a,b")]`.

use crate::types::find_extension;
use std::borrow::Cow;

/// The fields of one column value. Malformed input never fails (an unterminated quote runs to
/// the end, text between a closing quote and the next `,` is ignored), so a guest cannot be
/// made to trap by it.
pub fn split_column(value: &str) -> Vec<Option<String>> {
    fields(value)
        .into_iter()
        .map(|field| field.map(Cow::into_owned))
        .collect()
}

/// [`split_column`] borrowing from `value`: a field is copied only when it held a doubled
/// quote. The SDK's own row decoding reads columns this way, on every admission call.
pub(crate) fn fields(value: &str) -> Vec<Option<Cow<'_, str>>> {
    let mut fields = Vec::new();
    let mut rest = value;
    loop {
        let (field, next) = match rest.strip_prefix('"') {
            Some(quoted) => {
                let (text, end) = unquote(quoted);
                let tail = &quoted[end..];
                (Some(text), tail.find(',').map(|i| &tail[i + 1..]))
            }
            None => match rest.find(',') {
                Some(i) => (non_empty(&rest[..i]), Some(&rest[i + 1..])),
                None => (non_empty(rest), None),
            },
        };
        fields.push(field);
        match next {
            Some(next) => rest = next,
            None => return fields,
        }
    }
}

/// A quoted field's text (`quoted` starts after its opening quote, `""` stands for `"`) and
/// where it ends: after its closing quote, or at the end of the input when there is none.
fn unquote(quoted: &str) -> (Cow<'_, str>, usize) {
    let bytes = quoted.as_bytes();
    let mut owned: Option<String> = None;
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b'"' {
            if bytes.get(i + 1) == Some(&b'"') {
                // Keep one of the two quotes.
                owned
                    .get_or_insert_with(String::new)
                    .push_str(&quoted[start..=i]);
                i += 2;
                start = i;
                continue;
            }
            return (text(quoted, owned, start, i), i + 1);
        }
        i += 1;
    }
    (text(quoted, owned, start, quoted.len()), quoted.len())
}

/// `quoted[..end]` as unquoted so far: borrowed, or what `owned` gathered plus the rest.
fn text(quoted: &str, owned: Option<String>, start: usize, end: usize) -> Cow<'_, str> {
    match owned {
        Some(mut text) => {
            text.push_str(&quoted[start..end]);
            Cow::Owned(text)
        }
        None => Cow::Borrowed(&quoted[..end]),
    }
}

fn non_empty(field: &str) -> Option<Cow<'_, str>> {
    (!field.is_empty()).then_some(Cow::Borrowed(field))
}

/// One column value from its fields (the inverse of [`split_column`]); `None` is written as an
/// empty field.
pub fn join_column<S: AsRef<str>>(values: impl IntoIterator<Item = Option<S>>) -> String {
    let mut out = String::new();
    for (i, value) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if let Some(value) = value {
            push_field(&mut out, value.as_ref());
        }
    }
    out
}

/// Append one known field to a column value (the `,` between fields is the caller's): in double
/// quotes with `"` doubled when it is empty or holds `,` or `"`, else as it is. The host writes
/// its columns with this too, so both sides share one definition of the format.
pub fn push_field(out: &mut String, value: &str) {
    if value.is_empty() || value.contains([',', '"']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// The column `key` of `extensions`, split into exactly `rows` fields (missing ones unknown,
/// extra ones dropped); `None` when the host did not send it.
pub fn find_column(
    extensions: &[(String, String)],
    key: &str,
    rows: usize,
) -> Option<Vec<Option<String>>> {
    let mut fields = split_column(find_extension(extensions, key)?);
    fields.resize(rows, None);
    Some(fields)
}

/// [`find_column`] borrowing from `extensions` (see [`fields`]).
pub(crate) fn find_fields<'a>(
    extensions: &'a [(String, String)],
    key: &str,
    rows: usize,
) -> Option<Vec<Option<Cow<'a, str>>>> {
    let mut fields = fields(find_extension(extensions, key)?);
    fields.resize(rows, None);
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(fields: &[Option<&str>]) -> Vec<Option<String>> {
        fields.iter().map(|f| f.map(str::to_owned)).collect()
    }

    #[test]
    fn fields_round_trip_including_separators_quotes_and_empty_strings() {
        let fields = owned(&[
            Some("3.1"),
            None,
            Some("a,b"),
            Some(""),
            Some("say \"hi\""),
            Some("ü"),
            None,
        ]);
        let joined = join_column(fields.iter().map(Option::as_deref));
        assert_eq!(joined, r#"3.1,,"a,b","","say ""hi""",ü,"#);
        assert_eq!(split_column(&joined), fields);
    }

    #[test]
    fn fields_borrow_unless_a_quote_was_doubled() {
        let value = r#"3.1,,"a,b","say ""hi""",ü"#;
        let fields = fields(value);
        assert!(matches!(fields[0], Some(Cow::Borrowed("3.1"))));
        assert!(matches!(fields[2], Some(Cow::Borrowed("a,b"))));
        assert!(matches!(&fields[3], Some(Cow::Owned(text)) if text == r#"say "hi""#));
        assert!(fields[1].is_none());
        assert!(matches!(fields[4], Some(Cow::Borrowed("ü"))));
        assert_eq!(fields.len(), 5);
    }

    #[test]
    fn malformed_values_still_split() {
        assert_eq!(split_column(""), owned(&[None]));
        assert_eq!(split_column(r#""open"#), owned(&[Some("open")]));
        assert_eq!(split_column(r#""a"junk,b"#), owned(&[Some("a"), Some("b")]));
        assert_eq!(split_column(",,"), owned(&[None, None, None]));
    }

    #[test]
    fn columns_are_padded_or_cut_to_the_row_count() {
        let ext = vec![("k".to_owned(), "1,2,3".to_owned())];
        assert_eq!(
            find_column(&ext, "k", 2),
            Some(owned(&[Some("1"), Some("2")]))
        );
        assert_eq!(
            find_column(&ext, "k", 4),
            Some(owned(&[Some("1"), Some("2"), Some("3"), None]))
        );
        assert_eq!(find_column(&ext, "other", 4), None);
    }
}
