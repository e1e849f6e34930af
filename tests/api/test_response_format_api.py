"""`response_format` through the real server (Gunicorn subprocess, the bundled demo model) with the
official `openai` client: its structured-output helper (`chat.completions.parse` with a pydantic
model, and the streaming helper) returns a valid object for image requests; `json_object`; a cut
answer says "length"; bad schemas are 400 in OpenAI's error shape naming the part."""

from __future__ import annotations

import json
from typing import Literal

import pytest
import requests
from pydantic import BaseModel, Field

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


class Thing(BaseModel):
    label: Literal["circle", "square", "star", "triangle"]
    x: int = Field(ge=0, le=999)


class Picture(BaseModel):
    """A schema the demo model never saw: nested objects, enums, bounded strings, numbers, arrays."""

    caption: str = Field(max_length=32)
    colors: list[Literal["red", "green", "blue", "yellow"]] = Field(min_length=1, max_length=3)
    things: list[Thing] = Field(max_length=3)
    count: int = Field(ge=0, le=9)


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.mark.parametrize("seed", [51, 52])
def test_the_openai_parse_helper_returns_a_valid_object_for_an_image(server, seed):
    c = client(server)
    msgs = image_message(png_bytes(scene(seed=seed)), "Describe this image.")
    a = c.chat.completions.parse(model="demo", messages=msgs, response_format=Picture, max_tokens=200,
                                 temperature=0)
    choice = a.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Picture)
    assert Picture.model_validate_json(choice.message.content) == choice.message.parsed
    # streamed, through the client's streaming helper: the same answer, parsed the same
    with c.chat.completions.stream(model="demo", messages=msgs, response_format=Picture, max_tokens=200,
                                   temperature=0) as stream:
        deltas = [ev.delta for ev in stream if ev.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == choice.message.content
    assert final.choices[0].message.parsed == choice.message.parsed
    # sampled: still valid
    s = c.chat.completions.parse(model="demo", messages=msgs, response_format=Picture, max_tokens=200,
                                 temperature=1.0, seed=seed)
    assert s.choices[0].finish_reason == "stop" and isinstance(s.choices[0].message.parsed, Picture)


def test_json_object_and_a_cut_answer(server):
    msgs = image_message(png_bytes(scene(seed=53)), "Describe this image as JSON.")
    c = client(server)
    a = c.chat.completions.create(model="demo", messages=msgs, max_tokens=300, temperature=0,
                                  response_format={"type": "json_object"})
    text = a.choices[0].message.content
    if a.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert a.choices[0].finish_reason == "length" and text.startswith("{")
    cut = c.chat.completions.create(model="demo", messages=msgs, max_tokens=4, temperature=0,
                                    response_format={"type": "json_schema", "json_schema": {
                                        "name": "p", "schema": Picture.model_json_schema()}})
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 4
    assert cut.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("fmt, param", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_bad_response_formats_are_400_naming_the_part(server, fmt, param):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "response_format": fmt}
    r = requests.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


ATTACKS = {  # issue 40: each answered 500 ("the engine failed: RuntimeError") before
    "ref cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "self reference": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    "4294967295 repetition": {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{4294967295}$"}},
                              "required": ["s"]},
    "allOf of 16 patterns": {"type": "object", "properties": {"s": {"allOf": [
        {"type": "string", "pattern": "(a|b)*a(a|b){%d}" % k} for k in range(5, 21)]}}},
}


@pytest.mark.parametrize("name", ATTACKS)
def test_schemas_llguidance_cannot_serve_are_400_fast(server, name):
    import time

    schema = ATTACKS[name]
    for extra, param in (({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
                          "response_format.json_schema.schema"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                           "tool_choice": "required"}, "tools[0].function.parameters")):
        t = time.perf_counter()
        r = requests.post(server.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                                   **extra}, timeout=60)
        assert r.status_code == 400, r.text
        assert time.perf_counter() - t < 1.0
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == "invalid_schema" and err["type"] == "invalid_request_error"
