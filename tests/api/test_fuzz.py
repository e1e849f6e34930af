"""Fuzz the real server from its own OpenAPI description, and a short soak run.

Schemathesis loads `/openapi.json` from the running `server` fixture and, for every operation,
sends the schema's examples, boundary values (its coverage phase) and random valid and invalid
requests (`generation.mode = all`), with every check on: no 5xx; a documented status code, content
type and headers; a body (JSON or each server-sent event, chunks included) that validates against
the schema; schema-valid requests answered (2xx, or 429 when the queue is full), schema-invalid
ones refused (4xx); undeclared methods 405 with `Allow`. Afterwards the server must still answer
`/healthz` and `/readyz`.

The run is bounded (`VL_FUZZ_EXAMPLES`, 25 random examples per operation on top of the examples
and boundary cases); for a longer one: `VL_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest
tests/api/test_fuzz.py -k conforms`.

Before a chat request is sent, `fit` makes true what JSON Schema cannot state, so that a
schema-valid request is one the server must answer: every image URL becomes a real image and every
video URL a real clip, images past the server's `max_images` and videos past its `max_videos`
(counted over all messages) become text parts, a video's `max_frames` stays within the server's
limit, and `min_tokens` stays within `max_tokens`. Generation stays short: a body without max_tokens gets
`FUZZ_MAX_TOKENS`, and max_tokens / max_completion_tokens within bounds become at most that
(out-of-range values are kept: they are the invalid cases). Schemathesis re-checks an edited body
against the schema, so a case is judged as what is actually sent. Anthropic's `/v1/messages` (and
`count_tokens`), `/v1/completions`, `/tokenize`'s messages and `/v1/responses` are fitted the same
way (`fit_messages`, `fit_completion`, the chat's `fit`, `fit_responses`): real images, short answers, a user message
last, the tools' rules; only values of a valid shape are changed, so a schema-invalid case stays one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import requests

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402  (schemathesis depends on hypothesis)

from conftest import ROOT, data_url, make_clip, png_bytes, scene  # noqa: E402
from vlservice.config import Settings  # noqa: E402

server_test = pytest.mark.server  # conftest adds `slow` to every `server` test; both are explicit here
slow = pytest.mark.slow

EXAMPLES = int(os.environ.get("VL_FUZZ_EXAMPLES", "25"))
FUZZ_MAX_TOKENS = 8
CHAT = "/v1/chat/completions"
IMAGE = data_url(png_bytes(scene(32, 48, seed=3)))
LIMITS: dict = {}  # the running server's, read by `api_schema`
DEFAULT_SETTINGS = Settings()  # the test server runs with the default media budgets
FLOOR_PIXELS = 1  # a min_pixels at or below every item's resolved budget
CLIP: list = []  # a real clip's data URL, made once by `api_schema`


@pytest.fixture(scope="module")
def api_schema(server, tmp_path_factory):
    config = requests.get(server.url + "/api/config", timeout=10).json()
    LIMITS.update(max_images=config["max_images"], cap=config["max_tokens_cap"],
                  default=config["default_max_tokens"], max_videos=config["video"]["max_videos"],
                  max_frames=config["video"]["max_frames"])
    CLIP.append(data_url(make_clip(tmp_path_factory.mktemp("fuzz-clip"), "VP80", fps=10.0, frames=20, size=(64, 64)),
                         "video/webm"))
    config = schemathesis.Config.from_dict({
        "generation": {"max-examples": EXAMPLES, "database": "none", "mode": "all"},
        "request-timeout": 120,
    })
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _schemathesis_pytest9_shim(request):
    """schemathesis 4.32's lazy loader renames tests through `request.node._nodeid`, which pytest 9
    no longer has; give the node one (only the subtest labels use it)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    yield


