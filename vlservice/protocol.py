"""OpenAI Chat Completions JSON in, a typed `ChatRequest` out (or an `APIError` naming the field).

One validator, run before any model work, with the abuse limits in `Settings`. Policy on
parameters: the ones we implement are checked strictly (out of range is refused, never clamped);
OpenAI parameters we do not implement are refused when they ask for something we cannot do
(`n` > 1, `logprobs`, `tools`, `response_format` other than text) and ignored when they are
neutral (`user`, `metadata`, `store`, `frequency_penalty`/`presence_penalty` of 0, ...); names
that OpenAI does not define are ignored, as OpenAI's own API does for unknown body fields.
"""

from __future__ import annotations

import base64
import binascii
import re

from .config import Settings
from .errors import APIError, InvalidImage, InvalidRequest
from .engine.types import Sampling
from .engine.images import probe
from .engine.types import ChatRequest, ImageInput, Message

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
DETAILS = ("low", "auto", "high")
MEDIA_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/webp": "webp",
               "image/bmp": "bmp", "image/x-ms-bmp": "bmp", "image/gif": "gif"}
MAX_STOP = 4
MAX_STOP_CHARS = 64
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


def _bad(msg: str, param: str | None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(msg, param=param, code=code)


def _number(body: dict, name: str, lo: float, hi: float, default, integer: bool = False):
    if name not in body or body[name] is None:
        return default
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise _bad(f"`{name}` must be {kind}, got {value!r}", name, "invalid_type")
    if not lo <= value <= hi:
        raise _bad(f"`{name}` must be between {lo} and {hi}, got {value}", name)
    return value


def parse_chat(body, settings: Settings, defaults: dict | None = None, fetch_remote=None) -> tuple[ChatRequest, dict]:
    """(request, options) where options has `stream`, `include_usage`, `include_stages`, `model`."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_json")
    defaults = defaults or {}
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise _bad(f"`n` must be 1 (one answer per request), got {n!r}", "n")
    for name in ("logprobs", "tools", "functions", "audio"):
        if body.get(name):
            raise _bad(f"`{name}` is not supported by this server", name, "unsupported_parameter")
    rf = body.get("response_format")
    if rf not in (None, {"type": "text"}):
        raise _bad("only `response_format` {\"type\": \"text\"} is supported", "response_format",
                   "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        _number(body, name, -2.0, 2.0, 0.0)

    messages = _messages(body.get("messages"), settings, fetch_remote)

    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(param)
    if max_tokens is None:
        max_tokens = settings.default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise _bad(f"`{param}` must be an integer, got {max_tokens!r}", param, "invalid_type")
    elif not 1 <= max_tokens <= settings.max_tokens_cap:
        raise _bad(f"`{param}` must be between 1 and {settings.max_tokens_cap}, got {max_tokens}", param)
    temperature = _number(body, "temperature", 0.0, 2.0, defaults.get("temperature", 0.0))
    top_p = _number(body, "top_p", 0.0, 1.0, defaults.get("top_p", 1.0))
    if top_p == 0.0:
        raise _bad("`top_p` must be greater than 0, got 0", "top_p")
    top_k = _number(body, "top_k", 0, 1_000_000, defaults.get("top_k", 0), integer=True)
    rep = _number(body, "repetition_penalty", 0.01, 10.0, defaults.get("repetition_penalty", 1.0))
    seed = _number(body, "seed", -(2**63), 2**63 - 1, None, integer=True)
    min_tokens = _number(body, "min_tokens", 0, max_tokens, 0, integer=True)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("`stop` must be a string or a list of strings", "stop", "invalid_type")
    if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise _bad(f"`stop` takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"`stream` must be a boolean, got {stream!r}", "stream", "invalid_type")
    so = body.get("stream_options")
    so = {} if so is None else so
    if not isinstance(so, dict):
        raise _bad("`stream_options` must be an object", "stream_options", "invalid_type")
    for name in ("include_usage", "include_stages"):  # include_stages: our extension, the page's stage events
        if not isinstance(so.get(name, False), bool):
            raise _bad(f"`stream_options.{name}` must be a boolean", f"stream_options.{name}", "invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("`model` must be a string", "model", "invalid_type")

    sampling = Sampling(max_tokens=max_tokens, min_tokens=min_tokens, temperature=float(temperature),
                        top_p=float(top_p), top_k=int(top_k), repetition_penalty=float(rep), seed=seed,
                        stop=tuple(s for s in stop if s))
    result_cache = body.get("result_cache", True)
    if not isinstance(result_cache, bool):
        raise _bad("`result_cache` must be a boolean", "result_cache", "invalid_type")
    request = ChatRequest(messages=messages, sampling=sampling, result_cache=result_cache)
    return request, {"stream": stream, "include_usage": bool(so.get("include_usage")),
                     "include_stages": bool(so.get("include_stages")), "model": model}


def _messages(raw, settings: Settings, fetch_remote) -> list:
    if not isinstance(raw, list) or not raw:
        raise _bad("`messages` must be a non-empty list", "messages", "invalid_type" if not isinstance(raw, list) else "empty")
    out, images = [], 0
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"`{where}` must be an object", where, "invalid_type")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"`{where}.role` must be one of system, user, assistant, got {role!r}", f"{where}.role")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        parts = []
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                pw = f"{where}.content[{j}]"
                if not isinstance(part, dict):
                    raise _bad(f"`{pw}` must be an object", pw, "invalid_type")
                kind = part.get("type")
                if kind == "text":
                    text = part.get("text")
                    if not isinstance(text, str):
                        raise _bad(f"`{pw}.text` must be a string", f"{pw}.text", "invalid_type")
                    parts.append(text)
                elif kind == "image_url":
                    if ROLES[role] != "user":
                        raise _bad(f"images are accepted in user messages only (`{pw}`)", pw)
                    images += 1
                    if images > settings.max_images:
                        raise InvalidRequest(f"at most {settings.max_images} images per request", param=pw,
                                             code="too_many_images")
                    parts.append(_image(part.get("image_url"), f"{pw}.image_url", settings, fetch_remote))
                else:
                    raise _bad(f"`{pw}.type` must be \"text\" or \"image_url\", got {kind!r}", f"{pw}.type")
        else:
            raise _bad(f"`{where}.content` must be a string or a list of parts", f"{where}.content", "invalid_type")
        out.append(Message(ROLES[role], parts))
    if not any(m.role == "user" for m in out):
        raise _bad("`messages` must contain at least one user message", "messages")
    return out


def _image(spec, param: str, settings: Settings, fetch_remote) -> ImageInput:
    if isinstance(spec, str):
        spec = {"url": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
        raise _bad(f"`{param}` must be an object with a string `url`", param, "invalid_type")
    detail = spec.get("detail")
    detail = "auto" if detail is None else detail
    if not isinstance(detail, str) or detail not in DETAILS:
        raise _bad(f"`{param}.detail` must be one of low, auto, high, got {detail!r}", f"{param}.detail")
    url = spec["url"]
    if url.startswith("data:"):
        return ImageInput(data=decode_data_url(url, param, settings.max_image_bytes), detail=detail, param=param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        if fetch_remote is None:
            raise InvalidRequest("remote image URLs are disabled on this server; send the image as a data URL "
                                 "(data:image/jpeg;base64,...)", param=param, code="remote_images_disabled")
        return ImageInput(data=fetch_remote(url, param), detail=detail, param=param)
    raise InvalidRequest(f"unsupported image URL scheme {scheme or url[:16]!r}: use a data URL", param=param,
                         code="invalid_image_url")


def decode_data_url(url: str, param: str, max_bytes: int) -> bytes:
    m = _DATA_URL.match(url[:256])
    if not m:
        raise InvalidImage("malformed data URL: expected data:image/...;base64,...", param=param)
    if not m.group("b64"):
        raise InvalidImage("the data URL must be base64-encoded (;base64,)", param=param)
    declared = (m.group("type") or "").lower()
    if declared and declared not in MEDIA_TYPES:
        raise InvalidImage(f"unsupported media type {declared!r}; send PNG, JPEG, WebP, BMP or GIF", param=param)
    payload = url[m.end():]
    if len(payload) > (max_bytes * 4) // 3 + 8:
        from .errors import ImageTooLarge

        raise ImageTooLarge(f"the image is larger than the limit of {max_bytes} bytes", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("the data URL's base64 payload is invalid", param=param) from None
    if declared:
        try:
            actual = probe(data)[0]
        except APIError as exc:
            exc.param = param
            raise
        if MEDIA_TYPES[declared] != actual:
            raise InvalidImage(f"the data URL says {declared} but the data is {actual.upper()}", param=param,
                               code="invalid_image")
    return data
