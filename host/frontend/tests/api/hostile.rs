//! Hostile request bodies, as bytes, through what the gateway runs on them before tokenizing:
//! `parse_body`, the API's decoder (and the Responses history), then rendering for the engine
//! and the chat template. Generators: valid requests with one field replaced by a hostile value
//! (wrong type, huge number, deep nesting, empty or huge string), valid request bytes mutated
//! (flips, cuts, invalid UTF-8, lone surrogates, long runs of brackets) and any bytes at all.
//! Property: no panic; the request decodes and renders, or it is a 400 in the API's own error
//! shape.
//!
//! 256 cases per target; `PROPTEST_CASES=100000 cargo test -p switchyard-frontend --test api
//! hostile` for a longer run.

use proptest::prelude::*;
use serde_json::{Value, json};
use switchyard_frontend::{
    Api, ApiError, ErrorKind, ResponseStore, chat, completions, messages, parse_body, responses,
    to_chat_request, to_completion_request, to_template_messages,
};

use crate::support::fixture;

const APIS: [Api; 4] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::Responses,
    Api::Messages,
];

/// The gateway's first stage for `api` on `bytes` (see `proxy::prepare` in the gateway).
fn prepare(api: Api, bytes: &[u8]) -> Result<(), ApiError> {
    let body = parse_body(bytes)?;
    match api {
        Api::ChatCompletions => render(&chat::decode(&body)?),
        Api::Messages => {
            render(&messages::decode(&body)?);
            render(&messages::decode_count_tokens(&body)?);
        }
        Api::Completions => {
            to_completion_request(&completions::decode(&body)?);
        }
        Api::Responses => {
            let mut request = responses::decode(&body)?;
            let mut store = ResponseStore::new(4, 1 << 20);
            let inserted = store.insert("resp_known".into(), Vec::new());
            assert!(inserted.stored && inserted.journal.is_none());
            request.attach_history(&mut store)?;
            render(&request.conversation);
            request.reply_meta("r", 0);
        }
    }
    Ok(())
}

fn render(conversation: &switchyard_frontend::Conversation) {
    to_chat_request(conversation);
    to_template_messages(conversation);
}

/// Ok, or a 400 whose body has the API's own error shape.
fn assert_ok_or_400(api: Api, bytes: &[u8]) -> Result<(), TestCaseError> {
    let Err(err) = prepare(api, bytes) else {
        return Ok(());
    };
    prop_assert_eq!(err.status, 400, "{:?}: {}", api, err);
    prop_assert_eq!(err.kind, ErrorKind::InvalidRequest);
    prop_assert!(!err.message.is_empty());
    let body = api.error_body(&err);
    match api {
        Api::Messages => {
            prop_assert_eq!(&body["type"], "error");
            prop_assert_eq!(&body["error"]["type"], "invalid_request_error");
            prop_assert_eq!(
                body["error"]["message"].as_str(),
                Some(err.message.as_str())
            );
        }
        _ => {
            prop_assert_eq!(&body["error"]["type"], "invalid_request_error");
            prop_assert_eq!(
                body["error"]["message"].as_str(),
                Some(err.message.as_str())
            );
        }
    }
    Ok(())
}

/// A valid request of each API.
fn valid_requests() -> Vec<(Api, Value)> {
    vec![
        (Api::ChatCompletions, fixture("chat_parallel_tools.json")),
        (Api::Responses, fixture("codex_responses.json")),
        (Api::Messages, fixture("claude_code_messages.json")),
        (
            Api::Completions,
            json!({"model": "m", "prompt": ["a", [1, 2]], "max_tokens": 8, "stop": ["\n"],
                   "stream": true, "nvext": {"agent_hints": {"priority": 1}}}),
        ),
        (
            Api::Responses,
            json!({"model": "m", "input": "hi", "previous_response_id": "resp_known",
                   "instructions": "x", "store": true}),
        ),
    ]
}

/// JSON pointers to every value in `value`, root included.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let key = key.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{at}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Strings that are valid where a string is expected but odd: empty, huge, control and
/// bidi characters, and JSON-ish text (tool arguments are parsed again when rendering).
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("x".repeat(100_000)),
        Just("\u{0}\u{202e}é😀\u{feff}".to_owned()),
        Just("{\"a\":".to_owned()),
        Just("[".repeat(10_000)),
        Just("{}".to_owned()),
        Just("5m".to_owned()),
        Just("-1h".to_owned()),
        Just("99999999999999999999h".to_owned()),
        Just("user".to_owned()),
        Just("text".to_owned()),
        Just("function_call".to_owned()),
        Just("tool_use".to_owned()),
        Just("ephemeral".to_owned()),
        any::<String>(),
    ]
}

/// Numbers at the edges.
fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(5e-324)),
        Just(json!(0.5)),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
    ]
}

