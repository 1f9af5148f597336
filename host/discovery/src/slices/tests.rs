use super::*;
use proptest::prelude::*;
use serde_json::{Value, json};

fn config(text: &str) -> KubernetesDiscoveryConfig {
    toml::from_str(text).unwrap()
}

fn named_port() -> KubernetesDiscoveryConfig {
    config(
        r#"
        service = "vllm"
        port = "http"
        kv_events_port = 5557
        replay_port = 5558
        [worker]
        kind = "sglang"
        dp_size = 2
        kv_capacity_tokens = 4096
        upstream = "tokens"
        "#,
    )
}

/// A slice as the API server sends it: `endpoints` are `(addresses, conditions)`.
fn slice(
    name: &str,
    address_type: &str,
    ports: Value,
    endpoints: &[(&[&str], Value)],
) -> EndpointSlice {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(addresses, conditions)| json!({"addresses": addresses, "conditions": conditions}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "vllm"}},
        "addressType": address_type,
        "ports": ports,
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn http_ports() -> Value {
    json!([{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000, "protocol": "TCP"}])
}

fn urls(workers: &[WorkerConfig]) -> Vec<&str> {
    workers.iter().map(|w| w.url.as_str()).collect()
}

#[test]
fn a_ready_address_becomes_a_worker_built_from_the_template() {
    let slices = [slice(
        "vllm-a",
        "IPv4",
        http_ports(),
        &[(&["10.0.0.5"], json!({"ready": true}))],
    )];
    let workers = desired_workers(&named_port(), &slices);
    assert_eq!(
        workers,
        [WorkerConfig {
            url: "http://10.0.0.5:8000".into(),
            kind: switchyard_gateway::config::EngineKind::Sglang,
            kv_events: Some("tcp://10.0.0.5:5557".into()),
            replay: Some("tcp://10.0.0.5:5558".into()),
            dp_size: 2,
            kv_capacity_tokens: Some(4096),
            block_size: 16,
            upstream: switchyard_gateway::config::UpstreamMode::Tokens,
            kv_hints: switchyard_gateway::config::HintDelivery::None,
        }]
    );
}

#[test]
fn unready_and_terminating_endpoints_leave_and_absent_conditions_count_as_ready() {
    let endpoints: &[(&[&str], Value)] = &[
        (
            &["10.0.0.1"],
            json!({"ready": true, "serving": true, "terminating": false}),
        ),
        (&["10.0.0.2"], json!({"ready": false})),
        // Draining: still serving its last requests, but no new ones.
        (
            &["10.0.0.3"],
            json!({"ready": false, "serving": true, "terminating": true}),
        ),
        (&["10.0.0.4"], json!({})),
        (&["10.0.0.5"], Value::Null),
        (&["10.0.0.6"], json!({"serving": false})),
        (&["10.0.0.7"], json!({"ready": true, "terminating": true})),
    ];
    let slices = [slice("vllm-a", "IPv4", http_ports(), endpoints)];
    assert_eq!(
        urls(&desired_workers(&named_port(), &slices)),
        [
            "http://10.0.0.1:8000",
            "http://10.0.0.4:8000",
            "http://10.0.0.5:8000"
        ]
    );
}

#[test]
fn the_port_comes_by_name_from_each_slice_or_is_the_configured_number() {
    let ready = json!({"ready": true});
    let slices = [
        slice("a", "IPv4", http_ports(), &[(&["10.0.0.1"], ready.clone())]),
        slice(
            "b",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            &[(&["10.0.0.2"], ready.clone())],
        ),
        // No port named `http`: nothing from this slice.
        slice(
            "c",
            "IPv4",
            json!([{"name": "grpc", "port": 9000}]),
            &[(&["10.0.0.3"], ready.clone())],
        ),
        slice("d", "IPv4", Value::Null, &[(&["10.0.0.4"], ready.clone())]),
    ];
    assert_eq!(
        urls(&desired_workers(&named_port(), &slices)),
        ["http://10.0.0.1:8000", "http://10.0.0.2:8080"]
    );
    let numbered = config("service = \"vllm\"\nport = 8001\nscheme = \"https\"");
    let workers = desired_workers(&numbered, &slices);
    assert_eq!(workers.len(), 4);
    assert_eq!(workers[0].url, "https://10.0.0.1:8001");
    assert_eq!(workers[0].kv_events, None);
}

