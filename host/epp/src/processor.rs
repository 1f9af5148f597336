//! One ext_proc stream per HTTP request: collect the body, pick, stream the body back, then
//! watch the response go by (a streamed answer's first byte: prefill done, unless the engine's
//! KV events said so earlier, as they do for an answer that does not stream, or the rank's
//! learnt prefill pace; end: the booking is released).

use crate::envoy;
use crate::{DESTINATION_ENDPOINT, DESTINATION_SERVED};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, processing_request::Request,
};
use futures::Stream;
use std::pin::Pin as Boxed;
use std::time::Duration;
use switchyard_frontend::Api;
use switchyard_gateway::error::{GatewayError, Refusal};
use switchyard_gateway::proxy::{Pick, Picker};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

/// How often a pick that is still waiting asks Envoy for more time, and how much.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(5);
const KEEPALIVE_EXTENDS: Duration = Duration::from_secs(20);
/// The largest body chunk sent back in one message.
const BODY_CHUNK_BYTES: usize = 1 << 20;

/// The ext_proc service.
#[derive(Debug, Clone)]
pub struct Processor {
    picker: Picker,
}

impl Processor {
    /// Serve ext_proc with `picker`'s decisions.
    pub fn new(picker: Picker) -> Self {
        Self { picker }
    }
}

type Answers = Boxed<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let exchange = Exchange {
            picker: self.picker.clone(),
            state: State::Headers,
            out: tx,
        };
        tokio::spawn(exchange.run(request.into_inner()));
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Where a request stands.
enum State {
    /// Waiting for the request headers.
    Headers,
    /// An inference request: its body so far, until the pick.
    Collecting {
        headers: http::HeaderMap,
        api: Api,
        subset: Option<Vec<String>>,
        body: Vec<u8>,
    },
    /// Picked (or let through unpicked): its response is watched. Boxed: a pick is large.
    Forwarded(Option<Box<Pick>>),
}

/// One request's exchange with the proxy.
struct Exchange {
    picker: Picker,
    state: State,
    out: mpsc::Sender<Result<ProcessingResponse, Status>>,
}

/// The proxy went away (it closes the stream when the request ends or is reset).
struct Closed;

impl Exchange {
    async fn run(mut self, mut requests: Streaming<ProcessingRequest>) {
        loop {
            let message = match requests.message().await {
                Ok(Some(message)) => message,
                // The request ended or was reset: dropping `self` releases its booking.
                Ok(None) | Err(_) => return,
            };
            if self.handle(message).await.is_err() {
                return;
            }
        }
    }

    async fn send(&self, answer: ProcessingResponse) -> Result<(), Closed> {
        self.out.send(Ok(answer)).await.map_err(|_| Closed)
    }

