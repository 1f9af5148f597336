//! Each status of `/admin/workers`, against a gateway started in-process on 127.0.0.1 (its
//! workers need not run: a member is listed, added and removed whatever its health).

use crate::config::{Config, RawConfig};
use crate::server::GatewayHandle;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const CONFIG: &str = r#"
[server]
port = 0
[policies]
admin_tokens = [{ role = "read", token = "reader" }, { role = "write", token = "writer" }]
[[workers]]
url = "http://127.0.0.1:9"
"#;

struct Running {
    handle: GatewayHandle,
    url: String,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn config(text: &str) -> Config {
    Config::try_from(toml::from_str::<RawConfig>(text).unwrap()).unwrap()
}

async fn gateway() -> Running {
    let tokenizer = switchyard_tokenizer::ModelTokenizer::embedded_default().unwrap();
    let stop = CancellationToken::new();
    let handle = crate::start(config(CONFIG), tokenizer, stop.clone())
        .await
        .unwrap();
    let url = format!("http://{}/admin/workers", handle.addr());
    Running { handle, url, stop }
}

/// Status and JSON body of a request with `token` (none: no Authorization header).
async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let json = response.json().await.unwrap_or(Value::Null);
    (status, json)
}

async fn list(url: &str) -> Vec<Value> {
    let (status, json) = call(reqwest::Method::GET, url, Some("reader"), None).await;
    assert_eq!(status, 200, "{json}");
    json["workers"].as_array().unwrap().clone()
}

async fn post(url: &str, token: &str, body: &str) -> (u16, Value) {
    call(reqwest::Method::POST, url, Some(token), Some(body)).await
}

async fn delete(url: &str, worker: &str) -> (u16, Value) {
    let target = format!("{url}?url={}", worker.replace(':', "%3A"));
    call(reqwest::Method::DELETE, &target, Some("writer"), None).await
}

#[tokio::test]
async fn a_read_token_lists_members_with_their_source_and_state() {
    let gw = gateway().await;
    let workers = list(&gw.url).await;
    assert_eq!(workers.len(), 1);
    let first = &workers[0];
    assert_eq!(first["source"], "config");
    assert_eq!(first["url"], "http://127.0.0.1:9");
    assert_eq!(first["kind"], "vllm");
    assert_eq!(first["id"], 0);
    assert_eq!(first["ranks"][0]["rank"], "0.0");
    assert!(first["ranks"][0]["events"].is_null(), "{first}");
    // No token: 401; a read token on a change: 403; both in OpenAI's error shape.
    let (status, json) = call(reqwest::Method::GET, &gw.url, None, None).await;
    assert_eq!(
        (status, &json["error"]["code"]),
        (401, &json!("invalid_api_key"))
    );
    let (status, json) = post(&gw.url, "reader", r#"{"url": "http://127.0.0.1:10"}"#).await;
    assert_eq!(status, 403);
    assert_eq!(json["error"]["code"], "insufficient_permissions");
}

#[tokio::test]
async fn a_posted_worker_joins_as_admin_and_a_second_post_of_its_url_conflicts() {
    let gw = gateway().await;
    let body = r#"{"url": "http://127.0.0.1:10", "kind": "mock", "kv_events": "tcp://127.0.0.1:11", "dp_size": 2}"#;
    let (status, json) = post(&gw.url, "writer", body).await;
    assert_eq!(status, 201, "{json}");
    assert_eq!(json["source"], "admin");
    assert_eq!(json["id"], 1);
    assert_eq!(json["ranks"].as_array().unwrap().len(), 2);
    assert_eq!(json["ranks"][1]["rank"], "1.1");
    assert!(json["ranks"][1]["events"].is_object(), "{json}");
    let workers = list(&gw.url).await;
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[1]["url"], "http://127.0.0.1:10");
    for (url, owner) in [
        ("http://127.0.0.1:10/", "admin"),
        ("http://127.0.0.1:9", "config"),
    ] {
        let (status, json) = post(&gw.url, "writer", &format!(r#"{{"url": "{url}"}}"#)).await;
        assert_eq!(status, 409, "{json}");
        assert_eq!(json["error"]["code"], "conflict");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("source `{owner}`")), "{message}");
    }
    assert_eq!(list(&gw.url).await.len(), 2);
}

