//! Switchyard as the endpoint picker of a real Envoy (`deploy/envoy/epp.yaml`, only its ports
//! and endpoint lists rewritten, plus a Lua filter that plays the part of a gateway sending a
//! subset hint), over two mock engines: the Gateway API Inference Extension's conformance cases
//! `GatewayFollowingEPPRouting`, `GatewayDestinationEndpointServed` and `EppUnAvailableFailOpen`,
//! without Kubernetes, and the picker's refusals (503 for an empty subset, 429 when it sheds).

use crate::envoy::Envoy;
use crate::support::{MockEngine, Proc, TempFile, client, eventually, get_text, metric_sum};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const MODEL: &str = "smollm2-135m-instruct";
const REFERENCE: &str = include_str!("../../deploy/envoy/epp.yaml");

/// Plays the gateway's part: `x-test-subset: a,b` (or `none`) becomes the subset hint.
const SUBSET_FILTER: &str = r#"          - name: envoy.filters.http.lua
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
              default_source_code:
                inline_string: |
                  function envoy_on_request(h)
                    local hint = h:headers():get("x-test-subset")
                    if hint ~= nil then
                      local endpoints = {}
                      for e in string.gmatch(hint, "[^,]+") do
                        if e ~= "none" then table.insert(endpoints, e) end
                      end
                      h:streamInfo():dynamicMetadata():set("envoy.lb.subset_hint",
                        "x-gateway-destination-endpoint-subset", endpoints)
                    end
                  end
"#;

/// Replace the lines between `# {marker}:begin` and `# {marker}:end` with `lines`.
fn between(text: &str, marker: &str, lines: &str) -> String {
    let begin = format!("# {marker}:begin");
    let end = format!("# {marker}:end");
    let (head, rest) = text.split_once(&begin).expect("begin marker");
    let head_end = head.rfind('\n').map_or(0, |i| i + 1);
    let (_, tail) = rest.split_once(&end).expect("end marker");
    let tail = tail.split_once('\n').map_or("", |(_, t)| t);
    format!("{}{lines}{tail}", &head[..head_end])
}

fn endpoint_lines(addrs: &[&str]) -> String {
    addrs
        .iter()
        .map(|a| {
            let (host, port) = a.rsplit_once(':').unwrap();
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}\n"
            )
        })
        .collect()
}

/// The reference configuration with these engines and pickers, and OS-chosen ports.
fn render(engines: &[&str], pickers: &[&str]) -> String {
    let config = between(REFERENCE, "pool", &endpoint_lines(engines));
    let config = between(&config, "picker", &endpoint_lines(pickers));
    let config = between(&config, "filters", SUBSET_FILTER);
    assert_eq!(config.matches("port_value: 9902").count(), 1);
    assert_eq!(config.matches("port_value: 8081").count(), 1);
    config
        .replace("port_value: 9902", "port_value: 0")
        .replace("port_value: 8081", "port_value: 0")
}

/// `switchyard epp` over `engines`, with extra configuration; its (HTTP, gRPC) addresses.
fn start_picker(engines: &[&MockEngine], extra: &str) -> (Proc, TempFile, String, String) {
    let mut toml = String::from(extra);
    for e in engines {
        toml += &format!(
            "[[workers]]\nurl = \"{}\"\nkind = \"mock\"\nkv_events = \"{}\"\nreplay = \"{}\"\n",
            e.url, e.kv_events, e.replay
        );
    }
    let config = TempFile::new("epp.toml", &toml);
    let path = config.path.to_string_lossy().to_string();
    let proc = Proc::switchyard(&[
        "epp",
        "--config",
        &path,
        "--port",
        "0",
        "--grpc",
        "127.0.0.1:0",
    ]);
    let grpc = proc.wait_for("(ext_proc) on grpc://");
    let http = proc.wait_for("gateway on ");
    (proc, config, http, grpc)
}

