//! `nvext` (agent hints, cache control) and Anthropic's `cache_control` markers.

use std::time::Duration;

use crate::error::ApiError;
use crate::ir::{AgentHints, CacheControl};
use crate::json::Node;

/// The TTL of a `cache_control` marker without one (Anthropic's default).
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(300);

/// Reads `nvext` from a request body: its agent hints and its cache control.
pub(crate) fn nvext(root: &Node<'_, '_>) -> Result<(AgentHints, Option<CacheControl>), ApiError> {
    let Some(nvext) = root.get("nvext") else {
        return Ok((AgentHints::default(), None));
    };
    nvext.object()?;
    let hints = match nvext.get("agent_hints") {
        None => AgentHints::default(),
        Some(h) => {
            h.object()?;
            AgentHints {
                priority: h.get("priority").map(|p| priority(&p)).transpose()?,
                osl: h.opt_u32("osl")?,
                speculative_prefill: h.opt_bool("speculative_prefill")?.unwrap_or(false),
            }
        }
    };
    let cache = nvext
        .get("cache_control")
        .map(|c| cache_control(&c))
        .transpose()?;
    Ok((hints, cache))
}

fn priority(node: &Node<'_, '_>) -> Result<i32, ApiError> {
    let n = node.i64()?;
    i32::try_from(n).map_err(|_| node.error(format_args!("priority {n} is out of range")))
}

/// Reads one `cache_control` object: `{"type": "ephemeral", "ttl": "5m" | "1h" | "<N>s"}`.
pub(crate) fn cache_control(node: &Node<'_, '_>) -> Result<CacheControl, ApiError> {
    match node.tag()? {
        "ephemeral" => {}
        other => return Err(node.bad_tag("unsupported cache_control type", other)),
    }
    let ttl = match node.get("ttl") {
        None => DEFAULT_CACHE_TTL,
        Some(ttl) => parse_ttl(ttl.str()?).ok_or_else(|| {
            ttl.error(r#"expected "5m", "1h" or a whole number of seconds, minutes or hours ("30s", "10m", "2h")"#)
        })?,
    };
    Ok(CacheControl { ttl })
}

/// Parses a cache TTL: `<N>s`, `<N>m` or `<N>h` with a positive whole `N` (`"5m"`, `"1h"`,
/// `"90s"`).
pub fn parse_ttl(text: &str) -> Option<Duration> {
    let unit = match text.as_bytes().last()? {
        b's' => 1,
        b'm' => 60,
        b'h' => 3600,
        _ => return None,
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    (n > 0).then(|| n.checked_mul(unit).map(Duration::from_secs))?
}

/// The cache control of the longest prefix: of all markers in prompt order, the last one wins.
/// `nvext.cache_control` covers the whole prompt, so it wins over block markers.
#[derive(Debug, Default)]
pub(crate) struct CacheMarkers {
    last: Option<CacheControl>,
}

impl CacheMarkers {
    /// Reads the `cache_control` field of a block, tool or system entry, if it has one.
    pub(crate) fn visit(&mut self, owner: &Node<'_, '_>) -> Result<(), ApiError> {
        if let Some(marker) = owner.get("cache_control") {
            self.last = Some(cache_control(&marker)?);
        }
        Ok(())
    }

    /// The winning marker, given `nvext.cache_control`.
    pub(crate) fn resolve(self, nvext: Option<CacheControl>) -> Option<CacheControl> {
        nvext.or(self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_ttl("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("45s"), Some(Duration::from_secs(45)));
        for bad in [
            "",
            "m",
            "0s",
            "-5s",
            "5",
            "5d",
            "1.5h",
            " 5m",
            "5 m",
            "+5s",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_ttl(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nvext_reads_hints_and_cache() {
        let body = json!({"nvext": {
            "agent_hints": {"priority": -3, "osl": 256, "speculative_prefill": true, "future": 1},
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        }});
        let (hints, cache) = nvext(&Node::root(&body)).unwrap();
        assert_eq!(
            hints,
            AgentHints {
                priority: Some(-3),
                osl: Some(256),
                speculative_prefill: true
            }
        );
        assert_eq!(cache.unwrap().ttl, Duration::from_secs(3600));
    }

    #[test]
    fn nvext_errors_name_the_field() {
        let cases = [
            (json!({"nvext": 1}), "nvext"),
            (
                json!({"nvext": {"agent_hints": {"osl": -1}}}),
                "nvext.agent_hints.osl",
            ),
            (
                json!({"nvext": {"agent_hints": {"priority": "high"}}}),
                "nvext.agent_hints.priority",
            ),
            (
                json!({"nvext": {"agent_hints": {"priority": 1u64 << 33}}}),
                "nvext.agent_hints.priority",
            ),
            (
                json!({"nvext": {"agent_hints": {"speculative_prefill": "yes"}}}),
                "nvext.agent_hints.speculative_prefill",
            ),
            (
                json!({"nvext": {"cache_control": {"type": "persistent"}}}),
                "nvext.cache_control.type",
            ),
            (
                json!({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "1d"}}}),
                "nvext.cache_control.ttl",
            ),
            (
                json!({"nvext": {"cache_control": {"type": "ephemeral", "ttl": 300}}}),
                "nvext.cache_control.ttl",
            ),
            (
                json!({"nvext": {"cache_control": {}}}),
                "nvext.cache_control.type",
            ),
        ];
        for (body, param) in cases {
            let err = nvext(&Node::root(&body)).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
            assert_eq!(err.status, 400);
        }
    }

    #[test]
    fn last_marker_wins_and_nvext_wins_over_markers() {
        let body = json!([
            {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
            {},
            {"cache_control": {"type": "ephemeral"}},
        ]);
        let root = Node::root(&body);
        let mut markers = CacheMarkers::default();
        for item in root.items().unwrap() {
            markers.visit(&item).unwrap();
        }
        let nvext = CacheControl {
            ttl: Duration::from_secs(10),
        };
        assert_eq!(markers.last.unwrap().ttl, DEFAULT_CACHE_TTL);
        assert_eq!(markers.resolve(Some(nvext)), Some(nvext));
    }
}
