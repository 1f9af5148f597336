//! The HTTP service (axum): `/v1/exists`, `/v1/get`, `/v1/put`, `/v1/info`, plus `/metrics`
//! and `/health`. Every refusal is a 4xx in one JSON shape with its reason; nothing a client
//! sends can panic the service.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::events::{self, EventEndpoints};
use crate::metrics::{self, Refusals};
use crate::protocol::{
    ENTRY_BYTES, ErrorBody, ErrorDetail, ExistsResponse, FrameError, HEADER_BYTES, HashesRequest,
    MAX_TOKENS_PER_BLOCK, OCTET_STREAM, PoolInfo, VERSION_HEADER, VERSIONS, decode_put, encode_get,
};
use crate::store::{OpenError, Pool, PoolConfig, PutError};

/// How many of a get's blocks are missing (the frame says which).
const MISSING: HeaderName = HeaderName::from_static("x-kv-pool-missing");

/// The service's settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Where to listen (port 0: the OS picks).
    pub listen: SocketAddr,
    /// The pool.
    pub pool: PoolConfig,
    /// The bearer token every `/v1` call must carry (`None`: open).
    pub auth_token: Option<String>,
    /// The events' PUB endpoint (`None`: no events).
    pub events_endpoint: Option<String>,
    /// The events' replay ROUTER endpoint.
    pub replay_endpoint: Option<String>,
    /// TLS on the listener (`None`: plain HTTP).
    pub tls: Option<switchyard_tls::ServerTls>,
}

/// The service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The pool cannot be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The event sockets cannot be bound.
    #[error("kv pool events: {0}")]
    Events(#[from] switchyard_kv_events::Error),
    /// The listener cannot be bound.
    #[error("kv pool listener: {0}")]
    Io(#[from] io::Error),
    /// The listener's certificate, key or client CA cannot be used.
    #[error("kv pool TLS: {0}")]
    Tls(#[from] switchyard_tls::TlsError),
}

/// A running service.
#[derive(Debug)]
pub struct PoolService {
    addr: SocketAddr,
    https: bool,
    events: Option<EventEndpoints>,
    pool: Arc<Pool>,
    server: JoinHandle<io::Result<()>>,
    events_task: Option<JoinHandle<()>>,
}

impl PoolService {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`, or `https://addr` with TLS.
    pub fn base_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The event sockets, if publishing.
    pub fn events(&self) -> Option<&EventEndpoints> {
        self.events.as_ref()
    }

    /// The pool behind it (tests audit it).
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Wait until the service has stopped (its shutdown token was cancelled), the last
    /// events published and the ports released.
    pub async fn stopped(self) -> io::Result<()> {
        let served = self.server.await.map_err(io::Error::other)?;
        self.pool.close_events();
        if let Some(task) = self.events_task {
            task.await.map_err(io::Error::other)?;
        }
        served
    }
}

/// Open the pool, bind the sockets and serve until `shutdown` is cancelled.
pub async fn spawn(
    config: ServiceConfig,
    shutdown: CancellationToken,
) -> Result<PoolService, ServeError> {
    let (sender, endpoints, events_task) = match &config.events_endpoint {
        Some(endpoint) => {
            let (sender, endpoints, task) =
                events::start(endpoint, config.replay_endpoint.as_deref()).await?;
            (Some(sender), Some(endpoints), Some(task))
        }
        None => (None, None, None),
    };
    let pool = Arc::new(Pool::open(config.pool.clone(), sender)?);
    let adopted = pool.counters().adopted;
    if adopted > 0 {
        tracing::info!(blocks = adopted, "disk blocks kept from an earlier run");
    }
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let refusals = Arc::new(Refusals::default());
    let state = Arc::new(AppState {
        pool: pool.clone(),
        token: config.auth_token.filter(|t| !t.is_empty()),
        registry: metrics::registry(pool.clone(), refusals.clone()),
        refusals,
        limits: Limits::of(&config.pool),
    });
    let app = router(state);
    let stopping = shutdown.cancelled_owned();
    let server = match &config.tls {
        Some(tls) => serve(
            switchyard_tls::TlsListener::new(listener, tls)?,
            app,
            stopping,
        ),
        None => serve(listener, app, stopping),
    };
    Ok(PoolService {
        addr,
        https: config.tls.is_some(),
        events: endpoints,
        pool,
        server,
        events_task,
    })
}

/// Serve `app` on `listener` (plain or TLS) until `stopping` resolves.
fn serve<L>(
    listener: L,
    app: axum::Router,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stopping)
            .await
    })
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    block_bytes: usize,
    max_batch_blocks: usize,
    max_exists_hashes: usize,
    put_body: usize,
}

