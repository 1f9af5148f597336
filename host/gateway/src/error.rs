//! Every way a request can fail, and the one place each becomes an HTTP response.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// A request the gateway answers with an error.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not valid JSON or misses required fields.
    #[error("{0}")]
    BadRequest(String),
    /// The body is larger than the configured limit.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// No route for this path.
    #[error("no endpoint {0}")]
    NoSuchEndpoint(String),
    /// The requested model is not served here.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// No worker can take the request now.
    #[error("no healthy worker available")]
    NoHealthyWorker,
    /// The routing policy refused the request.
    #[error("{0}")]
    Rejected(String),
    /// Every attempt to reach an engine failed before it answered.
    #[error("upstream unavailable: {0}")]
    Upstream(String),
    /// An engine answered with an error: passed through unchanged.
    #[error("engine returned {status}")]
    Engine {
        /// The engine's status.
        status: StatusCode,
        /// The engine's body.
        body: Bytes,
        /// The engine's content type.
        content_type: Option<HeaderValue>,
    },
    /// The admin API was called without the right bearer token.
    #[error("missing or invalid admin token")]
    Unauthorized,
    /// A bug or an impossible state; logged.
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnknownModel(_) | Self::NoSuchEndpoint(_) => StatusCode::NOT_FOUND,
            Self::NoHealthyWorker => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Rejected(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Engine { status, .. } => *status,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Short label for the rejection counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::TooLarge { .. } => "too_large",
            Self::UnknownModel(_) => "unknown_model",
            Self::NoSuchEndpoint(_) => "no_such_endpoint",
            Self::NoHealthyWorker => "no_healthy_worker",
            Self::Unauthorized => "unauthorized",
            Self::Rejected(_) => "rejected",
            Self::Upstream(_) => "upstream",
            Self::Engine { .. } => "engine_error",
            Self::Internal(_) => "internal",
        }
    }

    fn openai_type(&self) -> &'static str {
        match self {
            Self::BadRequest(_)
            | Self::TooLarge { .. }
            | Self::NoSuchEndpoint(_)
            | Self::Unauthorized => "invalid_request_error",
            Self::UnknownModel(_) => "model_not_found",
            Self::NoHealthyWorker | Self::Upstream(_) => "service_unavailable",
            Self::Rejected(_) => "rate_limit_exceeded",
            Self::Engine { .. } | Self::Internal(_) => "internal_error",
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let Self::Engine {
            body, content_type, ..
        } = self
        {
            let mut response = (status, body).into_response();
            if let Some(ct) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            return response;
        }
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.openai_type(),
                "param": null,
                "code": status.as_u16(),
            }
        });
        let mut response = (status, axum::Json(body)).into_response();
        if matches!(self, Self::NoHealthyWorker | Self::Rejected(_)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
