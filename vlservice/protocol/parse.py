"""The request body to the engine's `ChatRequest`: JSON, the tree's limits, the request model."""

import json
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..config import Settings
from ..engine.interface import ChatRequest, Message, Sampling
from ..errors import InvalidRequest
from .base import _SURROGATE, MAX_DEPTH, MAX_JSON_VALUES, ROLES
from .errors import _explain, _param
from .media import _parts
from .request import StreamOptions, grammar_of, request_model
from .tools import grammar_of_tools, offered, tools_for_template


SCAN_BYTES = 1 << 20  # the body is scanned this much at a time: the scan's own memory stays small
_QUOTE, _COMMA, _OPEN, _CLOSE = 34, 44, (91, 123), (93, 125)


def check_shape(raw: bytes) -> None:
    """Refuses a body with more than `MAX_JSON_VALUES` values or nested deeper than `MAX_DEPTH`
    before it is parsed: Python's parser takes some 100 bytes a value (an 8 MiB array of small
    numbers grew a worker by 750 MiB). This scan costs about the body's size: escaped backslashes
    and quotes dropped (C), then a megabyte at a time, which bytes lie outside strings (a running
    parity of quotes), and of those the commas and brackets, counted in numpy."""
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    view = np.frombuffer(text, np.uint8)
    inside, depth, values = 0, 0, 1
    for start in range(0, len(view), SCAN_BYTES):
        chunk = view[start:start + SCAN_BYTES]
        parity = np.bitwise_xor.accumulate((chunk == _QUOTE).view(np.uint8)) ^ inside
        inside = int(parity[-1])
        outside = parity == 0
        opens = outside & ((chunk == _OPEN[0]) | (chunk == _OPEN[1]))
        closes = outside & ((chunk == _CLOSE[0]) | (chunk == _CLOSE[1]))
        values += int(np.count_nonzero(outside & (chunk == _COMMA))) + int(np.count_nonzero(opens))
        if values > MAX_JSON_VALUES:
            raise InvalidRequest(f"the request body holds more than {MAX_JSON_VALUES} JSON values",
                                 code="invalid_json")
        if opens.any() or closes.any():
            level = depth + np.cumsum(opens.astype(np.int32) - closes)
            if int(level.max()) > MAX_DEPTH:
                raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep",
                                     code="invalid_json")
            depth = int(level[-1])


def load_body(raw: bytes):
    """The request body's JSON, once `check_shape` has bounded what parsing it costs. A parser
    error is the client's (400), never the server's."""
    check_shape(raw)
    try:
        return json.loads(raw)
    except RecursionError:
        raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep",
                             code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError included
        raise InvalidRequest("the request body must be valid JSON (Content-Type: application/json)",
                             code="invalid_json") from None


def check_tree(body) -> None:
    """Refuses, once for the whole body and before any field is read, what no later step can
    handle: nesting deeper than `MAX_DEPTH` (validators and walkers recurse) and strings with a
    lone UTF-16 surrogate (JSON's `"\\ud800"` decodes to one; it cannot be encoded as UTF-8, so the
    tokenizer, the session hash and the answer's JSON would fail on it). Unknown fields too: the
    body as a whole must be text this server can encode."""
    stack: list[tuple[Any, tuple, int]] = [(body, (), 0)]
    while stack:
        value, loc, depth = stack.pop()
        if isinstance(value, str) and _SURROGATE.search(value):
            raise _surrogate(loc, "")
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep (at "
                                     f"`{_param(loc, tags=False)}`)", code="invalid_json")
            if isinstance(value, dict) and any(_SURROGATE.search(k) for k in value):
                raise _surrogate(loc, "a key of ")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(v, (*loc, k), depth + 1) for k, v in items]))  # the first fault is named


def _surrogate(loc, where: str) -> InvalidRequest:
    """The refusal of a lone surrogate at `loc`, naming the field (for a key, the object holding it)
    and never echoing the string (it could not be written in the answer either)."""
    p = _param(loc, tags=False)
    return InvalidRequest(f"{where}`{p or 'the request body'}` holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                          "escape without its pair): text must be valid Unicode", param=p or None,
                          code="invalid_value")


def parse_chat(body, settings: Settings, defaults: dict | None = None, fetch_remote=None) -> tuple[ChatRequest, dict]:
    """(request, options) where options has `stream`, `include_usage`, `include_stages`, `model`,
    `tools` (the answer is read for tool calls).

    `defaults`: the model's generation config (temperature, top_p, top_k, repetition_penalty) for
    what the request leaves unset; `fetch_remote(url, param) -> bytes`, or None to refuse http(s)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", param=None, code="invalid_json")
    check_tree(body)
    model = request_model(settings)
    r: Any  # the model is built per Settings (request_model), so its fields are not known to the checker
    try:
        r = model.model_validate(body)
    except ValidationError as exc:
        message, param, code = _explain(exc.errors(include_url=False)[0], model)
        raise InvalidRequest(message, param=param or None, code=code) from None
    defaults = defaults or {}

    def pick(value, name, fallback):
        return value if value is not None else defaults.get(name, fallback)

    max_tokens = r.max_completion_tokens or r.max_tokens or settings.default_max_tokens
    stop = [r.stop] if isinstance(r.stop, str) else (r.stop or [])
    sampling = Sampling(
        max_tokens=max_tokens, min_tokens=r.min_tokens or 0, temperature=float(pick(r.temperature, "temperature", 0.0)),
        top_p=float(pick(r.top_p, "top_p", 1.0)), top_k=int(pick(r.top_k, "top_k", 0)),
        repetition_penalty=float(pick(r.repetition_penalty, "repetition_penalty", 1.0)),
        frequency_penalty=r.frequency_penalty or 0.0, presence_penalty=r.presence_penalty or 0.0, seed=r.seed,
        stop=tuple(s for s in stop if s), logprobs=(r.top_logprobs or 0) if r.logprobs else None,
        grammar=grammar_of(r.response_format) or grammar_of_tools(r))
    messages = [Message(ROLES[m.role], _parts(m.content, f"messages[{i}]", settings, fetch_remote,
                                              r.mm_processor_kwargs),
                        [{"name": c.function.name, "arguments": c.function.arguments}
                         for c in getattr(m, "tool_calls", None) or []])
                for i, m in enumerate(r.messages)]
    so = r.stream_options or StreamOptions()
    request = ChatRequest(messages=messages, sampling=sampling, result_cache=r.result_cache, choices=r.n or 1,
                          tools=tools_for_template(r))
    return request, {"stream": r.stream, "include_usage": so.include_usage, "include_stages": so.include_stages,
                     "model": r.model, "tools": offered(r)}
