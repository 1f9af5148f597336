//! Host bindings of the policy worlds, generated from the repository's `wit/` (the only copy).
//!
//! Each world is bound as its frozen 1.0 core (`router-core`, ...), which every component of the
//! world exports, plus one small binding per later addition (1.1: `configurable`,
//! `router-arrival`, `admission-placement`, `kv-hints-outcomes`; 1.2: `router-packed`; 1.3:
//! `admission-packed`), linked
//! only when the component exports it: the
//! host dispatches on what a component exports, so a 1.0 component keeps working. The
//! `router-core` bindings own the shared interfaces (`types`, `host`); the others reuse them
//! through `with`, so one `HostState` implementation serves every world.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "router-core",
});

pub(crate) use switchyard::policy::host::Host;
pub(crate) use switchyard::policy::types::{
    CostOverrides, CostWeights, Host as TypesHost, LogLevel, PackedWorkers,
};

/// The `admission` world's 1.0 core.
pub(crate) mod admission {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "admission-core",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/host": super::switchyard::policy::host,
        },
    });

    pub(crate) use switchyard::policy::admission_types::{
        ActionKind, Host as AdmissionTypesHost, PackedSessions, PackedUtilization, SessionPhase,
    };
}

/// The `kv-hints` world's 1.0 core.
pub(crate) mod kv_hints {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "kv-hints-core",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/host": super::switchyard::policy::host,
        },
    });

    pub(crate) use switchyard::policy::kv_hint_types::{
        Compaction, EventKind, HintAction, HintKind, HintOutcome, HintOutcomes,
        Host as KvHintTypesHost, Residency, Tier, TierUsage, ToolCall,
    };
}

/// 1.1: `configure`, in every world.
pub(crate) mod configurable {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "configurable",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
        },
    });
}

/// 1.1: the router's `queue-key-at`.
pub(crate) mod router_arrival {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "router-arrival",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
        },
    });
}

/// 1.2: the router's `route-packed`.
pub(crate) mod router_packed {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "router-packed",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
        },
    });
}

/// 1.1: the admission world's `placement`.
pub(crate) mod admission_placement {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "admission-placement",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/admission-types": super::admission::switchyard::policy::admission_types,
        },
    });
}

/// 1.3: the admission world's `tick-packed`, `arrival-packed` and `placement-packed`.
pub(crate) mod admission_packed {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "admission-packed",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/admission-types": super::admission::switchyard::policy::admission_types,
        },
    });
}

/// 1.1: the kv-hints world's `on-outcomes`.
pub(crate) mod kv_hints_outcomes {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "kv-hints-outcomes",
        with: {
            "switchyard:policy/types": super::switchyard::policy::types,
            "switchyard:policy/kv-hint-types": super::kv_hints::switchyard::policy::kv_hint_types,
        },
    });
}
