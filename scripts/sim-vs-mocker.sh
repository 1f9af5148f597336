#!/usr/bin/env bash
# The simulator beside dynamo-mocker (docs/benchmarks.md (n)): the Mooncake conversation trace,
# 8 workers, 64-token blocks, 16,384 blocks a worker, arrivals at 1x and 4x, KV routing and round
# robin; each configuration run by Dynamo's `sim_anchor` and by each given switchyard binary in
# turn, REPS rounds, so that all see the same background load. Prints the CPU seconds (user +
# system) of every run and each binary's median ratio to Dynamo's, in all and user time alone,
# leaves the reports in OUT and says whether each binary's are identical to the first one's
# (results must not change with speed). The binaries take turns at running first after Dynamo's
# (round r starts with the r-th): on the project's VM whatever runs right after dynamo-mocker
# pays up to twice its CPU in system time faulting memory in (docs/benchmarks.md (n)), so with
# REPS a multiple of the number of binaries each pays it as often as the others.
#
#   scripts/sim-vs-mocker.sh SIM_ANCHOR TRACE NAME=BINARY[,FLAG...] [NAME=BINARY[,FLAG...]...]
#
# FLAGs after a binary are added to its `simulate` runs, e.g.
# own=target/release/switchyard,--engine-hashes,own.
#
# SIM_ANCHOR: the dynamo-anchor harness's `sim_anchor` (built as its README says); TRACE:
# conversation_trace.jsonl. Builds nothing. REPS (3), SPEEDUPS ("1 4") and OUT
# (/tmp/sim-vs-mocker) override the defaults.
set -euo pipefail
anchor=${1:?usage: sim-vs-mocker.sh SIM_ANCHOR TRACE NAME=BINARY...}
trace=${2:?usage: sim-vs-mocker.sh SIM_ANCHOR TRACE NAME=BINARY...}
shift 2
[ $# -gt 0 ] || { echo "name at least one switchyard binary, NAME=BINARY" >&2; exit 2; }
out=${OUT:-/tmp/sim-vs-mocker}
mkdir -p "$out"
times="$out/times.tsv"
: > "$times"

# One run: its CPU seconds (user + system) appended to the table.
measure() {
  local label=$1 routing=$2 speedup=$3
  shift 3
  if ! /usr/bin/time -o "$out/time.txt" -f '%U %S' "$@" > /dev/null 2> "$out/last.err"; then
    cat "$out/last.err" >&2
    echo "$label failed" >&2
    exit 1
  fi
  awk -v l="$label" -v r="$routing" -v s="$speedup" \
    '{printf "%s\t%s\tx%s\t%.2f\t%.2f\n", l, r, s, $1 + $2, $1}' "$out/time.txt" | tee -a "$times"
}

named_binaries=("$@")
for rep in $(seq "${REPS:-3}"); do
  lead=$(( (rep - 1) % ${#named_binaries[@]} ))
  order=("${named_binaries[@]:lead}" "${named_binaries[@]:0:lead}")
  for speedup in ${SPEEDUPS:-1 4}; do
    for routing in kv rr; do
      if [ "$routing" = kv ]; then dynamo=kv-router ours=kv-cost; else dynamo=round-robin ours=round-robin; fi
      measure dynamo-mocker "$routing" "$speedup" "$anchor" "$trace" --num-workers 8 \
        --router-modes "$dynamo" --arrival-speedup-ratio "$speedup" --engine-type vllm \
        --block-size 64 --trace-block-size 512 --deterministic --json-out "$out/dynamo.jsonl"
      for named in "${order[@]}"; do
        IFS=, read -r -a binary <<< "${named#*=}"
        measure "${named%%=*}" "$routing" "$speedup" "${binary[0]}" simulate --trace "$trace" \
          --block-size 64 --workers 8 --policies "$ours" --speedup "$speedup" \
          --report "$out/${named%%=*}-$routing-x$speedup.json" "${binary[@]:1}"
      done
    done
  done
done

python3 - "$times" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    label, routing, speedup, cpu, user = line.split("\t")
    runs[(label, routing, speedup)].append((float(cpu), float(user)))
configs = sorted({(r, s) for _, r, s in runs})
labels = [l for l in dict.fromkeys(l for l, _, _ in runs) if l != "dynamo-mocker"]
for column, what in ((0, "CPU s (user + system)"), (1, "user CPU s")):
    median = lambda key: statistics.median(run[column] for run in runs[key])
    print(f"\n{what}, medians of the runs:\n")
    print("| routing | arrivals | dynamo-mocker | " + " | ".join(f"{l} | vs mocker" for l in labels) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(labels))
    for routing, speedup in configs:
        base = median(("dynamo-mocker", routing, speedup))
        cells = []
        for l in labels:
            ours = median((l, routing, speedup))
            cells += [f"{ours:.2f}", f"{base / ours:.2f}x faster"]
        print(f"| {routing} | {speedup} | {base:.2f} | " + " | ".join(cells) + " |")
PY

# Same results: every binary's reports against the first one's, byte for byte (a report holds no
# timings), so an optimisation that changed a result shows here.
reference=${named_binaries[0]%%=*}
echo
for named in "${named_binaries[@]:1}"; do
  for speedup in ${SPEEDUPS:-1 4}; do
    for routing in kv rr; do
      config="$routing-x$speedup"
      if cmp -s "$out/$reference-$config.json" "$out/${named%%=*}-$config.json"; then
        verdict=identical
      else
        verdict=DIFFERENT
      fi
      echo "reports, $config: ${named%%=*} $verdict to $reference"
    done
  done
done
