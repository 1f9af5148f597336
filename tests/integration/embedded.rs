//! The embedded default: `switchyard serve` with no configuration.

use crate::support::{Proc, chat_text, client, get_text, metric_sum};
use serde_json::json;

#[tokio::test]
async fn serve_without_config_chats_at_once() {
    let proc = Proc::switchyard(&["serve", "--port", "0"]);
    let url = proc.wait_for("behind ");
    let models: serde_json::Value =
        serde_json::from_str(&get_text(&format!("{url}/v1/models")).await).unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    for stream in [false, true] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "stream": stream});
        let r = client()
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(!chat_text(&r.text().await.unwrap(), stream).is_empty());
    }
    let completion = client()
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(completion.status(), 200);
    let health = client().get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    // A harness's probes are answered, not rejected.
    for probe in [client().get(&url), client().head(&url)] {
        assert_eq!(probe.send().await.unwrap().status(), 200);
    }
    // The embedded model renders tools into the prompt, as a real model's template does, and
    // count_tokens counts them.
    let count = |tools: serde_json::Value| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "tools": tools});
        let request = client()
            .post(format!("{url}/v1/messages/count_tokens"))
            .json(&body);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<serde_json::Value>().await.unwrap()["input_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    let tool = json!([{"name": "read_file", "description": "Read a file from the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]);
    assert!(count(tool).await > count(json!([])).await + 30);
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_routing_decisions_total"),
        3.0,
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "switchyard_requests_total{endpoint=\"/v1/messages/count_tokens\",status=\"200\",harness=\"other\"} 2"
        ),
        "{metrics}"
    );
}
