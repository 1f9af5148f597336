#!/usr/bin/env python3
"""Prefix-hit ratio with one or two live gateway replicas, sticky or not (docs/benchmarks.md (l)).

Starts mock engines (`switchyard mock-engine`: a real prefix cache, real vLLM-format KV events)
and one or two `switchyard serve` gateways over them, all on 127.0.0.1, then sends multi-turn
agent sessions: every turn resends the whole conversation (a shared system prompt, the session's
own context, every earlier turn and answer) with an `x-session-id` header. With two replicas a
session's turns go either always to one replica (`sticky`: a stable hash of the session id, what
Envoy's header hash does) or to alternating replicas (`alternate`: turn k to replica
(session + k) mod 2). Each scenario runs twice: gateways fed by the engines' KV events, and
gateways without `kv_events` (approximate mode: each predicts from its own decisions).

The hit ratio is the engines' own count: the responses' `usage.prompt_tokens_details.
cached_tokens` over `usage.prompt_tokens`, cross-checked against the engines' `/metrics`
(`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`). Every scenario starts with fresh
processes (cold caches). Builds nothing; Python 3 standard library only.

    scripts/live-replicas.py target/release/switchyard [--sessions 16] [--turns 6] ...
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib

SHARED = " ".join(
    f"Rule {i}: read the file before editing it, keep changes small and run the tests."
    for i in range(40)
)


def context(session):
    """The session's own material (a file it works on), unique from its first words."""
    return f"Session {session} works on module_{session}.py. " + " ".join(
        f"def f_{session}_{i}(x): return x * {i} + {session}  # helper {i} of module {session}"
        for i in range(60)
    )


