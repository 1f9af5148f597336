//! Test fixtures (feature `test-util`): inline WAT components for the `router` world, a working
//! policy and its broken variants, so tests need no guest toolchain.
//!
//! Canonical ABI notes (why the core signatures look like this): `route` and `queue-key` take
//! more than 16 flat values, so their arguments arrive as one pointer into guest memory (the
//! host writes them there through `realloc`); `request.tokens` sits at offset 8 of the request.
//! Results wider than one value (`decision`, `policy-metadata`) are returned as a pointer.
//! `observe`'s `outcome` flattens to exactly 16 values, so it arrives flat.

use switchyard_core::router::Selection;

/// Tokens that make the "sometimes" variants misbehave; the canary uses 100.
pub const POISON_TOKENS: u32 = 13;

/// Metadata a test component reports.
#[derive(Debug, Clone, Copy)]
pub struct Meta<'a> {
    /// `name`.
    pub name: &'a str,
    /// `world-name`.
    pub world: &'a str,
    /// `wit-version`.
    pub wit_version: &'a str,
}

/// A valid router's metadata.
pub const ROUTER_META: Meta<'static> = Meta {
    name: "test-router",
    world: "router",
    wit_version: "1.0.0",
};

/// `route` bodies (the argument pointer is local 0; return a pointer to the decision).
pub mod route {
    /// chosen(0).
    pub const PICK_FIRST: &str = "(i32.store8 (i32.const 128) (i32.const 0)) (i32.store (i32.const 132) (i32.const 0)) (i32.const 128)";
    /// chosen(99): out of range for the small tests.
    pub const PICK_99: &str = "(i32.store8 (i32.const 128) (i32.const 0)) (i32.store (i32.const 132) (i32.const 99)) (i32.const 128)";
    /// chosen(last): `workers.worker-ids` (its length at offset 172 of the arguments) follows the
    /// 168-byte `request` record.
    pub const PICK_LAST: &str = "(i32.store8 (i32.const 128) (i32.const 0)) (i32.store (i32.const 132) (i32.sub (i32.load offset=172 (local.get 0)) (i32.const 1))) (i32.const 128)";
    /// costs([NaN]).
    pub const NAN_COST: &str = "(f64.store (i32.const 2048) (f64.const nan)) (i32.store8 (i32.const 128) (i32.const 1)) (i32.store (i32.const 132) (i32.const 2048)) (i32.store (i32.const 136) (i32.const 1)) (i32.const 128)";
}

/// Run `body` first unless the request looks like the registry's canary (100 tokens), then pick
/// the first worker: a policy that passes its canary and fails on real traffic.
pub fn unless_canary(body: &str) -> String {
    format!(
        "(if (i32.ne (i32.load offset=8 (local.get 0)) (i32.const {})) (then {body})) {}",
        crate::router::CANARY_TOKENS,
        route::PICK_FIRST
    )
}

/// Run `body` first when the request has [`POISON_TOKENS`] tokens, then pick the first worker.
pub fn when_poisoned(body: &str) -> String {
    format!(
        "(if (i32.eq (i32.load offset=8 (local.get 0)) (i32.const {POISON_TOKENS})) (then {body})) {}",
        route::PICK_FIRST
    )
}

/// Trap (`unreachable`).
pub const TRAP: &str = "unreachable";
/// Loop forever.
pub const SPIN: &str = "(loop $spin (br $spin))";
/// Grow memory by 64 MiB (past any cap the tests use), then fail like an allocator would.
pub const GROW: &str =
    "(if (i32.eq (memory.grow (i32.const 1024)) (i32.const -1)) (then unreachable))";

/// Options for a test component.
#[derive(Debug)]
pub struct Router<'a> {
    /// What `metadata` returns.
    pub meta: Meta<'a>,
    /// Body of the core `route` function.
    pub route: String,
    /// Initial memory in 64 KiB pages.
    pub pages: u32,
    /// Leave out the `queue-key` export.
    pub without_queue_key: bool,
    /// Body of a 1.2 `route-packed` export (the arguments' pointer is local 0, as for
    /// `route`); `None`: no such export, a 1.1 component.
    pub route_packed: Option<String>,
}