impl Limits {
    fn of(pool: &PoolConfig) -> Limits {
        let per_block = ENTRY_BYTES + 4 * MAX_TOKENS_PER_BLOCK + pool.block_bytes;
        Limits {
            block_bytes: pool.block_bytes,
            max_batch_blocks: pool.max_batch_blocks,
            max_exists_hashes: pool.max_exists_hashes,
            put_body: HEADER_BYTES.saturating_add(pool.max_batch_blocks.saturating_mul(per_block)),
        }
    }

    /// JSON hash lists: a u64 is at most 20 digits and a comma.
    fn json_body(&self, hashes: usize) -> usize {
        hashes.saturating_mul(21).saturating_add(256)
    }
}

#[derive(Debug)]
struct AppState {
    pool: Arc<Pool>,
    token: Option<String>,
    registry: Registry,
    refusals: Arc<Refusals>,
    limits: Limits,
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_page))
        .route("/v1/info", get(info))
        .route("/v1/exists", post(exists))
        .route("/v1/get", post(get_blocks))
        .route("/v1/put", post(put))
        .fallback(fallback)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

/// A refusal (or, rarely, a failure) in the one error shape.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    supported: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            supported: false,
        }
    }

    fn unsupported_version(message: String) -> ApiError {
        ApiError {
            supported: true,
            ..ApiError::new(StatusCode::BAD_REQUEST, "unsupported_version", message)
        }
    }

    fn too_large(message: String) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "batch_too_large", message)
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.to_owned(),
                message: self.message,
                supported: self
                    .supported
                    .then(|| VERSIONS.iter().map(|v| (*v).to_owned()).collect()),
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<FrameError> for ApiError {
    fn from(error: FrameError) -> ApiError {
        let message = error.to_string();
        match error {
            FrameError::WrongBlockSize { .. } | FrameError::BlockLength { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "wrong_block_size", message)
            }
            FrameError::UnsupportedVersion { .. } => ApiError::unsupported_version(message),
            FrameError::TooManyBlocks { .. } | FrameError::TooManyTokens { .. } => {
                ApiError::too_large(message)
            }
            FrameError::BadMagic { .. }
            | FrameError::BadLength { .. }
            | FrameError::BadPriority { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_frame", message)
            }
        }
    }
}

impl AppState {
    /// Count a refusal on its way out.
    fn refuse(&self, error: ApiError) -> ApiError {
        if error.status.is_client_error() {
            self.refusals.count(error.kind);
        }
        error
    }

    /// The bearer token, compared in constant time; then the version header, if sent.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        self.check_token(headers)?;
        match headers.get(VERSION_HEADER).map(|v| v.to_str()) {
            None => Ok(()),
            Some(Ok(version)) if VERSIONS.contains(&format!("v{version}").as_str()) => Ok(()),
            Some(version) => Err(ApiError::unsupported_version(format!(
                "{VERSION_HEADER}: {} is not supported (supported: {})",
                version.unwrap_or("(not text)"),
                VERSIONS.join(", ")
            ))),
        }
    }

    fn check_token(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(given) = given else {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this pool needs `Authorization: Bearer <token>`",
            ));
        };
        use subtle::ConstantTimeEq;
        if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the bearer token is not this pool's",
            ))
        }
    }
}

/// The body, refused with 413 past `limit` bytes (by its declared length, before reading it).
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit as u64
    {
        return Err(ApiError::too_large(format!(
            "body of {declared} bytes is over this call's bound of {limit}"
        )));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => Err(
            ApiError::too_large(format!("body is over this call's bound of {limit} bytes")),
        ),
        Err(error) => Err(ApiError::bad_request(format!("reading the body: {error}"))),
    }
}

async fn hashes_request(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    max: usize,
) -> Result<HashesRequest, ApiError> {
    let bytes = read_body(headers, body, state.limits.json_body(max)).await?;
    let request: HashesRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!("body is not {{\"hashes\": [u64, ...]}}: {e}"))
    })?;
    if request.hashes.len() > max {
        return Err(ApiError::too_large(format!(
            "{} hashes in one call, at most {max}",
            request.hashes.len()
        )));
    }
    Ok(request)
}