    async fn handle(&mut self, message: ProcessingRequest) -> Result<(), Closed> {
        let metadata = message.metadata_context.as_ref();
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                let subset = envoy::subset(metadata);
                self.request_headers(headers, subset).await
            }
            Some(Request::RequestBody(body)) => self.request_body(body).await,
            Some(Request::RequestTrailers(_)) => self.send(envoy::trailers(true)).await,
            Some(Request::ResponseHeaders(headers)) => self.response_headers(&headers).await,
            Some(Request::ResponseBody(body)) => self.response_body(body).await,
            Some(Request::ResponseTrailers(_)) => self.send(envoy::trailers(false)).await,
            None => Ok(()),
        }
    }

    async fn request_headers(
        &mut self,
        headers: HttpHeaders,
        subset: Option<Vec<String>>,
    ) -> Result<(), Closed> {
        let map = envoy::header_map(headers.headers.as_ref());
        let post = envoy::pseudo(&map, "method") == Some("POST");
        let api = envoy::pseudo(&map, "path").and_then(Picker::api);
        match api {
            // The headers are answered once the body is in and the pick made.
            Some(api) if post && !headers.end_of_stream => {
                self.state = State::Collecting {
                    headers: map,
                    api,
                    subset,
                    body: Vec::new(),
                };
                Ok(())
            }
            Some(api) if post => {
                let refusal =
                    GatewayError::BadRequest("the request has no body".into()).into_refusal(api);
                self.send(envoy::immediate(refusal)).await
            }
            // Not an inference request: on unpicked.
            _ => {
                self.state = State::Forwarded(None);
                self.send(envoy::request_headers(&[])).await
            }
        }
    }

    async fn request_body(&mut self, chunk: HttpBody) -> Result<(), Closed> {
        let State::Collecting { body, api, .. } = &mut self.state else {
            // Unpicked requests' bodies go on as they come.
            return self
                .send(envoy::body_chunk(true, chunk.body, chunk.end_of_stream))
                .await;
        };
        let limit = self.picker.max_body_bytes();
        if body.len() + chunk.body.len() > limit {
            let refusal = GatewayError::TooLarge { limit }.into_refusal(*api);
            self.state = State::Forwarded(None);
            return self.send(envoy::immediate(refusal)).await;
        }
        body.extend_from_slice(&chunk.body);
        if !chunk.end_of_stream {
            return Ok(());
        }
        let State::Collecting {
            headers,
            api,
            subset,
            body,
        } = std::mem::replace(&mut self.state, State::Forwarded(None))
        else {
            return Ok(());
        };
        match self.pick(api, &headers, &body, subset.as_deref()).await? {
            Ok(pick) => {
                let answer = match &pick {
                    Some(pick) => {
                        let endpoints = pick.endpoints.join(",");
                        let mut set = vec![(DESTINATION_ENDPOINT, endpoints.as_str())];
                        set.extend(pick.headers.iter().map(|(k, v)| (*k, v.as_str())));
                        let mut answer = envoy::request_headers(&set);
                        answer.dynamic_metadata =
                            Some(envoy::lb_metadata(DESTINATION_ENDPOINT, &endpoints));
                        answer
                    }
                    None => envoy::request_headers(&[]),
                };
                self.state = State::Forwarded(pick.map(Box::new));
                self.send(answer).await?;
                // Back in bounded messages: gRPC peers cap message sizes (4 MiB by default).
                let mut chunks = body.chunks(BODY_CHUNK_BYTES).peekable();
                while let Some(chunk) = chunks.next() {
                    let last = chunks.peek().is_none();
                    self.send(envoy::body_chunk(true, chunk.to_vec(), last))
                        .await?;
                }
                Ok(())
            }
            Err(refusal) => self.send(envoy::immediate(refusal)).await,
        }
    }

    /// The pick, while telling Envoy to keep waiting: admission may hold a paused program's
    /// request and the router queue a request for a saturated fleet far longer than Envoy's
    /// `message_timeout`.
    async fn pick(
        &self,
        api: Api,
        headers: &http::HeaderMap,
        body: &[u8],
        subset: Option<&[String]>,
    ) -> Result<Result<Option<Pick>, Refusal>, Closed> {
        let pick = self.picker.pick(api, headers, body, subset);
        tokio::pin!(pick);
        let mut keepalive = tokio::time::interval_at(
            tokio::time::Instant::now() + KEEPALIVE_EVERY,
            KEEPALIVE_EVERY,
        );
        loop {
            tokio::select! {
                picked = &mut pick => return Ok(picked),
                _ = keepalive.tick() => self.send(envoy::keep_waiting(KEEPALIVE_EXTENDS)).await?,
            }
        }
    }

    async fn response_headers(&mut self, headers: &HttpHeaders) -> Result<(), Closed> {
        if let State::Forwarded(Some(pick)) = &mut self.state {
            let map = envoy::header_map(headers.headers.as_ref());
            let status = envoy::pseudo(&map, "status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(200);
            let served = map.get(DESTINATION_SERVED).and_then(|v| v.to_str().ok());
            pick.answered(&self.picker, status, served);
            if headers.end_of_stream {
                pick.completed();
            }
        }
        self.send(envoy::response_headers()).await
    }

    async fn response_body(&mut self, chunk: HttpBody) -> Result<(), Closed> {
        if let State::Forwarded(Some(pick)) = &mut self.state {
            pick.first_byte();
            if chunk.end_of_stream {
                pick.completed();
            }
        }
        let end = chunk.end_of_stream;
        self.send(envoy::body_chunk(false, chunk.body, end)).await?;
        if end {
            // The response is done: release the booking now rather than when the stream closes.
            self.state = State::Forwarded(None);
        }
        Ok(())
    }
}
