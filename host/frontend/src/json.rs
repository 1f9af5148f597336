//! Reading request JSON by hand, with every error naming the field's path.
//!
//! Unknown fields are ignored (the APIs evolve); a known field of the wrong type is a 400 whose
//! message and `param` name it (`messages[2].content[0].type`). The path is a chain of borrowed
//! segments on the stack and is only rendered when an error is built.

use std::fmt;

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Where a value sits in the request body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Path<'a> {
    /// The body itself.
    Root,
    /// A field of an object.
    Key(&'a Path<'a>, &'a str),
    /// An element of an array.
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("body"),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// A JSON value (borrowed for `'v`) and its path (borrowed for `'p`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Node<'v, 'p> {
    pub(crate) value: &'v Value,
    pub(crate) path: Path<'p>,
}

/// How a JSON value's type reads in an error message.
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// === impl Node ===

impl<'v, 'p> Node<'v, 'p> {
    /// The request body.
    pub(crate) fn root(value: &'v Value) -> Self {
        Node {
            value,
            path: Path::Root,
        }
    }

    /// A 400 blaming this field.
    pub(crate) fn error(&self, problem: impl fmt::Display) -> ApiError {
        ApiError::invalid(self.path.to_string(), problem)
    }

    /// A 400 for a value of the wrong type.
    pub(crate) fn expected(&self, what: &str) -> ApiError {
        self.error(format_args!("expected {what}, got {}", kind_of(self.value)))
    }

    /// The field `key` of this object; `None` when absent or null (both mean "not given").
    /// A non-object has no fields.
    pub(crate) fn get<'b>(&'b self, key: &'b str) -> Option<Node<'v, 'b>> {
        match self.value.get(key) {
            None | Some(Value::Null) => None,
            Some(value) => Some(Node {
                value,
                path: Path::Key(&self.path, key),
            }),
        }
    }

    /// The field `key`, which must be given.
    pub(crate) fn required<'b>(&'b self, key: &'b str) -> Result<Node<'v, 'b>, ApiError> {
        self.get(key).ok_or_else(|| {
            Node {
                value: &Value::Null,
                path: Path::Key(&self.path, key),
            }
            .error("missing required field")
        })
    }

    /// This value as an object.
    pub(crate) fn object(&self) -> Result<&'v Map<String, Value>, ApiError> {
        self.value
            .as_object()
            .ok_or_else(|| self.expected("an object"))
    }

    /// This value as a string.
    pub(crate) fn str(&self) -> Result<&'v str, ApiError> {
        self.value.as_str().ok_or_else(|| self.expected("a string"))
    }

    /// This value as a boolean.
    pub(crate) fn bool(&self) -> Result<bool, ApiError> {
        self.value
            .as_bool()
            .ok_or_else(|| self.expected("a boolean"))
    }

    /// This value as a finite number.
    pub(crate) fn f64(&self) -> Result<f64, ApiError> {
        self.value
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.expected("a number"))
    }

    /// This value as an integer.
    pub(crate) fn i64(&self) -> Result<i64, ApiError> {
        self.value.as_i64().ok_or_else(|| {
            if self.value.is_u64() {
                self.error("integer out of range")
            } else {
                self.expected("an integer")
            }
        })
    }

    /// This value as an integer in `u32`'s range.
    pub(crate) fn u32(&self) -> Result<u32, ApiError> {
        let n = self.i64()?;
        u32::try_from(n).map_err(|_| {
            self.error(format_args!(
                "must be an integer between 0 and {}, got {n}",
                u32::MAX
            ))
        })
    }

    /// This value as an array.
    pub(crate) fn array(&self) -> Result<&'v [Value], ApiError> {
        self.value
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.expected("an array"))
    }

    /// The elements of this array, each with its path.
    pub(crate) fn items<'b>(
        &'b self,
    ) -> Result<impl ExactSizeIterator<Item = Node<'v, 'b>> + 'b, ApiError> {
        let path = &self.path;
        Ok(self
            .array()?
            .iter()
            .enumerate()
            .map(move |(i, value)| Node {
                value,
                path: Path::Index(path, i),
            }))
    }

    /// The `type` field of an object (required), for tagged unions.
    pub(crate) fn tag(&self) -> Result<&'v str, ApiError> {
        self.object()?;
        let tag = self.required("type")?;
        tag.value.as_str().ok_or_else(|| tag.expected("a string"))
    }

    /// A 400 for an unknown or unsupported tag: `{path}.type: {what} `{tag}``.
    pub(crate) fn bad_tag(&self, what: &str, tag: &str) -> ApiError {
        self.type_error(format_args!("{what} `{tag}`"))
    }

    /// A 400 blaming this object's `type` field.
    pub(crate) fn type_error(&self, problem: impl fmt::Display) -> ApiError {
        Node {
            value: self.value,
            path: Path::Key(&self.path, "type"),
        }
        .error(problem)
    }
}

/// Optional field helpers: `None` when absent or null, an error when present with the wrong type.
impl Node<'_, '_> {
    /// An optional string field.
    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<String>, ApiError> {
        self.get(key)
            .map(|n| n.str().map(str::to_owned))
            .transpose()
    }

    /// An optional boolean field.
    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.get(key).map(|n| n.bool()).transpose()
    }

    /// An optional number field.
    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ApiError> {
        self.get(key).map(|n| n.f64()).transpose()
    }

    /// An optional `u32` field.
    pub(crate) fn opt_u32(&self, key: &str) -> Result<Option<u32>, ApiError> {
        self.get(key).map(|n| n.u32()).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_render_like_javascript_accessors() {
        let body = json!({"messages": [{}, {}, {"content": [{"type": 7}]}]});
        let root = Node::root(&body);
        let messages = root.get("messages").unwrap();
        let third = messages.items().unwrap().nth(2).unwrap();
        let content = third.get("content").unwrap();
        let part = content.items().unwrap().next().unwrap();
        let err = part.tag().unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("messages[2].content[0].type"),
            "{err}"
        );
        assert_eq!(
            err.message,
            "messages[2].content[0].type: expected a string, got a number"
        );
    }

    #[test]
    fn null_reads_as_absent_and_missing_is_named() {
        let body = json!({"a": null, "n": -1, "big": 1u64 << 40});
        let root = Node::root(&body);
        assert!(root.get("a").is_none());
        assert_eq!(root.opt_u32("a").unwrap(), None);
        let err = root.required("model").unwrap_err();
        assert_eq!(err.message, "model: missing required field");
        assert!(
            root.opt_u32("n")
                .unwrap_err()
                .message
                .starts_with("n: must be")
        );
        assert!(root.opt_u32("big").is_err());
        assert_eq!(root.str().unwrap_err().param.as_deref(), Some("body"));
    }
}
