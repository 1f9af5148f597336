//! The WASI subset a guest may call: what a language runtime needs to start (componentize-py's
//! CPython reads its environment and seeds `random` on its first export call), answered
//! deterministically, and nothing that reaches outside the host.
//!
//! | interface (`@0.2.x`) | answer |
//! |---|---|
//! | `wasi:cli/environment` | no variables, no arguments, no working directory |
//! | `wasi:random/random`, `wasi:random/insecure` | one fixed-seed stream per instance (splitmix64), restarted with the instance |
//! | `wasi:random/insecure-seed` | a fixed pair |
//! | `wasi:cli/stdout`, `wasi:cli/stderr` + the `output-stream` writes of `wasi:io/streams` | the host log at `debug`, at most [`OUTPUT_BYTES_PER_CALL`] per call; stderr's tail is kept for the error of a call that then fails |
//!
//! Everything else a guest imports from WASI (clocks, filesystem, sockets, stdin, exit, polling)
//! is linked to a function that traps, so a call to it is contained like any other trap. The
//! random stream is not random: a decision must be reproducible in the simulator, and a policy
//! has no secret to protect. Only the versions `0.2.x` are answered; a `0.3` import traps.

use crate::engine::HostState;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{
    Component, ComponentType, Linker, LinkerInstance, Lower, Resource, ResourceType,
};
use wasmtime::{Engine, StoreContextMut};

/// WASI versions answered (`0.2.x` are semver-compatible with each other).
const VERSION_PREFIX: &str = "0.2.";
/// Largest `get-random-bytes` request; a runtime seeding a generator asks for tens of bytes, and
/// the host must not allocate what a guest names before the memory cap can refuse it.
const MAX_RANDOM_BYTES: u64 = 64 << 10;
/// Guest output logged per call; the rest is dropped.
pub(crate) const OUTPUT_BYTES_PER_CALL: usize = 4 << 10;
/// Characters of stderr kept for the error of a failed call (a Python traceback's last lines).
const STDERR_TAIL_CHARS: usize = 1024;
/// Seed of every instance's random stream.
const SEED: u64 = 0x5357_4954_4348_5944; // "SWITCHYD"
/// `insecure-seed`'s fixed answer.
const INSECURE_SEED: (u64, u64) = (SEED, !SEED);
/// What `check-write` allows at once (wasi-libc writes in chunks of at most this).
const WRITE_CHUNK_BYTES: u64 = 4096;

/// Per-instance WASI state: the random stream and the output budget.
#[derive(Debug)]
pub(crate) struct WasiState {
    rng: u64,
    output_left: usize,
    stderr_tail: String,
}

impl Default for WasiState {
    fn default() -> Self {
        Self {
            rng: SEED,
            output_left: OUTPUT_BYTES_PER_CALL,
            stderr_tail: String::new(),
        }
    }
}

impl WasiState {
    /// A call starts: a fresh output budget, no stderr yet.
    pub(crate) fn start_call(&mut self) {
        self.output_left = OUTPUT_BYTES_PER_CALL;
        self.stderr_tail.clear();
    }

    /// What the guest wrote to stderr during this call (its last characters).
    pub(crate) fn stderr_tail(&self) -> &str {
        self.stderr_tail.trim()
    }

    /// splitmix64: tiny, fast, and the same sequence on every platform.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        if len > MAX_RANDOM_BYTES {
            wasmtime::bail!("get-random-bytes({len}): at most {MAX_RANDOM_BYTES} bytes per call");
        }
        let len = usize::try_from(len)?;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        Ok(out)
    }

    fn write(&mut self, stream: u32, policy: &str, bytes: &[u8]) {
        let shown = bytes.len().min(self.output_left);
        self.output_left -= shown;
        if shown == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&bytes[..shown]);
        if stream == STDERR {
            self.stderr_tail.push_str(&text);
            let excess = self
                .stderr_tail
                .chars()
                .count()
                .saturating_sub(STDERR_TAIL_CHARS);
            if excess > 0 {
                self.stderr_tail = self.stderr_tail.chars().skip(excess).collect();
            }
        }
        let stream = if stream == STDERR { "stderr" } else { "stdout" };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            tracing::debug!(policy, stream, "{line}");
        }
    }
}

/// The host side of `wasi:io/streams`' `output-stream`: rep [`STDOUT`] or [`STDERR`].
struct OutputStream;
/// The host side of `wasi:io/error`'s `error` (never created: writes do not fail).
struct IoError;

const STDOUT: u32 = 1;
const STDERR: u32 = 2;

/// `wasi:io/streams`' `stream-error`, for the write functions' result type.
#[derive(ComponentType, Lower)]
#[component(variant)]
#[expect(dead_code, reason = "the type must match the WIT; writes never fail")]
enum StreamError {
    #[component(name = "last-operation-failed")]
    LastOperationFailed(Resource<IoError>),
    #[component(name = "closed")]
    Closed,
}

type WriteResult = wasmtime::Result<(Result<(), StreamError>,)>;

