//! Engine answers over plain HTTP/1.1, read where they are decoded.
//!
//! A pooled client (reqwest's) runs each engine connection as a task of its own, which hands the
//! answer's body over one chunk per poll and only once the reader asks for the next one. An
//! engine's stream is one chunk per token, so the gateway then relays one client write per token
//! even when the engine sent dozens at once (docs/benchmarks.md (k): 67 writes per 64-token
//! answer, and 42-56 % of the streaming CPU in those writes). Here the task that reads the answer
//! also drives its connection (hyper's `client::conn::http1`), so each read takes every chunk the
//! engine has already sent, as one piece: as many writes as the engine's sends, no waiting, no
//! added latency.
//!
//! Connections are kept per engine (`host:port`) for reuse, up to `max_idle`, for at most
//! [`IDLE_TIMEOUT`]; a kept one that fails before the answer's head is retried once on a new
//! connection (the engine closed it while idle). `https://` engines go through reqwest.

use super::EngineResponse;
use bytes::Bytes;
use futures::{FutureExt, Stream};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::http::{Request, header};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long a kept connection may wait for its next request (reqwest's pool is set the same).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The most bytes one read of an answer gathers before handing them on.
const MAX_GATHER: usize = 64 * 1024;

type Conn = Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

/// One HTTP/1.1 connection to an engine: the request side and the connection's own future, which
/// whoever reads the answer polls.
struct Link {
    sender: SendRequest<Full<Bytes>>,
    conn: Conn,
}

/// Kept connections per engine.
#[derive(Debug)]
pub(crate) struct Http1Pool {
    idle: Mutex<HashMap<String, Vec<(Instant, Link)>>>,
    connect_timeout: Duration,
    max_idle: usize,
    counters: ConnectionCounters,
}

/// Connections the pool opened, and requests it sent on a kept one (`/metrics`): their ratio
/// says whether engines keep connections alive.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionCounters {
    pub(crate) opened: Counter,
    pub(crate) reused: Counter,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").finish_non_exhaustive()
    }
}

/// A request for an engine: where, with which extra headers, and the JSON body.
#[derive(Debug)]
pub(crate) struct EngineRequest {
    /// `host:port` to connect to.
    pub(crate) authority: String,
    /// The `Host` header.
    pub(crate) host: String,
    /// Path and query.
    pub(crate) path: String,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) body: Bytes,
}

impl Http1Pool {
    pub(crate) fn new(
        connect_timeout: Duration,
        max_idle: usize,
        counters: ConnectionCounters,
    ) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(HashMap::new()),
            connect_timeout,
            max_idle,
            counters,
        })
    }

    /// POST `request` and wait for the answer's head, all within `timeout`, which also bounds
    /// reading the body. `Err` when nothing came back (connect error, timeout, a connection
    /// closed before the head).
    pub(crate) async fn post(
        self: &Arc<Self>,
        request: EngineRequest,
        timeout: Duration,
    ) -> Result<EngineResponse, String> {
        let deadline = Instant::now() + timeout;
        let timed_out = |_| format!("no answer from {} in {timeout:?}", request.authority);
        let mut kept = self.take(&request.authority);
        loop {
            let reused = kept.is_some();
            let link = match kept.take() {
                Some(link) => {
                    self.counters.reused.inc();
                    link
                }
                None => {
                    let link = tokio::time::timeout_at(deadline, self.connect(&request.authority))
                        .await
                        .map_err(timed_out)??;
                    self.counters.opened.inc();
                    link
                }
            };
            let head = tokio::time::timeout_at(deadline, send(link, &request)).await;
            match head {
                Ok(Ok((head, link))) => {
                    let content_type = head.headers().get(header::CONTENT_TYPE).cloned();
                    let status = head.status();
                    let body = AnswerBody {
                        body: head.into_body(),
                        link: Some(link),
                        pool: Arc::clone(self),
                        authority: request.authority.clone(),
                        deadline: Box::pin(tokio::time::sleep_until(deadline)),
                        failed: None,
                        done: false,
                    };
                    return Ok(EngineResponse {
                        status,
                        content_type,
                        body: Box::pin(body),
                    });
                }
                // A kept connection the engine closed while it was idle: once more, afresh.
                Ok(Err(_)) if reused => {}
                Ok(Err(error)) => return Err(error),
                Err(elapsed) => return Err(timed_out(elapsed)),
            }
        }
    }

    async fn connect(&self, authority: &str) -> Result<Link, String> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(authority))
            .await
            .map_err(|_| format!("connecting to {authority}: timed out"))?
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        // Small writes (a request, then nothing) must not wait for an acknowledgement.
        stream
            .set_nodelay(true)
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        Ok(Link {
            sender,
            conn: Box::pin(conn),
        })
    }

    /// A kept connection to `authority` that is still open, if any.
    fn take(&self, authority: &str) -> Option<Link> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let kept = idle.get_mut(authority)?;
        while let Some((since, mut link)) = kept.pop() {
            // Polling the connection once notices an engine that closed it meanwhile.
            if since.elapsed() < IDLE_TIMEOUT
                && (&mut link.conn).now_or_never().is_none()
                && !link.sender.is_closed()
            {
                return Some(link);
            }
        }
        None
    }

    /// Keep `link` for the next request to `authority`.
    fn give_back(&self, authority: String, link: Link) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let kept = idle.entry(authority).or_default();
        kept.retain(|(since, _)| since.elapsed() < IDLE_TIMEOUT);
        if kept.len() < self.max_idle {
            kept.push((Instant::now(), link));
        }
    }
}

