#!/usr/bin/env bash
# CPU per request of one of the gateway-anchor harness's fake backends, answering streamed (as
# the gateway asks every engine) and whole (as SMG asks for a non-streaming client): what each
# gateway's choice costs the engines that share the machine in that harness (docs/benchmarks.md
# (k)). Needs the harness's `fakebackend` and `oha`, built as its README says.
#
#   scripts/fake-backend-cost.sh FAKEBACKEND OHA BODY.json [SECONDS] [CLIENTS]
set -euo pipefail
backend=${1:?usage: fake-backend-cost.sh FAKEBACKEND OHA BODY.json [SECONDS] [CLIENTS]}
oha=${2:?usage: fake-backend-cost.sh FAKEBACKEND OHA BODY.json [SECONDS] [CLIENTS]}
body=${3:?usage: fake-backend-cost.sh FAKEBACKEND OHA BODY.json [SECONDS] [CLIENTS]}
seconds=${4:-5}
clients=${5:-8}
port=19021
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

"$backend" --port "$port" --threads 1 --model fake-model --tokens 64 > /dev/null 2>&1 &
pid=$!
sleep 0.5
url="http://127.0.0.1:$port/v1/chat/completions"
for mode in stream whole; do
  python3 - "$body" "$mode" > "$work/body.json" <<'PY'
import json, sys
body = json.load(open(sys.argv[1]))
body["stream"] = sys.argv[2] == "stream"
if body["stream"]:
    body["stream_options"] = {"include_usage": True}
print(json.dumps(body))
PY
  load() { "$oha" -z "$1" -c "$clients" -m POST -H 'content-type: application/json' \
    -D "$work/body.json" --no-tui --output-format json "$url"; }
  load 1s > /dev/null
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  load "${seconds}s" > "$work/oha.json"
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  python3 - "$mode" "$u0" "$s0" "$u1" "$s1" "$work/oha.json" <<'PY'
import json, os, sys
mode, (u0, s0, u1, s1), report = sys.argv[1], map(int, sys.argv[2:6]), sys.argv[6]
summary = json.load(open(report))["summary"]
requests = summary["requestsPerSec"] * summary["total"]
cpu = (u1 - u0 + s1 - s0) / os.sysconf("SC_CLK_TCK")
print(f"{mode}: {summary['requestsPerSec']:,.0f} req/s, backend CPU {cpu / requests * 1e6:.0f} us "
      f"per request, success {summary['successRate']}")
PY
done
