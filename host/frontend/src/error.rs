//! The one error type of this crate, and its body in each API's shape.

use serde_json::{Value, json};

/// What went wrong, independent of the API: decides the `type` of each API's error body and the
/// default HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something unsupported (400).
    InvalidRequest,
    /// The request carries no valid API key (401).
    Authentication,
    /// Something named by the request does not exist (404).
    NotFound,
    /// The body is larger than the gateway accepts (413).
    RequestTooLarge,
    /// Too many requests; try again later (429).
    RateLimited,
    /// No capacity now (503).
    Overloaded,
    /// The engine failed or answered something unreadable (502).
    Upstream,
    /// A bug or an impossible state (500).
    Internal,
}

impl ErrorKind {
    /// The HTTP status this kind gets unless told otherwise.
    pub fn default_status(self) -> u16 {
        match self {
            Self::InvalidRequest => 400,
            Self::Authentication => 401,
            Self::NotFound => 404,
            Self::RequestTooLarge => 413,
            Self::RateLimited => 429,
            Self::Overloaded => 503,
            Self::Upstream => 502,
            Self::Internal => 500,
        }
    }

    /// `error.type` in OpenAI's error body.
    pub fn openai_type(self) -> &'static str {
        match self {
            // OpenAI reports a bad key as an invalid request with code `invalid_api_key`.
            Self::InvalidRequest | Self::Authentication | Self::RequestTooLarge => {
                "invalid_request_error"
            }
            Self::NotFound => "not_found_error",
            Self::RateLimited => "rate_limit_exceeded",
            Self::Overloaded => "service_unavailable",
            Self::Upstream | Self::Internal => "server_error",
        }
    }

    /// `error.type` in Anthropic's error body.
    pub fn anthropic_type(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::NotFound => "not_found_error",
            Self::RequestTooLarge => "request_too_large",
            Self::RateLimited => "rate_limit_error",
            Self::Overloaded => "overloaded_error",
            Self::Upstream | Self::Internal => "api_error",
        }
    }
}

/// A request this crate refuses, or an engine reply it cannot read. Carries everything any API's
/// error body needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What went wrong.
    pub kind: ErrorKind,
    /// Human-readable; for a malformed field it starts with the field's path
    /// (`messages[2].content[0].type: unknown content part type `foo``).
    pub message: String,
    /// The offending field's path (`messages[2].content[0].type`), when one field is to blame.
    pub param: Option<String>,
    /// A machine-readable code (`previous_response_not_found`), when the API defines one.
    pub code: Option<String>,
}

// === impl ApiError ===

impl ApiError {
    /// An error of `kind` with its default status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status: kind.default_status(),
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 blaming the field at `param`; the message reads `"{param}: {problem}"`.
    pub fn invalid(param: impl Into<String>, problem: impl std::fmt::Display) -> Self {
        let param = param.into();
        Self {
            message: format!("{param}: {problem}"),
            param: Some(param),
            ..Self::new(ErrorKind::InvalidRequest, String::new())
        }
    }

    /// The same error with a machine-readable `code`.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// OpenAI's shape (chat completions, completions, responses):
    /// `{"error": {"message", "type", "param", "code"}}`.
    pub fn to_openai_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.openai_type(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// Anthropic's shape (messages): `{"type": "error", "error": {"type", "message"}}`.
    pub fn to_anthropic_json(&self) -> Value {
        json!({
            "type": "error",
            "error": {"type": self.kind.anthropic_type(), "message": self.message},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_names_the_field_in_both_shapes() {
        let err = ApiError::invalid(
            "messages[2].content[0].type",
            "unknown content part type `foo`",
        );
        assert_eq!(err.status, 400);
        assert_eq!(
            err.to_openai_json(),
            json!({"error": {
                "message": "messages[2].content[0].type: unknown content part type `foo`",
                "type": "invalid_request_error",
                "param": "messages[2].content[0].type",
                "code": null,
            }})
        );
        assert_eq!(
            err.to_anthropic_json(),
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "messages[2].content[0].type: unknown content part type `foo`",
            }})
        );
    }

    #[test]
    fn kinds_map_to_each_api_type() {
        let err = ApiError::new(ErrorKind::Overloaded, "busy").with_code("overloaded");
        assert_eq!(err.status, 503);
        assert_eq!(err.to_openai_json()["error"]["type"], "service_unavailable");
        assert_eq!(err.to_openai_json()["error"]["code"], "overloaded");
        assert_eq!(err.to_anthropic_json()["error"]["type"], "overloaded_error");
    }
}
