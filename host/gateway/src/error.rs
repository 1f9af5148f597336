//! Every way a request can fail, and the one place each becomes an HTTP response.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use switchyard_frontend::{Api, ApiError, ErrorKind};

/// A request the gateway answers with an error.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not valid JSON or misses required fields.
    #[error("{0}")]
    BadRequest(String),
    /// A client API refused the request (a malformed field, an unsupported feature), or could
    /// not read the engine's answer.
    #[error(transparent)]
    Api(#[from] ApiError),
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
    /// The gateway holds as many requests as it is configured to (`[server]
    /// max_concurrent_requests`).
    #[error("the gateway is at its limit of {limit} requests in flight; retry shortly")]
    Overloaded {
        /// The limit.
        limit: usize,
    },
    /// The client's API key has as many requests in flight as its `max_in_flight`.
    #[error("this API key has its limit of {limit} requests in flight; retry shortly")]
    KeyLimit {
        /// The key's limit.
        limit: usize,
    },
    /// The client's API key used its `tokens_per_minute`.
    #[error(
        "this API key used its {limit} tokens per minute; retry in {}s",
        whole_secs(*retry_after)
    )]
    KeyTokens {
        /// The key's limit.
        limit: u64,
        /// When its budget holds tokens again.
        retry_after: std::time::Duration,
    },
    /// The gateway is shutting down and its drain deadline passed.
    #[error("the gateway is shutting down; retry on another replica")]
    Stopping,
    /// The routing policy refused the request, or the router queue is full.
    #[error("{0}")]
    Rejected(String),
    /// Every worker is saturated and the request asked not to wait.
    #[error("every worker is saturated; retry in {}s", retry_after.as_secs().max(1))]
    Busy {
        /// When to try again.
        retry_after: std::time::Duration,
    },
    /// Every attempt to reach an engine failed before it answered.
    #[error("upstream unavailable: {0}")]
    Upstream(String),
    /// The engine's answer started, then nothing came for `[server] stream_idle_timeout`.
    #[error("the engine sent nothing for {}s (server.stream_idle_timeout)", idle.as_secs_f64())]
    Stalled {
        /// The timeout that passed.
        idle: std::time::Duration,
    },
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
    /// No worker has this URL (`DELETE /admin/workers`).
    #[error("no worker {url}")]
    UnknownWorker {
        /// The URL asked for.
        url: String,
    },
    /// The change conflicts with the fleet as it is (a worker that exists, or belongs to
    /// another source).
    #[error("{0}")]
    Conflict(String),
    /// The admin API was called without the right bearer token.
    #[error("missing or invalid admin token")]
    Unauthorized,
    /// A client API was called without one of `[[server.api_keys]]`.
    #[error(
        "missing or invalid API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`"
    )]
    InvalidApiKey,
    /// The admin token is valid but its role may not do this (a `read` token on a change).
    #[error("{0}")]
    Forbidden(String),
    /// A bug or an impossible state; logged.
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Api(e) => StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnknownModel(_) | Self::NoSuchEndpoint(_) | Self::UnknownWorker { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::NoHealthyWorker | Self::Overloaded { .. } | Self::Stopping => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Unauthorized | Self::InvalidApiKey => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Rejected(_)
            | Self::Busy { .. }
            | Self::KeyLimit { .. }
            | Self::KeyTokens { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Stalled { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Engine { status, .. } => *status,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Short label for the rejection counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Api(e) if e.kind == ErrorKind::InvalidRequest => "bad_request",
            Self::Api(_) => "api_error",
            Self::TooLarge { .. } => "too_large",
            Self::UnknownModel(_) => "unknown_model",
            Self::NoSuchEndpoint(_) => "no_such_endpoint",
            Self::UnknownWorker { .. } => "unknown_worker",
            Self::Conflict(_) => "conflict",
            Self::NoHealthyWorker => "no_healthy_worker",
            Self::Overloaded { .. } => "overloaded",
            Self::Stopping => "stopping",
            Self::Unauthorized => "unauthorized",
            Self::InvalidApiKey => "invalid_api_key",
            Self::Forbidden(_) => "forbidden",
            Self::Rejected(_) => "rejected",
            Self::Busy { .. } => "busy",
            Self::KeyLimit { .. } => "key_limit",
            Self::KeyTokens { .. } => "key_tokens",
            Self::Upstream(_) => "upstream",
            Self::Stalled { .. } => "stalled",
            Self::Engine { .. } => "engine_error",
            Self::Internal(_) => "internal",
        }
    }

    /// What kind of failure this is, for the error body of any API.
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Api(e) => e.kind,
            Self::BadRequest(_) | Self::Unauthorized | Self::Forbidden(_) | Self::Conflict(_) => {
                ErrorKind::InvalidRequest
            }
            Self::InvalidApiKey => ErrorKind::Authentication,
            Self::TooLarge { .. } => ErrorKind::RequestTooLarge,
            Self::UnknownModel(_) | Self::NoSuchEndpoint(_) | Self::UnknownWorker { .. } => {
                ErrorKind::NotFound
            }
            Self::NoHealthyWorker | Self::Overloaded { .. } | Self::Stopping => {
                ErrorKind::Overloaded
            }
            Self::Rejected(_)
            | Self::Busy { .. }
            | Self::KeyLimit { .. }
            | Self::KeyTokens { .. } => ErrorKind::RateLimited,
            Self::Upstream(_) | Self::Stalled { .. } => ErrorKind::Upstream,
            // The engine's own verdict: a 4xx is the request's fault, not the server's.
            Self::Engine { status, .. } => match status.as_u16() {
                404 => ErrorKind::NotFound,
                413 => ErrorKind::RequestTooLarge,
                429 => ErrorKind::RateLimited,
                400..=499 => ErrorKind::InvalidRequest,
                _ => ErrorKind::Upstream,
            },
            Self::Internal(_) => ErrorKind::Internal,
        }
    }

    /// This error as the client APIs describe errors.
    fn to_api_error(&self) -> ApiError {
        if let Self::Api(e) = self {
            return e.clone();
        }
        let message = match self {
            // The engine's own message, whatever shape its error body has.
            Self::Engine { body, .. } => engine_message(body),
            _ => self.to_string(),
        };
        ApiError {
            status: self.status().as_u16(),
            kind: self.kind(),
            message,
            param: None,
            code: match self {
                Self::UnknownModel(_) => Some("model_not_found".into()),
                Self::Unauthorized | Self::InvalidApiKey => Some("invalid_api_key".into()),
                Self::Forbidden(_) => Some("insufficient_permissions".into()),
                Self::UnknownWorker { .. } => Some("worker_not_found".into()),
                Self::Conflict(_) => Some("conflict".into()),
                _ => None,
            },
        }
    }

    /// The response for a request to `api`: its status and an error body in `api`'s shape.
    pub fn into_api_response(self, api: Api) -> Response {
        let refusal = self.into_refusal(api);
        let mut response = (
            refusal.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            refusal.body,
        )
            .into_response();
        if let Some(secs) = refusal.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// The same answer as plain parts, for a transport that is not this gateway's HTTP server
    /// (the endpoint picker's immediate responses).
    pub fn into_refusal(self, api: Api) -> Refusal {
        let retry_after = match &self {
            Self::NoHealthyWorker
            | Self::Overloaded { .. }
            | Self::KeyLimit { .. }
            | Self::Stopping
            | Self::Rejected(_) => Some(1),
            Self::Busy { retry_after } | Self::KeyTokens { retry_after, .. } => {
                Some(whole_secs(*retry_after))
            }
            _ => None,
        };
        Refusal {
            status: self.status(),
            retry_after,
            body: Bytes::from(api.error_body(&self.to_api_error()).to_string()),
        }
    }
}

