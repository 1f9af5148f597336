//! `qwen3_coder` (Qwen3-Coder, Qwen3.5): one call per block,
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
//! A value loses one newline on each side and is JSON if it parses, else a string.
//!
//! Checked against vLLM `vllm/entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py` (values
//! stripped of one leading and one trailing newline; a `<function=` block is also accepted
//! without `<tool_call>`; a missing `</parameter>` is forgiven) and SGLang
//! `python/sglang/srt/function_call/qwen3_coder_detector.py`. Without the request's tool schemas
//! a value cannot be typed by its declared type, so JSON-looking values become JSON.

use super::xml_params::{Layout, Trim, XmlParams, XmlSyntax, write_calls};
use crate::call::ToolCall;
use crate::error::Unrepresentable;

static SYNTAX: XmlSyntax = XmlSyntax {
    block: Some(("<tool_call>", "</tool_call>")),
    bare_calls: true,
    call_open: "<function=",
    name_close: Some(">"),
    call_close: "</function>",
    key_open: "<parameter=",
    key_close: ">",
    value_open: None,
    value_close: "</parameter>",
    trim: Trim::OneNewline,
    layout: Layout {
        sep: "\n",
        value_pad: "\n",
        quoted: false,
        block_per_call: true,
    },
};

/// The `qwen3_coder` parser.
pub(crate) fn machine() -> XmlParams {
    XmlParams::new(&SYNTAX)
}

/// Writes calls as Qwen3-Coder's chat template does.
pub(crate) fn format(calls: &[ToolCall]) -> Result<String, Unrepresentable> {
    write_calls(&SYNTAX, "qwen3_coder", calls)
}
