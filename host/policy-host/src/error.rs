//! Why a policy could not be loaded or did not answer, classified from wasmtime's root cause.

use crate::engine::HostState;
use wasmtime::Trap;

/// A policy failure. Load-time variants (`Compile` .. `Canary`) keep a policy from being
/// installed; call-time variants (`Trap` .. `BadOutput`) make that call use the native policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The engine settings are invalid, or the engine could not be created with them.
    #[error("policy engine: {0}")]
    Engine(String),
    /// The bytes are not a valid component (garbage, a core module, a truncated file).
    #[error("not a valid component: {0}")]
    Compile(String),
    /// The component implements another world, or imports what the host does not provide.
    #[error("wrong world: {0}")]
    WrongWorld(String),
    /// The component lacks an export of the `router` world.
    #[error("missing export `{0}`")]
    MissingExport(String),
    /// The component was built against an incompatible version of `switchyard:policy`.
    #[error("incompatible version: {0}")]
    IncompatibleVersion(String),
    /// The component failed its canary run on sample inputs.
    #[error("canary failed: {0}")]
    Canary(String),
    /// The file could not be read.
    #[error("cannot read: {0}")]
    Io(String),
    /// The file, or its directory, could be written by someone other than the gateway's user
    /// (or root): the message names it and the `chmod`/`chown` that fixes it.
    #[error("refused: {0}")]
    Untrusted(String),
    /// The guest trapped (panic, `unreachable`, stack overflow, ...).
    #[error("trap: {0}")]
    Trap(String),
    /// The call ran past its deadline.
    #[error("deadline exceeded")]
    Deadline,
    /// The guest tried to grow its memory past the cap.
    #[error("out of memory (cap {cap_bytes} bytes)")]
    OutOfMemory {
        /// The cap in force.
        cap_bytes: usize,
    },
    /// The policy refused its parameters (its reason), or takes none (a 1.0 component without
    /// `configure`) and was given some.
    #[error("parameters refused: {0}")]
    Params(String),
    /// The guest answered something impossible (wrong number of costs, index out of range, NaN).
    #[error("bad output: {0}")]
    BadOutput(String),
}

impl PolicyError {
    /// Short label for metrics (`reason` of `switchyard_policy_fallbacks_total`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Engine(_) => "engine",
            Self::Compile(_) => "compile",
            Self::WrongWorld(_) => "wrong_world",
            Self::MissingExport(_) => "missing_export",
            Self::IncompatibleVersion(_) => "incompatible_version",
            Self::Canary(_) => "canary",
            Self::Io(_) => "io",
            Self::Untrusted(_) => "untrusted",
            Self::Trap(_) => "trap",
            Self::Deadline => "deadline",
            Self::OutOfMemory { .. } => "out_of_memory",
            Self::Params(_) => "params",
            Self::BadOutput(_) => "bad_output",
        }
    }

    /// Classify an error from a call into (or instantiation of) a guest. The limiter's record
    /// comes first: a denied memory grow often surfaces as a guest `unreachable` (its allocator
    /// aborts), which is the memory cap's doing, not a bug in the guest.
    pub(crate) fn from_call(err: &wasmtime::Error, state: &HostState) -> Self {
        if state.limiter.denied {
            return Self::OutOfMemory {
                cap_bytes: state.limiter.max_memory_bytes,
            };
        }
        let trap = match err.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => return Self::Deadline,
            Some(trap) => trap.to_string(),
            None => format!("{err:#}"),
        };
        // What the guest printed to stderr before failing (e.g. a Python traceback) says why.
        match state.wasi.stderr_tail() {
            "" => Self::Trap(trap),
            stderr => Self::Trap(format!("{trap}; guest stderr: {stderr}")),
        }
    }
}
