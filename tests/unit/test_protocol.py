"""The one API contract (vlservice/protocol/), without a server: what `parse_chat` accepts and
refuses (status, code, param, and a message naming the field, the bound and the value), and that
the OpenAPI document generated from the same models agrees with it, request by request."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from vlservice.config import Settings
from vlservice.errors import APIError
from vlservice.http.openapi import spec
from vlservice.protocol import MAX_DEPTH, load_body, parse_chat

SETTINGS = Settings(max_tokens_cap=512, max_images=2)
PNG = "data:image/png;base64," + base64.b64encode(cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1]).decode()
HI = [{"role": "user", "content": "hi"}]
IMG = {"type": "image_url", "image_url": {"url": PNG}}


def user(*parts) -> list:
    return [{"role": "user", "content": list(parts)}]


def refusal(body, settings=SETTINGS) -> APIError:
    with pytest.raises(APIError) as info:
        parse_chat(body, settings)
    return info.value


# (name, body, code, param, words the message must hold)
REFUSED = [
    ("body a list", [1, 2], "invalid_json", None, ["JSON object"]),
    ("messages missing", {"model": "demo"}, "invalid_type", "messages", ["`messages`"]),
    ("messages empty", {"messages": []}, "empty", "messages", ["non-empty"]),
    ("messages a string", {"messages": "hi"}, "invalid_type", "messages", ["list", "'hi'"]),
    ("message not an object", {"messages": [5]}, "invalid_type", "messages[0]", ["object"]),
    ("unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, "invalid_value", "messages[0].role",
     ["'robot'", "user"]),
    ("object role", {"messages": [{"role": {}, "content": "hi"}]}, "invalid_value", "messages[0].role", ["{}"]),
    ("content a number", {"messages": [{"role": "user", "content": 42}]}, "invalid_type", "messages[0].content",
     ["string or a list"]),
    ("user content missing", {"messages": [{"role": "user"}]}, "invalid_type", "messages[0].content", []),
    ("part type unknown", {"messages": user({"type": "audio"})}, "invalid_value", "messages[0].content[0].type",
     ["'audio'"]),
    ("part not an object", {"messages": user(7)}, "invalid_type", "messages[0].content[0]", ["object"]),
    ("part type an object", {"messages": user({"type": {}})}, "invalid_value", "messages[0].content[0].type",
     ["{}"]),
    ("text part without text", {"messages": user({"type": "text"})}, "invalid_type", "messages[0].content[0].text",
     []),
    ("image in an assistant message", {"messages": HI + [{"role": "assistant", "content": [IMG]}]},
     "invalid_value", "messages[1].content[0]", ["user messages only"]),
    ("no user message", {"messages": [{"role": "system", "content": "be brief"}]}, "invalid_value", "messages",
     ["user message"]),
    ("too many images", {"messages": user(IMG, IMG, IMG)}, "too_many_images", "messages[0].content[2]", ["2"]),
    ("detail unknown", {"messages": user({"type": "image_url", "image_url": {"url": PNG, "detail": "max"}})},
     "invalid_value", "messages[0].content[0].image_url.detail", ["'max'", "'low'"]),
    ("image_url a number", {"messages": user({"type": "image_url", "image_url": 3})}, "invalid_type",
     "messages[0].content[0].image_url", ["url"]),
    ("remote URL", {"messages": user({"type": "image_url", "image_url": "https://example.org/a.png"})},
     "remote_images_disabled", "messages[0].content[0].image_url", ["data URL"]),
    ("file URL", {"messages": user({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}})},
     "invalid_image_url", "messages[0].content[0].image_url", ["'file'"]),
    ("bad base64", {"messages": user({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}})},
     "invalid_image", "messages[0].content[0].image_url", ["base64"]),
    ("max_tokens over the cap", {"messages": HI, "max_tokens": 5000}, "invalid_value", "max_tokens",
     ["between 1 and 512", "5000"]),
    ("max_tokens a string", {"messages": HI, "max_tokens": "5"}, "invalid_type", "max_tokens", ["integer", "'5'"]),
    ("max_tokens a fraction", {"messages": HI, "max_tokens": 5.5}, "invalid_type", "max_tokens", ["integer", "5.5"]),
    ("max_completion_tokens 0", {"messages": HI, "max_completion_tokens": 0}, "invalid_value",
     "max_completion_tokens", ["between 1 and 512", "got 0"]),
    ("temperature out of range", {"messages": HI, "temperature": 5}, "invalid_value", "temperature",
     ["between 0.0 and 2.0", "got 5"]),
    ("temperature a boolean", {"messages": HI, "temperature": True}, "invalid_type", "temperature", ["number"]),
    ("top_p 0", {"messages": HI, "top_p": 0}, "invalid_value", "top_p", ["greater than 0"]),
    ("top_k negative", {"messages": HI, "top_k": -1}, "invalid_value", "top_k", ["got -1"]),
    ("repetition_penalty 0", {"messages": HI, "repetition_penalty": 0}, "invalid_value", "repetition_penalty",
     ["0.01"]),
    ("frequency_penalty 3", {"messages": HI, "frequency_penalty": 3}, "invalid_value", "frequency_penalty",
     ["between -2.0 and 2.0", "got 3"]),
    ("presence_penalty a string", {"messages": HI, "presence_penalty": "1"}, "invalid_type", "presence_penalty",
     ["number"]),
    ("seed beyond 64 bits", {"messages": HI, "seed": 2**64}, "invalid_value", "seed", [str(2**64)]),
    ("min_tokens over max_tokens", {"messages": HI, "max_tokens": 5, "min_tokens": 6}, "invalid_value",
     "min_tokens", ["max_tokens (5)", "got 6"]),
    ("n over the batch", {"messages": HI, "n": 5}, "invalid_value", "n", ["between 1 and 4", "VL_MAX_BATCH", "got 5"]),
    ("n = 0", {"messages": HI, "n": 0}, "invalid_value", "n", ["got 0"]),
    ("n = true", {"messages": HI, "n": True}, "invalid_type", "n", ["integer"]),
    ("top_logprobs over 20", {"messages": HI, "logprobs": True, "top_logprobs": 21}, "invalid_value", "top_logprobs",
     ["between 0 and 20", "21"]),
    ("logprobs not a boolean", {"messages": HI, "logprobs": 1}, "invalid_type", "logprobs", ["a boolean"]),
    ("a tool without its function", {"messages": HI, "tools": [{"type": "function"}]}, "invalid_type",
     "tools[0].function", ["required"]),
    ("functions (deprecated)", {"messages": HI, "functions": [{"name": "f"}]}, "unsupported_parameter", "functions", []),
    ("unknown response_format", {"messages": HI, "response_format": {"type": "xml"}}, "invalid_value",
     "response_format.type", ['"json_schema"', "'xml'"]),
    ("a response_format type that is not a string", {"messages": HI, "response_format": {"type": {}, "json_schema": {
        "name": "0"}}}, "invalid_value", "response_format.type", ['"json_object"']),
    ("json_schema without its object", {"messages": HI, "response_format": {"type": "json_schema"}}, "invalid_type",
     "response_format.json_schema", ["required"]),
    ("an invalid schema", {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "foo"}}}}, "invalid_schema", "response_format.json_schema.schema", ["foo"]),
    ("an unsupported schema keyword", {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}, "invalid_schema",
     "response_format.json_schema.schema", ["uniqueItems"]),
    ("a dangling $ref", {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}}}}}, "invalid_schema",
     "response_format.json_schema.schema", ["/$defs/b"]),
    ("stop a number", {"messages": HI, "stop": 5}, "invalid_type", "stop", ["list of strings"]),
    ("five stop strings", {"messages": HI, "stop": ["a"] * 5}, "invalid_value", "stop", ["at most 4"]),
    ("a long stop string", {"messages": HI, "stop": ["a" * 65]}, "invalid_value", "stop[0]", ["64"]),
    ("stream a string", {"messages": HI, "stream": "yes"}, "invalid_type", "stream", ["boolean"]),
    ("stream_options a number", {"messages": HI, "stream_options": 3}, "invalid_type", "stream_options", []),
    ("include_usage null", {"messages": HI, "stream_options": {"include_usage": None}}, "invalid_type",
     "stream_options.include_usage", ["boolean"]),
    ("model a number", {"messages": HI, "model": 3}, "invalid_type", "model", []),
    ("result_cache null", {"messages": HI, "result_cache": None}, "invalid_type", "result_cache", []),
]


@pytest.mark.parametrize("name,body,code,param,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_requests_are_refused_naming_the_field(name, body, code, param, words):
    err = refusal(body)
    assert (err.status, err.type, err.code, err.param) == (400, "invalid_request_error", code, param)
    for w in words + ([f"`{param}`"] if param and err.message.startswith("`") else []):
        assert w in err.message, err.message


def test_response_format_becomes_the_engines_grammar():
    from vlservice.engine.output.constrain import grammar_for

    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    r, _ = parse_chat({"messages": HI, "response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": schema, "strict": True}}}, Settings())
    assert r.sampling.grammar == grammar_for("json_schema", schema)
    r, _ = parse_chat({"messages": HI, "response_format": {"type": "json_object"}}, Settings())
    assert r.sampling.grammar == grammar_for("json_object")
    for fmt in (None, {"type": "text"}):
        assert parse_chat({"messages": HI, "response_format": fmt}, Settings())[0].sampling.grammar is None


def test_a_full_request_becomes_the_engines_request():
    body = {"model": "qwen3-vl", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [IMG, {"type": "text", "text": "What?"}]},
        {"role": "assistant"},
        {"role": "user", "content": [{"type": "image_url", "image_url": PNG}, {"type": "text", "text": "And?"}]}],
        "max_tokens": 3, "max_completion_tokens": 9, "min_tokens": 2, "temperature": 0.5, "top_p": 0.9,
        "frequency_penalty": 0.5, "presence_penalty": -1, "seed": -3, "stop": "END", "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": False, "tools": [], "n": None,
        "response_format": {"type": "text"}, "user": "u-1", "some_future_option": {"x": 1}}
    req, opts = parse_chat(body, SETTINGS, {"top_k": 20, "temperature": 0.7})
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.messages[0].parts == ["be brief"] and req.messages[2].parts == [""]
    first, second = req.media
    assert first.detail == second.detail == "auto" and first.data[:4] == b"\x89PNG"
    assert (first.param, second.param) == ("messages[1].content[0].image_url", "messages[3].content[0].image_url")
    s = req.sampling
    assert (s.max_tokens, s.min_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop) == (
        9, 2, 0.5, 0.9, 20, -3, ("END",))
    assert (s.frequency_penalty, s.presence_penalty) == (0.5, -1.0)
    assert parse_chat({"messages": HI, "max_tokens": 5.0, "seed": 7.0}, SETTINGS)[0].sampling.max_tokens == 5
    assert opts == {"stream": True, "include_usage": True, "include_stages": False, "model": "qwen3-vl",
                    "tools": False}


def test_unset_sampling_comes_from_the_model_then_the_server():
    req, opts = parse_chat({"messages": HI}, SETTINGS, {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                         "repetition_penalty": 1.05})
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.repetition_penalty) == (
        SETTINGS.default_max_tokens, 0.7, 0.8, 20, 1.05)
    assert (s.frequency_penalty, s.presence_penalty, s.stop) == (0.0, 0.0, ())
    assert opts["stream"] is False and req.result_cache is True
    req, _ = parse_chat({"messages": HI}, SETTINGS)
    assert req.sampling.greedy


def test_bounds_follow_the_settings():
    small = Settings(max_tokens_cap=16, default_max_tokens=8, max_images=1)
    assert "between 1 and 16" in refusal({"messages": HI, "max_tokens": 17}, small).message
    assert parse_chat({"messages": HI, "max_tokens": 16}, small)[0].sampling.max_tokens == 16
    assert refusal({"messages": user(IMG, IMG)}, small).code == "too_many_images"
    assert refusal({"messages": HI, "min_tokens": 9}, small).param == "min_tokens"  # default max_tokens 8


LONE = "a\ud800b"
TEXT_PART = {"type": "text", "text": LONE}
# (body, param): a lone surrogate in every role, in text parts, in a field and in an ignored one
SURROGATES = [
    ({"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
    ({"messages": [{"role": "system", "content": LONE}] + HI}, "messages[0].content"),
    ({"messages": [{"role": "developer", "content": [TEXT_PART]}] + HI}, "messages[0].content[0].text"),
    ({"messages": HI + [{"role": "assistant", "content": "a\udfff"}]}, "messages[1].content"),
    ({"messages": HI + [{"role": "assistant", "content": [TEXT_PART]}]}, "messages[1].content[0].text"),
    ({"messages": user(IMG, {"type": "text", "text": "ok"}, TEXT_PART)}, "messages[0].content[2].text"),
    ({"messages": [{"role": LONE, "content": "hi"}]}, "messages[0].role"),
    ({"messages": HI, "stop": ["ok", LONE]}, "stop[1]"),
    ({"messages": HI, "model": LONE}, "model"),
    ({"messages": HI, "metadata": {"Note": [LONE]}}, "metadata.Note[0]"),
    ({"messages": HI, "metadata": {LONE: 1}}, "metadata"),
]


@pytest.mark.parametrize("body,param", SURROGATES, ids=[p for _, p in SURROGATES])
def test_lone_surrogates_are_refused_naming_the_field(body, param):
    err = refusal(body)
    assert (err.status, err.code, err.param) == (400, "invalid_value", param)
    assert "surrogate" in err.message and err.message.encode("utf-8")  # never echoes the string


def test_a_surrogate_pair_is_one_character_and_accepted():
    req, _ = parse_chat(load_body(b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'), SETTINGS)
    assert req.messages[0].parts == ["\U0001f600"]


def nested(depth: int):
    body: list = []
    for _ in range(depth - 1):
        body = [body]
    return body


def test_deep_bodies_are_refused_as_invalid_json():
    raw = b"[" * 10_000 + b"]" * 10_000  # the decoder raises RecursionError at about 1000
    for err in (pytest.raises(APIError, load_body, raw).value,
                refusal({"messages": HI, "metadata": nested(MAX_DEPTH)})):
        assert (err.status, err.code, err.param) == (400, "invalid_json", None)
        assert f"more than {MAX_DEPTH} levels" in err.message
    assert parse_chat({"messages": HI, "metadata": nested(MAX_DEPTH - 1)}, SETTINGS)[0].messages


def test_bodies_that_are_not_json_text_are_refused():
    for raw in (b"{not json", b"\xff\xfe\x00", b'{"a": "\\ud800'):
        assert pytest.raises(APIError, load_body, raw).value.code == "invalid_json"


# --------------------------------------------------------------------------- the document agrees

def document(settings=SETTINGS) -> dict:
    return spec(SimpleNamespace(extensions={"vlservice": SimpleNamespace(settings=settings)}))


def test_the_document_carries_the_running_bounds():
    props = document(Settings(max_tokens_cap=300))["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert props["max_tokens"]["maximum"] == props["max_completion_tokens"]["maximum"] == 300
    assert props["frequency_penalty"]["minimum"] == -2.0 and props["presence_penalty"]["maximum"] == 2.0
    assert props["top_p"]["exclusiveMinimum"] == 0.0


def schema_validator(settings=SETTINGS):
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schemas = document(settings)["components"]["schemas"]
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/ChatCompletionRequest", "components": {"schemas": schemas}})


# Structurally valid by the document and accepted (images are real), or invalid and refused: the
# document and the validator must agree on every one. Left out: refusals the document cannot state
# (the bytes of an image, a count across messages, min_tokens over max_tokens).
AGREE = [
    {"messages": HI}, {"messages": HI, "n": 1}, {"messages": HI, "n": None}, {"messages": HI, "logprobs": 0},
    {"messages": HI, "tools": []}, {"messages": HI, "audio": ""}, {"messages": HI, "stop": ["", "x"]},
    {"messages": HI, "response_format": None}, {"messages": [{"role": "assistant", "content": None}] + HI},
    {"messages": user(IMG, {"type": "text", "text": "x", "extra": 1})}, {"messages": HI, "top_p": 1e-300},
    {"messages": HI, "temperature": 2, "seed": -(2**63)}, {"messages": HI, "stream_options": None},
    *[r[1] for r in REFUSED if r[2] not in ("invalid_json", "too_many_images", "remote_images_disabled",
                                              "invalid_image_url", "invalid_image", "invalid_schema")
      and r[0] != "min_tokens over max_tokens"],
    {"messages": HI, "response_format": {"type": "text", "strict": True}}, {"messages": HI, "n": 1.5},
    {"messages": HI, "response_format": {"type": "json_object"}},
    {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
    {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "", "schema": {}}}},
    {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": []}}},
    {"messages": HI, "response_format": {"type": "json_object", "schema": {}}},
    {"messages": HI, "n": 1.0, "top_k": 205814.0},
    {"messages": HI, "logprobs": 1}, {"messages": HI, "stream_options": {"include_stages": 1}},
    {"messages": [{"role": "system", "content": None}] + HI}, {"messages": HI, "temperature": None, "stop": None},
    {"messages": user({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA", "max_frames": -445}})},
]


def test_the_document_states_bounds_in_json_schema_words():
    """pydantic writes a bound it cannot place as its own keyword ("ge"); JSON Schema ignores it."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if "type" in node:
                found.extend(f"{where}.{k}" for k in ("ge", "gt", "le", "lt") if k in node)
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(document()["components"]["schemas"], "schemas")
    assert found == []


@pytest.mark.parametrize("body", AGREE)
def test_document_and_validator_agree(body):
    valid = schema_validator().is_valid(body)
    try:
        parse_chat(body, SETTINGS)
        accepted = True
    except APIError:
        accepted = False
    assert valid == accepted


def test_the_example_request_is_accepted_with_a_real_png():
    doc = document()
    example = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "examples"]["image"]["value"]
    req, _ = parse_chat(example, SETTINGS)
    img = cv2.imdecode(np.frombuffer(req.media[0].data, np.uint8), cv2.IMREAD_COLOR)
    assert img.shape == (16, 16, 3) and len(np.unique(img.reshape(-1, 3), axis=0)) == 2
