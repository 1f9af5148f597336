//! Scheduling in the gateway. Session-aware admission: agent sessions whose contexts together overflow
//! the workers' KV make ThunderAgent pause programs at their tool boundaries and resume them later;
//! every request is answered exactly once and every held request completes.

use crate::support::{Gateway, MockEngine, client, get_text, metric_sum};
use serde_json::{Value, json};
use std::time::Duration;

const SESSIONS: usize = 10;
const TURNS: usize = 4;
/// Each mock engine's KV: 256 blocks of 16 tokens.
const BLOCKS: u32 = 256;

/// One agent session: every turn but the last ends in a tool call whose (long) output the next
/// turn sends back, so the context grows by ~250 tokens a turn.
async fn agent(url: String, model: String, session: usize) -> Vec<(u16, Value)> {
    // A long, session-specific system prompt: together the programs overflow the workers' KV.
    let rules: String = (0..60)
        .map(|i| format!("Rule {i} of agent {session}: keep the change small.\n"))
        .collect();
    let mut messages = vec![json!({"role": "system", "content": rules})];
    messages.push(json!({"role": "user",
        "content": "Inspect the repository. [[mock:tool_call run {\"cmd\": \"ls\"}]]"}));
    let mut answers = Vec::new();
    for turn in 0..TURNS {
        let last = turn + 1 == TURNS;
        let response = client()
            .post(format!("{url}/v1/chat/completions"))
            .header("x-dynamo-session-id", format!("agent-{session}"))
            .header(
                "x-dynamo-session-final",
                if last { "true" } else { "false" },
            )
            .json(&json!({"model": model, "messages": messages, "max_tokens": 64}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        answers.push((status, body.clone()));
        if status != 200 || last {
            break;
        }
        let message = body["choices"][0]["message"].clone();
        let call_id = message["tool_calls"][0]["id"]
            .as_str()
            .unwrap_or("none")
            .to_owned();
        messages.push(message);
        // The tool runs outside the GPU; its KV waits.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let output: String = (0..15)
            .map(|i| format!("s{session} t{turn} file_{i}.rs 4096 bytes\n"))
            .collect();
        let next = if turn + 2 == TURNS {
            "[[mock:say All done.]]".to_owned()
        } else {
            "[[mock:tool_call run {\"cmd\": \"cat\"}]]".to_owned()
        };
        messages.push(json!({"role": "tool", "tool_call_id": call_id,
                             "content": format!("{output}{next}")}));
    }
    answers
}

#[tokio::test]
async fn thunder_agent_pauses_and_resumes_programs_and_loses_no_request() {
    let engines = [
        MockEngine::start(50.0, BLOCKS),
        MockEngine::start(50.0, BLOCKS),
    ];
    let mut config = String::from(
        "[admission]\npolicy = \"thunder-agent\"\ntick_interval = \"100ms\"\nmax_hold = \"20s\"\n",
    );
    config += &Gateway::config_for(&engines.iter().collect::<Vec<_>>(), "kv-cost").replace(
        "kind = \"mock\"\n",
        &format!(
            "kind = \"mock\"\nupstream = \"tokens\"\nkv_capacity_tokens = {}\n",
            BLOCKS * 16
        ),
    );
    let gateway = Gateway::start(&config);
    let models: Value =
        serde_json::from_str(&get_text(&format!("{}/v1/models", gateway.url)).await).unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_owned();

    let agents: Vec<_> = (0..SESSIONS)
        .map(|s| tokio::spawn(agent(gateway.url.clone(), model.clone(), s)))
        .collect();
    let mut ids = std::collections::HashSet::new();
    for (session, agent) in agents.into_iter().enumerate() {
        let answers = tokio::time::timeout(Duration::from_secs(120), agent)
            .await
            .expect("every agent finishes")
            .unwrap();
        assert_eq!(answers.len(), TURNS, "agent {session}: {answers:?}");
        for (turn, (status, body)) in answers.iter().enumerate() {
            assert_eq!(*status, 200, "agent {session} turn {turn}: {body}");
            assert!(
                ids.insert(body["id"].as_str().unwrap().to_owned()),
                "answered twice"
            );
            let finish = &body["choices"][0]["finish_reason"];
            let expected = if turn + 1 == TURNS {
                "stop"
            } else {
                "tool_calls"
            };
            assert_eq!(finish, expected, "agent {session} turn {turn}: {body}");
        }
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    let m = |name: &str| metric_sum(&metrics, name);
    assert_eq!(
        m("switchyard_admission_arrivals_total"),
        (SESSIONS * TURNS) as f64
    );
    assert!(
        m("switchyard_admission_pauses_total") > 0.0,
        "no program paused:\n{metrics}"
    );
    assert!(
        m("switchyard_admission_holds_total") > 0.0,
        "no request held:\n{metrics}"
    );
    assert!(
        m("switchyard_admission_resumes_total") > 0.0,
        "no program resumed:\n{metrics}"
    );
    assert_eq!(
        m("switchyard_admission_held"),
        0.0,
        "held requests left:\n{metrics}"
    );
    assert_eq!(
        m("switchyard_requests_total"),
        (SESSIONS * TURNS) as f64,
        "{metrics}"
    );
}

/// With one request in flight per worker allowed, concurrent requests wait in the router queue
/// and all complete; a caller that asks not to wait gets a 429 with Retry-After instead.
#[tokio::test]
async fn the_router_queue_holds_requests_while_workers_are_saturated() {
    let engine = MockEngine::start(5.0, 4096);
    let config = String::from("[queue]\nmax_requests = 1\nretry_after = \"2s\"\n")
        + &Gateway::config_for(&[&engine], "kv-cost");
    let gateway = Gateway::start(&config);
    let send = |content: String, do_not_queue: bool| {
        let url = gateway.url.clone();
        async move {
            let mut request = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&json!({"model": "smollm2-135m-instruct", "max_tokens": 32,
                              "messages": [{"role": "user", "content": content}]}));
            if do_not_queue {
                request = request.header("x-switchyard-do-not-queue", "true");
            }
            request.send().await.unwrap()
        }
    };
    let waiting: Vec<_> = (0..4)
        .map(|i| tokio::spawn(send(format!("question {i}"), false)))
        .collect();
    // Wait until one runs and others wait, then try one that will not wait.
    let saturated = crate::support::eventually(20, async || {
        let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
        metric_sum(&metrics, "switchyard_router_queue_depth") >= 1.0
    })
    .await;
    assert!(saturated, "no request ever waited in the queue");
    let impatient = send("now please".into(), true).await;
    assert_eq!(impatient.status(), 429);
    assert_eq!(impatient.headers()["retry-after"], "2");
    for request in waiting {
        let response = request.await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let metrics = get_text(&format!("{}/metrics", gateway.url)).await;
    assert!(metric_sum(&metrics, "switchyard_router_queue_enqueued_total") >= 1.0);
    assert_eq!(
        metric_sum(&metrics, "switchyard_router_queue_would_queue_total"),
        1.0
    );
    assert_eq!(metric_sum(&metrics, "switchyard_router_queue_depth"), 0.0);
}
