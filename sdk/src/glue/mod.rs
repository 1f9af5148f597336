//! The Wasm side of the SDK: wit-bindgen bindings for the repository's `wit/` and the conversions
//! between them and the SDK's plain types. Compiled for `wasm32` only; the `export_*!` macros
//! reach it through `__private`.

// Every world gets its own bindings module. `pub_export_macro` makes wit-bindgen record each
// world's exports only where its export macro is used, so a component built from this crate
// exports exactly the world its policy implements.
#[allow(
    unsafe_code,
    unreachable_pub,
    missing_debug_implementations,
    clippy::too_many_arguments,
    reason = "wit-bindgen's generated canonical-ABI glue"
)]
pub mod router_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "router",
        pub_export_macro: true,
        export_macro_name: "__export_router_world",
        default_bindings_module: "::switchyard_policy_sdk::__private::router_world",
    });
}

#[allow(
    unsafe_code,
    unreachable_pub,
    missing_debug_implementations,
    clippy::too_many_arguments,
    reason = "wit-bindgen's generated canonical-ABI glue"
)]
pub mod admission_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "admission",
        pub_export_macro: true,
        export_macro_name: "__export_admission_world",
        default_bindings_module: "::switchyard_policy_sdk::__private::admission_world",
        // Share the common types so one set of conversions serves every world.
        with: {
            "switchyard:policy/types@1.3.0": crate::glue::router_world::switchyard::policy::types,
            "switchyard:policy/host@1.3.0": crate::glue::router_world::switchyard::policy::host,
        },
    });
}

#[allow(
    unsafe_code,
    unreachable_pub,
    missing_debug_implementations,
    clippy::too_many_arguments,
    reason = "wit-bindgen's generated canonical-ABI glue"
)]
pub mod kv_hints_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "kv-hints",
        pub_export_macro: true,
        export_macro_name: "__export_kv_hints_world",
        default_bindings_module: "::switchyard_policy_sdk::__private::kv_hints_world",
        with: {
            "switchyard:policy/types@1.3.0": crate::glue::router_world::switchyard::policy::types,
            "switchyard:policy/host@1.3.0": crate::glue::router_world::switchyard::policy::host,
        },
    });
}

pub mod admission;
pub(crate) mod common;
pub mod kv_hints;
pub mod router;
