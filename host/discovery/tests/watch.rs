//! Discovery end to end against a stand-in for the Kubernetes API server: no API server can run
//! on this machine (none installs), so a small HTTP server on 127.0.0.1 answers the two calls
//! the watch makes, as the API server does: the EndpointSlice list (with its resourceVersion),
//! and the watch (`?watch=true&resourceVersion=N`: one JSON line per event, `ADDED`, `MODIFIED`,
//! `DELETED`, or `ERROR` with a `Status` such as 410 Gone, which forces a relist). The real
//! `kube` client and watcher run against it over HTTP.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_gateway::discovery::KubernetesDiscoveryConfig;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What the stand-in holds: the slices, every change since the start (to resume watches from a
/// resourceVersion), the open watches, and what it was asked.
#[derive(Default)]
struct Cluster {
    version: u64,
    slices: BTreeMap<String, Value>,
    changes: Vec<(u64, Value)>,
    watches: Vec<mpsc::UnboundedSender<Bytes>>,
    failing_lists: bool,
    lists: usize,
    queries: Vec<String>,
}

#[derive(Clone)]
struct ApiServer(Arc<Mutex<Cluster>>);

fn line(event: &Value) -> Bytes {
    Bytes::from(format!("{event}\n"))
}

impl ApiServer {
    async fn start() -> (ApiServer, String) {
        let server = ApiServer(Arc::default());
        let app = axum::Router::new()
            .route(
                "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                axum::routing::get(endpointslices),
            )
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (server, url)
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.0.lock().unwrap()
    }

    /// Create or replace a slice, telling every open watch.
    fn apply(&self, slice: Value) {
        let mut cluster = self.cluster();
        cluster.version += 1;
        let version = cluster.version;
        let mut slice = slice;
        slice["metadata"]["resourceVersion"] = json!(version.to_string());
        let name = slice["metadata"]["name"].as_str().unwrap().to_string();
        let kind = if cluster.slices.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        cluster.slices.insert(name, slice.clone());
        cluster.publish(version, json!({"type": kind, "object": slice}));
    }

    fn delete(&self, name: &str) {
        let mut cluster = self.cluster();
        cluster.version += 1;
        let version = cluster.version;
        let mut slice = cluster.slices.remove(name).unwrap();
        slice["metadata"]["resourceVersion"] = json!(version.to_string());
        cluster.publish(version, json!({"type": "DELETED", "object": slice}));
    }

    /// End every open watch with 410 Gone, as the API server does when a watch's
    /// resourceVersion is too old: the client must list again.
    fn expire_watches(&self) {
        let mut cluster = self.cluster();
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version"}});
        for watch in cluster.watches.drain(..) {
            let _ = watch.send(line(&gone));
        }
    }

    fn fail_lists(&self, failing: bool) {
        self.cluster().failing_lists = failing;
    }
}

impl Cluster {
    fn publish(&mut self, version: u64, event: Value) {
        self.changes.push((version, event.clone()));
        self.watches.retain(|w| w.send(line(&event)).is_ok());
    }
}

async fn endpointslices(
    State(server): State<ApiServer>,
    Path(namespace): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    let mut cluster = server.cluster();
    cluster.queries.push(format!("{namespace}?{query}"));
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
    };
    if param("watch").as_deref() == Some("true") {
        let from: u64 = param("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        for (version, event) in &cluster.changes {
            if *version > from {
                let _ = tx.send(line(event));
            }
        }
        cluster.watches.push(tx);
        // The body ends when the stand-in drops the watch's sender.
        let lines = futures::stream::unfold(rx, |mut rx| async move {
            let next = rx.recv().await?;
            Some((Ok::<_, Infallible>(next), rx))
        });
        return Body::from_stream(lines).into_response();
    }
    cluster.lists += 1;
    if cluster.failing_lists {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is down"});
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(status),
        )
            .into_response();
    }
    let items: Vec<Value> = cluster.slices.values().cloned().collect();
    axum::Json(
        json!({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": cluster.version.to_string()}, "items": items}),
    )
    .into_response()
}

/// A slice of Service `vllm` with these `(address, conditions)` endpoints.
fn slice(name: &str, endpoints: &[(&str, Value)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(address, conditions)| json!({"addresses": [address], "conditions": conditions}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "inference",
            "labels": {"kubernetes.io/service-name": "vllm"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}], "endpoints": endpoints})
}

fn ready() -> Value {
    json!({"ready": true, "serving": true, "terminating": false})
}

/// Watch `url`'s cluster; every set of worker URLs discovery applies comes out of the receiver.
async fn discover(
    url: &str,
    debounce: &str,
) -> (mpsc::UnboundedReceiver<Vec<String>>, CancellationToken) {
    let config: KubernetesDiscoveryConfig = toml::from_str(&format!(
        "namespace = \"inference\"\nservice = \"vllm\"\nport = \"http\"\nkv_events_port = 5557\ndebounce = \"{debounce}\""
    ))
    .unwrap();
    let client_config = kube::Config::new(url.parse().unwrap());
    let client = kube::Client::try_from(client_config).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    tokio::spawn(switchyard_discovery::watch(
        client,
        config,
        move |workers| {
            let _ = tx.send(workers.iter().map(|w| w.url.clone()).collect());
        },
        stop.clone(),
    ));
    (rx, stop)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Vec<String>>) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("discovery applied nothing")
        .unwrap()
}

