#!/usr/bin/env bash
# How the KV index scales with event threads on Dynamo's own event stream, ours beside Dynamo's
# concurrent tree (`tp-crtc`), interleaved run by run (docs/benchmarks.md (a3)). Made for a
# machine with more cores than this one (the device box has 16): the query thread on CPU 0, N
# event threads on CPUs 1..N, strict order (every query sees every earlier event, so every run
# must give the same answer checksum). Serial runs of both open each round.
#
#   ANCHOR_BIN=DIR   the dynamo-anchor harness's release binaries (indexer_bench)
#   SY_BENCH=FILE    our `dynamo_stream` bench (cargo bench -p switchyard-gateway
#                    --bench dynamo_stream --no-run prints its path)
#   WORKLOAD=FILE    the anchor's workload.bin.zst
#   THREADS ("1 2 4 8"), REPS (3), OUT (index-threads.jsonl)
#
# Prints one markdown table of medians: block ops per second (wall), lookup p50 / p99 µs, and
# the checksums seen.
set -euo pipefail
: "${ANCHOR_BIN:?ANCHOR_BIN=dir of indexer_bench}" "${SY_BENCH:?SY_BENCH=our dynamo_stream bench}"
: "${WORKLOAD:?WORKLOAD=workload.bin.zst}"
THREADS=${THREADS:-1 2 4 8}
REPS=${REPS:-3}
OUT=${OUT:-index-threads.jsonl}

dynamo() { # label, args...
  local label=$1
  shift
  "$ANCHOR_BIN/indexer_bench" "$WORKLOAD" --json-out "$OUT" --label "$label" "$@" >/dev/null
}

ours() { # label, env...
  env DYNWL_WORKLOAD="$WORKLOAD" DYNWL_JSON_OUT="$OUT" DYNWL_LABEL="$1" "${@:2}" \
    "$SY_BENCH" --bench >/dev/null
}

for _ in $(seq "$REPS"); do
  dynamo serial --backend radix-tree --mode serial
  ours serial DYNWL_MODE=serial
  for n in $THREADS; do
    cpus=$(seq -s, 1 "$n")
    dynamo "strict-${n}ev" --backend tp-crtc --mode pipelined --event-threads "$n" \
      --event-cpus "$cpus" --max-lag-events 0
    ours "strict-${n}ev" DYNWL_MODE=pipelined DYNWL_EVENT_THREADS="$n" DYNWL_EVENT_CPUS="$cpus" \
      DYNWL_TRANSLATE=event
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["label"], r["backend"]), []).append(r)
def order(key):
    label = key[0]
    return (0 if label == "serial" else int(label.split("-")[1][:-2]), key[1])
print("| config | backend | runs | M block ops/s | lookup p50 µs | lookup p99 µs | checksums |")
print("|---|---|---:|---:|---:|---:|---|")
for key in sorted(runs, key=order):
    rs = runs[key]
    med = lambda f: statistics.median(f(r) for r in rs)
    sums = sorted({r["checksum"]["score_sum"] for r in rs})
    print(f"| {key[0]} | {key[1]} | {len(rs)} | {med(lambda r: r['block_ops_per_sec']) / 1e6:.2f} "
          f"| {med(lambda r: r['lookup_us']['p50']):.2f} | {med(lambda r: r['lookup_us']['p99']):.2f} "
          f"| {', '.join(map(str, sums))} |")
EOF
