//! The trace line (`switchyard.request.trace.v1`) and how a finished request becomes one.

use crate::agent::AgentContext;
use crate::sse::{Finish, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The schema name every line carries.
pub const SCHEMA: &str = "switchyard.request.trace.v1";

/// What a line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A request finished (`request` is set).
    RequestEnd,
    /// A harness started a tool call (`tool` is set).
    ToolStart,
    /// A tool call returned.
    ToolEnd,
    /// A tool call failed.
    ToolError,
}

/// One JSON line of the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceLine {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// What happened.
    pub event_type: EventType,
    /// When it happened (unix milliseconds).
    pub event_time_unix_ms: u64,
    /// The session it belongs to.
    pub agent_context: AgentContext,
    /// Set on `request_end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Box<RequestFields>>,
    /// Set on tool events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolFields>,
    /// Request body and completion text, only when the trace includes content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
}

/// A finished request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFields {
    /// The gateway's id of the request.
    pub request_id: String,
    /// Model name served.
    pub model: String,
    /// Prompt tokens (the engine's count, else ours).
    pub input_tokens: u64,
    /// Generated tokens the engine reported.
    pub output_tokens: u64,
    /// Prompt tokens the engine served from its prefix cache.
    pub cached_tokens: u64,
    /// When the gateway received the request (unix milliseconds).
    pub request_received_ms: u64,
    /// Received -> routing decision (parsing, tokenizing, routing).
    pub prefill_wait_time_ms: f64,
    /// Routing decision -> the engine's first byte.
    pub prefill_time_ms: f64,
    /// Received -> first byte.
    pub ttft_ms: f64,
    /// Received -> last byte (or the client leaving).
    pub total_time_ms: f64,
    /// Mean time between streamed events that carried tokens; 0 unstreamed.
    pub avg_itl_ms: f64,
    /// `cached_tokens / input_tokens`.
    pub kv_hit_rate: f64,
    /// Requests the router had booked on the chosen rank when this one was placed.
    pub queue_depth: u32,
    /// The rank that served it.
    pub worker: WorkerRef,
    /// How it ended.
    pub finish_reason_metadata: FinishMetadata,
    /// The prompt's block structure, enough to replay it.
    pub replay: ReplayBlock,
}

/// A rank and its engine's URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRef {
    /// `worker.dp_rank`.
    pub id: String,
    /// The engine's base URL.
    pub url: String,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishMetadata {
    /// The engine's reason, or `cancelled` (client left) / `error` (stream broke) / `unknown`.
    pub finish_reason: String,
    /// Tool calls the model made.
    pub tool_calls: Vec<ToolCallRef>,
}

/// A tool call's id and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRef {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
}

/// The prompt as block hashes: equal prefixes have equal leading hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayBlock {
    /// Tokens per block.
    pub trace_block_size: u32,
    /// Prompt tokens as the gateway tokenized them.
    pub input_length: u64,
    /// Sequence hash of each full block.
    pub input_sequence_hashes: Vec<u64>,
}

/// A tool event from a harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFields {
    /// The tool call id (as in the model's `tool_calls`).
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// How long the call took, when the harness said.
    pub duration_ms: Option<f64>,
    /// Why it failed (`tool_error`).
    pub error: Option<String>,
}

/// Request and completion content (only with `include_content`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Content {
    /// The request body as received.
    pub request: Value,
    /// The generated text.
    pub completion: String,
}

/// Unix milliseconds of a wall-clock time.
pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the gateway knows of a request once it is routed.
#[derive(Debug)]
pub struct RequestFacts {
    /// The gateway's request id.
    pub request_id: u64,
    /// Model name.
    pub model: String,
    /// Session.
    pub agent: AgentContext,
    /// When the request arrived.
    pub received: Instant,
    /// `received` on the wall clock.
    pub received_at: SystemTime,
    /// When the routing decision was made.
    pub routed: Instant,
    /// The chosen rank.
    pub worker: WorkerRef,
    /// Requests booked on the rank at the decision.
    pub queue_depth: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Prompt tokens as tokenized here.
    pub prompt_tokens: u64,
    /// Sequence hashes of the prompt's full blocks.
    pub hashes: Vec<u64>,
    /// The request body, kept only when content is traced.
    pub body: Option<Value>,
}

