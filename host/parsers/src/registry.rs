//! Parsers by name: the names vLLM and SGLang use, a few of their aliases, and what each builds.

use crate::call::{CallEmission, CallIds, ToolCall};
use crate::error::{ParserError, ParserKind, UnknownParser, Unrepresentable};
use crate::reasoning::{self, ReasoningParser};
use crate::stream::{Driver, Emitter};
use crate::tool::{self, ToolCallParser};

/// The tool-call parser names, as vLLM's `--tool-call-parser` and SGLang's `--tool-call-parser`
/// call them.
pub const TOOL_PARSERS: &[&str] = &[
    "hermes",
    "qwen3_coder",
    "minimax_m2",
    "glm47",
    "kimi_k2",
    "deepseek_v3",
    "deepseek_v3_1",
    "llama3_json",
    "mistral",
    "pythonic",
    "harmony",
];

/// The reasoning parser names, as vLLM's `--reasoning-parser` and SGLang's `--reasoning-parser`
/// call them.
pub const REASONING_PARSERS: &[&str] = &[
    "deepseek_r1",
    "qwen3",
    "glm45",
    "kimi",
    "minimax_m2",
    "minimax_m2_append_think",
    "gpt_oss",
];

struct ToolEntry {
    name: &'static str,
    aliases: &'static [&'static str],
    build: fn(Emitter) -> Box<dyn ToolCallParser>,
    format: fn(&[ToolCall]) -> Result<String, Unrepresentable>,
}

struct ReasoningEntry {
    name: &'static str,
    aliases: &'static [&'static str],
    build: fn() -> Box<dyn ReasoningParser>,
}

fn boxed_tool<M: tool::ToolMachine + 'static>(machine: M, out: Emitter) -> Box<dyn ToolCallParser> {
    Box::new(Driver::new(machine, out))
}

fn boxed_reasoning<M: reasoning::ReasoningMachine + 'static>(
    machine: M,
) -> Box<dyn ReasoningParser> {
    Box::new(Driver::new(machine, Emitter::plain()))
}

/// Aliases are other engines' spellings (names are also matched ignoring case and `-`/`_`).
static TOOLS: &[ToolEntry] = &[
    ToolEntry {
        name: "hermes",
        aliases: &["qwen25", "qwen"],
        build: |out| boxed_tool(tool::hermes::Hermes::default(), out),
        format: tool::hermes::format,
    },
    ToolEntry {
        name: "qwen3_coder",
        aliases: &[],
        build: |out| boxed_tool(tool::qwen3_coder::machine(), out),
        format: tool::qwen3_coder::format,
    },
    ToolEntry {
        name: "minimax_m2",
        aliases: &["minimax"],
        build: |out| boxed_tool(tool::minimax_m2::machine(), out),
        format: tool::minimax_m2::format,
    },
    ToolEntry {
        name: "glm47",
        aliases: &["glm45", "glm4_moe", "glm"],
        build: |out| boxed_tool(tool::glm47::machine(), out),
        format: tool::glm47::format,
    },
    ToolEntry {
        name: "kimi_k2",
        aliases: &["kimik2"],
        build: |out| boxed_tool(tool::kimi_k2::machine(), out),
        format: tool::kimi_k2::format,
    },
    ToolEntry {
        name: "deepseek_v3",
        aliases: &["deepseekv3"],
        build: |out| boxed_tool(tool::deepseek::machine(), out),
        format: tool::deepseek::format_v3,
    },
    ToolEntry {
        name: "deepseek_v3_1",
        aliases: &["deepseekv31", "deepseek_v31"],
        build: |out| boxed_tool(tool::deepseek::machine(), out),
        format: tool::deepseek::format_v3_1,
    },
    ToolEntry {
        name: "llama3_json",
        aliases: &["llama3", "llama4_json"],
        build: |out| boxed_tool(tool::llama3_json::Llama3Json::default(), out),
        format: tool::llama3_json::format,
    },
    ToolEntry {
        name: "mistral",
        aliases: &[],
        build: |out| boxed_tool(tool::mistral::Mistral::default(), out),
        format: tool::mistral::format,
    },
    ToolEntry {
        name: "pythonic",
        aliases: &["llama4_pythonic"],
        build: |out| boxed_tool(tool::pythonic::Pythonic::default(), out),
        format: tool::pythonic::format,
    },
    ToolEntry {
        name: "harmony",
        aliases: &["openai", "gpt_oss"],
        build: |out| boxed_tool(tool::harmony::Harmony::tool_parser(), out),
        format: tool::harmony::format,
    },
];