def _is_int(v) -> bool:
    """An integer as JSON Schema reads it (schemathesis sends 257.0 for one too)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()


def fit_tools(body: dict) -> None:
    """The tools' rules across fields (the schema cannot say them): unique names, a forced choice
    only with tools and naming one of them, no `response_format` beside a forced call, and the
    forced functions' `parameters` left to the server's default (a random schema may not compile)."""
    tools = body.get("tools")
    ok = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
          and isinstance(t["function"].get("name"), str)] if isinstance(tools, list) else []
    for i, f in enumerate(ok):
        if any(g["name"] == f["name"] for g in ok[:i]):  # a repeated valid name made unique, still valid
            f["name"] = f"{f['name'][:56]}_{i}"
    choice = body.get("tool_choice")
    named = (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
             and isinstance(choice["function"].get("name"), str))  # a valid shape: an invalid one stays as it is
    if not (choice == "required" or named):
        return
    if not ok:
        body["tool_choice"] = "auto"
        return
    if named:
        choice["function"]["name"] = ok[0]["name"]
    body["response_format"] = None
    for f in ok:
        f["parameters"] = None


RESPONSES = "/v1/responses"


def fit_responses(body: dict) -> None:
    """A Responses request's rules the schema cannot say, as `fit` and `fit_tools` make the chat
    request's: short answers, real images (at most `max_images`) and clips (through `fit`), media
    in user messages only, the tools' rules, no `text.format` beside a forced call."""
    limit = body.get("max_output_tokens")
    if limit is None or (_is_int(limit) and FUZZ_MAX_TOKENS < limit <= LIMITS["cap"]):
        body["max_output_tokens"] = FUZZ_MAX_TOKENS
    limit = body["max_output_tokens"] if body.get("max_output_tokens") is not None else LIMITS["default"]
    if _is_int(body.get("min_tokens")) and _is_int(limit) and limit < body["min_tokens"] <= LIMITS["cap"]:
        body["min_tokens"] = limit
    user_parts = []
    for item in body.get("input") if isinstance(body.get("input"), list) else []:
        parts = item.get("content") if isinstance(item, dict) else None
        if not isinstance(parts, list):
            continue
        media = any(isinstance(p, dict) and p.get("type") in ("input_image", "video_url", "input_video") for p in parts)
        if media and item.get("role") in ("system", "developer", "assistant"):
            item["role"] = "user"  # media go in user messages (valid or not, the item stays so)
        if item.get("role") == "user":
            user_parts.append(parts)
    # videos as the chat route's fitting makes them (real clips, the server's limits), in these parts
    fit(SimpleNamespace(body={"messages": [{"role": "user", "content": p} for p in user_parts], "max_tokens": 1},
                        operation=SimpleNamespace(path=CHAT)))
    images = 0
    for parts in user_parts:
        for i, part in enumerate(parts):
            if part == {"type": "text", "text": ""}:  # a video over the limit, as `fit` writes it
                parts[i] = {"type": "input_text", "text": ""}
            elif isinstance(part, dict) and part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                images += 1
                if images <= LIMITS["max_images"]:
                    part["image_url"] = IMAGE
                elif part.get("detail") in (None, "low", "auto", "high"):
                    parts[i] = {"type": "input_text", "text": ""}
    tools = body.get("tools")
    ok = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)] if isinstance(tools, list) else []
    for i, t in enumerate(ok):
        if any(u["name"] == t["name"] for u in ok[:i]):
            t["name"] = f"{t['name'][:56]}_{i}"
        if isinstance(t.get("input_schema"), dict) and len(json.dumps(t["input_schema"])) > 2000:
            t["input_schema"] = {"type": "object"}  # the rendered tools within the context (a limit the schema lacks)
    choice = body.get("tool_choice")
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str)
    if not (choice == "required" or named):
        return
    if not ok:
        body["tool_choice"] = "auto"
        return
    if named:
        choice["name"] = ok[0]["name"]
    body.pop("text", None)
    for t in ok:
        t["parameters"] = None


MESSAGES, COUNT_TOKENS, COMPLETIONS = "/v1/messages", "/v1/messages/count_tokens", "/v1/completions"
TOKENIZE = ("/tokenize", "/v1/tokenize")


TEXT_BUDGET = 8000  # characters of JSON: well inside the server's 8,192-token context whatever the text


def _shorten(value, most: int):
    """Every string in `value` cut to `most` characters, the structure and every type kept (so a
    schema-valid body stays valid and an invalid one invalid): the context limit the schema lacks."""
    if isinstance(value, str):
        return value[:most]
    if isinstance(value, list):
        return [_shorten(v, most) for v in value]
    if isinstance(value, dict):
        return {k: _shorten(v, most) for k, v in value.items()}
    return value


