#!/usr/bin/env bash
# Builds the Python least-load policy into target/examples/policy-python.wasm with
# componentize-py (PyPI; installed if missing). The component embeds CPython, so it is large
# and imports WASI interfaces (the interpreter's own needs) besides the WIT's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/examples"
mkdir -p "$out"
COMPONENTIZE_PY_VERSION=0.25.1
if ! componentize-py --version 2>/dev/null | grep -q "$COMPONENTIZE_PY_VERSION"; then
  python3 -m pip install --quiet "componentize-py==$COMPONENTIZE_PY_VERSION"
fi
cd "$here"
componentize-py -d "$root/wit" -w router componentize app -o "$out/policy-python.wasm"
echo "built $out/policy-python.wasm ($(wc -c < "$out/policy-python.wasm") bytes)"
