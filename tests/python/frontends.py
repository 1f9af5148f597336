"""Conformance of Switchyard's three client APIs, driven by the official `openai` and `anthropic`
Python packages (their typed models reject responses that are not in the API's exact shape).

Usage: frontends.py BASE_URL MODEL

The gateway runs on mock engines. A conversation asks the mock engine for a tool call by ending
its last message with `[[mock:tool_call NAME {json}]]` and for exact text with
`[[mock:say TEXT]]` (host/mock-engine/src/script.rs); the engine writes the call in its model's
format and the gateway (tokens mode) or the engine (chat mode) parses it back.
Prints one `ok <check>` line per passed check; any failure raises and exits non-zero.
"""

import json
import sys

import anthropic
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0)
ant = anthropic.Anthropic(base_url=BASE, api_key="unused", max_retries=0)

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '[[mock:tool_call get_weather {"city": "Paris"}]]'
SAY = "[[mock:say <think>The user greets me.</think>Hello there!]]"


def ok(name):
    print(f"ok {name}", flush=True)


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def check_chat_usage(usage):
    check(usage is not None, "chat usage missing")
    check(usage.prompt_tokens > 0, f"prompt_tokens {usage.prompt_tokens}")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"total {usage}")
    cached = usage.prompt_tokens_details.cached_tokens
    check(0 <= cached <= usage.prompt_tokens, f"cached {cached} of {usage.prompt_tokens}")


# --- chat completions -------------------------------------------------------------------------

def chat():
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"hi {SAY}"}], max_tokens=64
    )
    m = r.choices[0].message
    check(m.content == "Hello there!", f"chat content {m.content!r}")
    check(getattr(m, "reasoning_content", None) == "The user greets me."
          or (m.model_extra or {}).get("reasoning_content") == "The user greets me.",
          f"chat reasoning {m}")
    check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    check_chat_usage(r.usage)
    ok("chat")

    stream = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"hi {SAY}"}], max_tokens=64,
        stream=True, stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check(text == "Hello there!", f"chat stream text {text!r}")
    check(finish == "stop", finish)
    check_chat_usage(usage)
    ok("chat stream")

    messages = [{"role": "user", "content": f"Weather in Paris? {CALL}"}]
    tools = [{"type": "function", "function": WEATHER_TOOL}]
    r = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=64)
    calls = r.choices[0].message.tool_calls
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    check(len(calls) == 1 and calls[0].function.name == "get_weather", f"calls {calls}")
    check(json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls[0].function.arguments)
    # The streamed call assembles to the same call.
    stream = oai.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=64, stream=True
    )
    name, args = None, ""
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    check(name == "get_weather" and json.loads(args) == {"city": "Paris"}, f"{name} {args}")
    # Round trip: send the result back; the model answers in text.
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id,
         "content": "18C, sunny [[mock:say It is sunny in Paris.]]"},
    ]
    r = oai.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=64)
    check(r.choices[0].message.content == "It is sunny in Paris.", r.choices[0].message.content)
    ok("chat tool round trip")


# --- responses --------------------------------------------------------------------------------

def responses():
    r = oai.responses.create(
        model=MODEL, instructions="Be brief.", input=f"hi {SAY}", store=False,
        max_output_tokens=64,
    )
    check(r.output_text == "Hello there!", f"responses text {r.output_text!r}")
    check(r.status == "completed", r.status)
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, f"{r.usage}")
    check(0 <= r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens, f"{r.usage}")
    kinds = [item.type for item in r.output]
    check("reasoning" in kinds and "message" in kinds, f"output kinds {kinds}")
    ok("responses")

    events = list(oai.responses.create(
        model=MODEL, input=f"hi {SAY}", store=False, stream=True, max_output_tokens=64
    ))
    types = [e.type for e in events]
    check(types[0] == "response.created" and types[-1] == "response.completed", types)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(text == "Hello there!", f"responses stream text {text!r}")
    seq = [e.sequence_number for e in events]
    check(seq == sorted(seq) and len(set(seq)) == len(seq), f"sequence numbers {seq}")
    check(events[-1].response.usage.input_tokens > 0, "completed usage")
    ok("responses stream")

    tools = [{"type": "function", **WEATHER_TOOL}]
    first = oai.responses.create(
        model=MODEL, input=f"Weather in Paris? {CALL}", tools=tools, max_output_tokens=64
    )
    calls = [item for item in first.output if item.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"calls {first.output}")
    check(json.loads(calls[0].arguments) == {"city": "Paris"}, calls[0].arguments)
    events = list(oai.responses.create(
        model=MODEL, input=f"Weather in Paris? {CALL}", tools=tools, store=False, stream=True,
        max_output_tokens=64,
    ))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    check(json.loads(args) == {"city": "Paris"}, f"streamed arguments {args!r}")
    # Round trip through previous_response_id (the gateway's store) ...
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, tools=tools, max_output_tokens=64,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18C, sunny [[mock:say It is sunny in Paris.]]"}],
    )
    check(second.output_text == "It is sunny in Paris.", second.output_text)
    # ... and statelessly, the whole history resent (what Codex does with store: false).
    third = oai.responses.create(
        model=MODEL, store=False, tools=tools, max_output_tokens=64,
        input=[
            {"role": "user", "content": f"Weather in Paris? {CALL}"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id,
             "output": "18C, sunny [[mock:say It is sunny in Paris.]]"},
        ],
    )
    check(third.output_text == "It is sunny in Paris.", third.output_text)
    check(third.usage.input_tokens == second.usage.input_tokens,
          f"stored vs resent history: {second.usage.input_tokens} vs {third.usage.input_tokens}")
    try:
        oai.responses.create(model=MODEL, previous_response_id="resp_missing", input="hi")
        raise AssertionError("unknown previous_response_id accepted")
    except openai.BadRequestError as e:
        check("previous_response_id" in str(e) or "resp_missing" in str(e), str(e))
    ok("responses tool round trip")


