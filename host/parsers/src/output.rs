//! The parser the gateway uses: reasoning first, then tool calls on the text that is left.

use crate::ParsedEvent;
use crate::call::{CallEmission, CallIds, ParsedOutput};
use crate::error::UnknownParser;
use crate::reasoning::ReasoningParser;
use crate::registry::{
    reasoning_parser, reasoning_parser_name, tool_parser_name, tool_parser_with,
};
use crate::stream::merge_into;
use crate::tool::ToolCallParser;

/// A model's output parser: the reasoning parser splits off reasoning, the tool-call parser reads
/// calls from the rest. Either may be absent.
///
/// The `harmony` tool parser reads gpt-oss's channels itself, reasoning included, so with it a
/// `gpt_oss` reasoning parser is not run.
#[derive(Debug)]
pub struct OutputParser {
    reasoning: Option<Box<dyn ReasoningParser>>,
    tools: Option<Box<dyn ToolCallParser>>,
}

impl OutputParser {
    /// Parsers by name (see [`crate::REASONING_PARSERS`], [`crate::TOOL_PARSERS`]); calls the
    /// model gives no id get `{id_prefix}{index}`; calls are streamed.
    pub fn new(
        reasoning: Option<&str>,
        tools: Option<&str>,
        id_prefix: &str,
    ) -> Result<Self, UnknownParser> {
        Self::with_emission(reasoning, tools, id_prefix, CallEmission::Streaming)
    }

    /// As [`OutputParser::new`], with a chosen [`CallEmission`] ([`CallEmission::Complete`] for
    /// whole responses).
    pub fn with_emission(
        reasoning: Option<&str>,
        tools: Option<&str>,
        id_prefix: &str,
        emission: CallEmission,
    ) -> Result<Self, UnknownParser> {
        let tools_name = tools.map(tool_parser_name).transpose()?;
        let reasoning_name = reasoning.map(reasoning_parser_name).transpose()?;
        let reasoning = match (reasoning_name, tools_name) {
            (Some("gpt_oss"), Some("harmony")) => None,
            (Some(name), _) => Some(reasoning_parser(name)?),
            (None, _) => None,
        };
        let tools = tools_name
            .map(|name| tool_parser_with(name, CallIds::new(id_prefix), emission))
            .transpose()?;
        Ok(Self { reasoning, tools })
    }

    /// Parses the next chunk of output.
    pub fn push(&mut self, text: &str) -> Vec<ParsedEvent> {
        let first = match &mut self.reasoning {
            Some(reasoning) => reasoning.push(text),
            None => vec![ParsedEvent::Text(text.to_owned())],
        };
        self.route(first)
    }

    /// The output ended: returns everything still held back.
    pub fn finish(&mut self) -> Vec<ParsedEvent> {
        let first = match &mut self.reasoning {
            Some(reasoning) => reasoning.finish(),
            None => Vec::new(),
        };
        let mut events = self.route(first);
        if let Some(tools) = &mut self.tools {
            for event in tools.finish() {
                merge_into(&mut events, event);
            }
        }
        events
    }

    /// Parses a whole output at once.
    pub fn parse(&mut self, text: &str) -> ParsedOutput {
        let mut output: ParsedOutput = self.push(text).into_iter().collect();
        output.extend(self.finish());
        output
    }

    /// Sends text on to the tool parser; everything else passes.
    fn route(&mut self, events: Vec<ParsedEvent>) -> Vec<ParsedEvent> {
        let mut out = Vec::new();
        for event in events {
            match (event, &mut self.tools) {
                (ParsedEvent::Text(text), Some(tools)) => {
                    for parsed in tools.push(&text) {
                        merge_into(&mut out, parsed);
                    }
                }
                (event, _) => merge_into(&mut out, event),
            }
        }
        out
    }
}
