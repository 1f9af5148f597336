//! `OutputParser`: reasoning first, then tool calls on the text; names and errors.

use serde_json::json;
use switchyard_parsers::{
    CallEmission, OutputParser, ParsedEvent, ParserKind, REASONING_PARSERS, TOOL_PARSERS, ToolCall,
    format_tool_calls, reasoning_parser, tool_parser,
};

use crate::support::{Call, assert_output, call, normalize, same_for_every_split};

fn run(reasoning: Option<&str>, tools: Option<&str>, chunks: &[&str]) -> Vec<ParsedEvent> {
    let mut parser =
        OutputParser::new(reasoning, tools, crate::support::PREFIX).expect("known parsers");
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk));
    }
    events.extend(parser.finish());
    normalize(events)
}

#[test]
fn reasoning_then_calls_for_each_family() {
    let weather = || call("get_weather", json!({"city": "SF"}));
    let kimi_call = Call {
        id: Some("functions.get_weather:0"),
        ..weather()
    };
    type Case = (
        &'static str,
        &'static str,
        String,
        &'static str,
        &'static str,
        Vec<Call>,
    );
    let cases: Vec<Case> = vec![
        (
            "qwen3",
            "hermes",
            "<think>Weather needed.</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"SF\"}}\n</tool_call>".into(),
            "Weather needed.",
            "\n\nChecking.\n",
            vec![weather()],
        ),
        (
            "qwen3",
            "qwen3_coder",
            "<think>Weather needed.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSF\n</parameter>\n</function>\n</tool_call>".into(),
            "Weather needed.\n",
            "",
            vec![weather()],
        ),
        (
            "deepseek_r1",
            "deepseek_v3",
            "Weather needed.</think>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"SF\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>".into(),
            "Weather needed.",
            "Checking.",
            vec![weather()],
        ),
        (
            "glm45",
            "glm47",
            "<think>Weather needed.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call>".into(),
            "Weather needed.",
            "Checking.",
            vec![weather()],
        ),
        (
            "minimax_m2",
            "minimax_m2",
            "Weather needed.</think>\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">SF</parameter>\n</invoke>\n</minimax:tool_call>".into(),
            "Weather needed.",
            "\n",
            vec![weather()],
        ),
        (
            "kimi",
            "kimi_k2",
            "◁think▷Weather needed.◁/think▷<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"SF\"}<|tool_call_end|><|tool_calls_section_end|>".into(),
            "Weather needed.",
            "",
            vec![kimi_call],
        ),
        (
            "gpt_oss",
            "harmony",
            "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"SF\"}<|call|>".into(),
            "Weather needed.",
            "",
            vec![weather()],
        ),
    ];
    for (reasoning, tools, input, want_reasoning, want_text, calls) in cases {
        let events =
            same_for_every_split(&input, |chunks| run(Some(reasoning), Some(tools), chunks));
        assert_output(&events, want_text, want_reasoning, &calls);
    }
}

#[test]
fn gpt_oss_reasoning_feeds_raw_calls_to_another_tool_parser_stage() {
    // With the reasoning parser alone, a call message stays raw text...
    let input = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
    let events = run(Some("gpt_oss"), None, &[input]);
    assert_output(
        &events,
        &input[input.find("<|start|>").unwrap()..],
        "Hm.",
        &[],
    );
    // ...and the harmony tool parser alone reads everything.
    let events = run(None, Some("harmony"), &[input]);
    assert_output(&events, "", "Hm.", &[call("f", json!({}))]);
}

#[test]
fn without_parsers_everything_is_text() {
    let events = run(None, None, &["<think>a</think>", "<tool_call>b"]);
    assert_output(&events, "<think>a</think><tool_call>b", "", &[]);
}

#[test]
fn whole_responses_hold_calls_until_complete() {
    let mut parser =
        OutputParser::with_emission(Some("qwen3"), Some("hermes"), "id_", CallEmission::Complete)
            .unwrap();
    let partial =
        parser.push("<think>x</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ");
    assert_eq!(normalize(partial), vec![ParsedEvent::Reasoning("x".into())]);
    let output = parser.parse("1}}</tool_call>");
    assert_eq!(output.calls.len(), 1);
    assert_eq!(output.calls[0].id, "id_0");
    assert_eq!(output.calls[0].arguments, "{\"a\": 1}");
}

#[test]
fn the_mock_engine_path_formats_what_the_gateway_parses() {
    let calls = [ToolCall {
        name: "get_weather".into(),
        arguments: json!({"city": "SF"}),
    }];
    for name in TOOL_PARSERS {
        let text = format_tool_calls(name, &calls).unwrap();
        let output = OutputParser::new(None, Some(name), "x_")
            .unwrap()
            .parse(&text);
        assert_eq!(output.calls.len(), 1, "{name}: {text}");
        assert_eq!(output.calls[0].name, "get_weather");
    }
}

#[test]
fn unknown_names_list_the_known_ones() {
    let err = tool_parser("hermes2", "c_".into()).unwrap_err();
    assert_eq!(err.kind, ParserKind::ToolCall);
    let message = err.to_string();
    assert!(
        message.contains("unknown tool-call parser `hermes2`"),
        "{message}"
    );
    for name in TOOL_PARSERS {
        assert!(message.contains(name), "{message}");
    }
    let err = reasoning_parser("deepthink").unwrap_err().to_string();
    for name in REASONING_PARSERS {
        assert!(err.contains(name), "{err}");
    }
    assert!(OutputParser::new(Some("qwen3"), Some("nope"), "c_").is_err());
    assert!(OutputParser::new(Some("nope"), Some("hermes"), "c_").is_err());
    assert!(
        format_tool_calls("nope", &[])
            .unwrap_err()
            .to_string()
            .contains("hermes")
    );
}

#[test]
fn other_engines_names_work() {
    assert!(tool_parser("DeepSeek-V3", "c_".into()).is_ok());
    assert!(tool_parser("openai", "c_".into()).is_ok());
    assert!(reasoning_parser("deepseek-r1").is_ok());
}
