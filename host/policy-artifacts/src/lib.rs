//! The built-in Switchyard policies as WebAssembly components (`switchyard:policy@1.0.0`),
//! built from `policies/` for `wasm32-wasip2` by this crate's build script, so the gateway can
//! load them with no extra step: five routers (world `router`) and the Wasm twins of the native
//! admission policies (world `admission`) and KV-hint strategies (world `kv-hints`).

/// The default KV-aware cost policy (agentic-serving.md section 3).
pub const KV_COST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kv-cost.wasm"));
/// Rotates over the candidates, ignoring the cache.
pub const ROUND_ROBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/round-robin.wasm"));
/// Fewest active requests, then fewest decode blocks.
pub const LEAST_LOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/least-load.wasm"));
/// Keeps a session on its worker while its KV cost is within a margin of the best.
pub const SESSION_AFFINITY: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/session-affinity.wasm"));
/// Thompson sampling over workers on observed TTFT.
pub const BANDIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bandit.wasm"));

/// ThunderAgent's program-aware admission (twin of the native `thunder-agent`).
pub const THUNDER_AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/thunder-agent.wasm"));
/// Continuum's TTL retention for tool calls (twin of the native `continuum`).
pub const CONTINUUM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/continuum.wasm"));
/// Autellix's least-attained-service priorities (twin of the native `autellix`).
pub const AUTELLIX: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/autellix.wasm"));

/// Demotes a session's KV during a slow tool call, prefetches it back before the tool returns
/// (twin of the native `demote-on-tool-call`).
pub const DEMOTE_ON_TOOL_CALL: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/demote-on-tool-call.wasm"));
/// Evicts a finished subagent's KV (twin of the native `subagent-reclaim`).
pub const SUBAGENT_RECLAIM: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/subagent-reclaim.wasm"));
/// Shares a parent's prefix with the subagents it spawns (twin of the native
/// `share-to-subagent`).
pub const SHARE_TO_SUBAGENT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/share-to-subagent.wasm"));

/// Routers, then admission policies, then KV-hint strategies: [`builtin_for`] hands out each
/// world's part.
static BUILTIN: [(&str, &[u8]); 11] = [
    ("kv-cost", KV_COST),
    ("round-robin", ROUND_ROBIN),
    ("least-load", LEAST_LOAD),
    ("session-affinity", SESSION_AFFINITY),
    ("bandit", BANDIT),
    ("thunder-agent", THUNDER_AGENT),
    ("continuum", CONTINUUM),
    ("autellix", AUTELLIX),
    ("demote-on-tool-call", DEMOTE_ON_TOOL_CALL),
    ("subagent-reclaim", SUBAGENT_RECLAIM),
    ("share-to-subagent", SHARE_TO_SUBAGENT),
];
const ROUTERS: usize = 5;
const ADMISSION: usize = 3;

/// Every built-in policy as `(name, component bytes)`, of every world; the name is also the one
/// its `metadata()` reports, and no two worlds share a name.
pub fn builtin() -> &'static [(&'static str, &'static [u8])] {
    &BUILTIN
}

/// The built-in policies of `world` (`router`, `admission`, `kv-hints`); empty for any other
/// world.
pub fn builtin_for(world: &str) -> &'static [(&'static str, &'static [u8])] {
    match world {
        "router" => &BUILTIN[..ROUTERS],
        "admission" => &BUILTIN[ROUTERS..ROUTERS + ADMISSION],
        "kv-hints" => &BUILTIN[ROUTERS + ADMISSION..],
        _ => &[],
    }
}

/// The built-in policy called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static [u8]> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}

#[cfg(test)]
mod tests {
    use super::{builtin, builtin_for, find};

    /// A component (not a core module): `\0asm`, then the component-model layer and version.
    const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    #[test]
    fn every_builtin_is_a_component() {
        for (name, bytes) in builtin() {
            assert!(
                bytes.starts_with(&COMPONENT_HEADER),
                "{name} is not a component"
            );
            assert!(bytes.len() < 512 * 1024, "{name} is {} bytes", bytes.len());
        }
    }

    #[test]
    fn names_are_unique_and_found() {
        let names: Vec<_> = builtin().iter().map(|(n, _)| *n).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in names {
            assert!(find(name).is_some());
        }
        assert!(find("no-such-policy").is_none());
    }

    #[test]
    fn every_builtin_belongs_to_exactly_one_world() {
        let names = |world| -> Vec<&str> { builtin_for(world).iter().map(|(n, _)| *n).collect() };
        assert_eq!(
            names("router"),
            [
                "kv-cost",
                "round-robin",
                "least-load",
                "session-affinity",
                "bandit"
            ]
        );
        assert_eq!(
            names("admission"),
            ["thunder-agent", "continuum", "autellix"]
        );
        assert_eq!(
            names("kv-hints"),
            [
                "demote-on-tool-call",
                "subagent-reclaim",
                "share-to-subagent"
            ]
        );
        assert!(names("no-such-world").is_empty());
        let worlds = ["router", "admission", "kv-hints"];
        assert_eq!(
            worlds.map(|w| builtin_for(w).len()).iter().sum::<usize>(),
            builtin().len()
        );
    }
}