/// Poll a connection's own future once (it reads and writes the socket): `Ok(true)` once it
/// has ended, an error if it failed.
fn poll_conn(conn: &mut Conn, cx: &mut Context<'_>) -> Result<bool, String> {
    match conn.as_mut().poll(cx) {
        Poll::Pending => Ok(false),
        Poll::Ready(result) => result
            .map(|()| true)
            .map_err(|e| format!("engine connection: {e}")),
    }
}

/// Send `request` on `link`, driving the connection until the answer's head arrives.
async fn send(
    link: Link,
    request: &EngineRequest,
) -> Result<(hyper::Response<Incoming>, Link), String> {
    let mut builder = Request::post(request.path.as_str())
        .header(header::HOST, request.host.as_str())
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in &request.headers {
        builder = builder.header(*name, value.as_str());
    }
    let message = builder
        .body(Full::new(request.body.clone()))
        .map_err(|e| format!("building the engine request: {e}"))?;
    let Link {
        mut sender,
        mut conn,
    } = link;
    // The connection makes progress only when polled: here, alongside the request. Once it
    // ended, the request's own future says how, unless it failed.
    let mut closed = false;
    let mut drive = |conn: &mut Conn, cx: &mut Context<'_>| -> Result<(), String> {
        if !closed {
            closed = poll_conn(conn, cx)?;
        }
        Ok(())
    };
    poll_fn(|cx| {
        drive(&mut conn, cx)?;
        sender
            .poll_ready(cx)
            .map_err(|e| format!("engine connection: {e}"))
    })
    .await?;
    let answer = sender.try_send_request(message);
    let mut answer = std::pin::pin!(answer);
    let head = poll_fn(|cx| {
        drive(&mut conn, cx)?;
        answer
            .as_mut()
            .poll(cx)
            .map_err(|e| format!("engine request: {}", e.error()))
    })
    .await?;
    Ok((head, Link { sender, conn }))
}

/// An answer's body, read by polling its connection too, so that one read takes every chunk the
/// engine has sent so far. At its end the connection is kept for the next request.
struct AnswerBody {
    body: Incoming,
    /// `None` once the connection ended or went back to the pool.
    link: Option<Link>,
    pool: Arc<Http1Pool>,
    authority: String,
    deadline: Pin<Box<Sleep>>,
    /// An error that came after some bytes: given on the next read.
    failed: Option<String>,
    done: bool,
}

impl AnswerBody {
    /// Drive the connection: it reads the socket and hands the body what it has decoded.
    fn drive(&mut self, cx: &mut Context<'_>) -> Result<(), String> {
        if let Some(link) = &mut self.link {
            let ended = poll_conn(&mut link.conn, cx);
            if !matches!(ended, Ok(false)) {
                self.link = None;
            }
            ended?;
        }
        Ok(())
    }

    /// The answer ended whole: keep the connection if it can take another request.
    fn finish(&mut self, cx: &mut Context<'_>) {
        self.done = true;
        if let Some(mut link) = self.link.take() {
            // Let the connection see the end of the message, then ask whether it is ready.
            if link.conn.as_mut().poll(cx).is_pending()
                && matches!(link.sender.poll_ready(cx), Poll::Ready(Ok(())))
            {
                self.pool
                    .give_back(std::mem::take(&mut self.authority), link);
            }
        }
    }
}

