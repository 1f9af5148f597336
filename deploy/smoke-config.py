#!/usr/bin/env python3
"""Starts the gateway on a configuration and checks the endpoints the Kubernetes probes use.

    smoke-config.py BINARY CONFIG EXPECTED_HEALTH

CONFIG is a TOML file, or a ConfigMap manifest (`*.yaml`) whose `switchyard.toml` key is used.
The gateway listens on 127.0.0.1 with an ephemeral port (overriding [server]), so any number of
checks can run beside anything else. Checked: the file is accepted (an unknown key or a bad value
stops the gateway at startup), `GET /v1/models` (the liveness probe) answers 200, and
`GET /health` (the readiness probe) answers EXPECTED_HEALTH: 503 for deploy/k8s (its workers'
DNS names do not resolve here, so no engine is healthy), 200 for the image's embedded default.

A ConfigMap's `model.path` names a directory in the cluster (the served model's tokenizer); it is
replaced by the embedded model's tokenizer directory from this repository, which has the same
two files.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "host/tokenizer/assets/smollm2-135m-instruct")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    binary, config, expected_health = sys.argv[1], sys.argv[2], int(sys.argv[3])
    name = config
    with tempfile.TemporaryDirectory() as tmp:
        if config.endswith((".yaml", ".yml")):
            with open(config) as f:
                text = yaml.safe_load(f)["data"]["switchyard.toml"]
            text, n = re.subn(r'(?m)^path = ".*"', f'path = "{TOKENIZER}"', text)
            print(f"smoke: {config}: switchyard.toml, model.path -> {TOKENIZER} ({n} replaced)")
            config = os.path.join(tmp, "switchyard.toml")
            with open(config, "w") as f:
                f.write(text)
        log = open(os.path.join(tmp, "gateway.log"), "w+")
        proc = subprocess.Popen(
            [binary, "serve", "--config", config, "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            # The first line names the address: "switchyard: gateway on http://ADDR" (or
            # "... behind http://ADDR" for the embedded default).
            line = proc.stdout.readline()
            match = re.search(r"http://(\S+)", line)
            if not match:
                proc.wait(timeout=10)
                log.seek(0)
                sys.exit(f"smoke: FAIL {name}: the gateway did not start "
                         f"(exit {proc.returncode}):\n{log.read()[-3000:]}")
            base = f"http://{match.group(1)}"
            status, _ = get(f"{base}/v1/models")
            if status != 200:
                sys.exit(f"smoke: FAIL {name}: GET /v1/models answered {status}, not 200")
            # Health follows the engines' health checks (server.health_interval): give the first
            # round of checks time to land, then expect the steady answer.
            deadline = time.monotonic() + 15
            while True:
                status, body = get(f"{base}/health")
                if status == expected_health or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if status != expected_health:
                sys.exit(f"smoke: FAIL {name}: GET /health answered {status} "
                         f"({body.decode(errors='replace')}), expected {expected_health}")
            print(f"smoke: ok   {name}: accepted; /v1/models 200, "
                  f"/health {status} {json.loads(body)}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
