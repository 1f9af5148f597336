//! `minimax_m2` (MiniMax M2): calls as invokes in one block,
//! `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">VALUE</parameter>\n</invoke>\n</minimax:tool_call>`.
//! A value is trimmed and is JSON if it parses, else a string.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/minimax_m2_tool_parser.py` (names
//! may be quoted; values stripped of surrounding whitespace) and SGLang
//! `python/sglang/srt/function_call/minimax_m2.py`.

use super::xml_params::{Layout, Trim, XmlParams, XmlSyntax, write_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;

static SYNTAX: XmlSyntax = XmlSyntax {
    block: Some(("<minimax:tool_call>", "</minimax:tool_call>")),
    bare_calls: false,
    call_open: "<invoke name=",
    name_close: Some(">"),
    call_close: "</invoke>",
    key_open: "<parameter name=",
    key_close: ">",
    value_open: None,
    value_close: "</parameter>",
    trim: Trim::Whitespace,
    layout: Layout {
        sep: "\n",
        value_pad: "",
        quoted: true,
        block_per_call: false,
    },
};

/// The `minimax_m2` parser.
pub(crate) fn machine() -> XmlParams {
    XmlParams::new(&SYNTAX)
}

/// Writes calls as MiniMax M2's chat template does.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    write_calls(&SYNTAX, "minimax_m2", calls)
}
