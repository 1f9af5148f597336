#!/usr/bin/env bash
# Installs the pinned agent harness CLIs (package.json beside this script: exact versions; each
# pins its platform binary exactly) into a private prefix, default target/harnesses, and prints
# the folder of their executables. A no-op when the prefix already holds these versions. Install
# scripts must run: Claude Code's and OpenCode's postinstall put their native binary in place.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix="${1:-$here/../../target/harnesses}"
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
bin="$prefix/node_modules/.bin"
stamp="$prefix/installed.json"
if ! cmp -s "$here/package.json" "$stamp"; then
  rm -rf "$stamp" "$prefix/node_modules"
  cp "$here/package.json" "$prefix/"
  (cd "$prefix" && npm install --no-package-lock --no-audit --no-fund --loglevel=error >&2)
  # Each CLI must run here before the install counts.
  home="$(mktemp -d)"
  for cli in claude codex opencode; do
    HOME="$home" "$bin/$cli" --version >/dev/null
  done
  rm -rf "$home"
  cp "$here/package.json" "$stamp"
fi
echo "$bin"
