#!/usr/bin/env bash
# Builds the C least-load policy into target/examples/policy-c.wasm:
#   wit-bindgen c (bindings from wit/) -> zig cc for wasm32-wasi (a reactor core module with no
#   WASI imports) -> wasm-tools component new (embeds the world, makes the component).
# Installs what is missing from the registries: zig (PyPI `ziglang`), wit-bindgen-cli and
# wasm-tools (crates.io).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/examples"
gen="$out/policy-c-gen"
mkdir -p "$out" "$gen"

WIT_BINDGEN_VERSION=0.61.1
WASM_TOOLS_VERSION=1.263.0
ZIGLANG_VERSION=0.17.1

if ! wit-bindgen --version 2>/dev/null | grep -q " $WIT_BINDGEN_VERSION"; then
  cargo install --locked wit-bindgen-cli --version "$WIT_BINDGEN_VERSION"
fi
if ! command -v wasm-tools >/dev/null; then
  cargo install --locked wasm-tools --version "$WASM_TOOLS_VERSION"
fi
if ! python3 -m ziglang version >/dev/null 2>&1; then
  python3 -m pip install --quiet "ziglang==$ZIGLANG_VERSION"
fi

wit-bindgen c "$root/wit" --world router --out-dir "$gen"
# -mexec-model=reactor: a library module (no main); -O2 and no libc I/O keep it free of WASI
# imports, so the component imports nothing but the WIT's own interfaces.
# -z stack-size: zig's default wasm stack is 16 MiB, which alone would fill the host's default
# 16 MiB memory cap; the policy needs a few KiB (malloc grows the heap for the columns).
python3 -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -s -Wall -Werror \
  -Wl,-z,stack-size=65536 \
  -I "$gen" -o "$gen/least_load.core.wasm" \
  "$here/least_load.c" "$gen/router.c" "$gen/router_component_type.o"
wasm-tools component new "$gen/least_load.core.wasm" -o "$out/policy-c.wasm"
wasm-tools validate --features component-model "$out/policy-c.wasm"
echo "built $out/policy-c.wasm ($(wc -c < "$out/policy-c.wasm") bytes)"
