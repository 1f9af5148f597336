//! `glm45` (GLM-4.5, 4.6, 4.7): as `qwen3`, `<think>…</think>` only when the output starts with
//! `<think>`, and a `<tool_call>` before `</think>` ends the reasoning.
//!
//! Checked against SGLang `python/sglang/srt/parser/reasoning_parser.py` (`Glm45Detector`, with
//! `<tool_call>` as the tool start token) and vLLM `vllm/reasoning/glm4_moe_reasoning_parser.py`.

use super::think_tags::{ThinkSyntax, ThinkTags};

/// The same tags as Qwen3.
pub(crate) const SYNTAX: ThinkSyntax = super::qwen3::SYNTAX;

/// The `glm45` parser.
pub(crate) fn machine() -> ThinkTags {
    ThinkTags::new(SYNTAX)
}