fn addr(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// What came back through Envoy.
struct Answer {
    status: u16,
    served: String,
    retry_after: String,
    body: String,
}

async fn send(url: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut request = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (served, retry_after) = (
        header("x-gateway-destination-endpoint-served"),
        header("retry-after"),
    );
    Answer {
        status: response.status().as_u16(),
        served,
        retry_after,
        body: response.text().await.unwrap(),
    }
}

fn chat(content: &str, stream: bool, max_tokens: u32) -> Value {
    json!({"model": MODEL, "stream": stream, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": content}]})
}

/// A prompt of some 60 blocks, distinct per `tag`.
fn long_prompt(tag: &str) -> String {
    (0..400)
        .map(|w| format!("{tag}w{}", w % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Requests each engine finished, by its own count.
async fn served_by_engines(engines: &[&MockEngine]) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for e in engines {
        let n = e.metric("vllm:request_success_total").await;
        counts.insert(addr(&e.url).to_string(), n);
    }
    counts
}

/// Envoy follows the picker: a repeated prompt goes where its prefix is cached, a subset hint
/// confines it, and the engines' own counts agree with what Envoy reports as served; streams pass
/// through whole and their bookings end with them; an empty subset is a 503 and shedding a 429,
/// each in the API's error shape; with the picker killed, Envoy fails open to round robin.
#[tokio::test]
async fn envoy_routes_where_switchyard_picks_and_fails_open_without_it() {
    let engines = [MockEngine::start(1.0, 4096), MockEngine::start(1.0, 4096)];
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let (a, b) = (addr(&engines[0].url), addr(&engines[1].url));
    // Two pickers, active-active: each builds the same index from the engines' events. A worker
    // is saturated at one request: a second, unwilling to wait, is shed.
    let queue = "[queue]\nmax_requests = 1\nretry_after = \"3s\"\n";
    let (mut first, _first_config, first_http, first_grpc) = start_picker(&refs, queue);
    let (mut second, _second_config, second_http, second_grpc) = start_picker(&refs, queue);
    let envoy = Envoy::start(&render(&[a, b], &[&first_grpc, &second_grpc])).await;
    let url = envoy.url.clone();
    let healthy = |n: usize| {
        let envoy = &envoy;
        async move {
            let health = envoy.cluster_health("picker").await;
            health.values().filter(|f| *f == "healthy").count() == n
        }
    };
    let ready = eventually(20, async || healthy(2).await).await;
    assert!(
        ready,
        "the pickers never became healthy:\n{}",
        envoy.log_text()
    );

    // GatewayFollowingEPPRouting: one prompt, six times: the picker keeps it where its prefix
    // is (round robin would alternate); the engine that served is the one Envoy names.
    let prompt = long_prompt("follow");
    let mut served = Vec::new();
    for turn in 0..6 {
        let answer = send(&url, &chat(&prompt, turn % 2 == 1, 8), &[]).await;
        assert_eq!(answer.status, 200, "turn {turn}: {}", answer.body);
        served.push(answer.served);
    }
    assert!(
        served.iter().all(|s| s == &served[0]) && [a, b].contains(&served[0].as_str()),
        "a repeated prompt moved between engines: {served:?}"
    );
    // The subset hint confines the pick, even away from the cached prefix.
    let other = if served[0] == a { b } else { a };
    for turn in 0..3 {
        let answer = send(&url, &chat(&prompt, false, 8), &[("x-test-subset", other)]).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.served, other, "subset turn {turn}");
    }
    // GatewayDestinationEndpointServed: what Envoy reported is what the engines counted.
    let counts = served_by_engines(&refs).await;
    assert_eq!(counts[&served[0]], 6.0, "{counts:?}");
    assert_eq!(counts[other], 3.0, "{counts:?}");
    // Both pickers decided (Envoy spreads its ext_proc streams), and agreed.
    let metrics_of = |http: &str| {
        let url = format!("{http}/metrics");
        async move { get_text(&url).await }
    };
    let (m1, m2) = (
        metrics_of(&first_http).await,
        metrics_of(&second_http).await,
    );
    let decisions = |m: &str| metric_sum(m, "switchyard_routing_decisions_total");
    assert_eq!(decisions(&m1) + decisions(&m2), 9.0);
    assert!(
        decisions(&m1) > 0.0 && decisions(&m2) > 0.0,
        "one picker idle"
    );
    for m in [&m1, &m2] {
        assert_eq!(metric_sum(m, "switchyard_epp_served_elsewhere_total"), 0.0);
    }
    // Every booking ended with its response, streams included.
    let in_flight = async || {
        let (m1, m2) = (
            metrics_of(&first_http).await,
            metrics_of(&second_http).await,
        );
        metric_sum(&m1, "switchyard_worker_in_flight")
            + metric_sum(&m2, "switchyard_worker_in_flight")
    };
    let released = eventually(10, async || in_flight().await == 0.0).await;
    assert!(released, "bookings outlived their responses");

    // The prompt above now lives on both engines (the subset turns put it on the other one), so
    // what follows uses a prefix only one engine holds.
    let lone = long_prompt("survive");
    let placed = send(&url, &chat(&lone, false, 8), &[]).await;
    assert_eq!(placed.status, 200, "{}", placed.body);
    // A body far past 128 KB (the inference extension's picker once answered those with a 500)
    // streams through the picker in bounded chunks and is routed like any other.
    let mut big = chat(&lone, false, 8);
    big["metadata"] = json!({"note": "x".repeat(3 << 19)});
    let answer = send(&url, &big, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.served, placed.served, "a big body lost its prefix");

    // An empty subset: nothing to pick from, 503 in the OpenAI error shape.
    let empty = send(&url, &chat("hello", false, 4), &[("x-test-subset", "none")]).await;
    assert_eq!(empty.status, 503, "{}", empty.body);
    let error: Value = serde_json::from_str(&empty.body).unwrap();
    assert!(error["error"]["message"].is_string(), "{}", empty.body);
    // One picker dies: the other picks alone, and finds the prefix where it is (loads are per
    // picker, so shedding is shown on one).
    second.kill();
    let alone = eventually(20, async || healthy(1).await).await;
    assert!(alone, "Envoy never noticed a picker died");
    let answer = send(&url, &chat(&lone, false, 8), &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.served, placed.served, "the survivor lost the prefix");
    // Shedding: engine `a` busy with a long stream, a request confined to it that will not wait
    // gets a 429 with Retry-After; a patient one waits and is served.
    let long = {
        let url = url.clone();
        let a = a.to_string();
        tokio::spawn(async move {
            send(
                &url,
                &chat("a long answer", true, 400),
                &[("x-test-subset", &a)],
            )
            .await
        })
    };
    let busy = eventually(20, async || {
        metric_sum(
            &metrics_of(&first_http).await,
            "switchyard_worker_in_flight",
        ) >= 1.0
    })
    .await;
    assert!(busy, "the long stream never started");
    let shed = send(
        &url,
        &chat("now please", false, 4),
        &[("x-test-subset", a), ("x-switchyard-do-not-queue", "true")],
    )
    .await;
    assert_eq!(shed.status, 429, "{}", shed.body);
    assert_eq!(shed.retry_after, "3");
    let error: Value = serde_json::from_str(&shed.body).unwrap();
    assert_eq!(
        error["error"]["type"], "rate_limit_exceeded",
        "{}",
        shed.body
    );
    let long = long.await.unwrap();
    assert_eq!(long.status, 200, "{}", long.body);
    assert!(
        long.body.trim_end().ends_with("data: [DONE]"),
        "{}",
        long.body
    );

    // EppUnAvailableFailOpen: the last picker dies; once Envoy's health check sees it, requests go
    // on to the pool's fallback balancer (round robin) and are served.
    first.kill();
    let down = eventually(20, async || healthy(0).await).await;
    assert!(
        down,
        "Envoy never noticed the picker died: {:?}",
        envoy.cluster_health("picker").await
    );
    // The prompt the picker kept on one engine now goes round robin (each of Envoy's two worker
    // threads alternates on its own, so 8 requests reach both engines), every one served.
    // Envoy's worker threads learn the health a moment after its admin page does; until then a
    // call to the dead picker fails after the body went to it, which Envoy cannot fail open
    // (deploy/envoy/README.md).
    let open = eventually(5, async || {
        send(&url, &chat(&prompt, false, 4), &[]).await.status == 200
    })
    .await;
    assert!(open, "the fail-open path never served");
    let before = served_by_engines(&refs).await;
    let mut fallback = Vec::new();
    for turn in 0..8 {
        let answer = send(&url, &chat(&prompt, false, 4), &[]).await;
        assert_eq!(answer.status, 200, "fail-open turn {turn}: {}", answer.body);
        fallback.push(answer.served);
    }
    let after = served_by_engines(&refs).await;
    assert_eq!(after[a] + after[b] - before[a] - before[b], 8.0);
    for engine in [a, b] {
        assert!(
            after[engine] > before[engine],
            "the fallback never used {engine}: {fallback:?}"
        );
    }
}

/// The picker's shipped Kubernetes configuration is one the gateway accepts (it cannot start
/// here: its engines come from an API server this machine does not have).
#[test]
fn the_shipped_picker_configmap_is_a_valid_configuration() {
    let manifest = include_str!("../../deploy/k8s/epp/epp-configmap.yaml");
    let (_, body) = manifest
        .split_once("  switchyard.toml: |\n")
        .expect("a switchyard.toml key");
    let toml: String = body
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let file = TempFile::new("switchyard.toml", &toml);
    let raw = switchyard_gateway::config::RawConfig::from_file(&file.path).unwrap();
    let config = switchyard_gateway::config::Config::try_from(raw).unwrap();
    let kubernetes = config
        .discovery
        .and_then(|d| d.kubernetes)
        .expect("discovery");
    assert_eq!(kubernetes.service, "vllm");
    assert!(config.workers.is_empty());
}