static REASONING: &[ReasoningEntry] = &[
    ReasoningEntry {
        name: "deepseek_r1",
        aliases: &["step3"],
        build: || boxed_reasoning(reasoning::deepseek_r1::machine()),
    },
    ReasoningEntry {
        name: "qwen3",
        aliases: &[],
        build: || boxed_reasoning(reasoning::qwen3::machine()),
    },
    ReasoningEntry {
        name: "glm45",
        aliases: &["glm47"],
        build: || boxed_reasoning(reasoning::glm45::machine()),
    },
    ReasoningEntry {
        name: "kimi",
        aliases: &[],
        build: || boxed_reasoning(reasoning::kimi::machine()),
    },
    ReasoningEntry {
        name: "minimax_m2",
        aliases: &["minimax"],
        build: || boxed_reasoning(reasoning::minimax_m2::machine()),
    },
    ReasoningEntry {
        name: "minimax_m2_append_think",
        aliases: &["minimax_append_think"],
        build: || boxed_reasoning(reasoning::minimax_m2::append_think()),
    },
    ReasoningEntry {
        name: "gpt_oss",
        aliases: &["openai_gptoss", "harmony"],
        build: || boxed_reasoning(reasoning::gpt_oss::machine()),
    },
];

/// `DeepSeek-R1` → `deepseek_r1`.
fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

fn tool_entry(name: &str) -> Result<&'static ToolEntry, UnknownParser> {
    let wanted = normalize(name);
    TOOLS
        .iter()
        .find(|e| e.name == wanted)
        .or_else(|| TOOLS.iter().find(|e| e.aliases.contains(&wanted.as_str())))
        .ok_or_else(|| UnknownParser {
            kind: ParserKind::ToolCall,
            name: name.to_owned(),
            known: TOOL_PARSERS,
        })
}

fn reasoning_entry(name: &str) -> Result<&'static ReasoningEntry, UnknownParser> {
    let wanted = normalize(name);
    REASONING
        .iter()
        .find(|e| e.name == wanted)
        .or_else(|| {
            REASONING
                .iter()
                .find(|e| e.aliases.contains(&wanted.as_str()))
        })
        .ok_or_else(|| UnknownParser {
            kind: ParserKind::Reasoning,
            name: name.to_owned(),
            known: REASONING_PARSERS,
        })
}

/// The canonical name of a tool-call parser given by any of its names.
pub fn tool_parser_name(name: &str) -> Result<&'static str, UnknownParser> {
    tool_entry(name).map(|e| e.name)
}

/// The canonical name of a reasoning parser given by any of its names.
pub fn reasoning_parser_name(name: &str) -> Result<&'static str, UnknownParser> {
    reasoning_entry(name).map(|e| e.name)
}

/// A tool-call parser that streams calls as they are parsed ([`CallEmission::Streaming`]).
pub fn tool_parser(name: &str, ids: CallIds) -> Result<Box<dyn ToolCallParser>, UnknownParser> {
    tool_parser_with(name, ids, CallEmission::Streaming)
}

/// A tool-call parser with a chosen [`CallEmission`].
pub fn tool_parser_with(
    name: &str,
    ids: CallIds,
    emission: CallEmission,
) -> Result<Box<dyn ToolCallParser>, UnknownParser> {
    let entry = tool_entry(name)?;
    Ok((entry.build)(Emitter::new(ids, emission)))
}

/// A reasoning parser.
pub fn reasoning_parser(name: &str) -> Result<Box<dyn ReasoningParser>, UnknownParser> {
    Ok((reasoning_entry(name)?.build)())
}

/// Renders calls in the documented format of the model family that `parser_name` parses: what the
/// model would write (the mock engine answers with it; tests use it for fixtures). The tool
/// parser of the same name reads it back to the same calls.
pub fn format_tool_calls(parser_name: &str, calls: &[ToolCall]) -> Result<String, ParserError> {
    let entry = tool_entry(parser_name)?;
    Ok((entry.format)(calls)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_lists_match_the_tables() {
        assert_eq!(
            TOOLS.iter().map(|e| e.name).collect::<Vec<_>>(),
            TOOL_PARSERS
        );
        assert_eq!(
            REASONING.iter().map(|e| e.name).collect::<Vec<_>>(),
            REASONING_PARSERS
        );
    }

    #[test]
    fn other_engines_spellings_resolve() {
        assert_eq!(tool_parser_name("DeepSeek-V3").unwrap(), "deepseek_v3");
        assert_eq!(tool_parser_name("deepseekv31").unwrap(), "deepseek_v3_1");
        assert_eq!(tool_parser_name("openai").unwrap(), "harmony");
        assert_eq!(reasoning_parser_name("deepseek-r1").unwrap(), "deepseek_r1");
        assert_eq!(reasoning_parser_name("gpt-oss").unwrap(), "gpt_oss");
    }
}
