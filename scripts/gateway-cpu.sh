#!/usr/bin/env bash
# The gateway's own CPU per request and its memory, in front of four of the gateway-anchor
# harness's fake backends: a quick probe between two builds, or of one build under two
# environments, before an interleaved run of the harness itself (docs/benchmarks.md (k)).
# Needs the harness's `fakebackend` and `oha`, built as its README says. FAKEBACKEND `mock`
# runs four `switchyard mock-engine`s instead (answering in `chat` mode, about 64 tokens per
# answer, publishing KV events, as engines do where the router hears of prefills from events).
# ENGINE_STREAM sets the gateway's `[server] engine_stream`. API (chat, the default) = messages
# or responses sends BODY, a chat completions body, in that API's shape instead (the system
# message as `system` / `instructions`), to /v1/messages or /v1/responses: the engines still
# answer in chat completions, so the gateway translates both ways. With AS_IS=1, BODY is already
# in that API's shape and goes as it is (scripts/codex-sized-body.py writes one). Extra
# VAR=VALUE arguments go into the gateway's environment (e.g. MIMALLOC_ARENA_EAGER_COMMIT=0).
#
#   [ENGINE_STREAM=auto|always|as-client] [API=chat|messages|responses] [AS_IS=1] \
#     scripts/gateway-cpu.sh FAKEBACKEND|mock OHA BODY.json SWITCHYARD [SECONDS] [CLIENTS] [VAR=VALUE...]
set -euo pipefail
usage="usage: gateway-cpu.sh FAKEBACKEND|mock OHA BODY.json SWITCHYARD [SECONDS] [CLIENTS] [VAR=VALUE...]"
backend=${1:?$usage}
oha=${2:?$usage}
body=${3:?$usage}
switchyard=${4:?$usage}
seconds=${5:-5}
clients=${6:-32}
shift $(($# < 6 ? $# : 6))
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

port=19040
config=$work/switchyard.toml
printf '[server]\nhost = "127.0.0.1"\nport = %s\n' "$port" > "$config"
if [[ -n ${ENGINE_STREAM:-} ]]; then
  printf 'engine_stream = "%s"\n' "$ENGINE_STREAM" >> "$config"
fi
# A long-context model, as agents use: Codex's first request alone is ~9K tokens.
printf '[model]\nname = "fake-model"\ncontext_length = 131072\n' >> "$config"
for i in 1 2 3 4; do
  if [[ $backend == mock ]]; then
    events="tcp://127.0.0.1:$((port + 10 + i))"
    "$switchyard" mock-engine --port $((port + i)) --kv-events "$events" --model fake-model \
      --speedup 1000 --answer-median-tokens 64 > /dev/null 2>&1 &
    printf '[[workers]]\nurl = "http://127.0.0.1:%s"\nkind = "mock"\nupstream = "chat"\nkv_events = "%s"\n' \
      $((port + i)) "$events" >> "$config"
  else
    "$backend" --port $((port + i)) --threads 1 --model fake-model --tokens 64 > /dev/null 2>&1 &
    printf '[[workers]]\nurl = "http://127.0.0.1:%s"\nkind = "openai"\nblock_size = 16\n' $((port + i)) >> "$config"
  fi
  pids+=($!)
done
env RUST_LOG=warn "$@" "$switchyard" serve --config "$config" > "$work/gateway.log" 2>&1 &
gateway=$!
pids+=("$gateway")

case ${API:-chat} in
  chat) path=/v1/chat/completions ;;
  messages) path=/v1/messages ;;
  responses) path=/v1/responses ;;
  *) echo "API is chat, messages or responses" >&2; exit 2 ;;
esac
if [[ ${API:-chat} != chat && ${AS_IS:-0} != 1 ]]; then
  python3 - "$body" "$API" > "$work/body.json" <<'PY'
import json, sys
chat = json.load(open(sys.argv[1]))
system = "\n".join(m["content"] for m in chat["messages"] if m["role"] == "system")
turns = [{"role": m["role"], "content": m["content"]} for m in chat["messages"] if m["role"] != "system"]
common = {"model": chat["model"], "stream": chat.get("stream", False)}
if sys.argv[2] == "messages":
    body = {**common, "system": system, "messages": turns, "max_tokens": chat.get("max_tokens", 256)}
else:
    body = {**common, "instructions": system, "input": turns,
            "max_output_tokens": chat.get("max_tokens", 256), "store": False}
print(json.dumps(body))
PY
  body=$work/body.json
fi
url="http://127.0.0.1:$port$path"
post=(-m POST -H 'content-type: application/json' -D "$body")
for _ in $(seq 100); do
  curl -sf -o /dev/null -X POST -H 'content-type: application/json' --data "@$body" "$url" && break
  sleep 0.1
done
rss() { awk "/^$1:/ {print int(\$2 / 1024)}" "/proc/$gateway/status"; }
idle=$(rss VmRSS)
"$oha" -z 2s -c "$clients" --no-tui "${post[@]}" "$url" > /dev/null   # warm-up
ticks() { awk '{print $14 + $15}' "/proc/$gateway/stat"; }
before=$(ticks)
"$oha" -z "${seconds}s" -c "$clients" --no-tui --output-format json "${post[@]}" "$url" > "$work/oha.json"
after=$(ticks)
python3 - "$work/oha.json" "$before" "$after" "$idle" "$(rss VmRSS)" "$(rss VmHWM)" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
answered = sum(report["statusCodeDistribution"].values())
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf("SC_CLK_TCK")
print(f"requests {answered} ({report['statusCodeDistribution']}), "
      f"{report['summary']['requestsPerSec']:.0f} req/s, "
      f"gateway CPU {cpu / max(answered, 1) * 1e6:.0f} us/request, "
      f"RSS idle {sys.argv[4]} MB, after {sys.argv[5]} MB, peak {sys.argv[6]} MB")
PY
