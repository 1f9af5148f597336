//! `deepseek_r1` (DeepSeek R1 and R1-0528, and distills): reasoning until `</think>`; the chat
//! template already wrote `<think>`, and one the model repeats at the start is dropped.
//!
//! Checked against SGLang `python/sglang/srt/parser/reasoning_parser.py` (`DeepSeekR1Detector`:
//! reasoning forced from the start) and vLLM `vllm/reasoning/deepseek_r1_reasoning_parser.py`.
//! Output that ends before `</think>` is all reasoning.

use super::think_tags::{Opening, ThinkSyntax, ThinkTags};

pub(crate) const SYNTAX: ThinkSyntax = ThinkSyntax {
    open: "<think>",
    close: "</think>",
    opening: Opening::Implied,
    implicit_close: None,
};

/// The `deepseek_r1` parser.
pub(crate) fn machine() -> ThinkTags {
    ThinkTags::new(SYNTAX)
}