def fit_messages(body: dict) -> None:
    """An Anthropic request's rules the schema cannot say: a short answer, a user message last (no
    prefill), real images (at most `max_images`), unique tool names, a forced choice only with tools
    and naming one of them, the forced tools' schemas left open (a random one may not compile), the
    text within the context (`_shorten`)."""
    if _is_int(body.get("max_tokens")) and FUZZ_MAX_TOKENS < body["max_tokens"] <= LIMITS["cap"]:
        body["max_tokens"] = FUZZ_MAX_TOKENS
    for key in ("messages", "system"):
        if key in body and len(json.dumps(body[key])) > TEXT_BUDGET:
            body[key] = _shorten(body[key], 64)
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
            and messages[-1].get("role") == "assistant":
        messages.append({"role": "user", "content": "Hi"})
    images = 0
    for m in messages if isinstance(messages, list) else []:
        blocks = m.get("content") if isinstance(m, dict) else None
        for i, b in enumerate(blocks if isinstance(blocks, list) else []):
            source = b.get("source") if isinstance(b, dict) and b.get("type") == "image" else None
            if isinstance(source, dict) and (isinstance(source.get("url"), str) if source.get("type") == "url" else
                                             source.get("type") == "base64" and isinstance(source.get("data"), str)
                                             and source.get("media_type") in ("image/jpeg", "image/png", "image/gif",
                                                                              "image/webp")):
                images += 1  # a valid shape (an invalid one stays as it is): its image a real one
                blocks[i] = {"type": "text", "text": ""} if images > LIMITS["max_images"] else {
                    "type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                "data": IMAGE.split(",", 1)[1]}}
    tools = body.get("tools")
    ok = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)] if isinstance(tools, list) else []
    for i, t in enumerate(ok):
        if any(u["name"] == t["name"] for u in ok[:i]):
            t["name"] = f"{t['name'][:56]}_{i}"
        if isinstance(t.get("input_schema"), dict) and len(json.dumps(t["input_schema"])) > 2000:
            t["input_schema"] = {"type": "object"}  # the rendered tools within the context (a limit the schema lacks)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool") and isinstance(choice.get("name"), (str, type(None))) \
            and isinstance(choice.get("disable_parallel_tool_use"), (bool, type(None))):  # a valid shape, made to fit
        if not ok:
            body["tool_choice"] = {"type": "auto"}
            return
        if choice["type"] == "tool":
            choice["name"] = ok[0]["name"]
        for t in ok:
            if isinstance(t.get("input_schema"), dict):
                t["input_schema"] = {"type": "object"}
        if isinstance(body.get("output_config"), dict):  # one grammar per answer: the calls (an invalid
            body.pop("output_config")  # output_config stays: a negative case must stay negative)


def fit_completion(body: dict) -> None:
    """A short answer, and `min_tokens` within it."""
    if body.get("max_tokens") is None or (_is_int(body["max_tokens"]) and FUZZ_MAX_TOKENS < body["max_tokens"]
                                          <= LIMITS["cap"]):
        body["max_tokens"] = FUZZ_MAX_TOKENS
    if _is_int(body.get("min_tokens")) and _is_int(body["max_tokens"]) and \
            body["max_tokens"] < body["min_tokens"] <= LIMITS["cap"]:
        body["min_tokens"] = body["max_tokens"]