# --- messages ---------------------------------------------------------------------------------

def messages():
    r = ant.messages.create(
        model=MODEL, max_tokens=64, system="Be brief.",
        messages=[{"role": "user", "content": f"hi {SAY}"}],
    )
    kinds = [b.type for b in r.content]
    check(kinds == ["thinking", "text"], f"blocks {kinds}")
    check(r.content[1].text == "Hello there!", r.content[1].text)
    check(r.stop_reason == "end_turn", r.stop_reason)
    check(r.usage.input_tokens >= 0 and r.usage.output_tokens > 0, f"{r.usage}")
    ok("messages")

    with ant.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": f"hi {SAY}"}]
    ) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    check(types[0] == "message_start" and "message_stop" in types, types)
    check("content_block_delta" in types, types)
    check(final.content[-1].text == "Hello there!", f"{final.content}")
    ok("messages stream")

    tools = [{"name": WEATHER_TOOL["name"], "description": WEATHER_TOOL["description"],
              "input_schema": WEATHER_TOOL["parameters"]}]
    history = [{"role": "user", "content": [
        {"type": "text", "text": f"Weather in Paris? {CALL}",
         "cache_control": {"type": "ephemeral"}}]}]
    r = ant.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=history)
    uses = [b for b in r.content if b.type == "tool_use"]
    check(r.stop_reason == "tool_use", r.stop_reason)
    check(len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"},
          f"tool uses {r.content}")
    with ant.messages.stream(model=MODEL, max_tokens=64, tools=tools, messages=history) as s:
        final = s.get_final_message()
    check([b.input for b in final.content if b.type == "tool_use"] == [{"city": "Paris"}],
          f"streamed tool use {final.content}")
    history += [
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "18C, sunny [[mock:say It is sunny in Paris.]]"}]},
    ]
    r = ant.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=history)
    check(r.content[-1].text == "It is sunny in Paris.", f"{r.content}")
    check(r.usage.cache_read_input_tokens is not None, f"{r.usage}")
    counted = ant.messages.count_tokens(model=MODEL, tools=tools, messages=history)
    check(counted.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens
          + (r.usage.cache_creation_input_tokens or 0), f"count {counted} vs usage {r.usage}")
    ok("messages tool round trip")

    try:
        ant.messages.create(model=MODEL, max_tokens=16, extra_body={"max_tokens": "many"},
                            messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("bad max_tokens accepted")
    except anthropic.BadRequestError as e:
        check(e.body["type"] == "error" and "max_tokens" in e.body["error"]["message"], e.body)
    ok("messages error shape")


# --- one conversation, three APIs ---------------------------------------------------------------

def same_tokens():
    """The same tool-using turn, written by three harnesses, is the same prompt: equal prompt
    token counts, and the second and third sendings hit the first one's whole KV prefix."""
    result = '{"temp": 18}'
    ask = "What is the weather in Paris?"
    chat = oai.chat.completions.create(
        model=MODEL, max_tokens=1, tools=[{"type": "function", "function": WEATHER_TOOL}],
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": ask},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
        ],
    )
    resp = oai.responses.create(
        model=MODEL, max_output_tokens=16, store=False, instructions="You are terse.",
        tools=[{"type": "function", **WEATHER_TOOL}],
        input=[
            {"role": "user", "content": ask},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": result},
        ],
    )
    msg = ant.messages.create(
        model=MODEL, max_tokens=1, system="You are terse.",
        tools=[{"name": "get_weather", "description": WEATHER_TOOL["description"],
                "input_schema": WEATHER_TOOL["parameters"]}],
        messages=[
            {"role": "user", "content": ask},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": result}]},
        ],
    )
    prompts = {
        "chat": chat.usage.prompt_tokens,
        "responses": resp.usage.input_tokens,
        "messages": msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0),
    }
    check(len(set(prompts.values())) == 1, f"prompt tokens differ: {prompts}")
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    full = prompts["chat"] // block * block
    cached = {
        "responses": resp.usage.input_tokens_details.cached_tokens,
        "messages": msg.usage.cache_read_input_tokens,
    }
    # The prompt's last token is always recomputed (vLLM's rule): a whole-prompt hit is every
    # full block but, when the prompt is block-aligned, the last.
    check(all(c >= full - block for c in cached.values()),
          f"later sendings missed the first one's KV: {cached}, {full} full-block tokens")
    ok("same tokens through three APIs")


chat()
responses()
messages()
same_tokens()
