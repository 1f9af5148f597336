//! Every tool-call parser on hand-written output in its model's documented format: text around
//! the calls, one call, parallel calls, nested arguments, unicode and escaped quotes. Each
//! fixture is parsed whole and under every chunking, in both emission modes.

use serde_json::{Value, json};
use switchyard_parsers::{CallEmission, TOOL_PARSERS};

use crate::support::{Call, assert_output, call, run_tool, same_for_every_split};

/// Arguments with a nested object, unicode and quotes, as a model writes them in JSON.
const A_JSON: &str =
    r#"{"city": "São Paulo", "note": "say \"hi\" 🌧", "opts": {"units": "metric", "days": [1, 2]}}"#;
const B_JSON: &str = r#"{"query": "rust 🦀", "limit": 5}"#;

fn a() -> Value {
    json!({"city": "São Paulo", "note": "say \"hi\" 🌧", "opts": {"units": "metric", "days": [1, 2]}})
}

fn b() -> Value {
    json!({"query": "rust 🦀", "limit": 5})
}

struct Fixture {
    parser: &'static str,
    input: String,
    text: &'static str,
    reasoning: &'static str,
    calls: Vec<Call>,
}

fn fixture(parser: &'static str, input: String, text: &'static str, calls: Vec<Call>) -> Fixture {
    Fixture {
        parser,
        input,
        text,
        reasoning: "",
        calls,
    }
}

