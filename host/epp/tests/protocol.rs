//! The picker's side of the ext_proc protocol, driven by a gRPC client as Envoy drives it: what
//! it lets through unpicked, and what it refuses before picking (the Envoy end to end is in
//! tests/integration/epp.rs).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, body_mutation::Mutation,
    processing_request::Request, processing_response::Response,
};
use switchyard_gateway::config::{Config, RawConfig};
use tokio_util::sync::CancellationToken;

/// A picker over one worker that nothing answers on (nothing here gets as far as routing).
async fn picker() -> (String, CancellationToken) {
    let raw: RawConfig = toml::from_str(
        "[server]\nport = 0\nmax_body_bytes = 1024\n[[workers]]\nurl = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let tokenizer = switchyard_tokenizer::ModelTokenizer::embedded_default().unwrap();
    let stop = CancellationToken::new();
    let gateway =
        switchyard_gateway::start(Config::try_from(raw).unwrap(), tokenizer, stop.clone())
            .await
            .unwrap();
    let listener = switchyard_epp::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(switchyard_epp::serve(
        listener,
        gateway.picker(),
        stop.clone(),
    ));
    tokio::spawn(async move { gateway.wait().await });
    (format!("http://{addr}"), stop)
}

fn headers(method: &str, path: &str, end_of_stream: bool) -> ProcessingRequest {
    let header = |key: &str, value: &str| HeaderValue {
        key: key.into(),
        raw_value: value.as_bytes().to_vec(),
        ..HeaderValue::default()
    };
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":method", method),
                    header(":path", path),
                    header("content-type", "application/json"),
                ],
            }),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// Send `messages` on one stream; collect the answers until the picker has said `expect` things.
async fn exchange(
    url: &str,
    messages: Vec<ProcessingRequest>,
    expect: usize,
) -> Vec<ProcessingResponse> {
    let mut client = ExternalProcessorClient::connect(url.to_string())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for m in messages {
        tx.send(m).await.unwrap();
    }
    let mut answers = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while out.len() < expect {
        out.push(answers.message().await.unwrap().expect("an answer"));
    }
    drop(tx);
    out
}

fn immediate_status(answer: &ProcessingResponse) -> (i32, String) {
    match &answer.response {
        Some(Response::ImmediateResponse(r)) => (
            r.status.as_ref().unwrap().code,
            String::from_utf8_lossy(&r.body).into_owned(),
        ),
        other => panic!("not an immediate response: {other:?}"),
    }
}

#[tokio::test]
async fn what_is_not_an_inference_request_goes_on_unpicked_with_its_body() {
    let (url, stop) = picker().await;
    let answers = exchange(&url, vec![headers("GET", "/health", true)], 1).await;
    let Some(Response::RequestHeaders(h)) = &answers[0].response else {
        panic!("{answers:?}");
    };
    let common = h.response.as_ref().unwrap();
    assert!(common.header_mutation.is_none() && !common.clear_route_cache);
    // A POST elsewhere: headers answered at once, body chunks passed back as they come.
    let answers = exchange(
        &url,
        vec![
            headers("POST", "/v1/embeddings", false),
            body(b"{\"input\":", false),
            body(b"\"x\"}", true),
        ],
        3,
    )
    .await;
    assert!(matches!(
        answers[0].response,
        Some(Response::RequestHeaders(_))
    ));
    let chunks: Vec<(Vec<u8>, bool)> = answers[1..]
        .iter()
        .map(|a| match &a.response {
            Some(Response::RequestBody(b)) => {
                match b
                    .response
                    .as_ref()
                    .unwrap()
                    .body_mutation
                    .as_ref()
                    .unwrap()
                    .mutation
                    .as_ref()
                {
                    Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        chunks,
        vec![(b"{\"input\":".to_vec(), false), (b"\"x\"}".to_vec(), true)]
    );
    stop.cancel();
}

#[tokio::test]
async fn bad_requests_are_refused_in_the_apis_own_error_shape() {
    let (url, stop) = picker().await;
    // No body at all.
    let answers = exchange(&url, vec![headers("POST", "/v1/messages", true)], 1).await;
    let (status, text) = immediate_status(&answers[0]);
    assert_eq!(status, 400);
    let error: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["type"], "error", "Anthropic's shape: {text}");
    // Not JSON.
    let answers = exchange(
        &url,
        vec![
            headers("POST", "/v1/chat/completions", false),
            body(b"{oops", true),
        ],
        1,
    )
    .await;
    let (status, text) = immediate_status(&answers[0]);
    assert_eq!(status, 400);
    let error: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        error["error"]["message"].is_string(),
        "OpenAI's shape: {text}"
    );
    // Over `max_body_bytes`, refused as soon as it is, without waiting for the rest.
    let big = vec![b' '; 2048];
    let answers = exchange(
        &url,
        vec![
            headers("POST", "/v1/chat/completions", false),
            body(&big, false),
        ],
        1,
    )
    .await;
    assert_eq!(immediate_status(&answers[0]).0, 413);
    stop.cancel();
}
