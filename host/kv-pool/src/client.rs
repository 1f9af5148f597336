//! The async client engines use. It needs only reqwest: the server's dependencies are behind
//! the crate's `server` feature.
//!
//! An engine reads a [`PoolError`] one way: [`PoolError::is_unavailable`] (unreachable, timed
//! out, a server error) means recompute and count it; a refusal is a bug in the request (wrong
//! block size, bad token) that retrying will not fix.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use switchyard_tls::ClientTls;

use crate::protocol::{
    ErrorBody, ExistsResponse, FrameError, HashesRequest, OCTET_STREAM, PoolInfo, PutBlock,
    PutSummary, VERSION_HEADER, decode_get, encode_put,
};

/// Why a pool call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The pool could not be reached (connection refused, reset, DNS).
    #[error("kv pool unreachable: {0}")]
    Unreachable(String),
    /// The pool did not answer within the client's timeout.
    #[error("kv pool did not answer within {0:?}")]
    Timeout(Duration),
    /// The pool refused the request (4xx), with its reason.
    #[error("kv pool refused the request ({status}, {kind}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The error's `type`.
        kind: String,
        /// The error's `message`.
        message: String,
    },
    /// The pool failed (5xx).
    #[error("kv pool failed ({status}): {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// What it said.
        message: String,
    },
    /// The request could not be encoded, or the answer is not what the protocol says.
    #[error("kv pool protocol: {0}")]
    Protocol(String),
}

impl PoolError {
    /// Whether the engine should just recompute (the pool is down, slow or failing), as
    /// opposed to a request the pool will always refuse.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            PoolError::Unreachable(_) | PoolError::Timeout(_) | PoolError::Server { .. }
        )
    }
}

impl From<FrameError> for PoolError {
    fn from(error: FrameError) -> Self {
        PoolError::Protocol(error.to_string())
    }
}

/// A client of one pool.
#[derive(Debug, Clone)]
pub struct PoolClient {
    http: reqwest::Client,
    base: String,
    block_bytes: u32,
    token: Option<String>,
    timeout: Duration,
    max_batch: usize,
}

/// The default per-call timeout: a pool slower than this loses to recompute anyway.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Blocks per put or get request unless told otherwise: the service's default bound.
pub const DEFAULT_MAX_BATCH: usize = 64;
/// Hashes per exists request: the service's bound.
const MAX_EXISTS: usize = 16_384;

impl PoolClient {
    /// A client of the pool at `base_url` (`http://host:port`, or `https://` verified against
    /// the system's roots) whose blocks are `block_bytes`.
    pub fn new(base_url: &str, block_bytes: u32) -> Result<PoolClient, PoolError> {
        PoolClient::with_tls(base_url, block_bytes, &ClientTls::default())
    }

    /// Like [`PoolClient::new`], an `https://` pool also verified against `tls.ca_file` (a
    /// pool whose certificate a private CA signed), presenting `tls.identity` to a pool that
    /// asks for a client certificate.
    pub fn with_tls(
        base_url: &str,
        block_bytes: u32,
        tls: &ClientTls,
    ) -> Result<PoolClient, PoolError> {
        let builder = tls
            .apply(reqwest::Client::builder())
            .map_err(|e| PoolError::Protocol(format!("tls: {e}")))?;
        let http = builder
            .build()
            .map_err(|e| PoolError::Protocol(e.to_string()))?;
        Ok(PoolClient {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            block_bytes,
            token: None,
            timeout: DEFAULT_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
        })
    }

    /// Send `token` as a bearer token.
    pub fn with_token(mut self, token: impl Into<String>) -> PoolClient {
        self.token = Some(token.into());
        self
    }