fn with_ids(mut calls: Vec<Call>, ids: &[Option<&'static str>]) -> Vec<Call> {
    for (call, id) in calls.iter_mut().zip(ids) {
        call.id = *id;
    }
    calls
}

fn one() -> Vec<Call> {
    vec![call("get_weather", a())]
}

fn two() -> Vec<Call> {
    vec![call("get_weather", a()), call("search", b())]
}

fn fixtures() -> Vec<Fixture> {
    let qwen_call_a = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=note>\nsay \"hi\" 🌧\n</parameter>\n<parameter=opts>\n{\"units\": \"metric\", \"days\": [1, 2]}\n</parameter>\n</function>\n</tool_call>";
    let qwen_call_b = "<tool_call>\n<function=search>\n<parameter=query>\nrust 🦀\n</parameter>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>";
    let minimax_a = "<invoke name=\"get_weather\">\n<parameter name=\"city\">São Paulo</parameter>\n<parameter name=\"note\">say \"hi\" 🌧</parameter>\n<parameter name=\"opts\">{\"units\": \"metric\", \"days\": [1, 2]}</parameter>\n</invoke>\n";
    let minimax_b = "<invoke name=\"search\">\n<parameter name=\"query\">rust 🦀</parameter>\n<parameter name=\"limit\">5</parameter>\n</invoke>\n";
    let glm_a = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>São Paulo</arg_value><arg_key>note</arg_key><arg_value>say \"hi\" 🌧</arg_value><arg_key>opts</arg_key><arg_value>{\"units\": \"metric\", \"days\": [1, 2]}</arg_value></tool_call>";
    let glm_b = "<tool_call>search<arg_key>query</arg_key><arg_value>rust 🦀</arg_value><arg_key>limit</arg_key><arg_value>5</arg_value></tool_call>";
    let kimi = |name: &str, i: usize, args: &str| {
        format!(
            "<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        )
    };
    let ds3 = |name: &str, args: &str| {
        format!(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
        )
    };
    let ds31 = |name: &str, args: &str| {
        format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>")
    };
    let harmony_call = |name: &str, args: &str| {
        format!(
            "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"
        )
    };
    let py_a = r#"get_weather(city="São Paulo", note="say \"hi\" 🌧", opts={"units": "metric", "days": [1, 2]})"#;
    let py_a_single_quotes = r#"get_weather(city='São Paulo', note='say "hi" 🌧', opts={'units': 'metric', 'days': (1, 2)})"#;

    vec![
        fixture(
            "hermes",
            format!(
                "Let me check. <tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {A_JSON}}}\n</tool_call>\nDone."
            ),
            "Let me check. \nDone.",
            one(),
        ),
        fixture(
            "hermes",
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {A_JSON}}}\n</tool_call>\n<tool_call>\n{{\"arguments\": {B_JSON}, \"name\": \"search\"}}\n</tool_call>"
            ),
            "\n",
            two(),
        ),
        fixture(
            "qwen3_coder",
            format!("Let me check.\n{qwen_call_a}\nDone."),
            "Let me check.\n\nDone.",
            one(),
        ),
        fixture(
            "qwen3_coder",
            format!("{qwen_call_a}\n{qwen_call_b}"),
            "\n",
            two(),
        ),
        fixture(
            "minimax_m2",
            format!("Let me check.\n<minimax:tool_call>\n{minimax_a}</minimax:tool_call>\nDone."),
            "Let me check.\n\nDone.",
            one(),
        ),
        fixture(
            "minimax_m2",
            format!("<minimax:tool_call>\n{minimax_a}{minimax_b}</minimax:tool_call>"),
            "",
            two(),
        ),
        fixture(
            "glm47",
            // GLM-4.5 writes the parts on their own lines; GLM-4.7 does not.
            format!(
                "Let me check.\n{}\nDone.",
                glm_a
                    .replace("<arg_key>", "\n<arg_key>")
                    .replace("</tool_call>", "\n</tool_call>")
            ),
            "Let me check.\n\nDone.",
            one(),
        ),
        fixture("glm47", format!("{glm_a}{glm_b}"), "", two()),
        fixture(
            "kimi_k2",
            format!(
                "Let me check. <|tool_calls_section_begin|>{}<|tool_calls_section_end|> Done.",
                kimi("get_weather", 0, A_JSON)
            ),
            "Let me check.  Done.",
            with_ids(one(), &[Some("functions.get_weather:0")]),
        ),
        fixture(
            "kimi_k2",
            format!(
                "<|tool_calls_section_begin|>{}\n{}<|tool_calls_section_end|>",
                kimi("get_weather", 0, A_JSON),
                kimi("search", 1, B_JSON)
            ),
            "",
            with_ids(
                two(),
                &[Some("functions.get_weather:0"), Some("functions.search:1")],
            ),
        ),
        fixture(
            "deepseek_v3",
            format!(
                "Let me check.<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>Done.",
                ds3("get_weather", A_JSON)
            ),
            "Let me check.Done.",
            one(),
        ),
        fixture(
            "deepseek_v3",
            format!(
                "<｜tool▁calls▁begin｜>{}\n{}<｜tool▁calls▁end｜>",
                ds3("get_weather", A_JSON),
                ds3("search", B_JSON)
            ),
            "",
            two(),
        ),
        fixture(
            "deepseek_v3_1",
            format!(
                "Let me check.<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>Done.",
                ds31("get_weather", A_JSON)
            ),
            "Let me check.Done.",
            one(),
        ),
        fixture(
            "deepseek_v3_1",
            format!(
                "<｜tool▁calls▁begin｜>{}{}<｜tool▁calls▁end｜>",
                ds31("get_weather", A_JSON),
                ds31("search", B_JSON)
            ),
            "",
            two(),
        ),
        fixture(
            "llama3_json",
            format!(
                "Let me check.<|python_tag|>{{\"name\": \"get_weather\", \"parameters\": {A_JSON}}}\nDone."
            ),
            "Let me check.Done.",
            one(),
        ),
        fixture(
            "llama3_json",
            format!(
                "{{\"name\": \"get_weather\", \"parameters\": {A_JSON}}}; {{\"type\": \"function\", \"name\": \"search\", \"arguments\": {B_JSON}}}"
            ),
            "",
            two(),
        ),
        fixture(
            "mistral",
            format!("Let me check.[TOOL_CALLS]get_weather[ARGS]{A_JSON} Done."),
            "Let me check. Done.",
            one(),
        ),
        fixture(
            "mistral",
            format!(
                "[TOOL_CALLS][{{\"name\": \"get_weather\", \"arguments\": {A_JSON}}}, {{\"name\": \"search\", \"arguments\": {B_JSON}}}]"
            ),
            "",
            two(),
        ),
        fixture(
            "mistral",
            format!(
                "[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{A_JSON}[TOOL_CALLS]search{B_JSON}"
            ),
            "",
            with_ids(two(), &[Some("a1B2c3D4e"), None]),
        ),
        fixture(
            "pythonic",
            format!("Let me check. [{py_a}] Done."),
            "Let me check.  Done.",
            one(),
        ),
        fixture(
            "pythonic",
            format!("[{py_a_single_quotes},\n search(query=\"rust 🦀\", limit=5)]"),
            "",
            two(),
        ),
        Fixture {
            parser: "harmony",
            input: format!(
                "<|channel|>analysis<|message|>User wants the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>{}<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
                harmony_call("get_weather", A_JSON)
            ),
            text: "Let me check.Done.",
            reasoning: "User wants the weather.",
            calls: one(),
        },
        Fixture {
            parser: "harmony",
            input: format!(
                "<|channel|>analysis<|message|>Two calls.<|end|>{}<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{B_JSON}<|call|>",
                harmony_call("get_weather", A_JSON)
            ),
            text: "",
            reasoning: "Two calls.",
            calls: two(),
        },
    ]
}

#[test]
fn every_tool_parser_has_fixtures() {
    let fixtures = fixtures();
    for name in TOOL_PARSERS {
        let count = fixtures.iter().filter(|f| f.parser == *name).count();
        assert!(count >= 2, "{name} has {count} fixtures");
    }
}

#[test]
fn fixtures_parse_the_same_under_every_split() {
    for f in fixtures() {
        for emission in [CallEmission::Streaming, CallEmission::Complete] {
            let events =
                same_for_every_split(&f.input, |chunks| run_tool(f.parser, emission, chunks));
            assert_output(&events, f.text, f.reasoning, &f.calls);
        }
    }
}

#[test]
fn json_arguments_stream_before_the_call_ends() {
    // Up to the middle of the arguments: the call has started and part of its arguments is out.
    for (name, input) in [
        (
            "hermes",
            format!("<tool_call>{{\"name\": \"f\", \"arguments\": {A_JSON}}}</tool_call>"),
        ),
        (
            "kimi_k2",
            format!(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{A_JSON}<|tool_call_end|>"
            ),
        ),
        ("mistral", format!("[TOOL_CALLS]f[ARGS]{A_JSON}")),
        (
            "harmony",
            format!(
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{A_JSON}<|call|>"
            ),
        ),
    ] {
        let cut = input.find("metric").unwrap();
        let mut parser = switchyard_parsers::tool_parser(name, "c_".into()).unwrap();
        let events = crate::support::normalize(parser.push(&input[..cut]));
        let output: switchyard_parsers::ParsedOutput = events.into_iter().collect();
        assert_eq!(output.calls.len(), 1, "{name}");
        assert!(
            output.calls[0]
                .arguments
                .starts_with("{\"city\": \"São Paulo\""),
            "{name}: {output:?}"
        );
    }
}

#[test]
fn xml_parameters_stream_one_at_a_time() {
    let mut parser = switchyard_parsers::tool_parser("qwen3_coder", "c_".into()).unwrap();
    let events =
        parser.push("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nx");
    let output: switchyard_parsers::ParsedOutput = events.into_iter().collect();
    assert_eq!(output.calls[0].arguments, "{\"a\": 1");
}
