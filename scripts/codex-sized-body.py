#!/usr/bin/env python3
"""A /v1/responses body the size and shape of the real Codex CLI's first request (0.171: nine
tools, 18.7 KB of tool definitions, 21 KB of input in a developer and a user message), with
made-up text, for scripts/gateway-cpu.sh (API=responses AS_IS=1).

    scripts/codex-sized-body.py [--stream] > body.json
"""
import json
import sys

PROSE = "Runs a command in the workspace and returns its output, exit code and timing. "


def text(size):
    return (PROSE * (size // len(PROSE) + 1))[:size]


tools = [
    {"type": "function", "name": f"tool_{i}", "description": text(size), "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"], "additionalProperties": False}}
    for i, size in enumerate([1400, 650, 1250, 250, 10500, 150, 620, 2000, 40])
]
body = {
    "model": "fake-model",
    "stream": "--stream" in sys.argv,
    "store": False,
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": text(19000)}]},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": text(1800) + " Say hello."}]},
    ],
    "tools": tools,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0193-codex-session",
}
print(json.dumps(body))
