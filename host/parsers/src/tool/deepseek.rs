//! `deepseek_v3` and `deepseek_v3_1` (DeepSeek V3 / R1-0528 and V3.1). Both put calls in
//! `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`, one per `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`:
//!
//! - V3: `function<｜tool▁sep｜>NAME\n```json\n{json}\n```` (type, then the name and a fenced block);
//! - V3.1: `NAME<｜tool▁sep｜>{json}`.
//!
//! Either parser reads both forms (the form shows after the separator: a name line, or the JSON
//! itself); they differ in what [`format_v3`] / [`format_v3_1`] write. Checked against vLLM
//! `vllm/entrypoints/openai/tool_parsers/deepseekv3_tool_parser.py` and
//! `deepseekv31_tool_parser.py`, and SGLang `python/sglang/srt/function_call/deepseekv3_detector.py`
//! and `deepseekv31_detector.py`.

use super::args::{CallHead, HeadSyntax, plain_name};
use super::sectioned::{SectionSyntax, Sectioned};
use super::{args_json, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE_OPEN: &str = "```json";
const FENCE_CLOSE: &str = "```";

static SYNTAX: SectionSyntax = SectionSyntax {
    section_open: &[CALLS_BEGIN],
    section_close: CALLS_END,
    call_open: CALL_BEGIN,
    call_close: CALL_END,
    head: HeadSyntax {
        ends: &[FENCE_OPEN, "{"],
        parse: parse_head,
    },
    args_close: Some(FENCE_CLOSE),
};

/// The parser for both forms.
pub(crate) fn machine() -> Sectioned {
    Sectioned::new(&SYNTAX)
}

/// `function<sep>NAME\n` (V3) or `NAME<sep>` (V3.1).
fn parse_head(head: &str) -> Option<CallHead> {
    let (before, after) = head.split_once(SEP)?;
    let name = if after.trim().is_empty() {
        before
    } else {
        after
    };
    Some(CallHead {
        name: plain_name(name)?,
        id: None,
    })
}

/// Writes calls in DeepSeek V3's form.
pub(crate) fn format_v3(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    write(calls, "deepseek_v3", |name, args| {
        format!("{CALL_BEGIN}function{SEP}{name}\n{FENCE_OPEN}\n{args}\n{FENCE_CLOSE}{CALL_END}")
    })
}

/// Writes calls in DeepSeek V3.1's form.
pub(crate) fn format_v3_1(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    write(calls, "deepseek_v3_1", |name, args| {
        format!("{CALL_BEGIN}{name}{SEP}{args}{CALL_END}")
    })
}

fn write(
    calls: &[ToolCall],
    parser: &'static str,
    call: impl Fn(&str, &str) -> String,
) -> Result<String, Unrepresentable> {
    let calls = checked_calls(parser, calls)?;
    let body: Vec<String> = calls
        .into_iter()
        .map(|(name, args)| call(name, &args_json(args)))
        .collect();
    Ok(format!("{CALLS_BEGIN}{}{CALLS_END}", body.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_header_forms_name_the_tool() {
        assert_eq!(
            parse_head("function<｜tool▁sep｜>get_weather\n")
                .unwrap()
                .name,
            "get_weather"
        );
        assert_eq!(
            parse_head("get_weather<｜tool▁sep｜>").unwrap().name,
            "get_weather"
        );
        assert_eq!(parse_head("get_weather"), None);
        assert_eq!(parse_head("<｜tool▁sep｜>"), None);
    }
}
