//! `glm47` (GLM-4.5, 4.6, 4.7): one call per block, the name right after the opening tag,
//! `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>` (GLM-4.5 puts
//! newlines between the parts; both read the same). A value is trimmed and is JSON if it parses,
//! else a string.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/glm4_moe_tool_parser.py` (keys and
//! values stripped; JSON-deserialised unless declared a string) and SGLang
//! `python/sglang/srt/function_call/glm47_moe_detector.py`.

use super::xml_params::{Layout, Trim, XmlParams, XmlSyntax, write_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;

static SYNTAX: XmlSyntax = XmlSyntax {
    block: None,
    bare_calls: true,
    call_open: "<tool_call>",
    name_close: None,
    call_close: "</tool_call>",
    key_open: "<arg_key>",
    key_close: "</arg_key>",
    value_open: Some("<arg_value>"),
    value_close: "</arg_value>",
    trim: Trim::Whitespace,
    layout: Layout {
        sep: "",
        value_pad: "",
        quoted: false,
        block_per_call: false,
    },
};

/// The `glm47` parser.
pub(crate) fn machine() -> XmlParams {
    XmlParams::new(&SYNTAX)
}

/// Writes calls as GLM-4.7's chat template does.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    write_calls(&SYNTAX, "glm47", calls)
}
