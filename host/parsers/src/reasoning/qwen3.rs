//! `qwen3` (Qwen3 hybrid models with `enable_thinking`): `<think>…</think>` only when the output
//! starts with `<think>`; otherwise it is all text. A `<tool_call>` before `</think>` ends the
//! reasoning and stays in the text for the tool parser.
//!
//! Checked against vLLM `vllm/reasoning/qwen3_reasoning_parser.py` and SGLang
//! `python/sglang/srt/parser/reasoning_parser.py` (`Qwen3Detector`, which treats `<tool_call>` as
//! an implicit end of reasoning).

use super::think_tags::{Opening, ThinkSyntax, ThinkTags};

pub(crate) const SYNTAX: ThinkSyntax = ThinkSyntax {
    open: "<think>",
    close: "</think>",
    opening: Opening::Required,
    implicit_close: Some("<tool_call>"),
};

/// The `qwen3` parser.
pub(crate) fn machine() -> ThinkTags {
    ThinkTags::new(SYNTAX)
}
