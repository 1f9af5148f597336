//! Host bindings of the policy worlds, generated from the repository's `wit/` (the only copy).
//! The `router` bindings own the shared interfaces (`types`, `host`); the other worlds reuse
//! them through `with`, so one `HostState` implementation serves every world.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "router",
});

pub(crate) use switchyard::policy::host::Host;
pub(crate) use switchyard::policy::types::{
    CostOverrides, CostWeights, Host as TypesHost, LogLevel,
};

/// The `admission` world.
pub(crate) mod admission {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "admission",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/host": super::switchyard::policy::host,
        },
    });

    pub(crate) use switchyard::policy::admission_types::{
        ActionKind, Host as AdmissionTypesHost, SessionPhase,
    };
}

/// The `kv-hints` world.
pub(crate) mod kv_hints {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "kv-hints",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/host": super::switchyard::policy::host,
        },
    });

    pub(crate) use switchyard::policy::kv_hint_types::{
        Compaction, EventKind, HintKind, Host as KvHintTypesHost, Residency, Tier, TierUsage,
        ToolCall,
    };
}
