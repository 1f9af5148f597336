#!/usr/bin/env bash
# Builds the JavaScript least-load policy into target/examples/policy-js.wasm with
# componentize-js (npm; pinned in package.json, installed into node_modules if missing).
# Every WASI feature is disabled: the component imports only the WIT's own interfaces.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/examples"
mkdir -p "$out"
cd "$here"
if [ ! -x node_modules/.bin/componentize-js ]; then
  npm ci --no-audit --no-fund
fi
node_modules/.bin/componentize-js least-load.js --wit "$root/wit" --world-name router \
  --disable stdio random clocks http fetch-event -o "$out/policy-js.wasm"
echo "built $out/policy-js.wasm ($(wc -c < "$out/policy-js.wasm") bytes)"
