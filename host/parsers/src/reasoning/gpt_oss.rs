//! `gpt_oss` (gpt-oss): harmony channels, `analysis` as reasoning and `final` as text; messages to
//! a tool pass through as raw text. The `harmony` tool parser reads the same format and emits the
//! reasoning too, so with it this parser is not needed (see [`crate::OutputParser`]).
//!
//! Checked against vLLM `vllm/reasoning/gptoss_reasoning_parser.py` and SGLang
//! `python/sglang/srt/parser/reasoning_parser.py` (`GptOssDetector`).

use crate::tool::harmony::Harmony;

/// The `gpt_oss` parser.
pub(crate) fn machine() -> Harmony {
    Harmony::reasoning_parser()
}