impl Default for Router<'_> {
    fn default() -> Self {
        Self {
            meta: ROUTER_META,
            route: route::PICK_FIRST.into(),
            pages: 1,
            without_queue_key: false,
            route_packed: None,
        }
    }
}

fn escape(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

/// The metadata record at 256 and its strings from 1024.
fn metadata_data(meta: &Meta<'_>) -> String {
    let strings = [
        meta.name,
        "0.1.0",
        meta.world,
        meta.wit_version,
        "a test policy",
    ];
    let mut record = Vec::new();
    let mut text = Vec::new();
    for s in strings {
        record.extend_from_slice(&(1024 + text.len() as u32).to_le_bytes());
        record.extend_from_slice(&(s.len() as u32).to_le_bytes());
        text.extend_from_slice(s.as_bytes());
    }
    record.extend_from_slice(&0u32.to_le_bytes()); // extensions: empty list
    record.extend_from_slice(&0u32.to_le_bytes());
    format!(
        "(data (i32.const 256) \"{}\") (data (i32.const 1024) \"{}\")",
        escape(&record),
        escape(&text)
    )
}

/// Core-module functions every fixture world shares: a bump allocator (`realloc`, which the
/// host calls to pass arguments; each export resets the heap) and `metadata` (the record at 256).
const CORE_PRELUDE: &str = r#"(global $heap (mut i32) (i32.const 8192))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (global.set $heap (i32.add (local.get $p) (local.get 3)))
      (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
        (then (drop (memory.grow (i32.const 1)))))
      (local.get $p))
    (func (export "metadata") (result i32) (i32.const 256))"#;

