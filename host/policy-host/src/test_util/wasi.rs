//! A `router` fixture that imports WASI the way a language runtime's component does, to test the
//! host's WASI subset (`crate::wasi`) without a guest toolchain.
//!
//! Its `route` body (argument pointer in local 0, as in [`super::Router`]) may call:
//! `$rand` (`wasi:random/random.get-random-u64`), `$now` (`wasi:clocks/monotonic-clock.now`,
//! not granted: it traps), `$env` (`wasi:cli/environment.get-environment`, writing the list's
//! address and length at its argument) and `$eprint` (writes `n` bytes at `ptr` to stderr).
//! Memory comes from a small first module, because lowering functions that pass lists needs a
//! memory before the main module exists.

use super::{CORE_PRELUDE, Meta, ROUTER_META, SHARED_TYPES, TYPES, metadata_data, parse, route};

/// WASI version the fixture imports (any `0.2.x` is answered).
const VERSION: &str = "0.2.3";

/// chosen(`get-random-u64` mod the number of workers).
pub const PICK_RANDOM: &str = "(i32.store8 (i32.const 128) (i32.const 0))
    (i32.store (i32.const 132) (i32.wrap_i64 (i64.rem_u (call $rand)
      (i64.extend_i32_u (i32.load offset=172 (local.get 0))))))
    (i32.const 128)";

/// chosen(number of environment variables).
pub const PICK_ENV_LEN: &str = "(call $env (i32.const 4096))
    (i32.store8 (i32.const 128) (i32.const 0))
    (i32.store (i32.const 132) (i32.load offset=4 (i32.const 4096)))
    (i32.const 128)";

/// Read the monotonic clock (which traps), then chosen(0).
pub fn read_clock() -> String {
    format!("(drop (call $now)) {}", route::PICK_FIRST)
}

/// Write `text` to stderr, then run `then`.
pub fn eprint_then(text: &str, then: &str) -> String {
    format!(
        "(call $eprint (i32.const 3072) (i32.const {})) {then}",
        text.len().min(1024)
    )
}

/// A router importing WASI. `text` is placed at 3072 for [`eprint_then`].
#[derive(Debug)]
pub struct WasiRouter<'a> {
    /// What `metadata` returns.
    pub meta: Meta<'a>,
    /// Body of the core `route` function.
    pub route: String,
    /// Bytes at 3072 (what [`eprint_then`] writes).
    pub text: String,
}

impl Default for WasiRouter<'_> {
    fn default() -> Self {
        Self {
            meta: ROUTER_META,
            route: PICK_RANDOM.into(),
            text: String::new(),
        }
    }
}

impl WasiRouter<'_> {
    /// The component's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let text: String = self
            .text
            .bytes()
            .take(1024)
            .map(|b| format!("\\{b:02x}"))
            .collect();
        let wat = format!(
            r#"(component
  (import "wasi:random/random@{VERSION}" (instance $random
    (export "get-random-u64" (func (result u64)))))
  (import "wasi:clocks/monotonic-clock@{VERSION}" (instance $clock
    (export "now" (func (result u64)))))
  (import "wasi:cli/environment@{VERSION}" (instance $environment
    (export "get-environment" (func (result (list (tuple string string)))))))
  (import "wasi:io/error@{VERSION}" (instance $io-error
    (export "error" (type (sub resource)))))
  (alias export $io-error "error" (type $error))
  (import "wasi:io/streams@{VERSION}" (instance $streams
    (alias outer 1 $error (type $outer-error))
    (export "error" (type $e (eq $outer-error)))
    (export "output-stream" (type $os (sub resource)))
    (type $se' (variant (case "last-operation-failed" (own $e)) (case "closed")))
    (export "stream-error" (type $se (eq $se')))
    (export "[method]output-stream.blocking-write-and-flush"
      (func (param "self" (borrow $os)) (param "contents" (list u8)) (result (result (error $se)))))))
  (alias export $streams "output-stream" (type $output-stream))
  (import "wasi:cli/stderr@{VERSION}" (instance $stderr
    (alias outer 1 $output-stream (type $outer-os))
    (export "output-stream" (type $os (eq $outer-os)))
    (export "get-stderr" (func (result (own $os))))))
  (core module $mem
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 49152))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (global.get $heap))
      (global.set $heap (i32.add (global.get $heap) (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
      (local.get $p)))
  (core instance $mi (instantiate $mem))
  (core func $rand (canon lower (func $random "get-random-u64")))
  (core func $now (canon lower (func $clock "now")))
  (core func $env (canon lower (func $environment "get-environment")
    (memory (core memory $mi "memory")) (realloc (core func $mi "realloc"))))
  (core func $get-stderr (canon lower (func $stderr "get-stderr")))
  (core func $write (canon lower (func $streams "[method]output-stream.blocking-write-and-flush")
    (memory (core memory $mi "memory"))))
  (core module $m
    (import "mem" "memory" (memory 1))
    (import "wasi" "rand" (func $rand (result i64)))
    (import "wasi" "now" (func $now (result i64)))
    (import "wasi" "env" (func $env (param i32)))
    (import "wasi" "get-stderr" (func $get-stderr (result i32)))
    (import "wasi" "write" (func $write (param i32 i32 i32 i32)))
    {CORE_PRELUDE}
    (func $eprint (param $ptr i32) (param $len i32)
      (call $write (call $get-stderr) (local.get $ptr) (local.get $len) (i32.const 3968)))
    (func (export "route") (param i32) (result i32)
      (global.set $heap (i32.const 8192))
      {route})
    (func (export "observe") (param i32 i32 i32 i32 i32 i32 i32 f64 i32 f64 i32 i32 i32 i32 i32 i32))
    (func (export "queue-key") (param i32) (result f64) (f64.const 0))
    (data (i32.const 3072) "{text}")
    {data})
  (core instance $i (instantiate $m
    (with "mem" (instance $mi))
    (with "wasi" (instance
      (export "rand" (func $rand)) (export "now" (func $now)) (export "env" (func $env))
      (export "get-stderr" (func $get-stderr)) (export "write" (func $write))))))
  {SHARED_TYPES}
  {TYPES}
  (func (export "metadata") (result $meta)
    (canon lift (core func $i "metadata") (memory (core memory $mi "memory")) (realloc (core func $i "realloc"))))
  (func (export "route") (param "req" $request) (param "candidates" $workers) (result $decision)
    (canon lift (core func $i "route") (memory (core memory $mi "memory")) (realloc (core func $i "realloc"))))
  (func (export "observe") (param "feedback" $outcome)
    (canon lift (core func $i "observe") (memory (core memory $mi "memory")) (realloc (core func $i "realloc"))))
  (func (export "queue-key") (param "req" $request) (result f64)
    (canon lift (core func $i "queue-key") (memory (core memory $mi "memory")) (realloc (core func $i "realloc"))))
)"#,
            route = self.route,
            data = metadata_data(&self.meta),
        );
        parse(&wat)
    }
}
