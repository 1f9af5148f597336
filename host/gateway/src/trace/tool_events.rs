//! Tool events pushed by harnesses (`POST /v1/agent/tool_events`): one object or an array.
//!
//! ```json
//! {"event_type": "tool_end", "call_id": "call_1", "name": "bash", "duration_ms": 812.5,
//!  "session_id": "optional: else from the session headers", "event_time_unix_ms": 1717000000000}
//! ```

use super::record::{EventType, SCHEMA, ToolFields, TraceLine, unix_ms};
use crate::agent::AgentContext;
use serde::Deserialize;
use serde_json::Value;
use std::time::SystemTime;

/// One event as a harness sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEventInput {
    event_type: EventType,
    call_id: String,
    name: String,
    #[serde(default)]
    duration_ms: Option<f64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    parent_session_id: Option<String>,
    /// When it happened on the harness's clock; default: when the gateway received it.
    #[serde(default)]
    event_time_unix_ms: Option<u64>,
}

/// Validate a request body into trace lines; the session comes from each event, else from the
/// request's headers. The error names the first bad event.
pub fn parse_tool_events(
    body: &[u8],
    headers: &AgentContext,
    now: SystemTime,
) -> Result<Vec<TraceLine>, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let items = match value {
        Value::Array(items) if items.is_empty() => return Err("no tool events".into()),
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return Err("the body must be a tool event object or an array of them".into()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| to_line(item, headers, now).map_err(|e| format!("tool event {i}: {e}")))
        .collect()
}

fn to_line(item: Value, headers: &AgentContext, now: SystemTime) -> Result<TraceLine, String> {
    let event: ToolEventInput = serde_json::from_value(item).map_err(|e| e.to_string())?;
    if event.event_type == EventType::RequestEnd {
        return Err("event_type must be tool_start, tool_end or tool_error".into());
    }
    if event.call_id.trim().is_empty() || event.name.trim().is_empty() {
        return Err("call_id and name must not be empty".into());
    }
    if let Some(d) = event.duration_ms
        && !(d.is_finite() && d >= 0.0)
    {
        return Err("duration_ms must be a finite number >= 0".into());
    }
    let agent_context = match event.session_id.filter(|s| !s.trim().is_empty()) {
        Some(session_id) => AgentContext {
            session_id: Some(session_id),
            parent_session_id: event.parent_session_id,
            session_final: false,
            harness: headers.harness,
        },
        None if headers.session_id.is_some() => headers.clone(),
        None => return Err("no session: set session_id or send the session headers".into()),
    };
    Ok(TraceLine {
        schema: SCHEMA.into(),
        event_type: event.event_type,
        event_time_unix_ms: event.event_time_unix_ms.unwrap_or_else(|| unix_ms(now)),
        agent_context,
        request: None,
        tool: Some(ToolFields {
            call_id: event.call_id,
            name: event.name,
            duration_ms: event.duration_ms,
            error: event.error,
        }),
        content: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    const NOW: Duration = Duration::from_millis(5_000);

    fn parse(body: &str, headers: &AgentContext) -> Result<Vec<TraceLine>, String> {
        parse_tool_events(body.as_bytes(), headers, UNIX_EPOCH + NOW)
    }

    fn from_headers() -> AgentContext {
        AgentContext {
            session_id: Some("hdr".into()),
            parent_session_id: Some("root".into()),
            ..AgentContext::default()
        }
    }

    #[test]
    fn one_object_takes_the_session_from_the_headers() {
        let lines = parse(
            r#"{"event_type":"tool_start","call_id":"c1","name":"bash"}"#,
            &from_headers(),
        )
        .unwrap();
        let v = serde_json::to_value(&lines[0]).unwrap();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["event_type"], "tool_start");
        assert_eq!(v["event_time_unix_ms"], 5_000);
        assert_eq!(v["agent_context"]["session_id"], "hdr");
        assert_eq!(v["agent_context"]["parent_session_id"], "root");
        assert_eq!(v["tool"]["call_id"], "c1");
        assert!(v["tool"]["duration_ms"].is_null() && v["tool"]["error"].is_null());
        assert!(v.get("request").is_none());
    }

    #[test]
    fn an_array_with_its_own_sessions_and_times() {
        let lines = parse(
            r#"[{"event_type":"tool_end","call_id":"c1","name":"bash","duration_ms":12.5,
                 "session_id":"s1","event_time_unix_ms":42},
                {"event_type":"tool_error","call_id":"c2","name":"grep","error":"exit 2"}]"#,
            &from_headers(),
        )
        .unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].agent_context.session_id.as_deref(), Some("s1"));
        assert_eq!(lines[0].agent_context.parent_session_id, None);
        assert_eq!(lines[0].event_time_unix_ms, 42);
        assert_eq!(lines[0].tool.as_ref().unwrap().duration_ms, Some(12.5));
        assert_eq!(lines[1].event_type, EventType::ToolError);
        assert_eq!(
            lines[1].tool.as_ref().unwrap().error.as_deref(),
            Some("exit 2")
        );
    }

    #[test]
    fn bad_events_are_refused_with_their_position() {
        let none = AgentContext::default();
        let ok = r#"{"event_type":"tool_start","call_id":"c","name":"n","session_id":"s"}"#;
        for (body, needle) in [
            ("nope", "invalid JSON"),
            ("[]", "no tool events"),
            ("3", "must be a tool event"),
            (
                r#"{"event_type":"request_end","call_id":"c","name":"n","session_id":"s"}"#,
                "event_type must be",
            ),
            (
                r#"{"event_type":"tool_begin","call_id":"c","name":"n"}"#,
                "unknown variant",
            ),
            (r#"{"event_type":"tool_end","name":"n"}"#, "call_id"),
            (
                r#"{"event_type":"tool_end","call_id":" ","name":"n","session_id":"s"}"#,
                "must not be empty",
            ),
            (
                r#"{"event_type":"tool_end","call_id":"c","name":"n","session_id":"s","duration_ms":-1}"#,
                "duration_ms",
            ),
            (
                r#"{"event_type":"tool_end","call_id":"c","name":"n","sesion":"s"}"#,
                "unknown field",
            ),
            (
                r#"{"event_type":"tool_end","call_id":"c","name":"n"}"#,
                "no session",
            ),
        ] {
            let err = parse(body, &none).unwrap_err();
            assert!(err.contains(needle), "{body}: {err}");
        }
        let err = parse(&format!("[{ok}, {{}}]"), &none).unwrap_err();
        assert!(err.starts_with("tool event 1:"), "{err}");
    }
}
