"""The OpenAPI 3.1 description of the public API, served at `GET /openapi.json`.

Written by hand as plain dicts (no schema library at run time) from what the code accepts and
returns: the request schema follows `protocol.parse_chat` field by field, with the bounds of the
running app's `Settings` (max_tokens cap, images per request, ...); the response schemas follow
`api.py` and `web.py`. `tests/test_fuzz.py` fuzzes the real server from this document and
validates every response against it, so a change of either side that makes them disagree fails
there.

Policy the schema encodes: unknown body fields are ignored (`additionalProperties: true`), the
parameters we implement are checked strictly (out of range is a 400, never clamped), and OpenAI
parameters we cannot honour (`n` > 1, `logprobs`, `tools`, non-text `response_format`) are refused.
"""

from __future__ import annotations

import base64
import struct
import zlib

from ..protocol import DETAILS, MAX_STOP, MAX_STOP_CHARS

OPENAPI_VERSION = "3.1.0"
SSE = "text/event-stream"
JSON = "application/json"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vlservice")
    except Exception:
        return "0.1.0"


def _tiny_png_data_url(size: int = 16) -> str:
    """A small valid PNG (a two-colour square) as a data URL, for the request example."""
    rows = b""
    for y in range(size):
        row = bytearray([0])  # filter: none
        for x in range(size):
            row += bytes((200, 40, 40) if (x < size // 2) ^ (y < size // 2) else (240, 240, 240))
        rows += bytes(row)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _nullable(schema: dict) -> dict:
    """`schema` or JSON null (OpenAPI 3.1 style: a type list, or anyOf for enums/consts)."""
    out = dict(schema)
    t = out.get("type")
    if "enum" in out:
        out["enum"] = list(out["enum"]) + [None]
    if isinstance(t, str):
        out["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        out["type"] = t + ["null"]
    return out


def _number(lo, hi, desc: str, integer: bool = False, nullable: bool = True, **extra) -> dict:
    s = {"type": "integer" if integer else "number", "minimum": lo, "maximum": hi, "description": desc, **extra}
    return _nullable(s) if nullable else s


def _error_response(desc: str, retry_after: bool = False) -> dict:
    resp = {"description": desc, "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}
    if retry_after:
        resp["headers"] = {"Retry-After": {"description": "seconds after which a retry is likely to be served",
                                           "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
    return resp


def _json_response(desc: str, ref: str) -> dict:
    return {"description": desc, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


# --------------------------------------------------------------------------- schemas

def _message_schemas(settings) -> dict:
    text_part = {
        "type": "object", "title": "TextPart", "required": ["type", "text"], "additionalProperties": True,
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    }
    image_part = {
        "type": "object", "title": "ImagePart", "required": ["type", "image_url"], "additionalProperties": True,
        "properties": {
            "type": {"const": "image_url"},
            "image_url": {
                "description": "an object with `url`, or the URL itself as a string",
                "anyOf": [
                    {"type": "string"},
                    {"type": "object", "required": ["url"], "additionalProperties": True, "properties": {
                        "url": {"type": "string", "description": (
                            "the image as a data URL, `data:image/<png|jpeg|webp|bmp|gif>;base64,<payload>`; the "
                            "declared type must match the data. At most "
                            f"{settings.max_image_bytes} bytes decoded and {settings.max_image_pixels} pixels. "
                            + ("http(s) URLs are fetched from an allowlist of hosts."
                               if settings.remote_images else
                               "Remote http(s) URLs are refused on this server (`remote_images_disabled`)."))},
                        "detail": _nullable({
                            "type": "string", "enum": list(DETAILS), "default": "auto",
                            "description": "resolution budget: low, auto or high (see /api/config "
                                           "`detail_max_pixels`); null or empty means auto"}),
                    }},
                ],
            },
        },
    }
    text_content = {"anyOf": [{"type": "string"},
                              {"type": "array", "items": {"$ref": "#/components/schemas/TextPart"}}]}
    user_content = {"anyOf": [
        {"type": "string"},
        {"type": "array", "description": f"text and image parts in order; at most {settings.max_images} images "
                                         "per request (all messages together)",
         "items": {"anyOf": [{"$ref": "#/components/schemas/TextPart"}, {"$ref": "#/components/schemas/ImagePart"}]}},
    ]}

    def message(roles: list, content: dict, required_content: bool = True, title: str = "") -> dict:
        return {"type": "object", "title": title, "additionalProperties": True,
                "required": ["role", "content"] if required_content else ["role"],
                "properties": {"role": {"type": "string", "enum": roles}, "content": content}}

    return {
        "TextPart": text_part,
        "ImagePart": image_part,
        "Message": {
            "description": "one chat message: images are accepted in user messages only; an assistant "
                           "message's content may be null or missing",
            "anyOf": [
                message(["system", "developer"], text_content, title="SystemMessage"),
                message(["user"], user_content, title="UserMessage"),
                message(["assistant"], _nullable_anyof(text_content), required_content=False,
                        title="AssistantMessage"),
            ],
        },
    }


def _nullable_anyof(schema: dict) -> dict:
    return {"anyOf": list(schema["anyOf"]) + [{"type": "null"}]}


def _unsupported(what: str) -> dict:
    """A parameter we cannot honour: refused unless it asks for nothing (absent, null, false, 0, "", [], {})."""
    return {"description": f"not supported ({what}): any value that asks for it is refused "
                           "(`unsupported_parameter`); an empty or false value is accepted",
            "anyOf": [{"type": "null"}, {"const": False}, {"const": 0}, {"const": ""},
                      {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}]}


def _request_schema(settings) -> dict:
    cap = settings.max_tokens_cap
    stop_str = {"type": "string", "maxLength": MAX_STOP_CHARS}
    props = {
        "messages": {
            "type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"},
            "contains": {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}},
            "description": f"the conversation; at least one user message; at most {settings.max_images} images in "
                           f"all; prompt plus max_tokens within {settings.max_context_tokens} tokens",
        },
        "model": {"type": ["string", "null"], "description": "accepted and ignored: the server serves one model "
                                                   "(see GET /v1/models)"},
        "max_tokens": _number(1, cap, f"answer length limit in tokens (default {settings.default_max_tokens})",
                              integer=True),
        "max_completion_tokens": _number(1, cap, "same as max_tokens; takes precedence when present",
                                         integer=True),
        "min_tokens": _number(0, cap, "the end-of-sequence token is forbidden before this many tokens; at most "
                                      "max_tokens", integer=True),
        "temperature": _number(0.0, 2.0, "0 = greedy; default: the model's generation config"),
        "top_p": {k: v for k, v in _number(0.0, 1.0, "nucleus sampling; must be greater than 0",
                                           exclusiveMinimum=0.0).items() if k != "minimum"},
        "top_k": _number(0, 1_000_000, "0 = off", integer=True),
        "repetition_penalty": _number(0.01, 10.0, "1 = off (vLLM / llama.cpp extension)"),
        "seed": _number(-(2**63), 2**63 - 1, "sampling seed", integer=True),
        "stop": {"description": f"up to {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters; the answer "
                                "ends before the first one",
                 "anyOf": [stop_str, {"type": "array", "maxItems": MAX_STOP, "items": stop_str}, {"type": "null"}]},
        "stream": {"type": "boolean", "default": False,
                   "description": "answer as server-sent events (`text/event-stream`), ending with `data: [DONE]`"},
        "stream_options": {"type": ["object", "null"], "additionalProperties": True,
                           "properties": {"include_usage": {"type": "boolean", "description": (
                               "one last chunk with empty `choices`, `usage` and `timings`")}}},
        "result_cache": {"type": "boolean", "default": True,
                         "description": "extension: false bypasses the cache of identical greedy requests"},
        "frequency_penalty": _number(-2.0, 2.0, "accepted for compatibility; not applied"),
        "presence_penalty": _number(-2.0, 2.0, "accepted for compatibility; not applied"),
        "n": {"type": "integer", "minimum": 1, "maximum": 1, "default": 1, "description": "only 1 is supported"},
        "logprobs": _unsupported("log probabilities"),
        "tools": _unsupported("tool calling"),
        "functions": _unsupported("function calling"),
        "audio": _unsupported("audio output"),
        "response_format": {
            "description": "only {\"type\": \"text\"} is supported",
            "anyOf": [{"type": "object", "required": ["type"], "additionalProperties": False,
                       "properties": {"type": {"const": "text"}}}, {"type": "null"}]},
    }
    return {
        "type": "object", "required": ["messages"], "properties": props, "additionalProperties": True,
        "description": "OpenAI Chat Completions request. Fields this server does not know are ignored; "
                       "known ones are validated strictly (400 naming the field).",
    }


def _timings_schema() -> dict:
    num = {"type": "number", "minimum": 0}
    count = {"type": "integer", "minimum": 0}
    return {
        "type": "object", "additionalProperties": {"type": ["number", "boolean"]},
        "description": "where the time went, in milliseconds (llama.cpp-style names); token counts as integers",
        "required": ["queue_ms", "prompt_ms", "prompt_n", "cache_n", "predicted_ms", "predicted_n", "ttft_ms",
                     "total_ms"],
        "properties": {
            "image_decode_ms": num, "preprocess_ms": num, "submit_ms": num, "queue_ms": num,
            "cache_lookup_ms": num, "vision_encode_ms": num, "vision_cache_hit": {"type": "boolean"},
            "image_tokens": count, "prompt_ms": num, "prompt_n": count, "cache_n": count,
            "prompt_per_second": num, "predicted_n": count, "predicted_ms": num, "predicted_per_second": num,
            "result_cache_hit": {"type": "boolean"}, "ttft_ms": num, "total_ms": num, "model_ms": num,
        },
    }


def _response_schemas() -> dict:
    usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
             "properties": {k: {"type": "integer", "minimum": 0}
                            for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
    finish = {"type": "string", "enum": ["stop", "length"]}
    completion = {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage", "timings"],
        "properties": {
            "id": {"type": "string", "pattern": "^chatcmpl-"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                "type": "object", "required": ["index", "message", "finish_reason"],
                "properties": {
                    "index": {"const": 0},
                    "message": {"type": "object", "required": ["role", "content"], "properties": {
                        "role": {"const": "assistant"}, "content": {"type": "string"}}},
                    "finish_reason": finish,
                    "logprobs": {"type": "null"},
                }}},
            "usage": {"$ref": "#/components/schemas/Usage"},
            "timings": {"$ref": "#/components/schemas/Timings"},
            "system_fingerprint": {"type": "string"},
        },
    }
    chunk = {
        "type": "object", "description": "one `data:` event of a streamed answer",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"}, "object": {"const": "chat.completion.chunk"}, "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "maxItems": 1, "items": {
                "type": "object", "required": ["index", "delta", "finish_reason"], "properties": {
                    "index": {"const": 0},
                    "delta": {"type": "object", "properties": {"role": {"const": "assistant"},
                                                               "content": {"type": "string"}}},
                    "finish_reason": _nullable(finish),
                    "logprobs": {"type": "null"}}}},
            "usage": {"anyOf": [{"$ref": "#/components/schemas/Usage"}, {"type": "null"}]},
            "timings": {"$ref": "#/components/schemas/Timings"},
        },
    }
    event = {
        "type": "object", "required": ["data"],
        "description": (
            "one server-sent event (OpenAPI 3.1: this schema describes each event). `data` is a JSON "
            "`ChatCompletionChunk`, or a JSON `Error` when the request fails after the stream started, and the "
            "last event is `data: [DONE]`. Comment lines (`: queued N`, `: ping`, `: prefill`, ...) keep the "
            "connection alive. Closing the connection cancels the generation."),
        "properties": {
            "data": {"anyOf": [
                {"const": "[DONE]", "description": "the end of the stream"},
                {"type": "string", "pattern": "^\\{", "contentMediaType": JSON,
                 "contentSchema": {"anyOf": [{"$ref": "#/components/schemas/ChatCompletionChunk"},
                                             {"$ref": "#/components/schemas/Error"}]}}]},
            "event": {"const": "message"},
        },
    }
    error = {
        "type": "object", "required": ["error"], "description": "every error, with the status of the response",
        "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "description": "says what was wrong: the field, the bound, the value"},
                "type": {"type": "string", "examples": ["invalid_request_error", "authentication_error",
                                                        "unavailable_error", "server_error"]},
                "param": {"type": ["string", "null"], "description": "the request field at fault, e.g. "
                                                                     "`messages[0].content[1].image_url`"},
                "code": {"type": ["string", "null"], "examples": [
                    "invalid_value", "invalid_type", "invalid_json", "unsupported_parameter", "invalid_image",
                    "image_too_large", "too_many_images", "context_length_exceeded", "request_too_large",
                    "invalid_api_key", "server_busy", "queue_timeout", "not_ready", "not_found", "cancelled"]},
            }}},
    }
    cache_stats = {"type": "object", "additionalProperties": {"type": "number"}}
    stats = {
        "type": "object",
        "required": ["cpu", "rss_bytes", "queue_depth", "busy", "cache", "kv_cache", "result_cache", "last_timings",
                     "counters", "ready", "model"],
        "properties": {
            "cpu": {"type": "object", "required": ["total", "per_core", "history"], "properties": {
                "total": {"type": "number"}, "per_core": {"type": "array", "items": {"type": "number"}},
                "history": {"type": "array", "items": {"type": "array", "items": {"type": "number"},
                                                       "minItems": 2, "maxItems": 2},
                            "description": "[unix time, total %] samples"},
                "interval_s": {"type": "number"},
                "cores_logical": {"type": ["integer", "null"]}, "cores_physical": {"type": ["integer", "null"]}}},
            "rss_bytes": {"type": "integer", "minimum": 0, "description": "resident memory of this worker"},
            "queue_depth": {"type": "integer", "minimum": 0, "description": "requests waiting for the model"},
            "busy": {"type": "boolean", "description": "the model is working"},
            "cache": {**cache_stats, "description": "vision feature cache (memory and disk tiers)"},
            "kv_cache": {**cache_stats, "description": "conversation KV caches kept for follow-ups"},
            "result_cache": {**cache_stats, "description": "answers of identical greedy requests"},
            "last_timings": {"type": "object", "additionalProperties": {"type": ["number", "boolean"]}},
            "counters": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            "encoder_calls": {"type": "integer", "minimum": 0},
            "ready": {"type": "boolean"}, "model": {"type": "string"},
        },
    }
    notice = {"type": ["object", "null"], "additionalProperties": {"type": "string"},
              "description": "demo-model notice by language (en, zh), null for a real model"}
    config = {
        "type": "object",
        "required": ["model", "demo", "demo_notice", "detail_max_pixels", "min_pixels", "token_factor",
                     "encode_ms_per_token", "default_max_tokens", "max_tokens_cap", "api_key_required",
                     "max_image_bytes", "max_images", "vision_backend"],
        "properties": {
            "model": {"type": "string"}, "demo": {"type": "boolean"}, "demo_notice": notice,
            "detail_max_pixels": {"type": "object", "required": list(DETAILS),
                                  "properties": {d: {"type": "integer"} for d in DETAILS}},
            "min_pixels": {"type": "integer"}, "token_factor": {"type": "integer"},
            "encode_ms_per_token": {"type": ["number", "null"]},
            "default_max_tokens": {"type": "integer"}, "max_tokens_cap": {"type": "integer"},
            "api_key_required": {"type": "boolean"}, "max_image_bytes": {"type": "integer"},
            "max_images": {"type": "integer"}, "vision_backend": {"type": "string"},
        },
    }
    model = {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "input_modalities": {"type": "array", "items": {"type": "string"}},
            "output_modalities": {"type": "array", "items": {"type": "string"}},
            "max_context_length": {"type": "integer"}, "demo": {"type": "boolean"}, "notice": {"type": "string"},
        },
    }
    return {
        "Usage": usage, "Timings": _timings_schema(), "ChatCompletion": completion,
        "ChatCompletionChunk": chunk, "ServerSentEvent": event, "Error": error,
        "ChatCompletionCancel": {"type": "object", "required": ["id", "object", "cancelled"], "properties": {
            "id": {"type": "string"}, "object": {"const": "chat.completion.cancel"}, "cancelled": {"const": True}}},
        "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
            "object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}},
        "Model": model,
        "Health": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}},
        "Ready": {"type": "object", "required": ["status", "model", "demo"], "properties": {
            "status": {"const": "ready"}, "model": {"type": "string"}, "demo": {"type": "boolean"},
            "notice": {"type": ["string", "null"]}, "vision_backend": {"type": "string"},
            "load_s": {"type": "number"}, "warmup_s": {"type": "number"}}},
        "Stats": stats, "Config": config,
    }