/// Component types every world uses (`extensions`, `policy-metadata`).
const SHARED_TYPES: &str = r#"
  (type $kv' (list (tuple string string)))
  (export $kv "extensions" (type $kv'))
  (type $meta' (record (field "name" string) (field "version" string) (field "world-name" string)
    (field "wit-version" string) (field "description" string) (field "extensions" $kv)))
  (export $meta "policy-metadata" (type $meta'))
"#;

/// Component types of the `router` world (after [`SHARED_TYPES`]).
const TYPES: &str = r#"
  (type $weights' (record (field "device-credit" f64) (field "host-credit" f64)
    (field "disk-credit" f64) (field "prefill-load-scale" f64)))
  (export $weights "cost-weights" (type $weights'))
  (type $overrides' (record (field "device-credit" (option f64)) (field "host-credit" (option f64))
    (field "disk-credit" (option f64)) (field "prefill-load-scale" (option f64))))
  (export $overrides "cost-overrides" (type $overrides'))
  (type $request' (record (field "model" string) (field "tokens" u32) (field "blocks" u32)
    (field "block-size" u32) (field "weights" $weights) (field "overrides" $overrides)
    (field "session-id" (option string)) (field "parent-session-id" (option string))
    (field "priority" s32) (field "osl" (option u32)) (field "extensions" $kv)))
  (export $request "request" (type $request'))
  (type $workers' (record (field "worker-ids" (list u32)) (field "dp-ranks" (list u32))
    (field "device-blocks" (list u32)) (field "host-blocks" (list u32))
    (field "disk-blocks" (list u32)) (field "shared-blocks" (list u32))
    (field "indexed-blocks" (list u64)) (field "active-prefill-tokens" (list u64))
    (field "active-decode-blocks" (list u64)) (field "active-requests" (list u32))
    (field "kv-capacity-blocks" (list u64)) (field "kv-usage" (list f32))
    (field "queue-depth" (list u32)) (field "healthy" (list bool))
    (field "extra-columns" (list (tuple string (list f64)))) (field "extensions" $kv)))
  (export $workers "workers" (type $workers'))
  (type $trials' (record (field "extra-columns" (list (tuple string (list f64))))
    (field "extensions" $kv)))
  (export $trials "packed-trials" (type $trials'))
  (type $packed' (record (field "count" u32) (field "counts" (list u32)) (field "sizes" (list u64))
    (field "kv-usage" (list f32)) (field "trials" (option $trials))))
  (export $packed "packed-workers" (type $packed'))
  (type $decision' (variant (case "chosen" u32) (case "costs" (list f64)) (case "queue" string)
    (case "reject" string)))
  (export $decision "decision" (type $decision'))
  (type $outcome' (record (field "worker-index" u32) (field "worker-id" u32) (field "dp-rank" u32)
    (field "session-id" (option string)) (field "ttft-ms" (option f64)) (field "itl-ms" (option f64))
    (field "cached-tokens" u32) (field "prompt-tokens" u32) (field "output-tokens" u32)
    (field "error" (option string))))
  (export $outcome "outcome" (type $outcome'))
"#;

impl Router<'_> {
    /// The component, as WAT text.
    pub fn wat(&self) -> String {
        let queue_key_export = if self.without_queue_key {
            ""
        } else {
            r#"(func (export "queue-key") (param "req" $request) (result f64)
    (canon lift (core func $i "queue-key") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))"#
        };
        let (packed_core, packed_export) = match &self.route_packed {
            Some(body) => (
                format!(
                    r#"(func (export "route-packed") (param i32) (result i32)
      (global.set $heap (i32.const 8192))
      {body})"#
                ),
                r#"(func (export "route-packed") (param "req" $request) (param "candidates" $packed) (result $decision)
    (canon lift (core func $i "route-packed") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))"#,
            ),
            None => (String::new(), ""),
        };
        format!(
            r#"(component
  (core module $m
    (memory (export "memory") {pages})
    {CORE_PRELUDE}
    (func (export "route") (param i32) (result i32)
      (global.set $heap (i32.const 8192))
      {route})
    {packed_core}
    (func (export "observe") (param i32 i32 i32 i32 i32 i32 i32 f64 i32 f64 i32 i32 i32 i32 i32 i32))
    (func (export "queue-key") (param i32) (result f64)
      (global.set $heap (i32.const 8192))
      (f64.convert_i32_u (i32.load offset=8 (local.get 0))))
    {data})
  (core instance $i (instantiate $m))
  {SHARED_TYPES}
  {TYPES}
  (func (export "metadata") (result $meta)
    (canon lift (core func $i "metadata") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "route") (param "req" $request) (param "candidates" $workers) (result $decision)
    (canon lift (core func $i "route") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "observe") (param "feedback" $outcome)
    (canon lift (core func $i "observe") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  {queue_key_export}
  {packed_export}
)"#,
            pages = self.pages,
            route = self.route,
            data = metadata_data(&self.meta),
        )
    }

    /// The component's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        parse(&self.wat())
    }
}

/// A component of the `admission` world's shape (it exports `tick`, not `route`).
pub fn admission_component() -> Vec<u8> {
    parse(
        r#"(component
  (core module $m (func (export "tick") (result i32) (i32.const 0)))
  (core instance $i (instantiate $m))
  (func (export "tick") (result u32) (canon lift (core func $i "tick")))
)"#,
    )
}

/// A component whose one export `noop: func()` does nothing: the floor of a component call in
/// wasmtime (entering and leaving the guest), for the call benchmark.
pub fn noop_component() -> Vec<u8> {
    parse(
        r#"(component
  (core module $m (func (export "noop")))
  (core instance $i (instantiate $m))
  (func (export "noop") (canon lift (core func $i "noop")))
)"#,
    )
}

/// `route` (or 1.2's `route-packed`) on a live instance through wasmtime's generated bindings
/// alone: the request and the columns are converted once, outside the call, and there is no
/// deadline to arm, no counter and ([`BareRoute::call`], [`BareRoute::call_packed`]) no check
/// of the answer. Against [`crate::WasmRouter`]'s `select` on the same guest it tells
/// wasmtime's share of a call (entering the guest, lowering the request and each column through
/// the guest's `realloc`, lifting the decision) from the host's own. [`BareRoute::route`] and
/// [`BareRoute::route_packed`] check the answer as the host does, for tests that compare them.
#[doc(hidden)]
pub struct BareRoute {
    store: wasmtime::Store<crate::engine::HostState>,
    instance: crate::component::RouterInstance,
    request: crate::bindings::Request,
    columns: crate::bindings::Workers,
    packed: crate::bindings::PackedWorkers,
}

impl std::fmt::Debug for BareRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareRoute").finish_non_exhaustive()
    }
}

impl BareRoute {
    /// A started instance of `component` and the converted arguments.
    pub fn new(
        component: &crate::RouterComponent,
        request: &switchyard_core::router::PolicyRequest<'_>,
        candidates: &[switchyard_core::router::Candidate],
    ) -> Result<Self, crate::PolicyError> {
        use crate::component::ComponentHandle;
        let (mut store, instance) = component.loaded().instantiate(false)?;
        // A deadline no benchmark reaches, set once.
        store.set_epoch_deadline(u64::MAX / 2);
        let mut bare = Self {
            store,
            instance,
            request: crate::convert::route_request(request, "", candidates),
            columns: crate::convert::empty_workers(),
            packed: crate::convert::empty_packed(),
        };
        bare.fill(candidates);
        Ok(bare)
    }

    /// Convert `request` and `candidates` as the arguments of the next calls.
    pub fn set_candidates(
        &mut self,
        request: &switchyard_core::router::PolicyRequest<'_>,
        candidates: &[switchyard_core::router::Candidate],
    ) {
        self.request = crate::convert::route_request(request, "", candidates);
        self.fill(candidates);
    }

    /// Both shapes of the columns, from `candidates`.
    fn fill(&mut self, candidates: &[switchyard_core::router::Candidate]) {
        crate::convert::fill_workers(&mut self.columns, candidates);
        crate::convert::fill_packed(&mut self.packed, candidates);
    }

    /// One `route` call; whether the guest answered.
    pub fn call(&mut self) -> bool {
        self.instance
            .core
            .call_route(&mut self.store, &self.request, &self.columns)
            .is_ok()
    }

    /// One 1.2 `route-packed` call; whether the guest answered (`false` without the export).
    pub fn call_packed(&mut self) -> bool {
        self.instance.packed.as_ref().is_some_and(|exports| {
            exports
                .call_route_packed(&mut self.store, &self.request, &self.packed)
                .is_ok()
        })
    }

    /// The guest's answer through `route`, checked as the host checks it.
    pub fn route(&mut self) -> Result<Selection, crate::PolicyError> {
        let decision = self
            .instance
            .core
            .call_route(&mut self.store, &self.request, &self.columns)
            .map_err(|e| crate::PolicyError::from_call(&e, self.store.data()))?;
        crate::convert::selection(decision, self.columns.worker_ids.len())
    }

    /// The guest's answer through 1.2 `route-packed`, checked; `None` without the export.
    pub fn route_packed(&mut self) -> Option<Result<Selection, crate::PolicyError>> {
        let exports = self.instance.packed.as_ref()?;
        let answer = exports
            .call_route_packed(&mut self.store, &self.request, &self.packed)
            .map_err(|e| crate::PolicyError::from_call(&e, self.store.data()))
            .and_then(|decision| crate::convert::selection(decision, self.packed.count as usize));
        Some(answer)
    }
}

pub mod wasi;
pub mod worlds;

/// Assemble fixture WAT; the fixtures are constants, so a failure is a bug in this module.
fn parse(text: &str) -> Vec<u8> {
    match wat::parse_str(text) {
        Ok(bytes) => bytes,
        Err(e) => panic!("fixture WAT does not parse: {e}"),
    }
}
