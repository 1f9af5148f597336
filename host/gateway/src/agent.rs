//! Who is calling: the session a request belongs to, normalised from the headers each agent
//! harness sends (canonical `x-dynamo-*` first, then Claude Code, Codex, OpenCode).

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

/// Which agent harness sent a request, for metrics labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Harness {
    /// Anthropic's Claude Code.
    ClaudeCode,
    /// OpenAI's Codex CLI.
    Codex,
    /// OpenCode.
    OpenCode,
    /// Anything else.
    #[default]
    Other,
}

impl Harness {
    /// The label value: `claude-code`, `codex`, `opencode` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude-code",
            Self::Codex => "codex",
            Self::OpenCode => "opencode",
            Self::Other => "other",
        }
    }

    /// The harness as its headers give it away: its own session headers first, then its
    /// user agent (`claude-cli/...`, `codex_exec/...`, `opencode/...`).
    fn from_headers(get: impl Fn(&str) -> Option<String>) -> Self {
        let agent = get("user-agent").unwrap_or_default().to_ascii_lowercase();
        if get("x-claude-code-session-id").is_some() || agent.starts_with("claude-cli") {
            Self::ClaudeCode
        } else if get("x-codex-turn-metadata").is_some()
            || get("originator").is_some_and(|o| o.starts_with("codex"))
            || agent.starts_with("codex")
        {
            Self::Codex
        } else if agent.starts_with("opencode") {
            Self::OpenCode
        } else {
            Self::Other
        }
    }
}

/// The session of a request, whatever harness sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentContext {
    /// The conversation (or subagent) this request continues.
    pub session_id: Option<String>,
    /// The session that spawned this one (a subagent's root or parent agent).
    pub parent_session_id: Option<String>,
    /// The caller marked this as the session's last request (not traced).
    #[serde(skip)]
    pub session_final: bool,
    /// The harness that sent it (not traced: the trace has the session).
    #[serde(skip)]
    pub harness: Harness,
}

impl AgentContext {
    /// Read the session from request headers (names are case-insensitive). The first harness
    /// that names a session wins; a canonical parent or final marker applies to any of them.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let (session_id, harness_parent) = if let Some(id) = get("x-dynamo-session-id") {
            (Some(id), None)
        } else if let Some(root) = get("x-claude-code-session-id") {
            // A subagent names itself by agent id; its parent is the parent agent, else the root.
            match get("x-claude-code-agent-id") {
                Some(agent) if agent != root => {
                    let parent = get("x-claude-code-parent-agent-id").unwrap_or(root);
                    (Some(agent), Some(parent))
                }
                _ => (Some(root), None),
            }
        } else if let Some(id) = get("session-id").or_else(|| get("session_id")) {
            (Some(id), None)
        } else if let Some(id) = get("x-session-id") {
            (Some(id), get("x-parent-session-id"))
        } else {
            (None, None)
        };
        let session_final = get("x-dynamo-session-final")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        Self {
            parent_session_id: get("x-dynamo-parent-session-id").or(harness_parent),
            session_id,
            session_final,
            harness: Harness::from_headers(get),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pairs: &[(&str, &str)]) -> AgentContext {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        AgentContext::from_headers(&headers)
    }

    #[test]
    fn harnesses_are_recognised() {
        let cases = [
            (vec![("x-claude-code-session-id", "s")], Harness::ClaudeCode),
            (
                vec![("user-agent", "claude-cli/2.1.332 (external, sdk-cli)")],
                Harness::ClaudeCode,
            ),
            (
                vec![("originator", "codex_exec"), ("session-id", "s")],
                Harness::Codex,
            ),
            (
                vec![("user-agent", "codex_exec/0.171.0 (Debian)")],
                Harness::Codex,
            ),
            (
                vec![(
                    "user-agent",
                    "opencode/1.18.33 ai-sdk/provider-utils/4.0.23",
                )],
                Harness::OpenCode,
            ),
            (vec![("user-agent", "curl/8.0")], Harness::Other),
            (vec![], Harness::Other),
        ];
        for (headers, harness) in cases {
            assert_eq!(context(&headers).harness, harness, "{headers:?}");
        }
    }

    fn ids(c: &AgentContext) -> (Option<&str>, Option<&str>, bool) {
        (
            c.session_id.as_deref(),
            c.parent_session_id.as_deref(),
            c.session_final,
        )
    }

    #[test]
    fn canonical_headers() {
        let c = context(&[
            ("X-Dynamo-Session-Id", "s1"),
            ("x-dynamo-parent-session-id", "p1"),
            ("x-dynamo-session-final", "TRUE"),
        ]);
        assert_eq!(ids(&c), (Some("s1"), Some("p1"), true));
    }

    #[test]
    fn canonical_wins_over_harness_headers() {
        let c = context(&[
            ("x-claude-code-session-id", "cc"),
            ("x-session-id", "oc"),
            ("x-dynamo-session-id", "dyn"),
        ]);
        assert_eq!(ids(&c), (Some("dyn"), None, false));
    }

    #[test]
    fn claude_code_root_and_subagents() {
        let root = context(&[("x-claude-code-session-id", "root")]);
        assert_eq!(ids(&root), (Some("root"), None, false));
        let sub = context(&[
            ("x-claude-code-session-id", "root"),
            ("x-claude-code-agent-id", "a1"),
        ]);
        assert_eq!(ids(&sub), (Some("a1"), Some("root"), false));
        let nested = context(&[
            ("x-claude-code-session-id", "root"),
            ("x-claude-code-agent-id", "a2"),
            ("x-claude-code-parent-agent-id", "a1"),
        ]);
        assert_eq!(ids(&nested), (Some("a2"), Some("a1"), false));
    }

    #[test]
    fn codex_either_spelling() {
        assert_eq!(
            ids(&context(&[("session-id", "cx")])),
            (Some("cx"), None, false)
        );
        assert_eq!(
            ids(&context(&[("session_id", "cx2")])),
            (Some("cx2"), None, false)
        );
    }

    #[test]
    fn opencode_with_parent() {
        let c = context(&[("x-session-id", "oc"), ("x-parent-session-id", "op")]);
        assert_eq!(ids(&c), (Some("oc"), Some("op"), false));
    }

    #[test]
    fn canonical_parent_applies_to_a_harness_session() {
        let c = context(&[
            ("x-session-id", "oc"),
            ("x-parent-session-id", "op"),
            ("x-dynamo-parent-session-id", "dp"),
        ]);
        assert_eq!(ids(&c), (Some("oc"), Some("dp"), false));
    }

    #[test]
    fn no_or_blank_headers_mean_no_session() {
        assert_eq!(context(&[]), AgentContext::default());
        assert_eq!(
            context(&[("x-dynamo-session-id", "  ")]),
            AgentContext::default()
        );
    }
}