impl Stream for AnswerBody {
    type Item = Result<Bytes, String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(error) = this.failed.take() {
            this.done = true;
            return Poll::Ready(Some(Err(error)));
        }
        if this.done {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            this.link = None;
            return Poll::Ready(Some(Err(
                "the engine's answer outlasted the request timeout".into(),
            )));
        }
        let mut pieces: Vec<Bytes> = Vec::new();
        let mut size = 0;
        // After the body says "nothing yet", the connection gets one more turn: the body's ask
        // for more is what lets it hand over the next chunk it already holds.
        let mut retried = false;
        let failure = loop {
            if let Err(error) = this.drive(cx) {
                break Some(error);
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    retried = false;
                    if let Ok(data) = frame.into_data() {
                        size += data.len();
                        pieces.push(data);
                        if size >= MAX_GATHER {
                            break None;
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => break Some(format!("engine answer: {e}")),
                Poll::Ready(None) => {
                    this.finish(cx);
                    break None;
                }
                Poll::Pending if !retried && this.link.is_some() => retried = true,
                Poll::Pending => break None,
            }
        };
        let piece = match pieces.len() {
            0 | 1 => pieces.pop(),
            _ => Some(Bytes::from(pieces.concat())),
        };
        match (piece, failure) {
            (Some(piece), failure) => {
                this.failed = failure;
                Poll::Ready(Some(Ok(piece)))
            }
            (None, Some(error)) => {
                this.done = true;
                this.link = None;
                Poll::Ready(Some(Err(error)))
            }
            (None, None) if this.done => Poll::Ready(None),
            // Both the connection and the body registered this task's waker.
            (None, None) => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn event(i: usize) -> String {
        format!("data: {{\"i\": {i}}}\n\n")
    }

    /// An engine on 127.0.0.1 that answers every request with `events` server-sent events as
    /// chunked HTTP/1.1, each written (and sent) on its own, and closes the connection after each
    /// answer if `close`; the connections it accepted.
    async fn engine(events: usize, close: bool) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    socket.set_nodelay(true).unwrap();
                    while read_request(&mut socket).await {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                    transfer-encoding: chunked\r\n\r\n";
                        socket.write_all(head.as_bytes()).await.unwrap();
                        for i in 0..events {
                            let data = event(i);
                            let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                            socket.write_all(chunk.as_bytes()).await.unwrap();
                        }
                        socket.write_all(b"0\r\n\r\n").await.unwrap();
                        if close {
                            return;
                        }
                    }
                });
            }
        });
        (authority, accepted)
    }

    /// Read one request (head and `content-length` body); `false` at the end of the connection.
    async fn read_request(socket: &mut TcpStream) -> bool {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            match socket.read(&mut byte).await {
                Ok(1) => buf.push(byte[0]),
                _ => return false,
            }
        }
        let head = String::from_utf8_lossy(&buf).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        socket.read_exact(&mut body).await.is_ok()
    }

    fn request(authority: &str) -> EngineRequest {
        EngineRequest {
            authority: authority.to_owned(),
            host: authority.to_owned(),
            path: "/v1/chat/completions".into(),
            headers: vec![("x-data-parallel-rank", "1".into())],
            body: Bytes::from_static(b"{\"stream\": true}"),
        }
    }

    /// One answer's text, and how many pieces it came in.
    async fn read_all(response: EngineResponse) -> (String, usize) {
        let mut body = response.body;
        let (mut text, mut pieces) = (Vec::new(), 0);
        while let Some(piece) = body.next().await {
            text.extend_from_slice(&piece.unwrap());
            pieces += 1;
        }
        (String::from_utf8(text).unwrap(), pieces)
    }

    /// The test request's answer.
    async fn ask(pool: &Arc<Http1Pool>, authority: &str) -> EngineResponse {
        let answer = pool.post(request(authority), Duration::from_secs(10)).await;
        answer.unwrap()
    }

    fn pool() -> Arc<Http1Pool> {
        Http1Pool::new(Duration::from_secs(5), 8, ConnectionCounters::default())
    }

    fn expected(events: usize) -> String {
        (0..events).map(event).collect()
    }

    #[tokio::test]
    async fn a_read_takes_every_chunk_already_sent_and_the_connection_is_reused() {
        let (authority, accepted) = engine(64, false).await;
        let pool = pool();
        for _ in 0..3 {
            let response = ask(&pool, &authority).await;
            assert_eq!(response.status, hyper::StatusCode::OK);
            assert_eq!(response.content_type.as_ref().unwrap(), "text/event-stream");
            // Let the engine's 64 chunks all arrive before the first read.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (text, pieces) = read_all(response).await;
            assert_eq!(text, expected(64));
            assert!(pieces <= 2, "{pieces} pieces");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection, reused");
        assert_eq!(
            (pool.counters.opened.get(), pool.counters.reused.get()),
            (1, 2)
        );
    }

    /// A 100K-token prompt's body is hundreds of KB: the connection, driven alongside the
    /// request, writes all of it before the engine answers.
    #[tokio::test]
    async fn a_large_body_goes_out_whole() {
        let (authority, _) = engine(2, false).await;
        let pool = pool();
        let mut large = request(&authority);
        large.body = Bytes::from(vec![b' '; 4 << 20]);
        let response = pool.post(large, Duration::from_secs(30)).await.unwrap();
        assert_eq!(read_all(response).await.0, expected(2));
    }

    #[tokio::test]
    async fn a_connection_the_engine_closed_is_replaced() {
        let (authority, accepted) = engine(3, true).await;
        let pool = pool();
        for _ in 0..3 {
            let response = ask(&pool, &authority).await;
            assert_eq!(read_all(response).await.0, expected(3));
            // The engine's close reaches the client before the next request.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.counters.opened.get(), 3);
    }

    #[tokio::test]
    async fn no_engine_is_an_error_and_a_slow_one_times_out() {
        let pool = pool();
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = closed.local_addr().unwrap().to_string();
        drop(closed);
        let error = pool
            .post(request(&authority), Duration::from_secs(5))
            .await
            .err()
            .unwrap();
        assert!(error.contains("connecting"), "{error}");

        // An engine that accepts and never answers.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = silent.local_addr().unwrap().to_string();
        let error = pool
            .post(request(&authority), Duration::from_millis(200))
            .await
            .err()
            .unwrap();
        assert!(error.contains("no answer"), "{error}");
        drop(silent);
    }
}