# --------------------------------------------------------------------------- paths

def _paths(settings) -> dict:
    auth = bool(settings.api_key.strip(", "))
    security = {"security": [{"bearerAuth": []}]} if auth else {"security": []}
    unauthorized = _error_response("missing or wrong API key (`invalid_api_key`); only when the server has "
                                   "an API key configured (VL_API_KEY)")
    example = {"model": "qwen3-vl", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _tiny_png_data_url(), "detail": "low"}},
        {"type": "text", "text": "Describe this image."}]}]}
    stream_example = {**example, "stream": True, "stream_options": {"include_usage": True}}
    req_headers = {"X-Request-Id": {"description": "the request id, usable with the cancel operation",
                                    "schema": {"type": "string"}},
                   "X-Queue-Position": {"description": "requests ahead of this one when it was queued",
                                        "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
    chat = {
        "post": {
            "operationId": "createChatCompletion", "tags": ["chat"], **security,
            "summary": "Answer a question about images (OpenAI Chat Completions)",
            "description": "Validated before any model work. One request runs on the model at a time; up to "
                           f"{settings.queue_size} more wait (for at most {settings.queue_timeout_s:g} s), beyond that "
                           "the server answers 429 at once.",
            "parameters": [{"name": "X-Request-Priority", "in": "header", "required": False,
                            "description": "queue priority: interactive, default or batch (interactive is "
                                           "served first); any other value means default",
                            "schema": {"type": "string", "examples": ["interactive", "default", "batch"]}}],
            "requestBody": {"required": True, "content": {JSON: {
                "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"},
                "examples": {"image": {"summary": "one image, one question", "value": example},
                             "stream": {"summary": "streamed, with usage", "value": stream_example}}}}},
            "responses": {
                "200": {"description": "the answer: JSON, or server-sent events when `stream` is true",
                        "headers": req_headers,
                        "content": {JSON: {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                                    SSE: {"schema": {"$ref": "#/components/schemas/ServerSentEvent"}}}},
                "400": _error_response("invalid request: bad JSON, a field out of range or of the wrong type, a bad "
                                       "image, too many images, context length exceeded"),
                "401": unauthorized,
                "413": _error_response(f"the request body is larger than {settings.max_request_bytes} bytes"),
                "429": _error_response("the wait queue is full (`server_busy`): retry later", retry_after=True),
                "499": _error_response("cancelled (POST .../{id}/cancel) before a non-streamed answer was complete"),
                "503": _error_response("the model is not ready yet (`not_ready`) or the request waited too long "
                                       "for the model (`queue_timeout`)", retry_after=True),
            },
        }
    }
    cancel = {
        "post": {
            "operationId": "cancelChatCompletion", "tags": ["chat"], **security,
            "summary": "Cancel a running or queued request by its id (the `id` of its answer / X-Request-Id)",
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}}],
            "responses": {
                "200": _json_response("cancelled: the generation stops within a token", "ChatCompletionCancel"),
                "401": unauthorized,
                "404": _error_response("no running request with this id (finished or unknown)"),
            },
        }
    }

    def simple(op_id: str, summary: str, ok: dict, extra: dict | None = None, tag: str = "operations",
               sec: bool = False) -> dict:
        op = {"operationId": op_id, "tags": [tag], "summary": summary, "responses": {"200": ok, **(extra or {})}}
        if sec:
            op.update(security)
            op["responses"]["401"] = unauthorized
        else:
            op["security"] = []
        return {"get": op}

    return {
        "/v1/chat/completions": chat,
        "/v1/chat/completions/{id}/cancel": cancel,
        "/v1/models": simple("listModels", "The one model served", _json_response("the model", "ModelList"),
                             tag="models", sec=True),
        "/healthz": simple("health", "Liveness: the process answers (200 while the model loads too)",
                           _json_response("alive", "Health")),
        "/readyz": simple("ready", "Readiness: the model is loaded and warmed up",
                          _json_response("ready", "Ready"),
                          {"503": _error_response("still loading or warming up (`not_ready`)")}),
        "/api/stats": simple("stats", "Live statistics of this worker: memory, queue, caches, counters, CPU",
                             _json_response("statistics", "Stats")),
        "/api/config": simple("config", "What clients need to know: limits, model, detail budgets",
                              _json_response("configuration", "Config")),
        "/metrics": simple("metrics", "Prometheus metrics", {"description": "Prometheus text format", "content": {
            "text/plain": {"schema": {"type": "string"}}}}),
        "/openapi.json": simple("openapi", "This document", {"description": "OpenAPI 3.1", "content": {
            JSON: {"schema": {"type": "object"}}}}),
    }


def spec(app) -> dict:
    """The OpenAPI 3.1 document for `app` (a Flask app built by `app.create_app`)."""
    settings = app.extensions["vlservice"].settings
    auth = bool(settings.api_key.strip(", "))
    schemas = {**_message_schemas(settings), "ChatCompletionRequest": _request_schema(settings),
               **_response_schemas()}
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "vlservice",
            "version": _version(),
            "summary": "OpenAI-compatible API for Qwen3-VL on CPU",
            "description": (
                "Chat completions about images (OpenAI Chat Completions: JSON or server-sent events), "
                "plus health, readiness, statistics and configuration endpoints. Every error is "
                "`{\"error\": {\"message\", \"type\", \"param\", \"code\"}}` with the response status."),
        },
        "paths": _paths(settings),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": ("`Authorization: Bearer <key>` on /v1/* only, and only when the server has API "
                                "keys configured (VL_API_KEY, comma separated); the operational endpoints never "
                                "need it. This server " + ("requires a key." if auth else "has no key configured: "
                                                            "no authentication is needed."))}},
        },
        "tags": [{"name": "chat"}, {"name": "models"}, {"name": "operations"}],
    }
