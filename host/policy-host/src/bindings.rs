//! Host bindings of the `router` world, generated from the repository's `wit/` (the only copy).

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "router",
});

pub(crate) use switchyard::policy::host::Host;
pub(crate) use switchyard::policy::types::{
    CostOverrides, CostWeights, Host as TypesHost, LogLevel,
};