/// Define the subset, at the exact versions `component` imports, in `linker` (a per-component
/// copy). Imports of other WASI interfaces, or other versions, are left for the trap stubs.
pub(crate) fn add_to_linker(
    linker: &mut Linker<HostState>,
    engine: &Engine,
    component: &Component,
) -> wasmtime::Result<()> {
    let ty = component.component_type();
    for (import, item) in ty.imports(engine) {
        let Some((interface, version)) = import.split_once('@') else {
            continue;
        };
        let ComponentItem::ComponentInstance(exports) = item.ty else {
            continue;
        };
        if !interface.starts_with("wasi:") || !version.starts_with(VERSION_PREFIX) {
            continue;
        }
        let mut instance = linker.instance(import)?;
        // Interfaces re-export the stream and error resources they `use` (filesystem, sockets,
        // stdout): every instance must name the same host type, or the types do not match.
        let is_resource = |name: &str| {
            matches!(
                exports.get_export(engine, name).map(|e| e.ty),
                Some(ComponentItem::Resource(_))
            )
        };
        if is_resource("output-stream") {
            instance.resource(
                "output-stream",
                ResourceType::host::<OutputStream>(),
                |_, _| Ok(()),
            )?;
        }
        if is_resource("error") {
            instance.resource("error", ResourceType::host::<IoError>(), |_, _| Ok(()))?;
        }
        match interface {
            "wasi:cli/environment" => environment(&mut instance)?,
            "wasi:random/random" => random(&mut instance, "get-random-bytes", "get-random-u64")?,
            "wasi:random/insecure" => random(
                &mut instance,
                "get-insecure-random-bytes",
                "get-insecure-random-u64",
            )?,
            "wasi:random/insecure-seed" => {
                instance.func_wrap("insecure-seed", |_, (): ()| Ok((INSECURE_SEED,)))?;
            }
            "wasi:io/streams" => output_stream(&mut instance)?,
            "wasi:cli/stdout" => {
                instance.func_wrap("get-stdout", |_, (): ()| {
                    Ok((Resource::<OutputStream>::new_own(STDOUT),))
                })?;
            }
            "wasi:cli/stderr" => {
                instance.func_wrap("get-stderr", |_, (): ()| {
                    Ok((Resource::<OutputStream>::new_own(STDERR),))
                })?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn environment(instance: &mut LinkerInstance<'_, HostState>) -> wasmtime::Result<()> {
    instance.func_wrap("get-environment", |_, (): ()| {
        Ok((Vec::<(String, String)>::new(),))
    })?;
    instance.func_wrap("get-arguments", |_, (): ()| Ok((Vec::<String>::new(),)))?;
    instance.func_wrap("initial-cwd", |_, (): ()| Ok((None::<String>,)))
}

fn random(
    instance: &mut LinkerInstance<'_, HostState>,
    bytes: &str,
    u64_name: &str,
) -> wasmtime::Result<()> {
    instance.func_wrap(
        bytes,
        |mut store: StoreContextMut<'_, HostState>, (len,): (u64,)| {
            Ok((store.data_mut().wasi.bytes(len)?,))
        },
    )?;
    instance.func_wrap(
        u64_name,
        |mut store: StoreContextMut<'_, HostState>, (): ()| Ok((store.data_mut().wasi.next_u64(),)),
    )
}

/// The writes of `output-stream` (its resource is defined by [`add_to_linker`]).
fn output_stream(instance: &mut LinkerInstance<'_, HostState>) -> wasmtime::Result<()> {
    instance.func_wrap(
        "[method]output-stream.check-write",
        |_, (_stream,): (Resource<OutputStream>,)| Ok((Ok::<u64, StreamError>(WRITE_CHUNK_BYTES),)),
    )?;
    for name in [
        "[method]output-stream.write",
        "[method]output-stream.blocking-write-and-flush",
    ] {
        instance.func_wrap(
            name,
            |mut store: StoreContextMut<'_, HostState>,
             (stream, bytes): (Resource<OutputStream>, Vec<u8>)|
             -> WriteResult {
                let state = store.data_mut();
                let policy = state.policy.clone();
                state.wasi.write(stream.rep(), &policy, &bytes);
                Ok((Ok(()),))
            },
        )?;
    }
    for name in [
        "[method]output-stream.flush",
        "[method]output-stream.blocking-flush",
    ] {
        instance.func_wrap(
            name,
            |_, (_stream,): (Resource<OutputStream>,)| -> WriteResult { Ok((Ok(()),)) },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_random_stream_restarts_identically_per_instance() {
        let (mut a, mut b) = (WasiState::default(), WasiState::default());
        let first = a.bytes(37).unwrap();
        assert_eq!(first.len(), 37);
        assert_eq!(first, b.bytes(37).unwrap());
        assert_ne!(a.bytes(37).unwrap(), first, "the stream advances");
        assert!(a.bytes(MAX_RANDOM_BYTES + 1).is_err());
    }

    #[test]
    fn output_is_bounded_per_call_and_stderr_keeps_its_tail() {
        let mut state = WasiState::default();
        state.write(STDERR, "p", &vec![b'x'; OUTPUT_BYTES_PER_CALL]);
        state.write(STDERR, "p", b"dropped");
        assert_eq!(state.stderr_tail().len(), STDERR_TAIL_CHARS);
        assert!(!state.stderr_tail().contains('d'));
        state.start_call();
        state.write(STDOUT, "p", b"to the log only");
        state.write(STDERR, "p", b"Traceback: boom\n");
        assert_eq!(state.stderr_tail(), "Traceback: boom");
    }
}
