"""The OpenAPI 3.1 description of the public API, served at `GET /openapi.json`.

Generated: the chat request and every answer of the OpenAI routes come from the pydantic models
in `vlservice/protocol/` (the ones `parse_chat` validates with), with the bounds of the running
app's `Settings`; the operational routes' answers are the small models below. Written by hand:
only the paths, the server-sent event framing and the error responses.
`tests/api/test_fuzz.py` fuzzes the real server from this document (schema-valid requests must be
answered, schema-invalid ones refused, every answer must match), so the two cannot drift apart.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import cv2
import numpy as np
from pydantic import BaseModel, Field
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from .. import protocol
from . import openapi_peers
from ..protocol import responses as responses_protocol
from ..protocol import responses_answers

OPENAPI_VERSION = "3.1.0"
SSE = "text/event-stream"
JSON = "application/json"
REF = "#/components/schemas/{model}"


class _OpenAPI31(GenerateJsonSchema):
    """pydantic's JSON Schema, tidied for the document: no per-field titles, and `X or null` as a type
    list (`"type": ["integer", "null"]`, bounds beside it) where X is a plain type, as 3.1 allows."""

    def field_title_should_be_set(self, schema) -> bool:
        return False

    def nullable_schema(self, schema):
        inner = self.generate_inner(schema["schema"])
        if not isinstance(inner.get("type"), str) or "$ref" in inner:
            return super().nullable_schema(schema)
        out = {**inner, "type": [inner["type"], "null"]}
        if "const" in out:
            out["enum"] = [out.pop("const")]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out


# --------------------------------------------------------------------------- operational answers

class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    model: str
    demo: bool
    notice: str | None
    vision_backend: str
    load_s: float
    warmup_s: float


class Cpu(BaseModel):
    total: float
    per_core: list[float]
    history: list[tuple[float, float]] = Field(description="[unix time, total %] samples")
    interval_s: float
    cores_logical: int | None
    cores_physical: int | None


class Stats(BaseModel):
    """Live statistics of one worker."""

    cpu: Cpu
    rss_bytes: int = Field(ge=0, description="resident memory of this worker")
    queue_depth: int = Field(ge=0, description="requests waiting for the model")
    busy: bool = Field(description="the model is working")
    cache: dict[str, float] = Field(description="vision feature cache (memory and disk tiers)")
    kv_cache: dict[str, float] = Field(description="conversation KV caches kept for follow-ups")
    result_cache: dict[str, float] = Field(description="answers of identical greedy requests")
    shared_cache: dict[str, float | bool | str] | None = Field(
        None, description="the caches' Redis tier (VL_REDIS_URL): url, up, hits, misses, writes, fallbacks, outages, "
                          "corrupt; null without one")
    last_timings: dict[str, float | bool]
    counters: dict[str, int]
    ready: bool
    model: str


class Config(BaseModel):
    """What clients (the page) need to know: limits, model, detail budgets."""

    model: str
    demo: bool
    demo_notice: dict[str, str] | None = Field(description="demo-model notice by language, null for a real model")
    detail_max_pixels: dict[str, int] = Field(description="pixel budget per `detail` (low, auto, high)")
    min_pixels: int
    token_factor: int
    encode_ms_per_token: float | None
    default_max_tokens: int
    max_tokens_cap: int
    api_key_required: bool
    max_image_bytes: int
    max_images: int
    vision_backend: str


def _schemas(settings) -> dict:
    models: list[type[BaseModel]] = [protocol.request_model(settings), *protocol.ANSWERS, Health, Ready, Stats, Config]
    modes: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
        (m, "validation" if i == 0 else "serialization") for i, m in enumerate(models)]
    modes += openapi_peers.modes(settings)  # Anthropic Messages, Completions, the tokenizer routes
    modes += [(responses_protocol.responses_model(settings), "validation"),
              *((m, "serialization") for m in responses_answers.ANSWERS)]
    _, defs = models_json_schema(modes, ref_template=REF, schema_generator=_OpenAPI31)
    schemas = defs["$defs"]
    schemas["ServerSentEvent"] = {
        "type": "object", "required": ["data"],
        "description": (
            "one server-sent event (this schema describes each event). `data` is a JSON `ChatCompletionChunk`, "
            "or a JSON `Error` when the request fails after the stream started, and the last event is "
            "`data: [DONE]`. Comment lines (`: queued N`, `: ping`, `: prefill`, ...) keep the connection alive; "
            "with `stream_options.include_stages` the stages also come as `event: vlservice.stage` events "
            "whose data is `{\"stage\": ...}`. Closing the connection cancels the generation."),
        "properties": {
            "data": {"anyOf": [
                {"const": "[DONE]", "description": "the end of the stream"},
                {"type": "string", "pattern": "^\\{", "contentMediaType": JSON, "contentSchema": {"anyOf": [
                    {"$ref": REF.format(model="ChatCompletionChunk")}, {"$ref": REF.format(model="Error")},
                    {"type": "object", "required": ["stage"], "properties": {"stage": {"type": "string"}}}]}}]},
            "event": {"enum": ["message", "vlservice.stage"]},
        },
    }
    schemas["ResponseServerSentEvent"] = {
        "type": "object", "required": ["data"],
        "description": ("one event of a streamed response: `event` is its type, `data` the JSON `ResponseStreamEvent` "
                        "(no `[DONE]`: `response.completed`, `response.incomplete` or `response.failed` ends the "
                        "stream). Comment lines (`: ping`, `: prefill`, ...) keep the connection alive."),
        "properties": {
            "event": {"enum": list(responses_answers.EVENTS)},
            "data": {"type": "string", "pattern": "^\\{", "contentMediaType": JSON,
                     "contentSchema": {"$ref": REF.format(model="ResponseStreamEvent")}}},
    }
    return schemas


# --------------------------------------------------------------------------- paths

def _example_image_url(size: int = 16) -> str:
    """A small real PNG (a two-colour checker) as a data URL, for the request example."""
    half = (np.arange(size) < size // 2)
    img = np.where((half[:, None] ^ half[None, :])[..., None], (40, 40, 200), (240, 240, 240)).astype(np.uint8)
    return "data:image/png;base64," + base64.b64encode(cv2.imencode(".png", img)[1].tobytes()).decode()


def _json(desc: str, model: str) -> dict:
    return {"description": desc, "content": {JSON: {"schema": {"$ref": REF.format(model=model)}}}}


def _error(desc: str, retry_after: bool = False) -> dict:
    resp = _json(desc, "Error")
    if retry_after:
        resp["headers"] = {"Retry-After": {"description": "seconds after which a retry is likely to be served",
                                           "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
    return resp


_UNAUTHORIZED = ("missing or wrong API key (`invalid_api_key`); only when the server has an API key "
                 "configured (VL_API_KEY)")

_CHAT_PARAMETERS = [
    {"name": "X-Request-Priority", "in": "header", "required": False,
     "description": "queue priority: interactive, default or batch (interactive is served first); any other "
                    "value means default",
     "schema": {"type": "string", "examples": ["interactive", "default", "batch"]}},
    {"name": "X-Session-Id", "in": "header", "required": False,
     "description": "the conversation's session key: a load balancer hashes it onto one replica "
                    "(README, Several replicas); echoed in the answer",
     "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}}]

_CHAT_HEADERS = {
    "X-Request-Id": {"description": "the request id, usable with the cancel operation", "schema": {"type": "string"}},
    "X-Queue-Position": {"description": "requests ahead of this one when it was queued",
                         "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "X-Session-Id": {"description": "the session key: the request's X-Session-Id header, else its `user` field",
                     "schema": {"type": "string"}},
    "X-Served-By": {"description": "the replica that answered (VL_REPLICA_NAME or its host name)",
                    "schema": {"type": "string"}}}


def _chat(settings, security: list) -> dict:
    """POST /v1/chat/completions."""
    example = {"model": "qwen3-vl", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _example_image_url(), "detail": "low"}},
        {"type": "text", "text": "Describe this image."}]}]}
    return {
        "operationId": "createChatCompletion", "tags": ["chat"], "security": security,
        "summary": "Answer a question about images (OpenAI Chat Completions)",
        "description": "Validated before any model work. Up to "
                       f"{settings.queue_size} requests wait for the model (for at most {settings.queue_timeout_s:g} "
                       "s); beyond that the server answers 429 at once.",
        "parameters": _CHAT_PARAMETERS,
        "requestBody": {"required": True, "content": {JSON: {
            "schema": {"$ref": REF.format(model="ChatCompletionRequest")},
            "examples": {"image": {"summary": "one image, one question", "value": example},
                         "stream": {"summary": "streamed, with usage", "value": {
                             **example, "stream": True, "stream_options": {"include_usage": True}}}}}}},
        "responses": {
            "200": {"description": "the answer: JSON, or server-sent events when `stream` is true",
                    "headers": _CHAT_HEADERS,
                    "content": {JSON: {"schema": {"$ref": REF.format(model="ChatCompletion")}},
                                SSE: {"schema": {"$ref": REF.format(model="ServerSentEvent")}}}},
            "400": _error("invalid request: bad JSON, a field out of range or of the wrong type, a bad image, too "
                          "many images, context length exceeded"),
            "401": _error(_UNAUTHORIZED),
            "413": _error(f"the request body is larger than {settings.max_request_bytes} bytes"),
            "429": _error("the wait queue is full (`server_busy`): retry later", retry_after=True),
            "499": _error("cancelled (POST .../{id}/cancel) before a non-streamed answer was complete"),
            "503": _error("the model is not ready yet (`not_ready`) or the request waited too long for the model "
                          "(`queue_timeout`)", retry_after=True),
        },
    }


def _cancel(security: list) -> dict:
    """POST /v1/chat/completions/{id}/cancel."""
    return {
        "operationId": "cancelChatCompletion", "tags": ["chat"], "security": security,
        "summary": "Cancel a running or queued request by its id (the `id` of its answer / X-Request-Id)",
        "parameters": [{"name": "id", "in": "path", "required": True,
                        "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}}],
        "responses": {"200": _json("cancelled: the generation stops within a token", "ChatCompletionCancel"),
                      "401": _error(_UNAUTHORIZED),
                      "404": _error("no running request with this id (finished or unknown)")},
    }


def _responses(settings, security: list) -> dict:
    """/v1/responses and /v1/responses/{response_id}."""
    example = {"model": "qwen3-vl", "max_output_tokens": 8, "temperature": 0, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": _example_image_url(), "detail": "low"},
        {"type": "input_text", "text": "Describe this image."}]}]}
    response = {"response_id": {"name": "response_id", "in": "path", "required": True,
                                "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}}}
    missing = _error("no stored response with this id in this worker (expired, deleted, made with `store: false`, "
                     "kept by another worker, or the server restarted)")
    create = {
        "operationId": "createResponse", "tags": ["responses"], "security": security,
        "summary": "Answer about images (OpenAI Responses API: the subset a vision model serves)",
        "description": "Converted to the chat route's request: the same validation, limits, queue and caches. "
                       "Answers are kept (unless `store` is false) in this worker's memory, per API key, for "
                       "`previous_response_id` and GET.",
        "parameters": _CHAT_PARAMETERS,
        "requestBody": {"required": True, "content": {JSON: {
            "schema": {"$ref": REF.format(model="ResponseRequest")},
            "examples": {"image": {"summary": "one image, one question", "value": example},
                         "stream": {"summary": "streamed", "value": {**example, "stream": True}}}}}},
        "responses": {
            "200": {"description": "the response: JSON, or typed server-sent events when `stream` is true",
                    "headers": _CHAT_HEADERS,
                    "content": {JSON: {"schema": {"$ref": REF.format(model="ResponseObject")}},
                                SSE: {"schema": {"$ref": REF.format(model="ResponseServerSentEvent")}}}},
            "400": _error("invalid request: a field out of range or of the wrong type, a bad image, an item, part "
                          "or tool this server does not serve, context length exceeded"),
            "401": _error(_UNAUTHORIZED),
            "404": _error("`previous_response_id` names no stored response (`previous_response_not_found`)"),
            "413": _error(f"the request body is larger than {settings.max_request_bytes} bytes"),
            "429": _error("the wait queue is full (`server_busy`): retry later", retry_after=True),
            "499": _error("cancelled before a non-streamed answer was complete"),
            "503": _error("the model is not ready yet (`not_ready`) or the request waited too long for the model "
                          "(`queue_timeout`)", retry_after=True),
        },
    }
    one = {"tags": ["responses"], "security": security, "parameters": [response["response_id"]]}
    return {
        "/v1/responses": {"post": create},
        "/v1/responses/{response_id}": {
            "get": {**one, "operationId": "getResponse", "summary": "A stored response",
                    "responses": {"200": _json("the response", "ResponseObject"), "401": _error(_UNAUTHORIZED),
                                  "404": missing}},
            "delete": {**one, "operationId": "deleteResponse", "summary": "Delete a stored response",
                       "responses": {"200": _json("deleted", "ResponseDeleted"), "401": _error(_UNAUTHORIZED),
                                     "404": missing}}},
    }


def _get(security: list, op_id: str, summary: str, ok: dict, tag: str = "operations", keyed: bool = False,
         **more: Any) -> dict:
    """A GET operation; public unless `tag` is an API one or it is `keyed` (then behind the key like
    /v1/*: the statistics, `auth.PROTECTED`)."""
    responses = {"200": ok, **more}
    keyed = keyed or tag != "operations"
    if keyed:
        responses["401"] = _error(_UNAUTHORIZED)
    return {"get": {"operationId": op_id, "tags": [tag], "summary": summary,
                    "security": security if keyed else [], "responses": responses}}


def _paths(settings) -> dict:
    security: list[dict[str, list[str]]] = [{"bearerAuth": []}] if settings.auth else []

    def get(*args: Any, **kwargs: Any) -> dict:
        return _get(security, *args, **kwargs)

    return {
        "/v1/chat/completions": {"post": _chat(settings, security)},
        "/v1/chat/completions/{id}/cancel": {"post": _cancel(security)},
        **openapi_peers.paths(settings, security, _UNAUTHORIZED, _CHAT_PARAMETERS, _CHAT_HEADERS),
        **_responses(settings, security),
        "/v1/models": get("listModels", "The one model served", _json("the model", "ModelList"), tag="models"),
        "/healthz": get("health", "Liveness: the process answers (200 while the model loads too)",
                        _json("alive", "Health")),
        "/readyz": get("ready", "Readiness: the model is loaded and warmed up", _json("ready", "Ready"),
                       **{"503": _error("still loading or warming up (`not_ready`), or shutting down (`draining`)")}),
        "/api/stats": get("stats", "Live statistics of this worker: memory, queue, caches, counters, CPU",
                          _json("statistics", "Stats"), keyed=True),
        "/api/config": get("config", "What clients need to know: limits, model, detail budgets",
                           _json("configuration", "Config")),
        "/metrics": get("metrics", "Prometheus metrics", {"description": "Prometheus text format", "content": {
            "text/plain": {"schema": {"type": "string"}}}}, keyed=True),
        "/openapi.json": get("openapi", "This document", {"description": "OpenAPI 3.1", "content": {
            JSON: {"schema": {"type": "object"}}}}),
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vlservice")
    except Exception:
        return "0.1.0"


def spec(app) -> dict:
    """The OpenAPI 3.1 document for `app` (a Flask app built by `app.create_app`)."""
    settings = app.extensions["vlservice"].settings
    auth = bool(settings.auth)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "vlservice", "version": _version(), "summary": "OpenAI-compatible API for Qwen3-VL on CPU",
            "description": (
                "Chat completions about images (OpenAI Chat Completions: JSON or server-sent events), plus health, "
                "readiness, statistics and configuration endpoints. Every error is `{\"error\": {\"message\", "
                "\"type\", \"param\", \"code\"}}` with the response status."),
        },
        "paths": _paths(settings),
        "components": {
            "schemas": openapi_peers.schemas(_schemas(settings), openapi_peers.vocab_of(app)),
            "securitySchemes": {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": ("`Authorization: Bearer <key>` on /v1/* only, and only when the server has API "
                                "keys configured (VL_API_KEY, comma separated); the operational endpoints never "
                                "need it. This server " + ("requires a key." if auth else
                                                            "has no key configured: no authentication is needed."))}},
        },
        "tags": [{"name": "chat"}, {"name": "responses"}, {"name": "models"}, {"name": "operations"},
                 *openapi_peers.TAGS],
    }
