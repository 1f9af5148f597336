#!/usr/bin/env bash
# KV hints in the simulator (docs/benchmarks.md (m)): ThunderAgent admission alone vs with each
# KV-hint strategy vs all of them, on the Claude Code traces at concurrencies that overflow the
# device KV, with a host tier; one `switchyard simulate` sweep, then a markdown table from its
# report.
#
#   scripts/sim-hints.sh BINARY [TRACES_DIR] [extra simulate flags...]
#
# BINARY: a built switchyard (release); TRACES_DIR: holds weka/ (default $SWITCHYARD_TRACES).
# Builds nothing. ADMISSION (e.g. thunder-agent:migrate_after=60s), CONCURRENCY, HINTS, JOBS,
# SPEEDUP (how much faster than recorded the sessions think and wait on tools; 10 by default),
# REPORT and PLOT override the defaults below.
set -euo pipefail
bin=${1:?usage: sim-hints.sh BINARY [TRACES_DIR] [simulate flags...]}
traces=${2:-${SWITCHYARD_TRACES:?set SWITCHYARD_TRACES or pass TRACES_DIR}}
shift $(( $# >= 2 ? 2 : 1 ))
report=${REPORT:-hints.json}
plot=${PLOT:-hints.png}
# `no-hints` runs the hint path with a policy that never hints: ThunderAgent alone, to the bit.
all=demote-on-tool-call+subagent-reclaim+share-to-subagent
hints=${HINTS:-no-hints,demote-on-tool-call,subagent-reclaim,share-to-subagent,$all}
set -x
"$bin" simulate --trace "$traces/weka" --replicate 4 --workers 4 --speedup "${SPEEDUP:-10}" --max-gap 60s \
    --policies kv-cost --admission "${ADMISSION:-thunder-agent}" --concurrency "${CONCURRENCY:-32,64}" \
    --host-tier-blocks 65536 --kv-hints "$hints" \
    --jobs "${JOBS:-2}" --report "$report" --plot "$plot" "$@" > /dev/null
set +x
python3 - "$report" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
alone = {r["concurrency"]: r for r in runs if r["kv_hints"]["policy"] == "no-hints"}

def done(h, action):
    by = h["actions"].get(action, {})
    total = sum(c["actions"] for c in by.values())
    ok = sum(by.get(o, {}).get("actions", 0) for o in ("accepted", "clipped"))
    return f"{ok:,}/{total:,}" if total else "-"

print("| sessions | KV hints | req/s | vs alone | agent steps/min | hit: device / host (all) "
      "| recomputed | TTFT p50 ms | TTFT p99 ms | demote | prefetch | evict | retain "
      "| demoted / prefetched blocks |")
print("|---:|---|---:|---:|---:|---|---:|---:|---:|---|---|---|---|---|")
for r in runs:
    t, h = r["tiers"], r["kv_hints"]
    base = alone.get(r["concurrency"])
    vs = f"{r['requests_per_s'] / base['requests_per_s'] - 1:+.1%}" if base and base is not r else ""
    print(f"| {r['concurrency']} | {h['policy']} | {r['requests_per_s']:.2f} | {vs} "
          f"| {r['agent_steps_per_min']:.2f} "
          f"| {t['device_hit_ratio']:.3f} / {t['host_hit_ratio']:.3f} ({r['prefix_hit_ratio']:.3f}) "
          f"| {r['recomputed_tokens'] / 1e6:.1f} Mtok | {r['ttft_ms']['p50']:,.0f} | {r['ttft_ms']['p99']:,.0f} "
          f"| {done(h, 'demote')} | {done(h, 'prefetch')} | {done(h, 'evict')} | {done(h, 'retain')} "
          f"| {t['demoted_blocks']:,} / {t['prefetched_blocks']:,} |")
PY
