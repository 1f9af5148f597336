//! `minimax_m2` and `minimax_m2_append_think` (MiniMax M2). The chat template writes `<think>`,
//! so the output is reasoning until `</think>`; the "append think" variant instead keeps
//! everything as text with `<think>` put back in front, for clients that want the thinking inline.
//!
//! Checked against vLLM `vllm/reasoning/minimax_m2_reasoning_parser.py`
//! (`MiniMaxM2ReasoningParser`, `MiniMaxM2AppendThinkReasoningParser`) and SGLang
//! `python/sglang/srt/parser/reasoning_parser.py` (`minimax` forces reasoning from the start;
//! `MiniMaxAppendThinkDetector`).

use super::think_tags::{PrependThink, ThinkSyntax, ThinkTags};

/// The same tags as DeepSeek R1: reasoning from the start until `</think>`.
pub(crate) const SYNTAX: ThinkSyntax = super::deepseek_r1::SYNTAX;

/// The `minimax_m2` parser.
pub(crate) fn machine() -> ThinkTags {
    ThinkTags::new(SYNTAX)
}

/// The `minimax_m2_append_think` parser.
pub(crate) fn append_think() -> PrependThink {
    PrependThink::default()
}