/// `Retry-After` seconds: rounded up, so a client that waits as told is let in, and at least 1.
fn whole_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

/// An error answer: status, `Retry-After` seconds, and a JSON body in the client API's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status.
    pub status: StatusCode,
    /// When to try again, for refusals that pass.
    pub retry_after: Option<u64>,
    /// The error body (JSON).
    pub body: Bytes,
}

/// The message of an engine's error body (OpenAI's `{"error": {"message"}}`, vLLM's
/// `{"message"}`), else the body as text.
fn engine_message(body: &[u8]) -> String {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = json.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(serde_json::Value::as_str)
    });
    match message {
        Some(m) => format!("engine: {m}"),
        None => format!("engine: {}", String::from_utf8_lossy(body)),
    }
}

impl IntoResponse for GatewayError {
    /// OpenAI's error shape, for the paths that are not a client API (admin, tool events).
    fn into_response(self) -> Response {
        self.into_api_response(Api::ChatCompletions)
    }
}

impl From<crate::fleet::FleetError> for GatewayError {
    fn from(error: crate::fleet::FleetError) -> Self {
        use crate::config::ConfigError;
        use crate::fleet::FleetError;
        match error {
            FleetError::Invalid(ConfigError::Invalid(message)) => Self::BadRequest(message),
            FleetError::Invalid(e) => Self::BadRequest(e.to_string()),
            FleetError::Unknown { url } => Self::UnknownWorker { url },
            e @ (FleetError::Owned { .. }
            | FleetError::Exists { .. }
            | FleetError::Duplicate { .. }) => Self::Conflict(e.to_string()),
        }
    }
}

impl From<switchyard_core::router::RouteError> for GatewayError {
    fn from(error: switchyard_core::router::RouteError) -> Self {
        use switchyard_core::router::RouteError;
        match error {
            RouteError::NoHealthyWorker => Self::NoHealthyWorker,
            RouteError::Rejected { reason } => Self::Rejected(reason),
            e @ RouteError::BadSelection { .. } => Self::Internal(e.to_string()),
        }
    }
}
