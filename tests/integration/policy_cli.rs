//! The policy author's workflow end to end, as docs/policies.md walks it: `switchyard policy new`
//! scaffolds a kv-hints crate in a temp dir, its own `cargo test` passes, it builds offline to a
//! wasm32-wasip2 component, `policy check` accepts it, and `policy test` compares it with the
//! baseline on the example trace; `policy check` refuses a file that is not a component, or a
//! component of another world, naming why.
//!
//! Without the wasm32-wasip2 target the test prints a note and passes, unless `CI` is set (the
//! built-in policies need the target there anyway), where it fails saying what to install.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TARGET: &str = "wasm32-wasip2";

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn target_installed() -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout);
    Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(TARGET)
        .is_dir()
}

/// `switchyard args...` in `dir`, to completion.
fn switchyard(dir: &Path, args: &[&str]) -> Output {
    Command::new(crate::support::switchyard_bin())
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .output()
        .expect("run switchyard")
}

/// `cargo args...` in `dir`, offline, on a target dir kept between runs (the SDK and wit-bindgen
/// are built once), without what the outer build was told (instrumented or wrapped rustc flags
/// are for the host crates, not a guest).
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(args).arg("--offline").current_dir(dir).env(
        "CARGO_TARGET_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-scaffold"),
    );
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
    ] {
        command.env_remove(var);
    }
    command.output().expect("run cargo")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `output` succeeded; its stdout.
fn succeeded(what: &str, output: &Output) -> String {
    let (stdout, stderr) = text(output);
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    stdout
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_new_kv_hints_policy_builds_checks_and_runs_against_the_baseline() {
    if !target_installed() {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        assert!(
            !ci,
            "CI is set but the {TARGET} target is not installed, so a scaffolded policy cannot \
             be built: run `rustup target add {TARGET}`"
        );
        eprintln!("note: skipping the policy scaffold test: the {TARGET} target is not installed");
        return;
    }
    let tmp =
        TempDir(std::env::temp_dir().join(format!("switchyard-policy-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    std::fs::create_dir_all(&tmp.0).unwrap();
    // Policy files must not be writable by group or others, nor their directory (the loader's
    // rule): as `install -m 0644` into a 0755 directory.
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o755)).unwrap();

    // new: outside any checkout, so the SDK is the checkout this binary was built from.
    let out = succeeded(
        "policy new",
        &switchyard(
            &tmp.0,
            &["policy", "new", "kv-hints", "my-hints", "--dir", "."],
        ),
    );
    assert!(out.contains("SDK: path dependency on"), "{out}");
    let crate_dir = tmp.0.join("my-hints");
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        ".gitignore",
        "src/lib.rs",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing:\n{out}");
    }
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).unwrap();
    assert!(readme.contains("cargo build --target wasm32-wasip2 --release"));
    assert!(
        !switchyard(&tmp.0, &["policy", "new", "kv-hints", "my-hints"])
            .status
            .success()
    );

    // Its own tests pass natively, and it builds to a component.
    succeeded("cargo test of the scaffold", &cargo(&crate_dir, &["test"]));
    succeeded(
        "cargo build of the scaffold",
        &cargo(&crate_dir, &["build", "--release", "--target", TARGET]),
    );
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("policy-scaffold")
        .join(TARGET)
        .join("release/my_hints.wasm");
    let wasm = tmp.0.join("my-hints.wasm");
    std::fs::copy(&built, &wasm).unwrap();
    std::fs::set_permissions(&wasm, std::fs::Permissions::from_mode(0o644)).unwrap();

    // check: the registry's checks pass.
    let out = succeeded(
        "policy check",
        &switchyard(&tmp.0, &["policy", "check", "my-hints.wasm"]),
    );
    for expected in [
        "ok",
        "kv-hints",
        "switchyard:policy@1.",
        "my-hints",
        "canary",
    ] {
        assert!(out.contains(expected), "{expected}:\n{out}");
    }

    // test: both columns, the hint rows, on the example trace.
    let trace = root().join("examples/traces/claude-code");
    let out = succeeded(
        "policy test",
        &switchyard(
            &tmp.0,
            &[
                "policy",
                "test",
                "my-hints.wasm",
                "--trace",
                trace.to_str().unwrap(),
            ],
        ),
    );
    let header = out.lines().nth(1).unwrap_or_default();
    assert!(
        header.contains("no-hints") && header.contains("my-hints") && header.contains("change"),
        "{out}"
    );
    for row in [
        "requests/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "prefix hit ratio",
        "demote done/all",
    ] {
        assert!(out.lines().any(|l| l.starts_with(row)), "{row}:\n{out}");
    }

    // A file that is not a component, and a component of another world: refused, with why.
    let bad = tmp.0.join("bad.wasm");
    std::fs::write(&bad, b"not a component").unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = switchyard(&tmp.0, &["policy", "check", "bad.wasm"]);
    let (stdout, stderr) = text(&refused);
    assert!(!refused.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("bad.wasm: rejected (compile): not a valid component"),
        "{stderr}"
    );
    let refused = switchyard(
        &tmp.0,
        &["policy", "check", "my-hints.wasm", "--world", "router"],
    );
    let (stdout, stderr) = text(&refused);
    assert!(!refused.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("rejected (wrong_world)"), "{stderr}");
}
