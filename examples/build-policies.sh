#!/usr/bin/env bash
# Builds the least-load example policy in every guest language into target/examples/:
#   policy-c.wasm, policy-js.wasm, policy-python.wasm
# Each build.sh installs its own toolchain from the package registries if it is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for lang in c js python; do
  echo "== policy-$lang"
  "$here/policy-$lang/build.sh"
done
