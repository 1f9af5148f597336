#!/usr/bin/env python3
"""Decodes KV event payloads with vLLM's or SGLang's own event classes.

Used by host/kv-events/tests/python_publishers.rs to check that the mock engines publish what
the engines do: msgspec decodes strictly against the engine's types (`KVEventBatch`).

  engine_decoder.py ENGINE   (ENGINE: vllm or sglang; the module as engine_publisher.py loads it)

Reads one hex-encoded payload a line on stdin and answers one line each: the decoded batch as
JSON (`{"rank": ..., "events": [{"type": ..., field: value, ...}]}`, hashes as integers), or
`ERROR <what msgspec said>`.
"""

import json
import sys

import msgspec

from engine_publisher import load


def main():
    engine = sys.argv[1]
    kv = load(engine)
    decoder = msgspec.msgpack.Decoder(type=kv.KVEventBatch)
    for line in sys.stdin:
        try:
            batch = decoder.decode(bytes.fromhex(line.strip()))
        except msgspec.DecodeError as error:
            print("ERROR", error, flush=True)
            continue
        rank = batch.data_parallel_rank if engine == "vllm" else batch.attn_dp_rank
        events = [
            {"type": type(event).__name__, **msgspec.structs.asdict(event)}
            for event in batch.events
        ]
        print(json.dumps({"rank": rank, "events": events}), flush=True)


if __name__ == "__main__":
    main()