/// Values of any type, nested a little.
fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        hostile_number(),
        hostile_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(("[a-z_]{0,12}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A hostile value of the same JSON type as `original`, so that the request often still
/// decodes and reaches rendering.
fn same_type(original: &Value, string: String, number: Value, any: Value) -> Value {
    match original {
        Value::String(_) => string.into(),
        Value::Number(_) => number,
        Value::Bool(b) => (!b).into(),
        // Empty, or every item twice.
        Value::Array(_) if string.len().is_multiple_of(2) => json!([]),
        Value::Array(items) => items.iter().chain(items).cloned().collect(),
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert(string, any);
            map.into()
        }
        Value::Null => any,
    }
}

/// `value` nested `depth` times in arrays or objects.
fn nest(value: Value, depth: usize, arrays: bool) -> Value {
    (0..depth).fold(value, |v, _| {
        if arrays {
            json!([v])
        } else {
            json!({"type": v})
        }
    })
}

/// A valid request with one value replaced, as bytes.
fn mutated_request() -> impl Strategy<Value = (Api, Vec<u8>)> {
    let requests = valid_requests();
    (
        0..requests.len(),
        any::<prop::sample::Index>(),
        prop_oneof![
            4 => hostile_value(),
            1 => (hostile_value(), 1usize..200, any::<bool>())
                .prop_map(|(v, depth, arrays)| nest(v, depth, arrays)),
        ],
        any::<bool>(),
        hostile_string(),
        hostile_number(),
    )
        .prop_map(move |(which, at, value, keep_type, string, number)| {
            let (api, mut body) = requests[which].clone();
            let mut all = Vec::new();
            pointers(&body, String::new(), &mut all);
            let pointer = &all[at.index(all.len())];
            if let Some(slot) = body.pointer_mut(pointer) {
                *slot = if keep_type {
                    same_type(slot, string, number, value)
                } else {
                    value
                };
            }
            (api, serde_json::to_vec(&body).expect("a Value serialises"))
        })
}

/// One byte-level edit.
#[derive(Debug, Clone)]
enum Edit {
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Cut(prop::sample::Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let inserts = prop_oneof![
        // Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong NUL, 0xff.
        Just(b"\x80".to_vec()),
        Just(b"\xc3".to_vec()),
        Just(b"\xc0\x80".to_vec()),
        Just(b"\xff\xfe".to_vec()),
        Just(b"\\ud800".to_vec()),
        Just(b"\\u0000".to_vec()),
        Just(b"[".repeat(5_000)),
        Just(b"{\"a\":".repeat(1_000)),
        Just(b"1e999999".to_vec()),
        Just(b"-0".to_vec()),
        Just(b"\"".to_vec()),
        Just(b",".to_vec()),
        prop::collection::vec(any::<u8>(), 1..8),
    ];
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Edit::Flip(i, x)),
        (any::<prop::sample::Index>(), inserts).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(Edit::Cut),
    ]
}

/// Valid request bytes with a few edits.
fn edited_request() -> impl Strategy<Value = (Api, Vec<u8>)> {
    let requests = valid_requests();
    (0..requests.len(), prop::collection::vec(edit(), 1..4)).prop_map(move |(which, edits)| {
        let (api, body) = &requests[which];
        let mut bytes = serde_json::to_vec(body).expect("a Value serialises");
        for edit in edits {
            let len = bytes.len();
            match edit {
                Edit::Flip(i, x) if len > 0 => bytes[i.index(len)] ^= x,
                Edit::Insert(i, b) => {
                    let at = i.index(len + 1);
                    bytes.splice(at..at, b);
                }
                Edit::Cut(i) => bytes.truncate(i.index(len + 1)),
                _ => {}
            }
        }
        (*api, bytes)
    })
}

proptest! {
    // 256 cases (proptest's default) unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn hostile_field_values_are_ok_or_400((api, bytes) in mutated_request()) {
        // The body of one API is hostile to the others too.
        for other in APIS {
            assert_ok_or_400(other, &bytes)?;
        }
        let _ = api;
    }

    #[test]
    fn hostile_bytes_are_ok_or_400((api, bytes) in edited_request()) {
        assert_ok_or_400(api, &bytes)?;
    }

    #[test]
    fn any_bytes_are_ok_or_400(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        for api in APIS {
            assert_ok_or_400(api, &bytes)?;
        }
    }
}

/// Nesting past serde_json's recursion limit is a 400, not a stack overflow.
#[test]
fn deep_nesting_is_a_400() {
    for api in APIS {
        for open in ["[", "{\"a\":"] {
            let mut body = b"{\"model\":\"m\",\"messages\":".to_vec();
            body.extend(open.repeat(100_000).as_bytes());
            let err = prepare(api, &body).expect_err("too deep");
            assert_eq!(err.status, 400);
        }
    }
}

/// Invalid UTF-8 inside a string is a 400.
#[test]
fn invalid_utf8_is_a_400() {
    for api in APIS {
        let err = prepare(api, b"{\"model\":\"m\xff\",\"messages\":[]}").expect_err("bad UTF-8");
        assert_eq!(err.status, 400);
    }
}
