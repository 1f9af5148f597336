#!/usr/bin/env bash
# Prefix-hit ratio against gateway replicas in the simulator (docs/benchmarks.md (l)): one
# `switchyard simulate` sweep over 1, 2, 4, 8 replicas x session / random affinity x event-fed /
# approximate indexes on the Claude Code traces, then a markdown table from its report.
#
#   scripts/sim-replicas.sh BINARY [TRACES_DIR] [extra simulate flags...]
#
# BINARY: a built switchyard; TRACES_DIR: holds weka/ (default $SWITCHYARD_TRACES). Builds nothing.
set -euo pipefail
bin=${1:?usage: sim-replicas.sh BINARY [TRACES_DIR] [simulate flags...]}
traces=${2:-${SWITCHYARD_TRACES:?set SWITCHYARD_TRACES or pass TRACES_DIR}}
shift $(( $# >= 2 ? 2 : 1 ))
report=${REPORT:-replicas.json}
set -x
"$bin" simulate --trace "$traces/weka" --replicate 4 --workers 8 --speedup 10 --max-gap 60s \
    --policies kv-cost --concurrency 64 --host-tier-blocks 65536 \
    --replicas 1,2,4,8 --replica-affinity session,random --index events,approximate \
    --jobs "${JOBS:-2}" --report "$report" "$@" > /dev/null
set +x
python3 - "$report" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
print("| index | replicas | affinity | hit: device | hit: all | recomputed | TTFT p50 ms | TTFT p99 ms | req/s | output tok/s |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for r in runs:
    t = r.get("tiers") or {}
    device = t.get("device_hit_ratio", r["prefix_hit_ratio"])
    affinity = r["replica_affinity"] if r["replicas"] > 1 else "-"
    print(f"| {r['index']} | {r['replicas']} | {affinity} | {device:.3f} | {r['prefix_hit_ratio']:.3f} "
          f"| {r['recomputed_tokens'] / 1e6:.1f} Mtok | {r['ttft_ms']['p50']:,.0f} | {r['ttft_ms']['p99']:,.0f} "
          f"| {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:,.0f} |")
PY