def fit(case) -> None:
    body = case.body
    path = case.operation.path
    if path in (MESSAGES, COUNT_TOKENS) and isinstance(body, dict):
        return fit_messages(body)
    if path == COMPLETIONS and isinstance(body, dict):
        return fit_completion(body)
    if path in TOKENIZE and isinstance(body, dict) and "messages" in body:  # a chat's messages and tools
        return fit(SimpleNamespace(body=body, operation=SimpleNamespace(path=CHAT)))
    if case.operation.path == RESPONSES and isinstance(body, dict):
        fit_responses(body)
        return
    if case.operation.path != CHAT or not isinstance(body, dict):
        return
    if body.get("max_completion_tokens", body.get("max_tokens")) is None:
        body["max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"] = FUZZ_MAX_TOKENS
    for key in ("max_completion_tokens", "max_tokens"):
        if _is_int(body.get(key)) and FUZZ_MAX_TOKENS < body[key] <= LIMITS["cap"]:
            body[key] = FUZZ_MAX_TOKENS
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or LIMITS["default"]
    if _is_int(body.get("min_tokens")) and _is_int(limit) and limit < body["min_tokens"] <= LIMITS["cap"]:
        body["min_tokens"] = limit
    if _is_int(body.get("top_logprobs")) and 0 < body["top_logprobs"] <= 20 and body.get("logprobs") is not True:
        body["logprobs"] = True  # top_logprobs needs logprobs (OpenAI's rule; the schema cannot say it)
    fit_tools(body)
    images = videos = 0

    def fit_frames(part: dict, inner) -> None:
        """The server's frame limit and min <= max, limits of the running server the schema does not
        carry; max and min each resolved as the server does, the inner object's field first, then the
        part's (a min in one place is held to a max in the other)."""
        places = [w for w in (inner, part) if isinstance(w, dict)]
        for where in places:
            if _is_int(where.get("max_frames")) and where["max_frames"] > LIMITS["max_frames"]:
                where["max_frames"] = LIMITS["max_frames"]
        given = next((w["max_frames"] for w in places if w.get("max_frames") is not None), None)
        most = given if _is_int(given) and given >= 4 else LIMITS["max_frames"]
        for where in places:
            if _is_int(where.get("min_frames")) and most < where["min_frames"]:
                where["min_frames"] = most

    def fit_pixels(where) -> None:
        """Pixel budgets within the server's (an image's and a video frame's; the schema carries no cap)
        and a floor under them."""
        if not isinstance(where, dict):
            return
        cap = min(DEFAULT_SETTINGS.detail_high_pixels, DEFAULT_SETTINGS.video_detail_high_pixels)
        if _is_int(where.get("max_pixels")) and where["max_pixels"] > cap:
            where["max_pixels"] = cap
        if _is_int(where.get("min_pixels")) and where["min_pixels"] > FLOOR_PIXELS:
            where["min_pixels"] = FLOOR_PIXELS

    fit_pixels(body.get("mm_processor_kwargs"))
    for message in body.get("messages") if isinstance(body.get("messages"), list) else []:
        parts = message.get("content") if isinstance(message, dict) else None
        for i, part in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(part, dict):
                fit_pixels(part)
                fit_pixels(part.get(part.get("type")) if isinstance(part.get("type"), str) else None)
            if isinstance(part, dict) and part.get("type") in ("input_video", "video_url"):
                fit_frames(part, part.get(part["type"]))
            if isinstance(part, dict) and part.get("type") == "input_video":
                videos += 1  # llama.cpp's spelling of a video part: the same limit; its data a real clip
                spec = part.get("input_video")
                if videos > LIMITS["max_videos"]:
                    parts[i] = {"type": "text", "text": ""}
                elif isinstance(spec, str):
                    part["input_video"] = CLIP[0].split(",", 1)[1]
                elif isinstance(spec, dict):
                    if spec.get("data") is None and spec.get("url") is None:
                        spec["url"] = CLIP[0]  # the schema allows neither; the server needs one
                    if isinstance(spec.get("data"), str):
                        spec["data"] = CLIP[0].split(",", 1)[1]
                    if isinstance(spec.get("url"), str):
                        spec["url"] = CLIP[0]
                continue
            if isinstance(part, dict) and part.get("type") == "video_url" and isinstance(part.get("video_url"), dict):
                videos += 1
                spec = part["video_url"]
                if videos > LIMITS["max_videos"]:
                    parts[i] = {"type": "text", "text": ""}
                    continue
                if isinstance(spec.get("url"), str):
                    spec["url"] = CLIP[0]
                if _is_int(spec.get("max_frames")) and spec["max_frames"] > LIMITS["max_frames"]:
                    spec["max_frames"] = LIMITS["max_frames"]
            if not (isinstance(part, dict) and part.get("type") == "image_url"):
                continue
            images += 1
            if images > LIMITS["max_images"]:
                parts[i] = {"type": "text", "text": ""}
            elif isinstance(part.get("image_url"), str):
                part["image_url"] = IMAGE
            elif isinstance(part.get("image_url"), dict) and isinstance(part["image_url"].get("url"), str):
                part["image_url"]["url"] = IMAGE


@schema.parametrize()
@slow
@server_test
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_api_conforms_to_its_openapi(case):
    fit(case)
    case.call_and_validate(timeout=120)