class Proc:
    """A switchyard process whose stdout lines are read on a thread."""

    def __init__(self, binary, args):
        env = dict(os.environ, RUST_LOG="warn", NO_COLOR="1")
        self.p = subprocess.Popen(
            [binary, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line)

    def wait_for(self, marker, timeout=60):
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise RuntimeError(f"process never printed {marker!r}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if marker in line:
                return line.split(marker, 1)[1].split()[0]

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def post(url, body, headers):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
        worker = response.headers.get("x-switchyard-worker", "?")
    return answer, worker, time.perf_counter() - started


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        rest = line[len(name):] if line.startswith(name) else None
        if rest is not None and rest[:1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scenario(args, replicas, placement, events):
    """One run on fresh processes: the client's and the engines' counts."""
    procs = []
    files = []
    try:
        engines = []
        for _ in range(args.engines):
            p = Proc(
                args.binary,
                [
                    "mock-engine", "--port", "0",
                    "--kv-events", "tcp://127.0.0.1:0", "--replay", "tcp://127.0.0.1:0",
                    "--speedup", str(args.speedup), "--num-blocks", str(args.num_blocks),
                ],
            )
            procs.append(p)
            engines.append(
                (p.wait_for("listening on "), p.wait_for("kv events on "), p.wait_for("replay on "))
            )
        toml = '[router]\npolicy = "kv-cost"\n'
        for url, kv, replay in engines:
            toml += f'[[workers]]\nurl = "{url}"\nkind = "mock"\n'
            if events:
                toml += f'kv_events = "{kv}"\nreplay = "{replay}"\n'
        gateways = []
        for _ in range(replicas):
            f = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
            f.write(toml)
            f.close()
            files.append(f.name)
            p = Proc(args.binary, ["serve", "--config", f.name, "--port", "0"])
            procs.append(p)
            gateways.append(p.wait_for("gateway on "))
        time.sleep(1.0)  # event subscriptions connect

        totals = {"prompt": 0, "cached": 0, "later_prompt": 0, "later_cached": 0,
                  "requests": 0, "errors": 0, "latency": 0.0, "moves": 0}
        lock = threading.Lock()

        def run_session(s):
            sid = f"live-{args.tag}-{s}"
            messages = [{"role": "system", "content": SHARED},
                        {"role": "user", "content": context(s)}]
            last_worker = None
            for turn in range(args.turns):
                if turn > 0:
                    messages.append({"role": "user", "content":
                                     f"Tool result {turn} for session {s}: tests passed {turn}."})
                if replicas == 1:
                    r = 0
                elif placement == "sticky":
                    r = zlib.crc32(sid.encode()) % replicas
                else:
                    r = (s + turn) % replicas
                body = {"model": "smollm2-135m-instruct", "max_tokens": args.max_tokens, "messages": messages}
                try:
                    answer, worker, latency = post(
                        f"{gateways[r]}/v1/chat/completions", body, {"x-session-id": sid})
                except Exception as e:  # noqa: BLE001 - counted, reported
                    print(f"  {sid} turn {turn}: {e}", file=sys.stderr)
                    with lock:
                        totals["errors"] += 1
                    return
                usage = answer.get("usage", {})
                prompt = usage.get("prompt_tokens", 0)
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                text = answer["choices"][0]["message"].get("content") or ""
                messages.append({"role": "assistant", "content": text})
                with lock:
                    totals["prompt"] += prompt
                    totals["cached"] += cached
                    if turn > 0:
                        totals["later_prompt"] += prompt
                        totals["later_cached"] += cached
                        totals["moves"] += worker != last_worker
                    totals["requests"] += 1
                    totals["latency"] += latency
                last_worker = worker
                time.sleep(args.think_ms / 1000.0)

        next_session = iter(range(args.sessions))
        take = threading.Lock()

        def client():
            while True:
                with take:
                    s = next(next_session, None)
                if s is None:
                    return
                run_session(s)

        threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        hits = queries = 0.0
        for url, _, _ in engines:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
                text = response.read().decode()
            hits += metric_sum(text, "vllm:prefix_cache_hits_total")
            queries += metric_sum(text, "vllm:prefix_cache_queries_total")
        totals["engine_hits"], totals["engine_queries"], totals["wall"] = hits, queries, wall
        return totals
    finally:
        for p in reversed(procs):
            p.stop()
        for name in files:
            os.unlink(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", help="the switchyard binary (mock-engine and serve)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=8, help="sessions in flight")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--think-ms", type=float, default=20)
    ap.add_argument("--speedup", type=float, default=20, help="mock engines' time speed-up")
    ap.add_argument("--num-blocks", type=int, default=16384)
    ap.add_argument("--tag", default=str(int(time.time())), help="session id prefix")
    args = ap.parse_args()
    rows = []
    for events in (True, False):
        for replicas, placement in ((1, "-"), (2, "sticky"), (2, "alternate")):
            t = scenario(args, replicas, placement, events)
            rows.append((events, replicas, placement, t))
            print(f"done: {'events' if events else 'approximate'} x{replicas} {placement}",
                  file=sys.stderr)
    print(f"{args.engines} mock engines, {args.sessions} sessions x {args.turns} turns, "
          f"{args.concurrency} in flight, max_tokens {args.max_tokens}, speedup {args.speedup}")
    print("| index | replicas | placement | requests | errors | hit ratio (all) | hit ratio "
          "(turns 2+) | engines' hit ratio | worker changes (turns 2+) | mean latency ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for events, replicas, placement, t in rows:
        ratio = lambda c, p: c / p if p else 0.0  # noqa: E731
        print(f"| {'events' if events else 'approximate'} | {replicas} | {placement} "
              f"| {t['requests']} | {t['errors']} | {ratio(t['cached'], t['prompt']):.3f} "
              f"| {ratio(t['later_cached'], t['later_prompt']):.3f} "
              f"| {ratio(t['engine_hits'], t['engine_queries']):.3f} | {t['moves']} "
              f"| {1000 * t['latency'] / max(t['requests'], 1):.0f} |")


if __name__ == "__main__":
    main()