#[test]
fn addresses_are_deduplicated_sorted_and_checked_against_their_type() {
    let ready = json!({"ready": true});
    let slices = [
        slice(
            "a",
            "IPv4",
            http_ports(),
            &[(&["10.0.0.9", "10.0.0.1"], ready.clone())],
        ),
        // The same endpoint in a second slice (a slice being replaced): one worker.
        slice("b", "IPv4", http_ports(), &[(&["10.0.0.1"], ready.clone())]),
        slice("v6", "IPv6", http_ports(), &[(&["fd00::1"], ready.clone())]),
        slice(
            "dns",
            "FQDN",
            http_ports(),
            &[(&["vllm-0.vllm.ns.svc"], ready.clone())],
        ),
        // Not what the type says, or no address at all: skipped, never a bad URL.
        slice(
            "bad",
            "IPv4",
            http_ports(),
            &[(&["fd00::2", "10.0.0.300", "", "a/b"], ready.clone())],
        ),
        slice(
            "badname",
            "FQDN",
            http_ports(),
            &[(&["a..b", "a b", "x:1"], ready.clone())],
        ),
        slice(
            "other",
            "AppleTalk",
            http_ports(),
            &[(&["10.0.0.8"], ready.clone())],
        ),
    ];
    assert_eq!(
        urls(&desired_workers(&named_port(), &slices)),
        [
            "http://10.0.0.1:8000",
            "http://10.0.0.9:8000",
            "http://[fd00::1]:8000",
            "http://vllm-0.vllm.ns.svc:8000",
        ]
    );
}

fn conditions() -> impl Strategy<Value = Value> {
    let flag = prop_oneof![Just(None), Just(Some(true)), Just(Some(false))];
    (flag.clone(), flag.clone(), flag).prop_map(|(ready, serving, terminating)| {
        let mut c = serde_json::Map::new();
        for (key, value) in [
            ("ready", ready),
            ("serving", serving),
            ("terminating", terminating),
        ] {
            if let Some(v) = value {
                c.insert(key.into(), json!(v));
            }
        }
        Value::Object(c)
    })
}

fn endpoint() -> impl Strategy<Value = (Vec<String>, Value)> {
    let address = prop_oneof![
        (0u8..6).prop_map(|n| format!("10.0.0.{n}")),
        Just("fd00::1".to_string()),
        Just("not an address".to_string()),
        Just(String::new()),
    ];
    (prop::collection::vec(address, 0..3), conditions())
}

fn any_slice() -> impl Strategy<Value = EndpointSlice> {
    let ports = prop_oneof![
        Just(Value::Null),
        Just(http_ports()),
        (0i32..70000).prop_map(|p| json!([{"name": "http", "port": p}])),
    ];
    let address_type = prop_oneof![Just("IPv4"), Just("IPv6"), Just("FQDN")];
    (address_type, ports, prop::collection::vec(endpoint(), 0..4)).prop_map(
        |(address_type, ports, endpoints)| {
            let endpoints: Vec<(Vec<&str>, Value)> = endpoints
                .iter()
                .map(|(a, c)| (a.iter().map(String::as_str).collect(), c.clone()))
                .collect();
            let endpoints: Vec<(&[&str], Value)> = endpoints
                .iter()
                .map(|(a, c)| (a.as_slice(), c.clone()))
                .collect();
            slice("s", address_type, ports, &endpoints)
        },
    )
}

proptest! {
    /// Whatever the slices say: one valid worker per distinct serving address, sorted, and no
    /// worker for an address that no slice lists as serving.
    #[test]
    fn every_worker_is_valid_unique_and_from_a_serving_endpoint(
        slices in prop::collection::vec(any_slice(), 0..4),
    ) {
        let config = named_port();
        let workers = desired_workers(&config, &slices);
        let urls = urls(&workers);
        let mut sorted = urls.clone();
        sorted.sort_unstable();
        sorted.dedup();
        prop_assert_eq!(&sorted, &urls);
        for worker in &workers {
            prop_assert!(worker.validate("worker", 16).is_ok(), "{worker:?}");
            let serving = slices.iter().flat_map(|s| &s.endpoints).filter(|e| is_serving(e));
            let listed = serving
                .flat_map(|e| &e.addresses)
                .any(|a| config.worker_at(a, 0).url.rsplit_once(':').map(|(h, _)| h) == worker.url.rsplit_once(':').map(|(h, _)| h));
            prop_assert!(listed, "{} is not a serving address", worker.url);
        }
    }
}
