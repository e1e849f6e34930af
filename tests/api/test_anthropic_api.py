"""The Anthropic Messages API through the real server (Gunicorn subprocess, the bundled demo model)
with the official `anthropic` client: answers about an image, streamed (the client's own event
accumulator) equal to non-streamed for a greedy request, a tool round trip (tool_use, then its
tool_result sent back), stop sequences, count_tokens against the prompt the answer's usage reports,
the error shape and statuses, and `x-api-key` against a server with VL_API_KEYS."""

from __future__ import annotations

import base64
import json
import os

import jsonschema
import pytest
import requests

from conftest import ARTIFACTS, png_bytes, scene

anthropic = pytest.importorskip("anthropic")

pytestmark = pytest.mark.server

SHAPES = {"type": "object", "properties": {
    "shape": {"enum": ["circle", "square", "triangle", "star"]},
    "color": {"enum": ["red", "green", "blue", "yellow"]}}, "required": ["shape", "color"],
    "additionalProperties": False}
TOOLS = [{"name": "record_shapes", "description": "Record a shape seen in the image", "input_schema": SHAPES}]


# anthropic 2.x sends no sampling fields (its `create` has none): ours go in the body as older clients sent them
GREEDY = {"temperature": 0}


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=180)


def image_block(seed: int) -> dict:
    data = base64.b64encode(png_bytes(scene(seed=seed))).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def ask(seed: int, text: str = "Describe this image.") -> list:
    return [{"role": "user", "content": [image_block(seed), {"type": "text", "text": text}]}]


def test_an_image_is_described_and_usage_counts_the_image(server):
    c = client(server)
    m = c.messages.create(model="demo", max_tokens=40, extra_body=GREEDY, messages=ask(801))
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.output_tokens > 0
    counted = c.messages.count_tokens(model="demo", messages=ask(801))
    text_only = c.messages.count_tokens(model="demo", messages=[{"role": "user", "content": "Describe this image."}])
    assert counted.input_tokens == m.usage.input_tokens > text_only.input_tokens + 4  # the image's tokens in both


def test_streamed_equals_non_streamed_for_a_greedy_request(server):
    c = client(server)
    kw = dict(model="demo", max_tokens=30, system="Answer briefly.", messages=ask(802),
              extra_body={"temperature": 0, "result_cache": False})
    whole = c.messages.create(**kw)
    with c.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        whole.stop_reason, whole.usage.input_tokens, whole.usage.output_tokens)
    # Anthropic's sequence: message_start, a block's start / deltas / stop, message_delta, message_stop
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == len(whole.content)


def test_sse_wire_format_has_the_event_names(server):
    r = requests.post(server.url + "/v1/messages", json={
        "model": "demo", "max_tokens": 5, "temperature": 0, "stream": True, "messages": ask(803)},
        headers={"anthropic-version": "2023-06-01"}, stream=True, timeout=120)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = [(e.split("\n")[0], e.split("\n")[1]) for e in r.text.strip().split("\n\n") if e.startswith("event:")]
    names = [name[len("event: "):] for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    for name, data in events:  # each event's data is JSON whose `type` is the event's name
        assert json.loads(data[len("data: "):])["type"] == name[len("event: "):]


def test_tool_round_trip(server):
    c = client(server)
    msgs = ask(804, "Record the shapes you see.")
    a = c.messages.create(model="demo", max_tokens=120, extra_body=GREEDY, messages=msgs, tools=TOOLS,
                          tool_choice={"type": "any"})
    assert a.stop_reason == "tool_use"
    calls = [b for b in a.content if b.type == "tool_use"]
    assert calls and all(b.id.startswith("toolu_") and b.name == "record_shapes" for b in calls)
    for b in calls:
        jsonschema.validate(b.input, SHAPES)
    # streamed: the same calls, their input as input_json_delta
    with c.messages.stream(model="demo", max_tokens=120, extra_body=GREEDY, messages=msgs, tools=TOOLS,
                           tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(b.name, b.input) for b in calls]
    assert final.stop_reason == "tool_use"
    # the calls and their results sent back: the model answers them (a named tool forces one more call)
    msgs += [{"role": "assistant", "content": [b.model_dump() for b in a.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "recorded"}
                                          for b in calls]}]
    b = c.messages.create(model="demo", max_tokens=60, extra_body=GREEDY, messages=msgs, tools=TOOLS,
                          tool_choice={"type": "tool", "name": "record_shapes"})
    assert b.stop_reason == "tool_use" and b.usage.input_tokens > a.usage.input_tokens
    assert [x.name for x in b.content if x.type == "tool_use"] == ["record_shapes"]
    counted = c.messages.count_tokens(model="demo", messages=msgs, tools=TOOLS,
                                      tool_choice={"type": "tool", "name": "record_shapes"})
    assert counted.input_tokens == b.usage.input_tokens


