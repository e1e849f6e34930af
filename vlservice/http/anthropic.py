"""HTTP glue for the Anthropic Messages API: `POST /v1/messages` (JSON or Anthropic's SSE events) and
`POST /v1/messages/count_tokens`.

A request is read as the chat request it means (`protocol.anthropic.chat_body`) and runs through
the chat path: `parse_chat`, then the service's `submit` (or `prompt_ids` to count), so caches,
limits, grammars, tenants, cancellation and the metrics are the chat's. Errors are written once by
the app's handler; `_anthropic_errors` then restates any error of these routes in Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`, the type from the status).

Which stop sequence ended an answer: the engine reports "stop" for the end token and for a stop
string alike, so a request with `stop_sequences` asks the engine for its tokens' entries (`logprobs`
with no alternatives) and reads the text they spell past the answer. Such requests skip the result
cache (it keeps no entries).
"""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager

from flask import Blueprint, Response, g, request

from ..engine.output.toolcalls import CallStream
from ..errors import APIError
from ..protocol import parse_chat
from ..protocol.anthropic import CountTokensRequest, Renames, chat_body, explain, messages_model
from ..protocol.anthropic_answers import (AnthropicError, AnthropicErrorDetail, AnthropicMessage, AnthropicUsage,
                                          ContentBlockDelta, ContentBlockStart, ContentBlockStop, CountTokensAnswer,
                                          DeltaUsage, InputJsonDelta, MessageDelta, MessageDeltaBody, MessageStart,
                                          MessageStop, Ping, TextContent, TextDelta, ToolUseContent, error_type)
from ..protocol.answers import answer
from ..protocol.completions import validate
from .appstate import current
from .common import admit, count_requests, read_json, request_headers, sse_response
from .disconnect import cancel_on_disconnect
from .openai import PING_EVERY_S

bp = Blueprint("anthropic", __name__)
PATH = "/v1/messages"


@bp.after_app_request
def _count(response: Response) -> Response:
    return count_requests(f"{bp.name}.messages", response)


@bp.after_app_request
def _anthropic_errors(response: Response) -> Response:
    """An error of these routes (from the route, the key check, the body's size, a wrong method) in
    Anthropic's shape, with the status the app's error handler chose."""
    if not request.path.startswith(PATH) or response.status_code < 400 or response.is_streamed:
        return response
    try:
        body = json.loads(response.get_data())
    except ValueError:
        return response
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and body.get("type") != "error":
        message, param = str(err.get("message") or ""), err.get("param")
        if param and f"`{param}" not in message:  # Anthropic's shape has no `param`: the message names it
            message += f" (`{param}`)"
        response.set_data(answer(_error(response.status_code, message)))
    return response


def _error(status: int, message: str) -> AnthropicError:
    return AnthropicError(type="error", error=AnthropicErrorDetail(type=error_type(status), message=message))


@contextmanager
def _renamed(names: Renames):
    """An error about the chat request names the field of this request the client wrote."""
    try:
        yield
    except APIError as exc:
        new = names.param(exc.param)
        exc.message, exc.param = names.message(exc.message, exc.param, new), new
        raise


@bp.post(PATH)
def messages():
    ctx = current()
    record = g.chat_record = ctx.metrics.chat_started()
    body = read_json()
    r = validate(messages_model(ctx.settings), body, explain)
    chat, names = chat_body(r, max_tokens=r.max_tokens)
    with _renamed(names):
        req, opts = parse_chat(chat, ctx.settings, ctx.service.generation_defaults, ctx.fetch_remote)
        req.id = "msg_" + uuid.uuid4().hex[:24]
        admit(req, chat)
        stops = req.sampling.stop
        if stops and req.sampling.logprobs is None:
            req.sampling.logprobs = 0  # the tokens' entries tell which stop sequence ended it
        with cancel_on_disconnect(req, request.environ):
            gen = ctx.service.submit(req)
    model = ctx.service.model_name
    headers = request_headers(gen)
    if r.stream:
        return sse_response(gen, _sse(gen, model, opts["tools"], record), record)
    with cancel_on_disconnect(gen, request.environ):
        result = record.result = gen.result()
    blocks = _Blocks(opts["tools"])
    content = [b for kind, b in [*blocks.feed(result["text"]), *blocks.end()] if kind == "block"]
    reason, sequence = _stop_reason(result["finish_reason"], blocks.called, stops, result["text"],
                                    result.get("logprobs"))
    usage = result["usage"]
    out = AnthropicMessage(id=gen.id, type="message", role="assistant", model=model, content=content,
                           stop_reason=reason, stop_sequence=sequence, timings=result["timings"],
                           usage=AnthropicUsage(input_tokens=usage["prompt_tokens"],
                                                output_tokens=usage["completion_tokens"]))
    return Response(answer(out), mimetype="application/json", headers=headers)


@bp.post(PATH + "/count_tokens")
def count_tokens():
    ctx = current()
    r = validate(CountTokensRequest, read_json(), explain)
    chat, names = chat_body(r)
    with _renamed(names):
        req, _ = parse_chat(chat, ctx.settings, ctx.service.generation_defaults, ctx.fetch_remote)
        req.tenant = g.get("tenant", "")
        with cancel_on_disconnect(req, request.environ):
            ids = ctx.service.prompt_ids(req)
    return Response(answer(CountTokensAnswer(input_tokens=len(ids))), mimetype="application/json")