@pytest.mark.parametrize("api_key", ["", "k1, k2"])
def test_openapi_document_is_valid_openapi_31(api_key):
    """No server: the document for given settings validates against the OpenAPI 3.1 meta-schema,
    and the bearer scheme applies to what the key protects (/v1/*, /api/stats, /metrics) only when
    a key is configured."""
    from types import SimpleNamespace

    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    from vlservice.config import Settings
    from vlservice.http.openapi import spec

    settings = Settings(api_key=api_key, max_tokens_cap=300)
    doc = spec(SimpleNamespace(extensions={"vlservice": SimpleNamespace(settings=settings)}))
    errors = [str(e)[:300] for e in OPENAPI_31_VALIDATOR.iter_errors(doc)]
    assert errors == []
    json.dumps(doc)  # plain JSON
    from vlservice.http.auth import PROTECTED

    want = [{"bearerAuth": []}] if api_key else []
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert op["security"] == (want if path.startswith(PROTECTED) else []), path
            assert ("401" in op["responses"]) == path.startswith(PROTECTED), path
    props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert props["max_tokens"]["maximum"] == props["max_completion_tokens"]["maximum"] == 300
    # the example request is a valid chat request with a real PNG
    from vlservice.engine.media.images import probe
    from vlservice.protocol import parse_chat

    example = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "examples"]["image"]["value"]
    req, _ = parse_chat(example, settings)
    assert probe(req.media[0].data) == ("png", 16, 16)
    import cv2
    import numpy as np

    assert cv2.imdecode(np.frombuffer(req.media[0].data, np.uint8), cv2.IMREAD_COLOR).shape == (16, 16, 3)


@slow
@server_test
def test_openapi_document_describes_this_server(server):
    doc = requests.get(server.url + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    cfg = requests.get(server.url + "/api/config", timeout=10).json()
    req = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert req["properties"]["max_tokens"]["maximum"] == cfg["max_tokens_cap"] == 512
    assert req["additionalProperties"] is True and req["required"] == ["messages"]
    assert {"/v1/chat/completions", "/v1/chat/completions/{id}/cancel", "/v1/models", "/healthz", "/readyz",
            "/api/stats", "/api/config"} <= set(doc["paths"])
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"200", "400", "401", "413", "429", "503"} <= set(chat["responses"])
    assert {"application/json", "text/event-stream"} == set(chat["responses"]["200"]["content"])
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert chat["security"] == []  # the test server has no API key


@slow
@server_test
def test_object_role_is_refused_with_400(server):
    """Found by the fuzzer: a JSON object as a role once raised TypeError (a 500)."""
    r = requests.post(server.url + CHAT, json={"messages": [{"role": {}, "content": "Hi"}], "max_tokens": 1},
                      timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"


@slow
@server_test
def test_server_still_healthy_after_fuzzing(server):
    r = requests.get(server.url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert requests.get(server.url + "/readyz", timeout=10).status_code == 200
    stats = requests.get(server.url + "/api/stats", timeout=10).json()
    assert stats["ready"] is True


@slow
@server_test
def test_soak_short_run_passes(server, tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--url", server.url, "--seconds", "18",
                        "--sample-every", "5", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\| kind +\|", r.stdout) and "Verdict: PASS" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["verdict"] == "PASS" and rep["reasons"] == []
    assert set(rep["kinds"]) == {"new_image", "repeat_image", "follow_up", "stream", "clip", "cancel_close",
                                 "cancel_api", "bad_base64", "not_image", "bad_json", "over_cap"}
    for k in rep["kinds"].values():
        assert {"sent", "ok", "cancelled", "refused", "unexpected", "p50_ms", "p95_ms"} <= set(k)
    t = rep["totals"]
    assert t["sent"] > 0 and t["ok"] > 0 and t["unexpected"] == 0 and t["lost"] == 0
    assert t["expected_refusals"] > 0  # the bad inputs were refused, not served
    assert rep["server"]["accepted"] == rep["server"]["finished"] and rep["server"]["healthy_after"]
    m = rep["memory"]
    assert m["rss_start_mb"] > 0 and m["rss_end_mb"] > 0 and len(m["samples"]) >= 3
    assert m["trend_judged"] is False  # 18 s is too short to judge a trend
    assert isinstance(m["slope_mb_per_min"], float)
    assert isinstance(m["unexplained_slope_mb_per_min"], float) and m["threshold_mb_per_min"] == 2.0
    assert set(m["caches"]) == {"cache", "kv_cache"} and m["caches"]["kv_cache"]["capacity_bytes"] > 0


@slow
@server_test
def test_soak_sends_only_the_chosen_kinds(server, tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--url", server.url, "--seconds", "6",
                        "--sample-every", "3", "--kinds", "new_image", "bad_json", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = json.loads(out.read_text())["kinds"]
    assert kinds["new_image"]["sent"] > 0 and kinds["bad_json"]["sent"] > 0
    assert all(k["sent"] == 0 for name, k in kinds.items() if name not in ("new_image", "bad_json"))
    bad = subprocess.run([sys.executable, "-m", "vlservice", "soak", "--url", server.url, "--seconds", "1",
                          "--kinds", "nonsense"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown kind" in bad.stderr
