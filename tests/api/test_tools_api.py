"""Tool calling through the real server (Gunicorn subprocess, the bundled demo model) with the
official `openai` client and its types: forced calls ("required", a named function) come back as
`tool_calls` whose arguments validate against the function's schema, streamed as the same calls;
the round trip (the call and its result sent back) is rendered and answered; "none" and "auto"
answer in text the demo model writes; a forced request batched beside a plain one leaves the
plain answer as it is alone."""

from __future__ import annotations

import concurrent.futures as cf
import json

import jsonschema
import pytest

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server

SHAPES = {"type": "object", "properties": {
    "shape": {"enum": ["circle", "square", "triangle", "star"]},
    "color": {"enum": ["red", "green", "blue", "yellow"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["shape", "color"],
    "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "record_shapes", "description": "Record a shape seen in the image",
                                      "parameters": SHAPES}},
    {"type": "function", "function": {"name": "ask_user", "description": "Ask the user a question",
                                      "parameters": {"type": "object", "properties": {
                                          "question": {"type": "string", "maxLength": 40}},
                                          "required": ["question"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def check_calls(calls, allowed=tuple(SCHEMAS)):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in allowed
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("seed", [761, 762])
def test_required_calls_validate_and_stream_as_the_same_calls(server, seed):
    c = client(server)
    msgs = image_message(png_bytes(scene(seed=seed)), "Record the shapes you see.")
    a = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="required",
                                  max_tokens=200, temperature=0)
    choice = a.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    check_calls(choice.message.tool_calls)
    assert choice.message.content is None
    # streamed: the client's chunks carry the same calls (ids differ per answer), then "tool_calls"
    chunks = list(c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="required",
                                            max_tokens=200, temperature=0, stream=True))
    streamed = {}
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            s = streamed.setdefault(d.index, {"name": "", "arguments": ""})
            s["name"] += d.function.name or ""
            s["arguments"] += d.function.arguments or ""
    assert [streamed[i] for i in sorted(streamed)] == [
        {"name": t.function.name, "arguments": t.function.arguments} for t in choice.message.tool_calls]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert not any(ch.choices[0].delta.content for ch in chunks if ch.choices)


def test_a_named_function_and_one_call_at_most(server):
    c = client(server)
    msgs = image_message(png_bytes(scene(seed=763)), "What should I ask?")
    a = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, max_tokens=120, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "ask_user"}})
    calls = a.choices[0].message.tool_calls
    check_calls(calls, ("ask_user",))
    assert len(calls) == 1
    one = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, max_tokens=200, temperature=0.8, seed=5)
    assert len(one.choices[0].message.tool_calls) == 1


def test_the_round_trip_with_the_clients_types(server):
    c = client(server)
    msgs = image_message(png_bytes(scene(seed=764)), "Record the shapes you see.")
    a = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="required",
                                  max_tokens=200, temperature=0)
    turn = a.choices[0].message
    followup = msgs + [turn.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"ok": True})} for call in turn.tool_calls]
    b = c.chat.completions.create(model="demo", messages=followup, tools=TOOLS, max_tokens=16, temperature=0)
    assert b.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the call and the result are in the prompt: it is longer than the first request's by at least them
    assert b.usage.prompt_tokens > a.usage.prompt_tokens + a.usage.completion_tokens
    # "none": the tools stay out of the prompt and the answer is text
    n = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=16,
                                  temperature=0)
    plain = c.chat.completions.create(model="demo", messages=msgs, max_tokens=16, temperature=0)
    assert n.choices[0].message.tool_calls is None and n.choices[0].message.content == plain.choices[0].message.content
    assert n.usage.prompt_tokens == plain.usage.prompt_tokens


def test_auto_answers_and_a_forced_request_beside_a_plain_one(server):
    c = client(server)
    msgs = image_message(png_bytes(scene(seed=765)), "Describe this image.")
    auto = c.chat.completions.create(model="demo", messages=msgs, tools=TOOLS, max_tokens=24, temperature=0)
    m = auto.choices[0].message
    assert m.content or m.tool_calls
    if m.tool_calls:
        check_calls(m.tool_calls)
    alone = c.chat.completions.create(model="demo", messages=msgs, max_tokens=24, temperature=0,
                                      extra_body={"result_cache": False})
    with cf.ThreadPoolExecutor(2) as pool:
        forced = pool.submit(c.chat.completions.create, model="demo", messages=msgs, tools=TOOLS,
                             tool_choice="required", max_tokens=200, temperature=0)
        beside = pool.submit(c.chat.completions.create, model="demo", messages=msgs, max_tokens=24, temperature=0,
                             extra_body={"result_cache": False})
        check_calls(forced.result().choices[0].message.tool_calls)
        assert beside.result().choices[0].message.content == alone.choices[0].message.content


def test_bad_tools_are_400_in_openais_shape(server):
    import requests

    r = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "launch"}}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "tool_choice.function.name" and "launch" in err["message"]
    r = requests.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "a": {"type": "nonsense"}}}}}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.parameters"