def _stop_reason(finish: str, called: bool, stops: tuple, text: str, entries) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) of an answer whose engine `finish` was "stop" or
    "length"; with stop sequences, the text its tokens spell past `text` says which one it met."""
    if finish == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if stops and entries is not None:
        spelt = b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", errors="replace")
        rest = spelt[len(text):] if spelt.startswith(text) else spelt
        hit = next((s for s in stops if rest.startswith(s)), None) or next((s for s in stops if s in rest), None)
        if hit is not None:
            return "stop_sequence", hit
    return "end_turn", None


def _tool_use(call) -> ToolUseContent:
    return ToolUseContent(type="tool_use", id="toolu_" + uuid.uuid4().hex[:24], name=call.name,
                          input=json.loads(call.arguments))


class _Blocks:
    """An answer's text as Anthropic's content blocks, in order, whether it comes whole or a piece at a
    time (so the streamed answer is the same as the whole one): ("event", model) for a stream,
    ("block", model) for each finished block. With tools offered, each call block (one
    `<tool_call>`, read by `CallStream` as chat reads it) becomes a `tool_use` block."""

    def __init__(self, tools: bool):
        self.calls = CallStream() if tools else None
        self.index = -1
        self.text: TextContent | None = None  # the open text block
        self.called = False

    def feed(self, piece: str) -> list:
        out: list = []
        for kind, value in (self.calls.feed(piece) if self.calls is not None else [("text", piece)]):
            if kind == "text" and value:
                out += self._text(str(value))
            elif kind == "call":
                out += self._close()
                self.called = True
                self.index += 1
                block = _tool_use(value)
                out += [("event", ContentBlockStart(type="content_block_start", index=self.index, content_block=
                                                    ToolUseContent(type="tool_use", id=block.id, name=block.name,
                                                                   input={}))),
                        ("event", ContentBlockDelta(type="content_block_delta", index=self.index, delta=InputJsonDelta(
                            type="input_json_delta", partial_json=json.dumps(block.input, ensure_ascii=False)))),
                        ("event", ContentBlockStop(type="content_block_stop", index=self.index)), ("block", block)]
        return out

    def _text(self, text: str) -> list:
        out: list = []
        if self.text is None:
            self.index += 1
            self.text = TextContent(type="text", text="")
            out.append(("event", ContentBlockStart(type="content_block_start", index=self.index,
                                                   content_block=TextContent(type="text", text=""))))
        self.text.text += text
        return out + [("event", ContentBlockDelta(type="content_block_delta", index=self.index,
                                                  delta=TextDelta(type="text_delta", text=text)))]

    def _close(self) -> list:
        if self.text is None:
            return []
        block, self.text = self.text, None
        return [("event", ContentBlockStop(type="content_block_stop", index=self.index)), ("block", block)]

    def end(self) -> list:
        held = self.calls.finish() if self.calls is not None else ""
        return (self._text(held) if held else []) + self._close()


def _event(model) -> str:
    return f"event: {model.type}\ndata: " + answer(model) + "\n\n"


def _sse(gen, model: str, tools: bool, record):
    """Anthropic's event sequence: message_start, ping, per block content_block_start / _delta /
    _stop, message_delta (stop reason, usage), message_stop; an `error` event if the request fails
    once streaming. Pings keep the connection alive while the model is busy. It counts its request
    at its last event."""
    start = AnthropicMessage(id=gen.id, type="message", role="assistant", model=model, content=[], stop_reason=None,
                             stop_sequence=None, usage=AnthropicUsage(input_tokens=0, output_tokens=0))
    yield _event(MessageStart(type="message_start", message=start))
    yield _event(Ping(type="ping"))
    blocks = _Blocks(tools)
    text: list[str] = []
    entries: list[dict] = []
    for ev in gen.events(ping_every=PING_EVERY_S):
        if ev is None:
            yield _event(Ping(type="ping"))
        elif ev.kind == "stage":
            yield f": {ev.data['stage']}\n\n"
        elif ev.kind == "delta":
            text.append(ev.text)
            entries.extend(ev.data.get("logprobs") or ())
            yield from (_event(m) for kind, m in blocks.feed(ev.text) if kind == "event")
        elif ev.kind == "error":
            record.finish(ev.error.status)
            yield _event(_error(ev.error.status, ev.error.message))
            return
        elif ev.kind == "done":
            record.result = ev.data
            record.finish(200)
            yield from (_event(m) for kind, m in blocks.end() if kind == "event")
            stops = gen.request.sampling.stop
            reason, sequence = _stop_reason(ev.data["finish_reason"], blocks.called, stops, "".join(text),
                                            entries if stops else None)
            usage = ev.data["usage"]
            yield _event(MessageDelta(type="message_delta", delta=MessageDeltaBody(
                stop_reason=reason, stop_sequence=sequence), usage=DeltaUsage(
                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"])))
            yield _event(MessageStop(type="message_stop"))
            return
