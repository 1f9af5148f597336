#!/usr/bin/env bash
# The build steps of the Switchyard image, in one place: the Dockerfile's builder stage runs this
# script (`--in-place`), and CI runs it without a container runtime (deploy/check.sh) on a copy
# of the repository, so a broken step shows up in CI and not only at `docker build` time.
#
#   deploy/docker/build-steps.sh [--in-place] PROFILE [DEST]
#
# PROFILE  a cargo profile: `release` (the image's default) or `dev` (CI's check: see below).
# DEST     where to install the binary without its debug info (e.g. /out/switchyard); absent: it
#          stays in the target dir only.
# --in-place  build the tree the script is in (the Dockerfile's case: /src is already a clean
#             copy, the build context minus .dockerignore). Without it, the script first copies
#             the repository into a temporary directory and builds there (CI's case).
#
# What "a copy of the repository" is: the files git tracks plus untracked files git does not
# ignore, with their modification times; nothing ignored (target/, node_modules/, venvs). That is
# what `docker build .` sends as its context after .dockerignore (the working tree, not HEAD),
# and it proves the build needs nothing that only a developer's tree has.
#
# CI's choice: `CARGO_TARGET_DIR=$PWD/target deploy/docker/build-steps.sh dev`. A from-scratch
# build in a fresh target directory would take ~25 minutes on CI's 2 cores; pointing the copy at
# the target directory that `cargo test --workspace` already filled makes it cost little: the
# dependencies are reused as they are, and since the copy keeps the files' modification times,
# cargo's freshness checks give the same answer in the copy as in the checkout (building HEAD's
# sources into a shared target dir could leave artifacts that cargo would then take as fresh for
# a checkout with uncommitted edits). The copy gets a `target` symlink to that directory instead
# of the variable, because the policies' build script (host/policy-artifacts/build.rs) reruns
# when CARGO_TARGET_DIR changes, which would rebuild the gateway crates twice per check.
# The release profile (what the image ships) is not built in CI: it is the same commands with
# another flag, and a cold release build takes ~27 minutes.
set -euo pipefail

in_place=false
if [[ "${1:-}" == "--in-place" ]]; then
  in_place=true
  shift
fi
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 [--in-place] PROFILE [DEST]" >&2
  exit 2
fi
profile=$1
dest=${2:-}
if [[ -n "$dest" && "$dest" != /* ]]; then
  dest="$PWD/$dest"
fi
here=$(cd "$(dirname "$0")/../.." && pwd)

if ! $in_place; then
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-build-steps.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # Tracked and untracked-but-not-ignored files that exist (a tracked file deleted in the
  # working tree is not sent by docker either); tar keeps their modification times.
  (cd "$here" && git ls-files -z --cached --others --exclude-standard --deduplicate |
    while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done |
    tar -c --null -T - -f -) | tar -x -C "$tmp" -f -
  if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
    mkdir -p "$CARGO_TARGET_DIR"
    ln -s "$(cd "$CARGO_TARGET_DIR" && pwd)" "$tmp/target"
    unset CARGO_TARGET_DIR
  fi
  echo "build-steps: building a copy of $here in $tmp ($profile)" >&2
  "$tmp/deploy/docker/build-steps.sh" --in-place "$profile" "$dest"
  exit
fi

cd "$here"

# === The steps (keep them the Dockerfile's only build commands) ===

# 1. The built-in policies are compiled to wasm32-wasip2 components by
#    host/policy-artifacts/build.rs (a nested cargo build of policies/). The build script would
#    add the target itself; doing it here keeps the step visible (and cached in a layer).
#    Listing installed targets needs no network, so an up-to-date toolchain costs nothing.
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi

# 2. The binary. --locked: Cargo.lock (and policies/Cargo.lock, which the build script builds
#    with --locked too) is used as committed, never updated. The C parts (oniguruma, for the
#    tokenizer's regexes, via onig_sys and cc) need only gcc and libc headers, which the rust
#    image has; nothing needs cmake, pkg-config or system libraries.
cargo build --locked --profile "$profile" -p switchyard

# 3. Where cargo put it: `dev` builds into debug/, other profiles into a folder of their name.
case $profile in
  dev) out=debug ;;
  *) out=$profile ;;
esac
bin="${CARGO_TARGET_DIR:-target}/$out/switchyard"
"$bin" --version
# 4. The installed copy without its DWARF: the release profile keeps line tables for profiling
#    (perf, backtraces with file:line), ~200 of the binary's ~260 MB. The image ships the symbol
#    table only, so a backtrace still names its functions; the target directory keeps the full
#    binary. objcopy comes with gcc's binutils.
if [[ -n "$dest" ]]; then
  install -D -m 0755 "$bin" "$dest"
  objcopy --strip-debug "$dest"
  "$dest" --version >/dev/null
  echo "build-steps: installed $dest ($(du -h "$dest" | cut -f1), debug info stripped)" >&2
fi
