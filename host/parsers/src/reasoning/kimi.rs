//! `kimi` (Kimi-VL and Kimi 1.5 thinking models): `◁think▷…◁/think▷` only when the output starts
//! with `◁think▷`; otherwise it is all text.
//!
//! Checked against SGLang `python/sglang/srt/parser/reasoning_parser.py` (`KimiDetector`).

use super::think_tags::{Opening, ThinkSyntax, ThinkTags};

pub(crate) const SYNTAX: ThinkSyntax = ThinkSyntax {
    open: "◁think▷",
    close: "◁/think▷",
    opening: Opening::Required,
    implicit_close: None,
};

/// The `kimi` parser.
pub(crate) fn machine() -> ThinkTags {
    ThinkTags::new(SYNTAX)
}
