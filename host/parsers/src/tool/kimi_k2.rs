//! `kimi_k2` (Kimi K2): `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//! <|tool_call_argument_begin|>{json}<|tool_call_end|>…<|tool_calls_section_end|>`. The model
//! writes the call id itself, `functions.NAME:IDX`; the name is the part between the last `.`
//! and the `:`.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/kimi_k2_tool_parser.py` (id and
//! name rule) and SGLang `python/sglang/srt/function_call/kimik2_detector.py`, which also accepts
//! the section token spelled `<|tool_call_section_begin|>`.

use super::args::{CallHead, HeadSyntax, plain_name};
use super::sectioned::{SectionSyntax, Sectioned};
use super::{args_json, checked_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARGS_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

static SYNTAX: SectionSyntax = SectionSyntax {
    section_open: &[SECTION_BEGIN, "<|tool_call_section_begin|>"],
    section_close: SECTION_END,
    call_open: CALL_BEGIN,
    call_close: CALL_END,
    head: HeadSyntax {
        ends: &[ARGS_BEGIN],
        parse: parse_head,
    },
    args_close: None,
};

/// The `kimi_k2` parser.
pub(crate) fn machine() -> Sectioned {
    Sectioned::new(&SYNTAX)
}

/// `functions.get_weather:0` → name `get_weather`, and the whole as the id.
fn parse_head(head: &str) -> Option<CallHead> {
    let id = head.trim();
    let before_index = id.split(':').next()?;
    let name = plain_name(before_index.rsplit('.').next()?)?;
    Some(CallHead {
        name,
        id: Some(id.to_owned()),
    })
}

/// Writes calls as Kimi K2's chat template does.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    let mut out = String::from(SECTION_BEGIN);
    for (i, (name, args)) in checked_calls("kimi_k2", calls)?.into_iter().enumerate() {
        let args = args_json(args);
        out.push_str(&format!(
            "{CALL_BEGIN}functions.{name}:{i}{ARGS_BEGIN}{args}{CALL_END}"
        ));
    }
    out.push_str(SECTION_END);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_read_from_the_id() {
        let head = parse_head(" functions.get_weather:3 ").unwrap();
        assert_eq!(
            head,
            CallHead {
                name: "get_weather".into(),
                id: Some("functions.get_weather:3".into())
            }
        );
        assert_eq!(parse_head("search:0").unwrap().name, "search");
        assert_eq!(parse_head("  "), None);
    }
}
