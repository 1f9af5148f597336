//! Builds the policies workspace (`policies/`) for `wasm32-wasip2` in release and copies each
//! component into `OUT_DIR`, where `src/lib.rs` embeds it.
//!
//! The nested cargo gets its own target directory (`<target>/policies`): sharing the outer one
//! would deadlock on its build lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, exit};

const TARGET: &str = "wasm32-wasip2";
/// Crates of the policies workspace; their library artifacts are `<name with _>.wasm`.
const POLICIES: [&str; 11] = [
    "kv-cost",
    "round-robin",
    "least-load",
    "session-affinity",
    "bandit",
    "thunder-agent",
    "continuum",
    "autellix",
    "demote-on-tool-call",
    "subagent-reclaim",
    "share-to-subagent",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir.join("../..");
    // The admission and kv-hints built-ins compile the core's native policies: a core change
    // rebuilds them.
    for watched in ["policies", "sdk", "wit", "host/core"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if !target_installed(Path::new(&rustc)) {
        // A fresh machine has only the host target: add it the way a user would, once.
        println!("cargo:warning=installing the {TARGET} target with rustup");
        let _ = Command::new("rustup")
            .args(["target", "add", TARGET])
            .status();
    }
    if !target_installed(Path::new(&rustc)) {
        fail(&format!(
            "the {TARGET} target is not installed, so the built-in policies cannot be built; \
             run: rustup target add {TARGET}"
        ));
    }

    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("policies");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .arg("build")
        .args(["--release", "--locked", "--target", TARGET])
        .arg("--manifest-path")
        .arg(root.join("policies/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    // What the outer build was told applies to the host crates, not to the guests: instrumented
    // or wrapped (clippy) rustc flags would break or slow the Wasm build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
    ] {
        build.env_remove(var);
    }
    match build.status() {
        Ok(status) if status.success() => {}
        Ok(status) => fail(&format!(
            "building the policies workspace for {TARGET} failed ({status}); \
             see the cargo output above"
        )),
        Err(e) => fail(&format!(
            "could not run cargo for the policies workspace: {e}"
        )),
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let release = target_dir.join(TARGET).join("release");
    for policy in POLICIES {
        let built = release.join(format!("{}.wasm", policy.replace('-', "_")));
        let embedded = out_dir.join(format!("{policy}.wasm"));
        if let Err(e) = std::fs::copy(&built, &embedded) {
            fail(&format!("cannot copy {}: {e}", built.display()));
        }
    }
}

/// Whether the sysroot of `rustc` has the standard library for `TARGET`.
fn target_installed(rustc: &Path) -> bool {
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout);
    Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(TARGET)
        .is_dir()
}

/// Stops the build with `message` shown as an error.
fn fail(message: &str) -> ! {
    println!("cargo:error={message}");
    eprintln!("error: {message}");
    exit(1);
}