def test_stop_sequence_is_reported(server):
    c = client(server)
    whole = c.messages.create(model="demo", max_tokens=40, extra_body=GREEDY, messages=ask(805))
    text = whole.content[0].text
    stop = text.strip().split()[1]  # a word the greedy answer writes
    cut = c.messages.create(model="demo", max_tokens=40, extra_body=GREEDY, messages=ask(805),
                            stop_sequences=["never-written", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert "".join(b.text for b in cut.content) == text[:text.index(stop)]  # cut before it, as chat cuts
    with c.messages.stream(model="demo", max_tokens=40, extra_body=GREEDY, messages=ask(805),
                           stop_sequences=["never-written", stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    short = c.messages.create(model="demo", max_tokens=2, extra_body=GREEDY, messages=ask(805))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


@pytest.mark.parametrize("body, status, words", [
    ({"messages": [{"role": "user", "content": "Hi"}]}, 400, "`max_tokens` is required"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]}, 400, "max_tokens"),
    ({"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "Hi"}]}, 400, "temperature"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, 400, "document"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}]}, 400,
     "last message"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}]}]}, 400,
     "messages[0].content[0].source"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://example.com/a.png"}}]}]}, 400, "remote image URLs are disabled"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "thinking": {"type": "enabled",
                                                                                      "budget_tokens": 1024}},
     400, "thinking"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, 400, "server tools"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS,
      "tool_choice": {"type": "tool", "name": "nope"}}, 400, "tool_choice.name"),
])
def test_errors_in_anthropic_shape(server, body, status, words):
    r = requests.post(server.url + "/v1/messages", json={"model": "demo", **body}, timeout=60)
    assert r.status_code == status, r.text
    out = r.json()
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert set(out["error"]) == {"type", "message"} and words in out["error"]["message"], out


def test_errors_raise_the_clients_exceptions(server):
    c = client(server)
    with pytest.raises(anthropic.BadRequestError) as bad:
        c.messages.create(model="demo", max_tokens=10**9, messages=[{"role": "user", "content": "Hi"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in bad.value.message
    r = requests.get(server.url + "/v1/messages", timeout=10)
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = requests.post(server.url + "/v1/messages", data=b"{not json", headers={"Content-Type": "application/json"},
                      timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


KEY = "sk-anthropic-" + "k" * 20


@pytest.fixture(scope="module")
def keyed(cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_API_KEYS": f"team:{KEY}", "VL_MAX_TOKENS_CAP": "512"}
    with ServerProcess(env, ARTIFACTS / "server-anthropic-keys.log") as proc:
        yield proc


def test_x_api_key_is_accepted_and_a_wrong_one_refused(keyed):
    m = client(keyed, KEY).messages.create(model="demo", max_tokens=5, extra_body=GREEDY, messages=ask(806))
    assert m.type == "message" and m.usage.input_tokens > 0
    assert client(keyed, KEY).messages.count_tokens(model="demo", messages=ask(806)).input_tokens == \
        m.usage.input_tokens
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client(keyed, "sk-wrong").messages.create(model="demo", max_tokens=5, messages=ask(806))
    assert refused.value.status_code == 401 and refused.value.body["error"]["type"] == "authentication_error"
    # the bearer works here too, and the tokenizer routes are behind the key like /v1/
    bearer = requests.post(keyed.url + "/v1/messages/count_tokens", json={"messages": ask(806)},
                           headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert bearer.status_code == 200 and bearer.json() == {"input_tokens": m.usage.input_tokens}
    assert requests.post(keyed.url + "/tokenize", json={"prompt": "hi"}, timeout=10).status_code == 401
    assert requests.post(keyed.url + "/tokenize", json={"prompt": "hi"}, headers={"x-api-key": KEY},
                         timeout=10).status_code == 200


def test_structured_output_with_the_clients_parse(server):
    from typing import Literal

    from pydantic import BaseModel

    class Shape(BaseModel):
        shape: Literal["circle", "square", "triangle", "star"]
        color: Literal["red", "green", "blue", "yellow"]

    m = client(server).messages.parse(model="demo", max_tokens=100, messages=ask(807, "What shape is there?"),
                                      output_format=Shape, extra_body=GREEDY)
    assert m.stop_reason == "end_turn" and isinstance(m.parsed_output, Shape)
    r = requests.post(server.url + "/v1/messages", json={
        "model": "demo", "max_tokens": 5, "messages": ask(807), "tools": TOOLS, "tool_choice": {"type": "any"},
        "output_config": {"format": {"type": "json_schema", "schema": SHAPES}}}, timeout=60)
    assert r.status_code == 400 and "output_config.format" in r.json()["error"]["message"]


def test_tool_results_alone_are_not_a_question(server):
    r = requests.post(server.url + "/v1/messages/count_tokens", json={"model": "demo", "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}]},
        timeout=30)
    assert r.status_code == 400 and "user message with text or an image" in r.json()["error"]["message"]
