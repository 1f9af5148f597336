#!/usr/bin/env python3
"""Load and soak: thousands of concurrent streams through the gateway (docs/reliability.md, "Load
and soak").

Starts mock engines (`switchyard mock-engine`) and one `switchyard serve` over them, all on
127.0.0.1, with `[server] max_concurrent_requests = --limit`. Clients (asyncio, raw HTTP/1.1, one
connection per request) each loop: a streaming chat request read to its end, or on a 503 a check
of its `Retry-After` and a short wait. The number of clients steps up through `--steps` (each for
`--step-seconds`), the last steps beyond the limit so the gateway sheds; then `--soak-seconds` at
`--soak` clients; then everyone stops and the gateway idles for `--idle-seconds`.

Every half second it samples the gateway's RSS, open file descriptors and threads (from /proc)
and its `/metrics` (requests in flight per worker). Writes `--out` (JSON: samples and a summary
per step) and, with matplotlib installed, `--plot` (RSS, streams open and shed per second).
Builds nothing; Python 3 standard library, matplotlib for the plot.

    scripts/soak.py target/release/switchyard [--limit 3000] [--steps 250,500,1000,2000,4000] ...
"""

import argparse
import asyncio
import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


class Proc:
    """A switchyard process whose stdout lines are read on a thread."""

    def __init__(self, binary, args):
        env = dict(os.environ, RUST_LOG="warn", NO_COLOR="1")
        self.p = subprocess.Popen(
            [binary, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line)

    def wait_for(self, marker, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                break
            if marker in line:
                return line.split(marker, 1)[1].split()[0]
        raise RuntimeError(f"process never printed {marker!r}")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def proc_sample(pid):
    """RSS in MiB, open fds, threads of a process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Counts:
    def __init__(self):
        self.open = 0
        self.ok = 0
        self.shed = 0
        self.shed_without_retry_after = 0
        self.failed = 0
        self.cut = 0
        self.errors = {}


async def one_request(host, port, body, counts):
    """One streaming request; returns the seconds to wait before the next (Retry-After)."""
    reader = writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            ).encode()
            + body
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 503:
            counts.shed += 1
            if b"retry-after:" not in head.lower():
                counts.shed_without_retry_after += 1
            return 0.2
        if status != 200:
            counts.failed += 1
            counts.errors[status] = counts.errors.get(status, 0) + 1
            return 0.2
        counts.open += 1
        try:
            rest = await reader.read()  # to EOF: `connection: close`
        finally:
            counts.open -= 1
        if b"[DONE]" in rest and b'"finish_reason":"' in rest:
            counts.ok += 1
        else:
            counts.cut += 1
        return 0.0
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        counts.failed += 1
        key = type(e).__name__
        counts.errors[key] = counts.errors.get(key, 0) + 1
        return 0.5
    finally:
        if writer is not None:
            writer.close()


async def client(host, port, body, counts, stop):
    while not stop.is_set():
        wait = await one_request(host, port, body, counts)
        if wait:
            await asyncio.sleep(wait)


async def drive(args, gateway_url, pid):
    host, port = gateway_url.removeprefix("http://").split(":")
    port = int(port)
    body = json.dumps(
        {
            "model": "smollm2-135m-instruct",
            "max_tokens": args.max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": "Tell me about the harbour. " * 20}],
        }
    ).encode()
    counts = Counts()
    samples = []
    steps = []
    started = time.time()
    loop = asyncio.get_running_loop()

    async def sampler(done):
        while not done.is_set():
            t = time.time() - started
            rss, fds, threads = proc_sample(pid)
            try:
                text = await loop.run_in_executor(
                    None,
                    lambda: urllib.request.urlopen(f"{gateway_url}/metrics", timeout=5)
                    .read()
                    .decode(),
                )
                in_flight = metric_sum(text, "switchyard_worker_in_flight")
            except OSError:
                in_flight = float("nan")
            samples.append(
                {
                    "t": round(t, 2),
                    "rss_mib": round(rss, 1),
                    "fds": fds,
                    "threads": threads,
                    "streams_open": counts.open,
                    "in_flight": in_flight,
                    "ok": counts.ok,
                    "shed": counts.shed,
                    "failed": counts.failed + counts.cut,
                }
            )
            await asyncio.sleep(0.5)

    done = asyncio.Event()
    sampling = asyncio.create_task(sampler(done))
    plan = [(n, args.step_seconds) for n in args.steps] + [(args.soak, args.soak_seconds)]
    tasks, stops = [], []
    for clients, seconds in plan:
        # Grow or shrink the pool of clients to `clients`.
        while len(tasks) < clients:
            stop = asyncio.Event()
            stops.append(stop)
            tasks.append(asyncio.create_task(client(host, port, body, counts, stop)))
        while len(tasks) > clients:
            stops.pop().set()
            tasks.pop()
        before = (counts.ok, counts.shed, counts.failed + counts.cut, time.time())
        peak = 0
        end = time.time() + seconds
        while time.time() < end:
            peak = max(peak, counts.open)
            await asyncio.sleep(0.1)
        elapsed = time.time() - before[3]
        window = [s for s in samples if s["t"] >= before[3] - started]
        steps.append(
            {
                "clients": clients,
                "seconds": round(elapsed, 1),
                "streams_open_peak": peak,
                "completed_per_s": round((counts.ok - before[0]) / elapsed, 1),
                "shed_per_s": round((counts.shed - before[1]) / elapsed, 1),
                "failed": counts.failed + counts.cut - before[2],
                "rss_mib_max": max((s["rss_mib"] for s in window), default=None),
                "fds_max": max((s["fds"] for s in window), default=None),
            }
        )
        print(json.dumps(steps[-1]), flush=True)
    for stop in stops:
        stop.set()
    # Let the streams in flight finish, then idle.
    await asyncio.wait(tasks, timeout=120)
    await asyncio.sleep(args.idle_seconds)
    done.set()
    await sampling
    return counts, samples, steps


def plot(samples, path, limit):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    t = [s["t"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(t, [s["rss_mib"] for s in samples], label="gateway RSS (MiB)", color="tab:red")
    top.set_ylabel("MiB")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left")
    fds = top.twinx()
    fds.plot(t, [s["fds"] for s in samples], label="open fds", color="tab:gray", alpha=0.6)
    fds.set_ylabel("file descriptors")
    fds.set_ylim(bottom=0)
    fds.legend(loc="upper right")
    bottom.plot(t, [s["streams_open"] for s in samples], label="streams open (client)")
    bottom.axhline(limit, color="black", linestyle=":", label=f"max_concurrent_requests {limit}")
    rate = [0.0] + [
        (b["shed"] - a["shed"]) / max(b["t"] - a["t"], 1e-9) for a, b in zip(samples, samples[1:])
    ]
    bottom.plot(t, rate, label="shed per second (503)", color="tab:orange", alpha=0.7)
    bottom.set_xlabel("seconds")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper left")
    fig.suptitle("switchyard serve under a concurrency ramp and soak (scripts/soak.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=3000, help="max_concurrent_requests")
    ap.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")],
                    default=[250, 500, 1000, 2000, 4000])
    ap.add_argument("--step-seconds", type=float, default=20)
    ap.add_argument("--soak", type=int, default=2000, help="clients during the soak")
    ap.add_argument("--soak-seconds", type=float, default=120)
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--out", default="soak.json")
    ap.add_argument("--plot", default="soak.png")
    args = ap.parse_args()

    # Each stream is a socket here and two in the gateway (client and engine side).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * max(args.steps + [args.soak]) + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    procs = []
    try:
        engines = []
        for _ in range(args.engines):
            p = Proc(args.binary, ["mock-engine", "--port", "0", "--speedup", str(args.speedup),
                                   "--answer-median-tokens", "1000000"])
            procs.append(p)
            engines.append(p.wait_for("listening on "))
        toml = f"[server]\nmax_concurrent_requests = {args.limit}\n[router]\npolicy = \"kv-cost\"\n"
        for url in engines:
            toml += f'[[workers]]\nurl = "{url}"\nkind = "mock"\n'
        config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        config.write(toml)
        config.close()
        gateway = Proc(args.binary, ["serve", "--config", config.name, "--port", "0"])
        procs.append(gateway)
        url = gateway.wait_for("gateway on ")
        counts, samples, steps = asyncio.run(drive(args, url, gateway.p.pid))
        idle = samples[-1]
        summary = {
            "limit": args.limit,
            "steps": steps,
            "completed": counts.ok,
            "shed": counts.shed,
            "shed_without_retry_after": counts.shed_without_retry_after,
            "failed": counts.failed,
            "cut": counts.cut,
            "errors": {str(k): v for k, v in counts.errors.items()},
            "rss_mib_start": samples[0]["rss_mib"],
            "rss_mib_max": max(s["rss_mib"] for s in samples),
            "rss_mib_idle_after": idle["rss_mib"],
            "fds_start": samples[0]["fds"],
            "fds_max": max(s["fds"] for s in samples),
            "fds_idle_after": idle["fds"],
            "in_flight_idle_after": idle["in_flight"],
            "threads_max": max(s["threads"] for s in samples),
        }
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "samples": samples}, f, indent=1)
        print(json.dumps(summary, indent=1))
        plot(samples, args.plot, args.limit)
        if gateway.p.poll() is not None:
            sys.exit("the gateway exited during the run")
    finally:
        for p in procs:
            p.stop()


if __name__ == "__main__":
    main()