#[tokio::test]
async fn bad_entries_are_refused_with_the_field_named() {
    let gw = gateway().await;
    for (body, needle) in [
        (r#"{"url": "ftp://x"}"#, "worker.url must be an http(s) URL"),
        (
            r#"{"url": "http://a:1", "dp_size": "two"}"#,
            "worker.dp_size: invalid type",
        ),
        (
            r#"{"url": "http://a:1", "dp_size": 0}"#,
            "worker: block_size and dp_size",
        ),
        (
            r#"{"url": "http://a:1", "block_size": 32}"#,
            "worker.block_size is 32",
        ),
        (
            r#"{"url": "http://a:1", "bogus": 1}"#,
            "unknown field `bogus`",
        ),
        (
            r#"{"url": "http://a:1", "kind": "nope"}"#,
            "worker.kind: unknown variant",
        ),
        (
            r#"{"url": "http://a:1", "replay": "tcp://a:2"}"#,
            "worker: replay without kv_events",
        ),
        (
            r#"{"url": "http://a:1", "kv_events": "tcp://a", "dp_size": 2}"#,
            "worker.kv_events",
        ),
        (r#"{"kind": "vllm"}"#, "missing field `url`"),
        ("not json", "worker: expected"),
    ] {
        let (status, json) = post(&gw.url, "writer", body).await;
        assert_eq!(status, 400, "{body}: {json}");
        assert_eq!(json["error"]["type"], "invalid_request_error");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    assert_eq!(list(&gw.url).await.len(), 1, "nothing joined");
}

#[tokio::test]
async fn delete_removes_admin_workers_only() {
    let gw = gateway().await;
    let (status, _) = post(&gw.url, "writer", r#"{"url": "http://127.0.0.1:10"}"#).await;
    assert_eq!(status, 201);
    let (status, json) = delete(&gw.url, "http://127.0.0.1:12").await;
    assert_eq!(
        (status, &json["error"]["code"]),
        (404, &json!("worker_not_found"))
    );
    let (status, json) = delete(&gw.url, "http://127.0.0.1:9").await;
    assert_eq!(status, 409, "{json}");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("belongs to source `config`"), "{message}");
    let (status, json) = call(reqwest::Method::DELETE, &gw.url, Some("writer"), None).await;
    assert_eq!(status, 400, "{json}");
    let (status, json) = delete(&gw.url, "http://127.0.0.1:10").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["removed"], "http://127.0.0.1:10");
    let workers = list(&gw.url).await;
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0]["source"], "config");
    // Gone for good: a second delete is a 404, and a new post of the URL gets a new id.
    assert_eq!(delete(&gw.url, "http://127.0.0.1:10").await.0, 404);
    let (status, json) = post(&gw.url, "writer", r#"{"url": "http://127.0.0.1:10"}"#).await;
    assert_eq!((status, &json["id"]), (201, &json!(2)));
}

#[tokio::test]
async fn a_reload_keeps_admin_workers_and_refuses_their_urls() {
    let gw = gateway().await;
    let (status, _) = post(&gw.url, "writer", r#"{"url": "http://127.0.0.1:10"}"#).await;
    assert_eq!(status, 201);
    // The file's worker changes: the admin-added one stays.
    let changed = CONFIG.replace("127.0.0.1:9", "127.0.0.1:13");
    let done = gw.handle.reload(Ok(config(&changed))).unwrap();
    assert!(done.applied.contains(&"workers"), "{done:?}");
    let urls: Vec<_> = list(&gw.url)
        .await
        .iter()
        .map(|w| (w["source"].clone(), w["url"].clone()))
        .collect();
    assert_eq!(
        urls,
        [
            (json!("admin"), json!("http://127.0.0.1:10")),
            (json!("config"), json!("http://127.0.0.1:13")),
        ]
    );
    // The file may not list the admin's worker too: refused whole, with both sources named.
    let claimed = format!("{changed}[[workers]]\nurl = \"http://127.0.0.1:10\"\n");
    let err = gw
        .handle
        .reload(Ok(config(&claimed)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("belongs to source `admin`; `config` cannot also list it"),
        "{err}"
    );
    assert_eq!(list(&gw.url).await.len(), 2);
}

/// Drain (`POST`) or take back (`DELETE`) `worker` with `token`.
async fn drain(url: &str, method: reqwest::Method, worker: &str, token: &str) -> (u16, Value) {
    let target = format!("{url}/drain?url={}", worker.replace(':', "%3A"));
    call(method, &target, Some(token), None).await
}

#[tokio::test]
async fn a_drained_member_is_out_of_routing_until_taken_back() {
    use reqwest::Method;
    let gw = gateway().await;
    // The file's own member can be drained: draining changes no membership.
    let (status, json) = drain(&gw.url, Method::POST, "http://127.0.0.1:9", "writer").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["draining"], true);
    assert_eq!(json["ranks"][0]["healthy"], false, "{json}");
    // The listed health is the router's: a drained rank is no candidate.
    assert_eq!(list(&gw.url).await[0]["draining"], true);
    let (status, json) = drain(&gw.url, Method::DELETE, "http://127.0.0.1:9", "writer").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["draining"], false);
    assert_eq!(list(&gw.url).await[0]["draining"], false);
    // An unknown worker, no URL, a read token: each refused in the API's error shape.
    let (status, json) = drain(&gw.url, Method::POST, "http://127.0.0.1:12", "writer").await;
    assert_eq!(
        (status, &json["error"]["code"]),
        (404, &json!("worker_not_found"))
    );
    let no_url = format!("{}/drain", gw.url);
    let (status, json) = call(Method::POST, &no_url, Some("writer"), None).await;
    assert_eq!(status, 400, "{json}");
    let (status, json) = drain(&gw.url, Method::POST, "http://127.0.0.1:9", "reader").await;
    assert_eq!(
        (status, &json["error"]["code"]),
        (403, &json!("insufficient_permissions"))
    );
    assert_eq!(list(&gw.url).await[0]["draining"], false);
}
