#!/usr/bin/env bash
# The KV block manager's GPU check (docs/kvbm.md): the CUDA tests, the mock engine's tier tests
# with G1 in GPU memory (demote, prefetch and onboard copies checked byte for byte), and the
# H2D/D2H bandwidth bench, printed as markdown to paste, dated, into docs/benchmarks.md section
# (i). Needs the NVIDIA driver but no CUDA toolkit (cudarc loads libcuda at run time). Without a
# GPU it still runs: the tests check the fallbacks and the bench says why it measured nothing.
# It also runs the gateway's KV-hint tests against mock engines built with `cuda` (the gateway
# and the engines as processes: the demote and the prefetch are PCIe copies).
#
#   scripts/gpu-check.sh              build with cargo, then run
#   scripts/gpu-check.sh --build DIR  only build (release) the test binaries and the bench into a
#                                     new DIR (~31 MB)
#   scripts/gpu-check.sh --run DIR    run what --build put in DIR (a GPU machine without cargo,
#                                     in a checkout of the repository at any path)
set -euo pipefail
cd "$(dirname "$0")/.."

# The executables cargo built for "$@", one path a line.
executables() {
  cargo "$@" --message-format=json | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'
}

kvbm=(-p switchyard-kvbm --features cuda)
engine=(-p switchyard-mock-engine --features cuda --lib)
gateway=(-p switchyard --features cuda)

# A new DIR (so that no stale binary runs), stripped, and the gateway's two gzipped, to travel.
build() {
  mkdir "$1"
  executables build "${kvbm[@]}" --release --example gpu_bandwidth | xargs -r cp -t "$1"
  executables test "${kvbm[@]}" --release --no-run | xargs -r cp -t "$1"
  mv "$1/gpu_bandwidth" "$1/bench"
  cp "$(executables test "${engine[@]}" --release --no-run)" "$1/engine-tiers"
  executables build "${gateway[@]}" --release --bin switchyard | xargs -r cp -t "$1"
  # (cargo names the gateway binary the suite runs too: take the suite's own.)
  cp "$(executables test "${gateway[@]}" --release --test integration --no-run |
    grep '/integration-')" "$1/integration"
  if command -v strip >/dev/null; then strip "$1"/*; fi
  gzip -9 "$1/switchyard" "$1/integration"
}

# The hint tests from the integration binary of --build, on the gateway binary beside it.
hints_from() {
  local tmp
  tmp=$(mktemp -d)
  gunzip -c "$1/switchyard.gz" > "$tmp/switchyard"
  gunzip -c "$1/integration.gz" > "$tmp/integration"
  chmod +x "$tmp/switchyard" "$tmp/integration"
  echo "\$ integration hints::"
  SWITCHYARD_TEST_BIN="$tmp/switchyard" "$tmp/integration" hints:: || status=$?
  rm -rf "$tmp"
}

header() {
  echo "### GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty 2>/dev/null || echo '?')"
  echo
  if command -v nvidia-smi >/dev/null; then
    # On a GPU machine a fallback is a failure: the tests and the bench refuse it.
    export KVBM_REQUIRE_GPU=1
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader | head -n1)"
    echo '```'
    nvidia-smi
  else
    echo "GPU: none (no nvidia-smi)"
    echo '```'
  fi
}

status=0
case "${1:-}" in
  --build)
    build "${2:?--build DIR}"
    exit 0
    ;;
  --run)
    dir=$(cd "${2:?--run DIR}" && pwd)
    header
    for test in "$dir"/*; do
      case $test in
        */bench | *.gz) continue ;;
        */engine-tiers) filter=(tiers::) ;;
        *) filter=() ;;
      esac
      echo "\$ ${test##*/} ${filter[*]}"
      (cd host/kvbm && "$test" "${filter[@]}") || status=$?
    done
    hints_from "$dir"
    bench=("$dir/bench")
    ;;
  "")
    header
    cargo test "${kvbm[@]}" 2>&1 || status=$?
    cargo test "${engine[@]}" tiers:: 2>&1 || status=$?
    cargo test -p switchyard --features cuda --test integration hints:: 2>&1 || status=$?
    cargo build -q --release "${kvbm[@]}" --example gpu_bandwidth 2>&1
    bench=(cargo run -q --release "${kvbm[@]}" --example gpu_bandwidth)
    ;;
  *)
    echo "usage: $0 [--build DIR | --run DIR]" >&2
    exit 2
    ;;
esac
echo '```'
echo
"${bench[@]}" || status=$?
exit "$status"
