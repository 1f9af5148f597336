//! Hostile input to the gateway's own parsers: engine SSE streams (garbage at any chunking), the
//! configuration loader (TOML-ish text), trace segments (any bytes, torn lines, truncated gzip)
//! and the harness tool-event API. Property: no panic, plus what each parser promises.
//!
//! 256 cases per target; `PROPTEST_CASES=100000 cargo test -p switchyard-gateway --test fuzz`
//! for a longer run.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::io::Write;
use std::time::{Duration, SystemTime};

use flate2::Compression;
use flate2::write::GzEncoder;
use proptest::prelude::*;
use switchyard_gateway::agent::AgentContext;
use switchyard_gateway::config::{Config, RawConfig, rank_endpoint};
use switchyard_gateway::sse::{SseReader, SseTap};
use switchyard_gateway::trace::{TraceLine, parse_tool_events, read_trace};

/// `bytes` cut at the positions `picks` choose (any byte, UTF-8 sequences included).
fn chunks<'b>(bytes: &'b [u8], picks: &[prop::sample::Index]) -> Vec<&'b [u8]> {
    let mut cuts: Vec<usize> = picks.iter().map(|p| p.index(bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for cut in cuts {
        out.push(&bytes[from..cut]);
        from = cut;
    }
    out.push(&bytes[from..]);
    out
}

// === SSE ===

/// An engine stream, or something pretending to be one: SSE pieces, both line endings, JSON
/// chunks with usage and tool calls, invalid UTF-8 and arbitrary bytes.
fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: x".to_vec()),
        Just(b": keep-alive".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r\n\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just(br#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#.to_vec()),
        Just(br#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}"#.to_vec()),
        Just(br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":18446744073709551615,"id":"c","function":{"name":"f"}}]}}]}"#.to_vec()),
        Just(br#"{"choices":[{"index":0,"finish_reason":"stop","delta":{}}]}"#.to_vec()),
        Just(br#"{"choices":"x","usage":[]}"#.to_vec()),
        Just(b"\xff\xfe\xc3".to_vec()),
        Just("é😀".as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 1..16),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

proptest! {
    // 256 cases (proptest's default) unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig::default())]

    /// The reader gives the same events however the bytes arrive.
    #[test]
    fn fuzz_sse_reader_split_invariant(
        stream in sse_stream(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut whole = SseReader::default();
        let mut expected = whole.push(&stream).unwrap();
        expected.extend(whole.finish());
        let mut reader = SseReader::default();
        let mut got = Vec::new();
        for chunk in chunks(&stream, &picks) {
            got.extend(reader.push(chunk).unwrap());
        }
        got.extend(reader.finish());
        prop_assert_eq!(got, expected);
    }

    /// The tap forwards the stream byte for byte, holds back only an unterminated last event,
    /// and reads the same usage and finish at any chunking.
    #[test]
    fn fuzz_sse_tap_forwards_verbatim(
        stream in sse_stream(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut whole = SseTap::new(false).capturing_text();
        whole.feed(&stream);
        whole.finish();
        let mut tap = SseTap::new(false).capturing_text();
        let mut out = Vec::new();
        let mut fed = 0;
        for chunk in chunks(&stream, &picks) {
            out.extend_from_slice(&tap.feed(chunk));
            fed += chunk.len();
            // Only an unterminated event is held back: what is not forwarded yet has no
            // terminator (and so, with no length cap, this is all the tap ever buffers).
            let held = &stream[out.len().min(fed)..fed];
            let terminated = held.windows(2).any(|w| w == b"\n\n")
                || held.windows(4).any(|w| w == b"\r\n\r\n");
            prop_assert!(!terminated, "held back {:?}", held);
        }
        out.extend_from_slice(&tap.finish());
        prop_assert_eq!(&out, &stream);
        prop_assert_eq!(tap.usage(), whole.usage());
        prop_assert_eq!(tap.token_events(), whole.token_events());
        prop_assert_eq!(tap.take_finish(), whole.take_finish());
    }

    /// Hiding the usage chunk also does not depend on the chunking.
    #[test]
    fn fuzz_sse_tap_hiding_usage_split_invariant(
        stream in sse_stream(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let mut whole = SseTap::new(true);
        let mut expected = whole.feed(&stream).to_vec();
        expected.extend_from_slice(&whole.finish());
        let mut tap = SseTap::new(true);
        let mut out = Vec::new();
        for chunk in chunks(&stream, &picks) {
            out.extend_from_slice(&tap.feed(chunk));
        }
        out.extend_from_slice(&tap.finish());
        prop_assert_eq!(out, expected);
    }
}

// === Configuration ===

const EXAMPLE: &str = include_str!("../../../examples/switchyard.toml");

/// The loader as `switchyard serve --config` runs it, plus every rank's event endpoints (the
/// server derives them at start).
fn load(text: &str) {
    let Ok(raw) = toml::from_str::<RawConfig>(text) else {
        return;
    };
    let Ok(config) = Config::try_from(raw) else {
        return;
    };
    for worker in &config.workers {
        for endpoint in [&worker.kv_events, &worker.replay].into_iter().flatten() {
            let _ = rank_endpoint(endpoint, worker.dp_size - 1);
        }
    }
}

/// Values a key might get: every TOML type, extremes, durations, endpoints.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("4294967295".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("-9223372036854775808".to_owned()),
        Just("1e309".to_owned()),
        Just("nan".to_owned()),
        Just("-inf".to_owned()),
        Just("0.5".to_owned()),
        Just("true".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"0s\"".to_owned()),
        Just("\"1ns\"".to_owned()),
        Just("\"584942417355y\"".to_owned()),
        Just("\"99999999999999999999h\"".to_owned()),
        Just("\"-5s\"".to_owned()),
        Just("\"tcp://h:65535\"".to_owned()),
        Just("\"tcp://h:4294967295\"".to_owned()),
        Just("\"tcp://h:\"".to_owned()),
        Just("\"tcp://[::1]\"".to_owned()),
        Just("\"http://x\"".to_owned()),
        Just("\"[\"".to_owned()),
        Just("\"**\"".to_owned()),
        Just("\"{a,\"".to_owned()),
        Just("\"kv-cost\"".to_owned()),
        Just("\"thunder-agent\"".to_owned()),
        Just("\"hermes\"".to_owned()),
        Just("\"tokens\"".to_owned()),
        Just("[]".to_owned()),
        Just("[1, \"a\"]".to_owned()),
        Just("{}".to_owned()),
        Just("{ device_credit = -1e308 }".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "[ -~]{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

/// Text built from the schema's own tables and keys with hostile values.
fn toml_text() -> impl Strategy<Value = String> {
    let table = prop::sample::select(vec![
        "[server]",
        "[model]",
        "[router]",
        "[router.weights]",
        "[frontend]",
        "[admission]",
        "[queue]",
        "[trace]",
        "[policies]",
        "[policies.models.m]",
        "[[workers]]",
        "[[workers]]\nurl = \"http://w:1\"",
        "[[workers]]\nurl = \"http://w:1\"\nkv_events = \"tcp://w:65535\"\ndp_size = 2",
        "",
    ]);
    let key = prop::sample::select(vec![
        "host",
        "port",
        "max_body_bytes",
        "request_timeout",
        "connect_timeout",
        "health_interval",
        "name",
        "path",
        "tool_parser",
        "reasoning_parser",
        "aliases",
        "context_length",
        "policy",
        "temperature",
        "weights",
        "booking_ttl",
        "approx_ttl",
        "approx_max_blocks",
        "max_attempts",
        "response_store_entries",
        "response_store_bytes",
        "session_cache_sessions",
        "session_cache_bytes",
        "session_idle",
        "session_prompts",
        "volatile_system_lines",
        "tick_interval",
        "max_hold",
        "program_idle",
        "pause_threshold",
        "pause_target",
        "resume_hysteresis",
        "acting_weight",
        "order",
        "max_prefill_tokens",
        "max_requests",
        "capacity",
        "retry_after",
        "url",
        "kind",
        "kv_events",
        "replay",
        "dp_size",
        "kv_capacity_tokens",
        "block_size",
        "upstream",
        "segment_bytes",
        "gzip",
        "include_content",
        "buffer",
        "dir",
        "router",
        "shadow",
        "kv_hints",
        "admin_token",
        "debounce",
        "deadline",
        "startup_deadline",
        "max_memory_bytes",
        "device_credit",
        "zzz",
    ]);
    let entry = (key, toml_value()).prop_map(|(k, v)| format!("{k} = {v}"));
    prop::collection::vec((table, prop::collection::vec(entry, 0..6)), 0..6).prop_map(|tables| {
        tables
            .into_iter()
            .map(|(t, entries)| format!("{t}\n{}\n", entries.join("\n")))
            .collect()
    })
}

/// The annotated example with one line replaced, removed or cut.
fn edited_example() -> impl Strategy<Value = String> {
    (
        any::<prop::sample::Index>(),
        toml_value(),
        0u8..3,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(line, value, how, cut)| {
            let mut lines: Vec<String> = EXAMPLE.lines().map(str::to_owned).collect();
            let i = line.index(lines.len());
            match how {
                // Keep the key, replace the value.
                0 => {
                    if let Some((key, _)) = lines[i].split_once('=') {
                        lines[i] = format!("{key}= {value}");
                    }
                }
                1 => {
                    lines.remove(i);
                }
                _ => {
                    let text = lines[i].clone();
                    let at = text
                        .char_indices()
                        .map(|(b, _)| b)
                        .nth(cut.index(text.chars().count() + 1))
                        .unwrap_or(text.len());
                    lines[i] = text[..at].to_owned();
                }
            }
            lines.join("\n")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_config_never_panics(
        text in prop_oneof![toml_text(), edited_example(), any::<String>()],
    ) {
        load(&text);
    }
}

/// Regression: rank 1 of an endpoint whose port is `u32::MAX` overflowed `port + dp_rank`.
#[test]
fn rank_endpoint_port_overflow_is_an_error() {
    assert!(rank_endpoint("tcp://h:4294967295", 1).is_err());
    assert!(rank_endpoint("tcp://h:65535", 1).is_err());
    assert_eq!(rank_endpoint("tcp://h:65534", 1).unwrap(), "tcp://h:65535");
}

// === Trace segments ===

/// Trace lines as the gateway writes them (tool events are the lines a test can build from the
/// public API).
fn trace_lines(n: usize) -> Vec<TraceLine> {
    if n == 0 {
        return Vec::new();
    }
    let body = serde_json::to_vec(
        &(0..n)
            .map(|i| {
                serde_json::json!({"event_type": "tool_end", "call_id": format!("c{i}"),
                    "name": "bash", "duration_ms": 1.5, "session_id": "s"})
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    parse_tool_events(&body, &AgentContext::default(), SystemTime::UNIX_EPOCH).unwrap()
}

fn jsonl(lines: &[TraceLine]) -> Vec<u8> {
    lines
        .iter()
        .flat_map(|l| {
            let mut line = serde_json::to_vec(l).unwrap();
            line.push(b'\n');
            line
        })
        .collect()
}

/// `lines` gzipped with a sync flush after each, as the sink flushes per batch; also the
/// compressed length after each flush.
fn gzipped(lines: &[TraceLine]) -> (Vec<u8>, Vec<usize>) {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    let mut flushed = Vec::new();
    for line in lines {
        gz.write_all(&jsonl(std::slice::from_ref(line))).unwrap();
        gz.flush().unwrap();
        flushed.push(gz.get_ref().len());
    }
    (gz.finish().unwrap(), flushed)
}

fn read(bytes: &[u8]) -> Vec<TraceLine> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace-1-0.jsonl.gz");
    std::fs::write(&path, bytes).unwrap();
    read_trace(&path).expect("a readable file reads")
}

proptest! {
    // Each case writes a file: 64 by default (PROPTEST_CASES, when set, wins).
    #![proptest_config(ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            ProptestConfig::default().cases
        } else {
            64
        },
        ..ProptestConfig::default()
    })]

    /// Any bytes (gzip magic in front half the time) read as some lines, never a panic.
    #[test]
    fn fuzz_trace_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        let bytes = if magic { [&[0x1f, 0x8b][..], &bytes].concat() } else { bytes };
        let _ = read(&bytes);
    }

    /// A plain segment cut anywhere: exactly the complete lines before the cut.
    #[test]
    fn fuzz_trace_torn_plain(n in 0usize..6, cut in any::<prop::sample::Index>()) {
        let lines = trace_lines(n);
        let text = jsonl(&lines);
        let at = cut.index(text.len() + 1);
        let complete = text[..at].iter().filter(|&&b| b == b'\n').count();
        prop_assert_eq!(read(&text[..at]), &lines[..complete]);
    }

    /// A gzip segment cut anywhere: a prefix of its lines, and at least those flushed before
    /// the cut.
    #[test]
    fn fuzz_trace_torn_gzip(n in 0usize..6, cut in any::<prop::sample::Index>()) {
        let lines = trace_lines(n);
        let (gz, flushed) = gzipped(&lines);
        let at = cut.index(gz.len() + 1);
        let got = read(&gz[..at]);
        prop_assert!(got.len() <= lines.len());
        prop_assert_eq!(&got[..], &lines[..got.len()]);
        let at_least = flushed.iter().filter(|&&end| end <= at).count();
        prop_assert!(got.len() >= at_least, "{} lines, {} flushed", got.len(), at_least);
    }

    /// A gzip segment with a flipped byte: no panic.
    #[test]
    fn fuzz_trace_corrupt_gzip(n in 1usize..6, at in any::<prop::sample::Index>(), x in 1u8..=255) {
        let (mut gz, _) = gzipped(&trace_lines(n));
        let i = at.index(gz.len());
        gz[i] ^= x;
        let _ = read(&gz);
    }
}

// === Harness tool events (`POST /v1/agent/tool_events`) ===

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_tool_events_never_panic(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..128),
            (
                prop::sample::select(vec!["tool_start", "tool_end", "tool_error", "request_end", ""]),
                prop_oneof![Just("1.5".to_owned()), Just("-1e308".to_owned()), Just("null".to_owned()), Just("\"x\"".to_owned())],
                prop_oneof![Just("0".to_owned()), Just("18446744073709551615".to_owned()), Just("-1".to_owned()), Just("1e30".to_owned())],
                any::<bool>(),
            )
                .prop_map(|(kind, duration, time, array)| {
                    let event = format!(r#"{{"event_type":"{kind}","call_id":"c","name":"n","duration_ms":{duration},"event_time_unix_ms":{time}}}"#);
                    (if array { format!("[{event},{event}]") } else { event }).into_bytes()
                }),
        ],
    ) {
        let _ = parse_tool_events(&body, &AgentContext::default(), SystemTime::UNIX_EPOCH + Duration::from_secs(1));
    }
}