/// Run a pool call off the async threads (disk reads and writes block).
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(call).await.map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("pool call failed: {error}"),
        )
    })
}

async fn health() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

async fn metrics_page(State(state): State<Arc<AppState>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            [(
                CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn info(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    state.authorize(&headers).map_err(|e| state.refuse(e))?;
    let config = state.pool.config();
    Ok(axum::Json(PoolInfo {
        versions: VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        block_bytes: config.block_bytes as u64,
        memory_blocks: config.memory_blocks as u64,
        disk_blocks: config.disk.as_ref().map_or(0, |d| d.blocks as u64),
        max_batch_blocks: config.max_batch_blocks as u64,
        max_exists_hashes: config.max_exists_hashes as u64,
    })
    .into_response())
}

async fn exists(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<ExistsResponse>, ApiError> {
    let run = async {
        state.authorize(&headers)?;
        let request =
            hashes_request(&state, &headers, body, state.limits.max_exists_hashes).await?;
        let pool = state.pool.clone();
        let present = blocking(move || pool.exists(&request.hashes)).await?;
        Ok(axum::Json(ExistsResponse { present }))
    };
    run.await.map_err(|e| state.refuse(e))
}

async fn get_blocks(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let run = async {
        state.authorize(&headers)?;
        let request = hashes_request(&state, &headers, body, state.limits.max_batch_blocks).await?;
        let expected = state.limits.block_bytes as u64;
        match request.block_bytes {
            Some(got) if got == expected => {}
            Some(got) => {
                return Err(FrameError::WrongBlockSize { expected, got }.into());
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "a get names its block size: \"block_bytes\": {expected}"
                )));
            }
        }
        let pool = state.pool.clone();
        let hashes = request.hashes;
        let blocks = blocking(move || pool.get(&hashes)).await?;
        let missing = blocks.iter().filter(|b| b.is_none()).count();
        let frame = encode_get(&blocks, state.limits.block_bytes as u32);
        Ok((
            [
                (CONTENT_TYPE, HeaderValue::from_static(OCTET_STREAM)),
                (MISSING, HeaderValue::from(missing)),
            ],
            frame,
        )
            .into_response())
    };
    run.await.map_err(|e| state.refuse(e))
}

async fn put(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let run = async {
        state.authorize(&headers)?;
        let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
        if content_type.is_some_and(|t| t != OCTET_STREAM) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("a put body is a binary frame ({OCTET_STREAM}), not {content_type:?}"),
            ));
        }
        let frame = read_body(&headers, body, state.limits.put_body).await?;
        let blocks = decode_put(
            frame,
            state.limits.block_bytes as u64,
            state.limits.max_batch_blocks,
        )?;
        let pool = state.pool.clone();
        let summary = blocking(move || pool.put(&blocks)).await?;
        match summary {
            Ok(summary) => Ok(axum::Json(summary).into_response()),
            Err(error @ PutError::WrongBlockSize { .. }) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "wrong_block_size",
                error.to_string(),
            )),
            Err(error @ PutError::Retention { .. }) => {
                Err(ApiError::bad_request(error.to_string()))
            }
            Err(error @ PutError::Storage { .. }) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "storage",
                error.to_string(),
            )),
        }
    };
    run.await.map_err(|e| state.refuse(e))
}

/// Unknown paths: another version is refused with the versions that exist.
async fn fallback(State(state): State<Arc<AppState>>, headers: HeaderMap, uri: Uri) -> ApiError {
    if let Err(error) = state.authorize(&headers) {
        return state.refuse(error);
    }
    let first = uri
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    let versioned = first
        .strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let error = if versioned && !VERSIONS.contains(&first) {
        ApiError::unsupported_version(format!(
            "protocol version {first} is not supported (supported: {})",
            VERSIONS.join(", ")
        ))
    } else {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such call: {}", uri.path()),
        )
    };
    state.refuse(error)
}

/// A known path with the wrong method, in the one error shape.
async fn wrong_method(State(state): State<Arc<AppState>>, uri: Uri) -> ApiError {
    let method = if uri.path().starts_with("/v1/info") || !uri.path().starts_with("/v1/") {
        "GET"
    } else {
        "POST"
    };
    state.refuse(ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} takes {method}", uri.path()),
    ))
}