    /// Give up on a call after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> PoolClient {
        self.timeout = timeout;
        self
    }

    /// Send at most `blocks` per put or get request (the pool's `max_batch_blocks`, see
    /// [`PoolClient::info`]); longer calls are split, in order.
    pub fn with_max_batch(mut self, blocks: usize) -> PoolClient {
        self.max_batch = blocks.max(1);
        self
    }

    /// The block size this client speaks.
    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// Which of `hashes` the pool holds, in order.
    pub async fn exists(&self, hashes: &[u64]) -> Result<Vec<bool>, PoolError> {
        let mut present = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(MAX_EXISTS) {
            let body = HashesRequest {
                hashes: chunk.to_vec(),
                block_bytes: None,
            };
            let response = self.send(self.post("exists").json(&body)).await?;
            let answer: ExistsResponse = response.json().await.map_err(|e| self.transport(e))?;
            if answer.present.len() != chunk.len() {
                return Err(PoolError::Protocol(format!(
                    "{} answers for {} hashes",
                    answer.present.len(),
                    chunk.len()
                )));
            }
            present.extend(answer.present);
        }
        Ok(present)
    }

    /// The bytes of each of `hashes` the pool holds (`None`: missing), in order.
    pub async fn get(&self, hashes: &[u64]) -> Result<Vec<Option<Bytes>>, PoolError> {
        let mut blocks = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(self.max_batch) {
            let body = HashesRequest {
                hashes: chunk.to_vec(),
                block_bytes: Some(self.block_bytes.into()),
            };
            let response = self.send(self.post("get").json(&body)).await?;
            let frame = response.bytes().await.map_err(|e| self.transport(e))?;
            blocks.extend(decode_get(frame, self.block_bytes.into(), chunk.len())?);
        }
        Ok(blocks)
    }

    /// Write `blocks` (idempotent: blocks already there are touched and counted as
    /// duplicates). A call split in several requests may fail after its first ones stored.
    pub async fn put(&self, blocks: &[PutBlock]) -> Result<PutSummary, PoolError> {
        let mut summary = PutSummary {
            stored: 0,
            duplicates: 0,
            results: Vec::with_capacity(blocks.len()),
        };
        for chunk in blocks.chunks(self.max_batch) {
            let frame = encode_put(chunk, self.block_bytes)?;
            let request = self
                .post("put")
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body(frame);
            let response = self.send(request).await?;
            let part: PutSummary = response.json().await.map_err(|e| self.transport(e))?;
            summary.stored += part.stored;
            summary.duplicates += part.duplicates;
            summary.results.extend(part.results);
        }
        Ok(summary)
    }

    /// The pool's block size, capacities and bounds.
    pub async fn info(&self) -> Result<PoolInfo, PoolError> {
        let request = self.authorized(self.http.get(format!("{}/v1/info", self.base)));
        let response = self.send(request).await?;
        response.json().await.map_err(|e| self.transport(e))
    }

    fn post(&self, call: &str) -> reqwest::RequestBuilder {
        self.authorized(self.http.post(format!("{}/v1/{call}", self.base)))
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.timeout(self.timeout).header(VERSION_HEADER, "1");
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, PoolError> {
        let response = request.send().await.map_err(|e| self.transport(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        if status.is_server_error() {
            return Err(PoolError::Server {
                status: status.as_u16(),
                message: text,
            });
        }
        Err(refusal(status, &text))
    }

    fn transport(&self, error: reqwest::Error) -> PoolError {
        if error.is_timeout() {
            PoolError::Timeout(self.timeout)
        } else if error.is_decode() {
            PoolError::Protocol(error.to_string())
        } else {
            PoolError::Unreachable(error.to_string())
        }
    }
}

fn refusal(status: StatusCode, text: &str) -> PoolError {
    match serde_json::from_str::<ErrorBody>(text) {
        Ok(body) => PoolError::Refused {
            status: status.as_u16(),
            kind: body.error.kind,
            message: body.error.message,
        },
        Err(_) => PoolError::Refused {
            status: status.as_u16(),
            kind: "unknown".into(),
            message: text.to_owned(),
        },
    }
}