/// A routed request on its way: the proxy adds timings, then turns it into a line at the end.
#[derive(Debug)]
pub struct RequestDraft {
    facts: RequestFacts,
    first_byte: Option<Instant>,
    first_tokens: Option<Instant>,
    last_tokens: Option<Instant>,
    token_events: u64,
}

/// How the response to the client ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The whole response was delivered.
    Complete,
    /// The client left first.
    ClientLeft,
    /// The engine's stream broke.
    EngineError,
}

impl RequestDraft {
    /// A draft with no response seen yet.
    pub fn new(facts: RequestFacts) -> Self {
        Self {
            facts,
            first_byte: None,
            first_tokens: None,
            last_tokens: None,
            token_events: 0,
        }
    }

    /// The engine's first byte arrived.
    pub fn first_byte(&mut self, at: Instant) {
        self.first_byte.get_or_insert(at);
    }

    /// `events` streamed events carrying tokens arrived together.
    pub fn tokens(&mut self, at: Instant, events: u64) {
        if events == 0 {
            return;
        }
        self.first_tokens.get_or_insert(at);
        self.last_tokens = Some(at);
        self.token_events += events;
    }

    /// The request is over: the trace line.
    pub fn finish(
        self,
        ended: Instant,
        usage: Option<Usage>,
        finish: Finish,
        ending: Ending,
    ) -> TraceLine {
        let facts = self.facts;
        let since = |t: Instant| ms(t.saturating_duration_since(facts.received));
        let first_byte = self.first_byte.unwrap_or(ended);
        let usage = usage.unwrap_or(Usage {
            prompt_tokens: facts.prompt_tokens,
            ..Usage::default()
        });
        let avg_itl_ms = match (self.first_tokens, self.last_tokens) {
            (Some(first), Some(last)) if self.token_events > 1 => {
                ms(last.saturating_duration_since(first)) / (self.token_events - 1) as f64
            }
            _ => 0.0,
        };
        let finish_reason = match (finish.finish_reason, ending) {
            (Some(reason), _) => reason,
            (None, Ending::ClientLeft) => "cancelled".into(),
            (None, Ending::EngineError) => "error".into(),
            (None, Ending::Complete) => "unknown".into(),
        };
        let request = RequestFields {
            request_id: facts.request_id.to_string(),
            model: facts.model,
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            cached_tokens: usage.cached_tokens,
            request_received_ms: unix_ms(facts.received_at),
            prefill_wait_time_ms: since(facts.routed),
            prefill_time_ms: ms(first_byte.saturating_duration_since(facts.routed)),
            ttft_ms: since(first_byte),
            total_time_ms: since(ended),
            avg_itl_ms,
            kv_hit_rate: if usage.prompt_tokens == 0 {
                0.0
            } else {
                usage.cached_tokens as f64 / usage.prompt_tokens as f64
            },
            queue_depth: facts.queue_depth,
            worker: facts.worker,
            finish_reason_metadata: FinishMetadata {
                finish_reason,
                tool_calls: finish
                    .tool_calls
                    .into_iter()
                    .map(|c| ToolCallRef {
                        id: c.id,
                        name: c.name,
                    })
                    .collect(),
            },
            replay: ReplayBlock {
                trace_block_size: facts.block_size,
                input_length: facts.prompt_tokens,
                input_sequence_hashes: facts.hashes,
            },
        };
        let ended_at = facts.received_at + ended.saturating_duration_since(facts.received);
        TraceLine {
            schema: SCHEMA.into(),
            event_type: EventType::RequestEnd,
            event_time_unix_ms: unix_ms(ended_at),
            agent_context: facts.agent,
            request: Some(Box::new(request)),
            tool: None,
            content: facts.body.map(|request| Content {
                request,
                completion: finish.text,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::ToolCall;

    fn facts(received: Instant) -> RequestFacts {
        RequestFacts {
            request_id: 7,
            model: "m".into(),
            agent: AgentContext {
                session_id: Some("s".into()),
                ..AgentContext::default()
            },
            received,
            received_at: UNIX_EPOCH + Duration::from_secs(1_000),
            routed: received + Duration::from_millis(2),
            worker: WorkerRef {
                id: "1.0".into(),
                url: "http://w".into(),
            },
            queue_depth: 3,
            block_size: 16,
            prompt_tokens: 40,
            hashes: vec![11, 22],
            body: None,
        }
    }

    #[test]
    fn a_streamed_request_becomes_the_schema_line() {
        let t0 = Instant::now();
        let mut d = RequestDraft::new(facts(t0));
        d.first_byte(t0 + Duration::from_millis(10));
        d.tokens(t0 + Duration::from_millis(10), 1);
        d.tokens(t0 + Duration::from_millis(20), 2);
        d.tokens(t0 + Duration::from_millis(40), 1);
        let finish = Finish {
            finish_reason: Some("tool_calls".into()),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "bash".into(),
            }],
            text: String::new(),
        };
        let usage = Usage {
            prompt_tokens: 40,
            cached_tokens: 32,
            completion_tokens: 4,
        };
        let line = d.finish(
            t0 + Duration::from_millis(50),
            Some(usage),
            finish,
            Ending::Complete,
        );
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["event_type"], "request_end");
        assert_eq!(v["event_time_unix_ms"], 1_000_050);
        assert_eq!(v["agent_context"]["session_id"], "s");
        assert!(v["agent_context"]["parent_session_id"].is_null());
        assert!(v.get("content").is_none() && v.get("tool").is_none());
        let r = &v["request"];
        assert_eq!(r["request_id"], "7");
        assert_eq!(r["request_received_ms"], 1_000_000);
        assert_eq!(
            (&r["input_tokens"], &r["output_tokens"], &r["cached_tokens"]),
            (&40.into(), &4.into(), &32.into())
        );
        assert_eq!(r["prefill_wait_time_ms"], 2.0);
        assert_eq!(r["prefill_time_ms"], 8.0);
        assert_eq!(r["ttft_ms"], 10.0);
        assert_eq!(r["total_time_ms"], 50.0);
        assert_eq!(r["avg_itl_ms"], 10.0); // 30 ms over 3 gaps
        assert_eq!(r["kv_hit_rate"], 0.8);
        assert_eq!(r["queue_depth"], 3);
        assert_eq!(r["worker"]["id"], "1.0");
        assert_eq!(r["finish_reason_metadata"]["tool_calls"][0]["name"], "bash");
        assert_eq!(r["replay"]["trace_block_size"], 16);
        assert_eq!(r["replay"]["input_length"], 40);
        assert_eq!(
            r["replay"]["input_sequence_hashes"],
            serde_json::json!([11, 22])
        );
        let back: TraceLine = serde_json::from_value(v).unwrap();
        assert_eq!(back, line);
    }

    #[test]
    fn a_client_that_left_is_cancelled_and_content_is_kept_when_asked() {
        let t0 = Instant::now();
        let d = RequestDraft::new(RequestFacts {
            body: Some(serde_json::json!({"prompt": "hi"})),
            ..facts(t0)
        });
        let finish = Finish {
            text: "partial".into(),
            ..Finish::default()
        };
        let line = d.finish(t0, None, finish, Ending::ClientLeft);
        let r = line.request.as_deref().unwrap();
        assert_eq!(r.finish_reason_metadata.finish_reason, "cancelled");
        // No usage from the engine: our own prompt count, nothing cached.
        assert_eq!(
            (r.input_tokens, r.cached_tokens, r.kv_hit_rate),
            (40, 0, 0.0)
        );
        let content = line.content.unwrap();
        assert_eq!(content.request["prompt"], "hi");
        assert_eq!(content.completion, "partial");
    }
}
