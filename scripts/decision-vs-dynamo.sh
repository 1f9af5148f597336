#!/usr/bin/env bash
# One routing decision on the router bench's fixture (docs/benchmarks.md (b): a 32K-token prompt,
# 16 workers of 16,384 blocks), ours beside NVIDIA Dynamo 1.6.1's own, measured on this machine
# and interleaved run by run so that both see the same background load. Ours is the router
# bench's tail pass alone (`SWITCHYARD_ROUTER_BENCH=tail`: `Router::route` then `finish`, policy
# KvCost, from precomputed hashes); Dynamo's is scripts/dynamo-decision, which builds the same
# fixture in Dynamo's index and times `SelectionCore::select_and_reserve` then `free_reservation`
# (from precomputed hashes and from tokens) and its index lookup alone. Each side times 5 rounds
# of 2,000 calls one by one and prints one JSON line per pass (medians of the rounds' p50, p99
# and mean, and the worker chosen). The two take turns at running first; both are pinned to one
# CPU with taskset where it works.
#
#   scripts/decision-vs-dynamo.sh
#
# Builds the Dynamo harness (cargo build --release, target DYNAMO_TARGET_DIR,
# /tmp/dynamo-decision-target) and our bench (cargo bench --no-run), nothing else. REPS (3),
# OUT (/tmp/decision-vs-dynamo), CPU (0) and DYNAMO_ARGS (extra flags for the harness, e.g.
# "--indexer-threads 1") override the defaults. Leaves every run's output and results.jsonl in
# OUT and prints a markdown table of the medians over runs, with Dynamo / ours for p50 and p99.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/decision-vs-dynamo}
target=${DYNAMO_TARGET_DIR:-/tmp/dynamo-decision-target}
read -r -a dynamo_args <<< "${DYNAMO_ARGS:-}"
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"

(cd "$root/scripts/dynamo-decision" && CARGO_TARGET_DIR="$target" cargo build --release --locked)
dynamo="$target/release/dynamo-decision"
ours=$(cd "$root" && cargo bench -p switchyard-core --bench router --no-run --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "router" \
            and message.get("executable"):
        print(message["executable"])')
[ -x "$ours" ] || { echo "no router bench executable from cargo bench --no-run" >&2; exit 1; }

pin=()
if command -v taskset > /dev/null && taskset -c "${CPU:-0}" true 2> /dev/null; then
  pin=(taskset -c "${CPU:-0}")
else
  echo "taskset unavailable: runs are not pinned" >&2
fi

# One run: its output kept in OUT, its JSON lines tagged with the run and appended to results.
run() {
  local side=$1 rep=$2
  shift 2
  local log="$out/$side-$rep.log"
  if ! "${pin[@]}" "$@" > "$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "$side failed (run $rep)" >&2
    exit 1
  fi
  grep '^{' "$log" | sed "s/^{/{\"run\":$rep,/" >> "$results"
  grep '^{' "$log" | sed "s/^/$side run $rep: /"
}

ours_run() { run switchyard "$1" env SWITCHYARD_ROUTER_BENCH=tail "$ours" --bench; }
dynamo_run() { run dynamo "$1" "$dynamo" "${dynamo_args[@]}"; }

for rep in $(seq "${REPS:-3}"); do
  if [ $((rep % 2)) -eq 1 ]; then
    ours_run "$rep"
    dynamo_run "$rep"
  else
    dynamo_run "$rep"
    ours_run "$rep"
  fi
done

python3 - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    row = json.loads(line)
    runs[(row["side"], row["bench"])].append(row)
median = lambda rows, key: statistics.median(row[key] for row in rows)
ours = runs[("switchyard", "router/route/32k-16w")]
base = {key: median(ours, key) for key in ("p50_us", "p99_us")}
print(f"\nmedians of {len(ours)} runs (each the median of its rounds), µs:\n")
print("| side | measured | p50 | p99 | mean | winner | Dynamo / ours p50 | Dynamo / ours p99 |")
print("|---|---|---:|---:|---:|---|---:|---:|")
for (side, bench), rows in runs.items():
    p50, p99, mean = (median(rows, key) for key in ("p50_us", "p99_us", "mean_us"))
    winners = ",".join(sorted({str(row["winner"]) for row in rows}))
    if side == "dynamo" and bench.startswith("decision/"):
        ratios = f"{p50 / base['p50_us']:.2f} | {p99 / base['p99_us']:.2f}"
    else:
        ratios = "- | -"
    print(f"| {side} | {bench} | {p50:.1f} | {p99:.1f} | {mean:.1f} | {winners} | {ratios} |")
PY
