#!/usr/bin/env bash
# SMG's harness (gateway-anchor's bench.py) with engines that publish KV events: four
# `switchyard mock-engine`s stand in for its fake backends (OpenAI chat, about 64 tokens per
# answer, vLLM-format KV events on the backend's port + 1000), with SMG 1.13 round robin,
# Switchyard at its default (`engine_stream = "auto"`) and Switchyard with `always`, measured
# interleaved in one session (docs/benchmarks.md (k)). SMG reads no KV events; Switchyard
# subscribes to them. Needs the harness's smg venv, oha and bodies, as its run.sh installs them.
#
#   scripts/anchor-mock-engines.sh GATEWAY_ANCHOR SWITCHYARD [OUT]
# Env: CONC (1,32), REPEATS (3), DURATION (6), SMG (/tmp/gwa-smg-venv/bin/smg),
#      OHA (/tmp/gwa-tools/bin/oha), BODIES (/tmp/gateway-anchor-bodies).
set -euo pipefail
usage="usage: anchor-mock-engines.sh GATEWAY_ANCHOR SWITCHYARD [OUT]"
anchor=${1:?$usage}
switchyard=$(realpath "${2:?$usage}")
out=${3:-/tmp/gateway-anchor-results/$(date +%Y%m%d-%H%M%S)-mock-engines}
smg=${SMG:-/tmp/gwa-smg-venv/bin/smg}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The harness starts each backend as `BIN --port P --threads N --tokens T ...`.
cat > "$work/backend" <<EOF
#!/usr/bin/env bash
port=\$2
exec "$switchyard" mock-engine --port "\$port" --kv-events "tcp://127.0.0.1:\$((port + 1000))" \\
  --model fake-model --speedup 1000 --answer-median-tokens 64
EOF
# The gateway under test: PORT MODEL WORKER_URL..., ENGINE_STREAM from the environment.
cat > "$work/gateway" <<EOF
#!/usr/bin/env bash
port=\$1 model=\$2
shift 2
config=$work/switchyard-\$port.toml
printf '[server]\nhost = "127.0.0.1"\nport = %s\nengine_stream = "%s"\n[model]\nname = "%s"\n' \\
  "\$port" "\$ENGINE_STREAM" "\$model" > "\$config"
for url in "\$@"; do
  events="tcp://127.0.0.1:\$((\${url##*:} + 1000))"
  printf '[[workers]]\nurl = "%s"\nkind = "vllm"\nupstream = "chat"\nkv_events = "%s"\n' \\
    "\$url" "\$events" >> "\$config"
done
RUST_LOG=warn exec "$switchyard" serve --config "\$config"
EOF
chmod +x "$work/backend" "$work/gateway"

smg_cmd="$smg launch --host 127.0.0.1 --port {PORT} --worker-urls {WORKERS}"
smg_cmd+=" --prometheus-host 127.0.0.1 --prometheus-port {METRICS_PORT} --policy round_robin"
mkdir -p "$out"
python3 "$anchor/bench.py" --out "$out" --oha "${OHA:-/tmp/gwa-tools/bin/oha}" \
  --backend-bin "$work/backend" --bodies "${BODIES:-/tmp/gateway-anchor-bodies}" \
  --modes nonstream --conc "${CONC:-1,32}" --repeats "${REPEATS:-3}" \
  --duration "${DURATION:-6}" --warmup 2 \
  --gateway "smg-rr=$smg_cmd" \
  --gateway "switchyard=env ENGINE_STREAM=auto $work/gateway {PORT} {MODEL} {WORKERS}" \
  --gateway "switchyard-always=env ENGINE_STREAM=always $work/gateway {PORT} {MODEL} {WORKERS}" \
  2>&1 | tee "$out/bench.log"
python3 "$anchor/summarize.py" "$out"
