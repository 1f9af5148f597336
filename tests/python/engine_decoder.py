#!/usr/bin/env python3
"""Decodes what Switchyard sends engines with the engines' own classes.

Used by host/kv-events/tests/engine_python.rs: msgspec decodes strictly against the engine's
types, so a field of the wrong name or type is an error.

  engine_decoder.py ENGINE kv-events   KV event payloads, one hex-encoded a line, decoded as the
                                       engine's `KVEventBatch` (ENGINE: vllm or sglang)
  engine_decoder.py vllm kv-hints      `kv_hints` envelopes, one JSON a line, decoded as vLLM's
                                       `KvHintsEnvelope` (vllm/v1/kv_hints/protocol.py)

Modules are fetched as engine_publisher.py does. Answers one line each: what was decoded, as
JSON (a batch as `{"rank": ..., "events": [{"type": ..., field: value, ...}]}`), or `ERROR <what
msgspec said>`.
"""

import json
import sys

import msgspec

from engine_publisher import load, load_module


def main():
    engine, what = sys.argv[1], sys.argv[2]
    if what == "kv-events":
        decoder = msgspec.msgpack.Decoder(type=load(engine).KVEventBatch)
        read = bytes.fromhex
    else:
        decoder = msgspec.json.Decoder(type=load_module(engine, "kv_hints").KvHintsEnvelope)
        read = str.encode
    for line in sys.stdin:
        try:
            decoded = decoder.decode(read(line.strip()))
        except msgspec.DecodeError as error:
            print("ERROR", error, flush=True)
            continue
        if what == "kv-events":
            rank = decoded.data_parallel_rank if engine == "vllm" else decoded.attn_dp_rank
            events = [
                {"type": type(event).__name__, **msgspec.structs.asdict(event)}
                for event in decoded.events
            ]
            decoded = {"rank": rank, "events": events}
        print(msgspec.json.encode(decoded).decode(), flush=True)


if __name__ == "__main__":
    main()
