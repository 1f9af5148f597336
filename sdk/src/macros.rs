//! The export macros: one line turns a policy type into a component's exports.
//!
//! Each keeps one instance of the policy (built with `Default`) in a thread-local, so every call
//! of the component sees the same state. On non-Wasm targets they expand to nothing, so a policy
//! crate with an `export_*!` line still builds and unit-tests natively.

/// Exports a [`RouterPolicy`](crate::RouterPolicy) `+ Default` as the component's `router`
/// world: `switchyard_policy_sdk::export_router!(MyPolicy);` at the crate root.
#[macro_export]
macro_rules! export_router {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::__private::router as glue;
            ::std::thread_local! {
                static POLICY: ::core::cell::RefCell<$policy> =
                    ::core::cell::RefCell::new(<$policy as ::core::default::Default>::default());
            }
            struct SwitchyardRouterExport;
            impl $crate::__private::router_world::Guest for SwitchyardRouterExport {
                fn metadata() -> glue::WitMetadata {
                    POLICY.with_borrow(|p| glue::metadata(p))
                }
                fn route(req: glue::WitRequest, candidates: glue::WitWorkers) -> glue::WitDecision {
                    POLICY.with_borrow_mut(|p| glue::route(p, req, candidates))
                }
                fn route_packed(
                    req: glue::WitRequest,
                    candidates: glue::WitPackedWorkers,
                ) -> glue::WitDecision {
                    POLICY.with_borrow_mut(|p| glue::route_packed(p, req, candidates))
                }
                fn observe(result: glue::WitOutcome) {
                    POLICY.with_borrow_mut(|p| glue::observe(p, result))
                }
                fn queue_key(req: glue::WitRequest) -> f64 {
                    POLICY.with_borrow_mut(|p| glue::queue_key(p, req))
                }
                fn queue_key_at(
                    req: glue::WitRequest,
                    arrival_ms: u64,
                ) -> ::core::option::Option<f64> {
                    POLICY.with_borrow_mut(|p| glue::queue_key_at(p, req, arrival_ms))
                }
                fn configure(
                    params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    POLICY.with_borrow_mut(|p| glue::configure(p, params))
                }
            }
            $crate::__private::router_world::__export_router_world!(
                SwitchyardRouterExport with_types_in $crate::__private::router_world
            );
        };
    };
}

/// Exports an [`AdmissionPolicy`](crate::AdmissionPolicy) `+ Default` as the component's
/// `admission` world.
#[macro_export]
macro_rules! export_admission {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::__private::admission as glue;
            ::std::thread_local! {
                static POLICY: ::core::cell::RefCell<$policy> =
                    ::core::cell::RefCell::new(<$policy as ::core::default::Default>::default());
            }
            struct SwitchyardAdmissionExport;
            impl $crate::__private::admission_world::Guest for SwitchyardAdmissionExport {
                fn metadata() -> glue::WitMetadata {
                    POLICY.with_borrow(|p| glue::metadata(p))
                }
                fn tick(
                    now_ms: u64,
                    state: glue::WitSessions,
                    workers: glue::WitUtilization,
                ) -> ::std::vec::Vec<glue::WitAction> {
                    POLICY.with_borrow_mut(|p| glue::tick(p, now_ms, state, workers))
                }
                fn arrival(
                    now_ms: u64,
                    req: glue::WitIncoming,
                    state: glue::WitSessions,
                    workers: glue::WitUtilization,
                ) -> ::std::vec::Vec<glue::WitAction> {
                    POLICY.with_borrow_mut(|p| glue::arrival(p, now_ms, req, state, workers))
                }
                fn placement(
                    now_ms: u64,
                    session_id: ::std::string::String,
                    state: glue::WitSessions,
                    workers: glue::WitUtilization,
                ) -> ::core::option::Option<(u32, u32)> {
                    POLICY
                        .with_borrow_mut(|p| glue::placement(p, now_ms, session_id, state, workers))
                }
                fn tick_packed(
                    now_ms: u64,
                    state: glue::WitPackedSessions,
                    workers: glue::WitPackedUtilization,
                ) -> ::std::vec::Vec<glue::WitAction> {
                    POLICY.with_borrow_mut(|p| glue::tick_packed(p, now_ms, state, workers))
                }
                fn arrival_packed(
                    now_ms: u64,
                    req: glue::WitIncoming,
                    state: glue::WitPackedSessions,
                    workers: glue::WitPackedUtilization,
                ) -> ::std::vec::Vec<glue::WitAction> {
                    POLICY.with_borrow_mut(|p| glue::arrival_packed(p, now_ms, req, state, workers))
                }
                fn placement_packed(
                    now_ms: u64,
                    session_id: ::std::string::String,
                    state: glue::WitPackedSessions,
                    workers: glue::WitPackedUtilization,
                ) -> ::core::option::Option<(u32, u32)> {
                    POLICY.with_borrow_mut(|p| {
                        glue::placement_packed(p, now_ms, session_id, state, workers)
                    })
                }
                fn configure(
                    params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    POLICY.with_borrow_mut(|p| glue::configure(p, params))
                }
            }
            $crate::__private::admission_world::__export_admission_world!(
                SwitchyardAdmissionExport with_types_in $crate::__private::admission_world
            );
        };
    };
}

/// Exports a [`KvHintPolicy`](crate::KvHintPolicy) `+ Default` as the component's `kv-hints`
/// world.
#[macro_export]
macro_rules! export_kv_hints {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            use $crate::__private::kv_hints as glue;
            ::std::thread_local! {
                static POLICY: ::core::cell::RefCell<$policy> =
                    ::core::cell::RefCell::new(<$policy as ::core::default::Default>::default());
            }
            struct SwitchyardKvHintsExport;
            impl $crate::__private::kv_hints_world::Guest for SwitchyardKvHintsExport {
                fn metadata() -> glue::WitMetadata {
                    POLICY.with_borrow(|p| glue::metadata(p))
                }
                fn on_events(
                    now_ms: u64,
                    events: ::std::vec::Vec<glue::WitEvent>,
                    index: glue::WitIndexState,
                ) -> ::std::vec::Vec<glue::WitHint> {
                    POLICY.with_borrow_mut(|p| glue::on_events(p, now_ms, events, index))
                }
                fn on_outcomes(now_ms: u64, outcomes: glue::WitHintOutcomes) {
                    POLICY.with_borrow_mut(|p| glue::on_outcomes(p, now_ms, outcomes))
                }
                fn configure(
                    params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    POLICY.with_borrow_mut(|p| glue::configure(p, params))
                }
            }
            $crate::__private::kv_hints_world::__export_kv_hints_world!(
                SwitchyardKvHintsExport with_types_in $crate::__private::kv_hints_world
            );
        };
    };
}
