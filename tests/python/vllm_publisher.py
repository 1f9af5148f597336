#!/usr/bin/env python3
"""A stand-in for vLLM's KV event publisher, writing its ZMQ frames and msgpack layout by hand.

It covers what vLLM's own publisher (engine_publisher.py) does not write today: events in
msgspec's array form, and the replay answers of older vLLM releases, `[b"", seq, payload]`
without the topic frame.

Used by host/kv-events/tests/engine_python.rs. Binds a PUB socket and a replay ROUTER socket
at the endpoints given (port `*` picks a free one), prints `READY <pub endpoint> <replay
endpoint>`, then obeys commands on stdin, one per line:

  go       publish the first engine life: array and map encodings, u64 hashes above i64::MAX,
           a signed hash, a CPU offload without tokens, a BlockRemoved and a lost message
           (kept in the replay buffer, never sent) that the subscriber must replay;
  restart  start a second engine life: sequence back to 0, empty replay buffer, no
           AllBlocksCleared; bytes hashes.

It answers `DONE <command>` once a command's batches are sent, and exits at end of input.

Blocks hold 4 tokens. The Rust test asserts the index this produces.
"""

import struct
import sys
import threading
import time

import msgpack
import zmq

BLOCK_SIZE = 4
END_OF_REPLAY = struct.pack(">q", -1)


def stored(hashes, parent, tokens, medium=None, block_size=BLOCK_SIZE):
    """BlockStored with every field of current vLLM, in msgspec's positional order."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": None,
        "group_idx": None,
        "kv_cache_spec_kind": None,
        "kv_cache_spec_sliding_window": None,
    }


def removed(hashes, medium=None):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": None}


def as_array(event):
    """msgspec `array_like=True, tag=True`: the tag, then the fields in declaration order."""
    return [event["type"]] + [value for key, value in event.items() if key != "type"]


def batch(events, array_form, dp_rank=0):
    ts = time.time()
    if array_form:
        return msgpack.packb([ts, [as_array(e) for e in events], dp_rank])
    return msgpack.packb({"ts": ts, "events": events, "data_parallel_rank": dp_rank})


class Engine:
    """One PUB stream with its replay buffer; `restart` is a new engine process."""

    def __init__(self, ctx, endpoint, replay_endpoint):
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(replay_endpoint)
        self.lock = threading.Lock()
        self.restart()

    def restart(self):
        with self.lock:
            self.seq = 0
            self.buffer = []

    def publish(self, payload, lost=False):
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if not lost:
            self.pub.send_multipart([b"", struct.pack(">Q", seq), payload])

    def serve_replay(self):
        while True:
            identity, _empty, start = self.router.recv_multipart()
            (start,) = struct.unpack(">Q", start)
            with self.lock:
                answer = [(s, p) for s, p in self.buffer if s >= start]
            for seq, payload in answer:
                self.router.send_multipart([identity, b"", struct.pack(">Q", seq), payload])
            self.router.send_multipart([identity, b"", END_OF_REPLAY, b""])


def first_life(engine):
    h1, h2 = 2**64 - 5, 2**63 + 7  # above i64::MAX: msgpack uint64
    h3, h4, h5, h6 = 3, -12345, 5, 6  # h4 signed, as SGLang sends
    engine.publish(batch([stored([h1, h2], None, range(0, 8), medium="GPU")], array_form=True))
    engine.publish(
        batch([stored([h3], h2, range(8, 12)), stored([h4], None, range(100, 104))], array_form=False)
    )
    offload = stored([h1, h2], None, [], medium="CPU", block_size=0)
    engine.publish(batch([offload], array_form=True))
    engine.publish(batch([removed([h4], medium="GPU")], array_form=False))
    engine.publish(batch([stored([h5], h3, range(12, 16))], array_form=True), lost=True)
    engine.publish(batch([stored([h6], h5, range(16, 20))], array_form=True))


def second_life(engine):
    engine.restart()
    c1, c2, c3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    engine.publish(batch([stored([c1, c2], None, range(200, 208))], array_form=False))
    engine.publish(batch([stored([c3], c2, range(208, 212))], array_form=True))
    engine.publish(batch([removed([c3])], array_form=True))


def main():
    endpoint, replay_endpoint = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    engine = Engine(ctx, endpoint, replay_endpoint)
    threading.Thread(target=engine.serve_replay, daemon=True).start()
    bound = engine.pub.getsockopt_string(zmq.LAST_ENDPOINT)
    replay_bound = engine.router.getsockopt_string(zmq.LAST_ENDPOINT)
    print("READY", bound, replay_bound, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            first_life(engine)
        elif command == "restart":
            second_life(engine)
        print("DONE", command, flush=True)


if __name__ == "__main__":
    main()
