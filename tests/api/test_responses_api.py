"""The OpenAI Responses API (`/v1/responses`) through the real server (Gunicorn subprocess, the
bundled demo model) with the official `openai` client: `responses.create` with text and an image,
the streaming helper (typed events, in order, the same answer as the JSON one), `responses.parse`
with a pydantic model (the grammar makes it valid), a function call round trip (by sending the
items back, and by `previous_response_id`), a three-turn chain from an image whose continuations
the prefix cache serves and whose answer equals the same conversation sent whole, `store: false`,
GET / DELETE, and refusals as 400s in OpenAI's error shape naming the field."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
import requests
from pydantic import BaseModel, Field

from conftest import data_url, png_bytes, scene

pytestmark = pytest.mark.server

RESPONSES = "/v1/responses"
SHAPE = {"type": "object", "properties": {
    "shape": {"enum": ["circle", "square", "triangle", "star"]},
    "color": {"enum": ["red", "green", "blue", "yellow"]}}, "required": ["shape", "color"],
    "additionalProperties": False}
TOOLS = [{"type": "function", "name": "record_shape", "description": "Record a shape seen in the image",
          "parameters": SHAPE}]


class Picture(BaseModel):
    caption: str = Field(max_length=32)
    colors: list[Literal["red", "green", "blue", "yellow"]] = Field(min_length=1, max_length=3)
    count: int = Field(ge=0, le=9)


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def image_input(seed: int, text: str) -> list:
    return [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(png_bytes(scene(seed=seed))), "detail": "low"},
        {"type": "input_text", "text": text}]}]


def test_create_with_text_and_an_image(server):
    c = client(server)
    r = c.responses.create(model="demo", input=image_input(901, "Describe this image."), max_output_tokens=64,
                           temperature=0, instructions="Answer briefly.", metadata={"case": "image"})
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output and r.output[0].type == "message" and r.output[0].id.startswith("msg_")
    assert r.output_text == r.output[0].content[0].text and r.output_text
    assert r.instructions == "Answer briefly." and r.metadata == {"case": "image"} and r.max_output_tokens == 64
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens <= 64 and u.output_tokens_details.reasoning_tokens == 0
    assert (r.status == "incomplete") == (r.incomplete_details is not None and u.output_tokens == 64)
    plain = c.responses.create(model="demo", input="Say something.", max_output_tokens=8, temperature=0)
    assert plain.output[0].content[0].type == "output_text" and plain.usage.output_tokens <= 8


def test_the_stream_is_typed_events_in_order_and_the_same_answer(server):
    c = client(server)
    kw = dict(model="demo", input=image_input(902, "What shape is this?"), max_output_tokens=120, temperature=0,
              extra_body={"result_cache": False})
    whole = c.responses.create(**kw)
    with c.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed" and whole.status == "completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done"} <= set(types)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert deltas == done[0] == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.id != whole.id and events[0].response.id == final.id
    # sampled with a seed: the same too
    kw.update(temperature=1.0, top_p=0.9, extra_body={"seed": 7})  # `seed` is our extension here, as in chat
    sampled = c.responses.create(**kw)
    with c.responses.stream(**kw) as stream:  # the helper's final response needs "completed": read the deltas
        streamed = [e for e in stream if e.type in ("response.output_text.delta", "response.completed",
                                                    "response.incomplete")]
    assert "".join(e.delta for e in streamed[:-1]) == sampled.output_text
    assert streamed[-1].response.status == sampled.status


def test_parse_returns_a_valid_object_streamed_too(server):
    c = client(server)
    inp = image_input(903, "Describe this image.")
    r = c.responses.parse(model="demo", input=inp, text_format=Picture, max_output_tokens=200, temperature=0)
    assert r.status == "completed", r.output_text
    assert isinstance(r.output_parsed, Picture)
    assert Picture.model_validate_json(r.output_text) == r.output_parsed
    with c.responses.stream(model="demo", input=inp, text_format=Picture, max_output_tokens=200,
                            temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == r.output_parsed
    j = c.responses.create(model="demo", input=inp, max_output_tokens=200, temperature=0,
                           text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(j.output_text), dict) if j.status == "completed" else j.output_text.startswith("{")


def test_a_function_call_round_trip(server):
    c = client(server)
    inp = image_input(904, "Record the shape you see.")
    first = c.responses.create(model="demo", input=inp, tools=TOOLS, tool_choice="required",
                               parallel_tool_calls=False, max_output_tokens=120, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "record_shape" and calls[0].call_id.startswith("call_")
    assert calls[0].id.startswith("fc_") and calls[0].status == "completed"
    jsonschema.validate(json.loads(calls[0].arguments), SHAPE)
    # streamed: the same call, as argument events
    with c.responses.stream(model="demo", input=inp, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                            max_output_tokens=120, temperature=0) as stream:
        events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [calls[0].arguments]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
        calls[0].arguments
    # the call's output sent back with the items (no stored state) ...
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"saved": True})}
    manual = c.responses.create(model="demo", input=inp + [calls[0].model_dump(exclude_none=True), result],
                                tools=TOOLS, max_output_tokens=40, temperature=0, store=False)
    # ... or through previous_response_id: the same conversation, so the same answer
    chained = c.responses.create(model="demo", previous_response_id=first.id, input=[result], tools=TOOLS,
                                 max_output_tokens=40, temperature=0)
    assert manual.output and chained.output
    assert [o.type for o in chained.output] == [o.type for o in manual.output]
    assert chained.output_text == manual.output_text
    assert chained.usage.input_tokens == manual.usage.input_tokens
    assert chained.previous_response_id == first.id


def test_previous_response_id_over_three_turns_from_an_image(server):
    c = client(server)
    kw = dict(model="demo", max_output_tokens=40, temperature=0)
    first = c.responses.create(input=image_input(905, "Describe this image."), **kw)
    second = c.responses.create(previous_response_id=first.id, input="What color is it?", **kw)
    third = c.responses.create(previous_response_id=second.id, input="And the shape?", **kw)
    # each continuation holds the turns before it: its prompt grows, and the KV cache serves it
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2
    assert third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens // 2
    # the chain is the conversation: sent whole, it gets the same answer
    whole = image_input(905, "Describe this image.") + [
        {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "What color is it?"},
        {"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And the shape?"}]
    again = c.responses.create(input=whole, store=False, extra_body={"result_cache": False}, **kw)
    assert again.output_text == third.output_text
    assert again.usage.input_tokens == third.usage.input_tokens


def test_store_false_get_and_delete(server):
    from openai import NotFoundError

    c = client(server)
    kept = c.responses.create(model="demo", input="Hello.", max_output_tokens=8, temperature=0)
    got = c.responses.retrieve(kept.id)
    assert got.model_dump() == kept.model_dump()
    gone = c.responses.create(model="demo", input="Hello.", max_output_tokens=8, temperature=0, store=False)
    assert gone.store is False
    with pytest.raises(NotFoundError) as err:
        c.responses.create(model="demo", input="More.", previous_response_id=gone.id, max_output_tokens=8)
    assert err.value.body["code"] == "previous_response_not_found"
    assert err.value.body["param"] == "previous_response_id" and "store: false" in err.value.body["message"]
    with pytest.raises(NotFoundError):
        c.responses.retrieve(gone.id)
    c.responses.delete(kept.id)
    for call in (lambda: c.responses.retrieve(kept.id), lambda: c.responses.delete(kept.id)):
        with pytest.raises(NotFoundError):
            call()
    r = requests.delete(server.url + RESPONSES + "/" + kept.id, timeout=30)
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


BAD = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0].type",
     "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input[0].content[0].image_url", "invalid_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     "input[0].content[0].image_url", "remote_images_disabled"),
    ({"max_output_tokens": 100000}, "max_output_tokens", "invalid_value"),
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"truncation": "auto"}, "truncation", "invalid_value"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#/nope"}}}}, "text.format.schema",
     "invalid_schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name", "invalid_value"),
    ({"input": [{"role": "system", "content": "Only a system message."}]}, "input", "invalid_value"),
    ({"input": 5}, "input", "invalid_type"),
]


@pytest.mark.parametrize("extra, param, code", BAD, ids=[b[1] + "-" + b[2] for b in BAD])
def test_bad_requests_are_400_in_openais_shape(server, extra, param, code):
    from openai import BadRequestError

    c = client(server)
    body = {"input": "Hello.", "max_output_tokens": 8, **extra}
    with pytest.raises(BadRequestError) as err:
        c.responses.create(model="demo", **{k: v for k, v in body.items() if k in ("input", "max_output_tokens")},
                           extra_body={k: v for k, v in body.items() if k not in ("input", "max_output_tokens")})
    e = err.value
    assert e.status_code == 400 and set(e.body) == {"message", "type", "param", "code"}
    assert (e.body["param"], e.body["code"], e.body["type"]) == (param, code, "invalid_request_error"), e.body
    raw = requests.post(server.url + RESPONSES, json=body, timeout=30)
    assert raw.status_code == 400 and raw.json()["error"]["param"] == param
    assert requests.post(server.url + RESPONSES, data=b"{", headers={"Content-Type": "application/json"},
                         timeout=30).json()["error"]["code"] == "invalid_json"


KEYS = {"alice": "key-alice", "bob": "key-bob"}


@pytest.fixture(scope="module")
def keyed_server(cache_dir):
    """A server of its own: two API keys (tenants) and a store of two responses per key."""
    from conftest import ARTIFACTS
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": "demo", "VL_CACHE_DIR": str(cache_dir), "VL_RESPONSES_STORE_ENTRIES": "2",
           "VL_API_KEYS": ",".join(f"{name}:{key}" for name, key in KEYS.items())}
    proc = ServerProcess(env, ARTIFACTS / "server-responses.log").start()
    yield proc
    proc.stop()


def test_stored_responses_are_per_key_bounded_and_gone_after_a_restart(keyed_server):
    from openai import AuthenticationError, NotFoundError, OpenAI

    def as_(name):
        return OpenAI(base_url=keyed_server.url + "/v1", api_key=KEYS[name], max_retries=0, timeout=180)

    alice, bob = as_("alice"), as_("bob")
    kw = dict(model="demo", max_output_tokens=4, temperature=0)
    first = alice.responses.create(input="One.", **kw)
    assert alice.responses.retrieve(first.id).id == first.id
    # another key neither reads, continues nor deletes it
    for call in (lambda: bob.responses.retrieve(first.id), lambda: bob.responses.delete(first.id),
                 lambda: bob.responses.create(input="Two.", previous_response_id=first.id, **kw)):
        with pytest.raises(NotFoundError):
            call()
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=keyed_server.url + "/v1", api_key="wrong", max_retries=0).responses.retrieve(first.id)
    # bob's responses do not push alice's out; her third does (two per key), least recently used first
    bob.responses.create(input="B1.", **kw)
    bob.responses.create(input="B2.", **kw)
    second = alice.responses.create(input="Two.", previous_response_id=first.id, **kw)
    alice.responses.retrieve(first.id)  # first is now the more recently used
    third = alice.responses.create(input="Three.", **kw)
    with pytest.raises(NotFoundError):
        alice.responses.retrieve(second.id)
    # a chain with a link gone is refused, naming the link, not answered shorter
    link = alice.responses.create(input="Four.", previous_response_id=third.id, **kw)
    alice.responses.delete(third.id)
    with pytest.raises(NotFoundError) as err:
        alice.responses.create(input="Five.", previous_response_id=link.id, **kw)
    assert third.id in err.value.body["message"] and err.value.body["param"] == "previous_response_id"
    # after a restart the worker's memory is empty: a clear 404, not a shorter conversation
    keyed_server.stop()
    keyed_server.start()
    with pytest.raises(NotFoundError) as err:
        alice.responses.create(input="Six.", previous_response_id=link.id, **kw)
    assert err.value.body["code"] == "previous_response_not_found" and "restarted" in err.value.body["message"]


def sse(response) -> list[tuple[str, dict]]:
    """A stream's events as (event name, data)."""
    out, name = [], None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def test_an_engine_fault_mid_stream_is_an_error_event_then_response_failed(cache_dir):
    """Through the fault-injecting app (every 8th decoding step raises): a stream that has begun
    ends with `error` and `response.failed` (the response not stored), and the next is served."""
    from conftest import ARTIFACTS
    from server import ServerProcess

    env = {"VL_MODEL": "demo", "VL_CACHE_DIR": str(cache_dir), "VL_TEST_FAIL_EVERY": "8"}
    with ServerProcess(env, ARTIFACTS / "server-responses-fault.log", app="fault_wsgi:app") as srv:
        ends = []
        for i in range(4):
            body = {"model": "demo", "input": f"Say something {i}.", "max_output_tokens": 5, "min_tokens": 5,
                    "stream": True, "result_cache": False}
            with requests.post(srv.url + RESPONSES, json=body, stream=True, timeout=60) as r:
                assert r.status_code == 200
                events = sse(r)
            assert [name for name, _ in events] == [data["type"] for _, data in events]
            assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
            ends.append([name for name, _ in events][-2:])
            if events[-1][0] == "response.failed":
                error, failed = events[-2][1], events[-1][1]["response"]
                assert error["code"] == "engine_error" and failed["status"] == "failed"
                assert failed["error"]["code"] == "engine_error"
                assert requests.get(srv.url + RESPONSES + "/" + failed["id"], timeout=30).status_code == 404
        assert ["error", "response.failed"] in ends
        after = ends[ends.index(["error", "response.failed"]) + 1:]
        assert any(end[-1] in ("response.completed", "response.incomplete") for end in after)  # served after it