/// Nothing is applied for `quiet`.
async fn nothing_for(rx: &mut mpsc::UnboundedReceiver<Vec<String>>, quiet: Duration) {
    if let Ok(applied) = tokio::time::timeout(quiet, rx.recv()).await {
        panic!("applied {applied:?}");
    }
}

fn urls(hosts: &[u8]) -> Vec<String> {
    hosts
        .iter()
        .map(|h| format!("http://10.0.0.{h}:8000"))
        .collect()
}

#[tokio::test]
async fn endpoints_join_and_leave_as_the_slices_change() {
    let (server, url) = ApiServer::start().await;
    server.apply(slice(
        "vllm-a",
        &[("10.0.0.1", ready()), ("10.0.0.2", json!({"ready": false}))],
    ));
    let (mut applied, _stop) = discover(&url, "100ms").await;
    assert_eq!(next(&mut applied).await, urls(&[1]), "the first list");
    let queries = server.cluster().queries.clone();
    assert!(
        queries.iter().all(|q| q.starts_with("inference?")
            && q.contains("labelSelector=kubernetes.io%2Fservice-name%3Dvllm")),
        "{queries:?}"
    );

    // A second slice joins.
    server.apply(slice("vllm-b", &[("10.0.0.3", ready())]));
    assert_eq!(next(&mut applied).await, urls(&[1, 3]));
    // 1 turns unready while 2 turns ready: 1 leaves, 2 joins.
    server.apply(slice(
        "vllm-a",
        &[("10.0.0.1", json!({"ready": false})), ("10.0.0.2", ready())],
    ));
    assert_eq!(next(&mut applied).await, urls(&[2, 3]));
    // 3 terminates (still serving its last requests): it leaves; 4 joins.
    let draining = json!({"ready": false, "serving": true, "terminating": true});
    server.apply(slice(
        "vllm-b",
        &[("10.0.0.3", draining), ("10.0.0.4", ready())],
    ));
    assert_eq!(next(&mut applied).await, urls(&[2, 4]));
    // The slice is deleted: its endpoints leave.
    server.delete("vllm-a");
    assert_eq!(next(&mut applied).await, urls(&[4]));
}

#[tokio::test]
async fn a_burst_of_changes_is_applied_once() {
    let (server, url) = ApiServer::start().await;
    server.apply(slice("vllm-a", &[("10.0.0.1", ready())]));
    let (mut applied, _stop) = discover(&url, "500ms").await;
    assert_eq!(next(&mut applied).await, urls(&[1]));
    // A rollout: three changes at once, one application of where they end.
    server.apply(slice(
        "vllm-a",
        &[("10.0.0.1", ready()), ("10.0.0.2", ready())],
    ));
    server.apply(slice(
        "vllm-a",
        &[("10.0.0.2", ready()), ("10.0.0.3", ready())],
    ));
    server.apply(slice("vllm-b", &[("10.0.0.4", ready())]));
    assert_eq!(next(&mut applied).await, urls(&[2, 3, 4]));
    nothing_for(&mut applied, Duration::from_secs(1)).await;
    // A change that changes no worker (a condition nobody reads) applies nothing.
    server.apply(slice("vllm-b", &[("10.0.0.4", json!({"ready": true}))]));
    nothing_for(&mut applied, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_watch_error_and_failed_relists_keep_the_workers_until_a_relist_succeeds() {
    let (server, url) = ApiServer::start().await;
    server.apply(slice(
        "vllm-a",
        &[("10.0.0.1", ready()), ("10.0.0.2", ready())],
    ));
    let (mut applied, _stop) = discover(&url, "100ms").await;
    assert_eq!(next(&mut applied).await, urls(&[1, 2]));

    // The watch ends with 410 Gone and every relist fails for a while: nothing is applied (the
    // fleet keeps its workers), and the changes made meanwhile are not lost.
    server.fail_lists(true);
    let lists_before = server.cluster().lists;
    server.expire_watches();
    server.delete("vllm-a");
    server.apply(slice(
        "vllm-b",
        &[("10.0.0.2", ready()), ("10.0.0.5", ready())],
    ));
    nothing_for(&mut applied, Duration::from_secs(2)).await;
    assert!(
        server.cluster().lists > lists_before,
        "the watcher never relisted"
    );
    server.fail_lists(false);
    assert_eq!(next(&mut applied).await, urls(&[2, 5]), "the relist's set");

    // A watch that just ends (the server's timeout) resumes from its resourceVersion.
    server.cluster().watches.clear();
    server.apply(slice("vllm-b", &[("10.0.0.5", ready())]));
    assert_eq!(next(&mut applied).await, urls(&[5]));
}
