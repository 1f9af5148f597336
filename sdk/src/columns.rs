//! Extension columns: one value per row of a record (session, rank) packed into a single
//! `extensions` entry, so trial signals reach policies before they earn a typed WIT field
//! (wit/README.md, "Evolution rules").
//!
//! The value is one CSV row: fields separated by `,`, in the record's row order. An empty
//! unquoted field is *unknown* (`None`); a field that is empty or contains `,` or `"` is written
//! in double quotes with `"` doubled, so `""` is a known empty string. `3.1,,"a,b"` is
//! `[Some("3.1"), None, Some("a,b")]`.

use crate::types::find_extension;

/// The fields of one column value. Malformed input never fails (an unterminated quote runs to
/// the end, text between a closing quote and the next `,` is ignored), so a guest cannot be
/// made to trap by it.
pub fn split_column(value: &str) -> Vec<Option<String>> {
    let mut fields = Vec::new();
    let mut rest = value;
    loop {
        let (field, next) = match rest.strip_prefix('"') {
            Some(quoted) => {
                let mut field = String::new();
                let mut end = quoted.len();
                let mut chars = quoted.char_indices();
                while let Some((i, c)) = chars.next() {
                    if c != '"' {
                        field.push(c);
                    } else if quoted[i + 1..].starts_with('"') {
                        field.push('"');
                        chars.next();
                    } else {
                        end = i + 1;
                        break;
                    }
                }
                let tail = &quoted[end..];
                (Some(field), tail.find(',').map(|i| &tail[i + 1..]))
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

fn non_empty(field: &str) -> Option<String> {
    (!field.is_empty()).then(|| field.to_owned())
}

/// One column value from its fields (the inverse of [`split_column`]); `None` is written as an
/// empty field.
pub fn join_column<S: AsRef<str>>(values: impl IntoIterator<Item = Option<S>>) -> String {
    let mut out = String::new();
    for (i, value) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let Some(value) = value else { continue };
        let value = value.as_ref();
        if value.is_empty() || value.contains([',', '"']) {
            out.push('"');
            out.push_str(&value.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(value);
        }
    }
    out
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
