"""HTTP glue for the OpenAI-compatible API: `/v1/chat/completions` (JSON or SSE), `/v1/models`.

Handlers return a response or raise an `APIError`; `app.py` has the one place that writes the
error JSON. Nothing here touches the model except through `VLModelService`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, cast

from flask import Blueprint, Response, g, request

from ..engine.output.grounding import GroundingParser, grounding, parse
from ..errors import NotFound, brief
from ..engine.output.toolcalls import CallStream, split_calls
from ..protocol import parse_chat
from ..protocol.answers import (AssistantReply, ChatCompletion, ChatCompletionCancel, ChatCompletionChunk, Choice,
                                ChoiceLogprobs, ChunkChoice, Delta, Grounding, Model, ModelList, ToolCall,
                                ToolCallDelta, answer)
from .appstate import current
from .common import admit, count_requests, read_json, request_headers, sse_response
from .disconnect import cancel_on_disconnect

if TYPE_CHECKING:
    from ..engine.output.toolcalls import ToolCall as FoundCall  # a call found in the answer (not the API's ToolCall)

bp = Blueprint("api", __name__)

PING_EVERY_S = 2.0  # an SSE comment at least this often, so clients and proxies do not time out
STAGE_EVENT = "vlservice.stage"  # the SSE event name of stages (queued, vision_encode, prefill)


@bp.get("/v1/models")
def models():
    ctx = current()
    svc = ctx.service
    entry = {"id": svc.model_name, "object": "model", "created": int(ctx.started), "owned_by": "vlservice",
             "input_modalities": ["text", "image", "video"], "output_modalities": ["text"],
             "max_context_length": ctx.settings.max_context_tokens, "demo": svc.is_demo}
    if svc.is_demo:
        entry["notice"] = svc.info()["demo_notice"]["en"]
    return _json(ModelList(object="list", data=[Model.model_validate(entry)]))


@bp.post("/v1/chat/completions/<request_id>/cancel")
def cancel(request_id: str):
    if not current().service.cancel(request_id, g.get("tenant", "")):
        raise NotFound(f"no running request with id {brief(request_id)}", param="id")
    return _json(ChatCompletionCancel(id=request_id, object="chat.completion.cancel", cancelled=True))


@bp.after_app_request
def _count_chat(response: Response) -> Response:
    """Counts a chat request once, by the status its answer ends with: here a JSON answer or an
    error (raised in the route, or before it ran: a refused API key); a stream counts itself when
    it ends. The cancel and models endpoints are not chat requests."""
    return count_requests(f"{bp.name}.chat_completions", response)


@bp.post("/v1/chat/completions")
def chat_completions():
    ctx = current()
    record = g.chat_record = ctx.metrics.chat_started()
    body = read_json()
    req, opts = parse_chat(body, ctx.settings, ctx.service.generation_defaults, ctx.fetch_remote)
    admit(req, body)
    t0 = time.perf_counter()
    with cancel_on_disconnect(req, request.environ):  # a client that leaves stops its media's decoding
        gen = ctx.service.submit(req)
    model = ctx.service.model_name
    headers = request_headers(gen)
    if opts["stream"]:
        return sse_response(gen, _sse(gen, model, opts["include_usage"], record, t0, opts["include_stages"],
                                      opts["tools"]), record)
    with cancel_on_disconnect(gen, request.environ):
        result = record.result = gen.result()
    several = len(result["choices"]) > 1
    body = ChatCompletion(
        id=gen.id, object="chat.completion", created=gen.created, model=model,
        choices=[_choice(c, opts["tools"], gen.image_sizes if several else None) for c in result["choices"]],
        usage=result["usage"], timings=result["timings"], system_fingerprint=ctx.service.model_fp)
    boxes = grounding(parse(result["text"]), gen.image_sizes)
    if boxes:
        body.grounding = Grounding.model_validate(boxes)
    return _json(body, headers)


def _choice(result: dict, tools: bool, image_sizes: list | None) -> Choice:
    """One choice of a JSON answer (`Generation.result()`'s `choices`); with `image_sizes` (several
    choices), its own `grounding`."""
    message, called = _reply(result["text"], tools)
    choice = Choice(index=result["index"], message=message, finish_reason=_finish(result["finish_reason"], called),
                    logprobs=_logprobs(result.get("logprobs")))
    boxes = grounding(parse(result["text"]), image_sizes) if image_sizes is not None else None
    if boxes:
        choice.grounding = Grounding.model_validate(boxes)
    return choice


def _json(model, headers: dict | None = None) -> Response:
    return Response(answer(model), mimetype="application/json", headers=headers)


def _reply(text: str, tools: bool) -> tuple[AssistantReply, bool]:
    """The answer's message: with tools offered, its call blocks as `tool_calls` (the text beside
    them as `content`, null when there is none)."""
    if tools:
        content, calls = split_calls(text)
        if calls:
            return AssistantReply(role="assistant", content=content or None,
                                  tool_calls=[ToolCall.model_validate(c.to_dict()) for c in calls]), True
    return AssistantReply(role="assistant", content=text), False


def _finish(reason: str, called: bool) -> str:
    """OpenAI's `finish_reason`: "tool_calls" when an answer that ended by itself made calls."""
    return "tool_calls" if called and reason == "stop" else reason


def _logprobs(entries) -> ChoiceLogprobs | None:
    """A choice's `logprobs` (OpenAI's shape), or None when the request did not ask."""
    return None if entries is None else ChoiceLogprobs(content=entries, refusal=None)


def _chunk(gen, model, delta: dict | None = None, finish=None, logprobs=None, index: int = 0, **extra) -> str:
    """One `data:` event (of choice `index`); `extra` fields at the top level, those that are None left out."""
    chunk = ChatCompletionChunk(
        id=gen.id, object="chat.completion.chunk", created=gen.created, model=model,
        choices=[] if delta is None else [ChunkChoice(index=index, delta=Delta(**delta), finish_reason=finish,
                                                      logprobs=_logprobs(logprobs))],
        **{"usage": None, **{k: v for k, v in extra.items() if v is not None}})
    return "data: " + answer(chunk) + "\n\n"


def _stage(stage: str, named: bool, **data) -> str:
    """A stage as an SSE comment (proxies see traffic; OpenAI clients skip it) and, when the client
    asked with `stream_options.include_stages`, also as a named event it can parse: plain OpenAI
    clients would take any extra event for a chunk, so they never get one."""
    comment = ": " + " ".join([stage, *map(str, data.values())]) + "\n\n"
    if not named:
        return comment
    return comment + f"event: {STAGE_EVENT}\ndata: " + json.dumps({"stage": stage, **data}) + "\n\n"


def _sse(gen, model, include_usage, record, t0, include_stages=False, tools=False):
    """The SSE body. It counts its request at its last event, before the client can see it end."""
    # the first bytes: headers reach the client now
    yield _stage("queued", include_stages, position=gen.queue_position)
    count = max(1, gen.request.choices)
    for index in range(count):
        yield _chunk(gen, model, {"role": "assistant", "content": ""}, index=index)
    boxes = [GroundingParser() for _ in range(count)]
    outs = [_StreamedAnswer(gen, model, tools, index) for index in range(count)]
    for ev in gen.events(ping_every=PING_EVERY_S):
        if ev is None:
            yield ": ping\n\n"
        elif ev.kind == "stage":
            yield _stage(ev.data["stage"], include_stages)
        elif ev.kind == "delta":
            boxes[ev.choice].feed(ev.text)
            yield from outs[ev.choice].delta(ev.text, ev.data.get("logprobs"))
        elif ev.kind == "choice_done":  # one of several choices ended (a single one ends with `done`)
            yield from outs[ev.choice].end(ev.data["finish_reason"],
                                           grounding(boxes[ev.choice].items, gen.image_sizes))
        elif ev.kind == "error":
            record.finish(ev.error.status)
            yield "data: " + json.dumps(ev.error.to_dict()) + "\n\n"
            yield "data: [DONE]\n\n"
            return
        elif ev.kind == "done":
            record.result = ev.data
            record.finish(200)
            if count == 1:
                yield from outs[0].end(ev.data["finish_reason"], grounding(boxes[0].items, gen.image_sizes))
            if include_usage:
                yield _chunk(gen, model, None, usage=ev.data["usage"], timings=ev.data["timings"])
            yield "data: [DONE]\n\n"
            return


class _StreamedAnswer:
    """A streamed answer's chunks (of choice `index`): text as `content` deltas; with tools offered,
    each call block as one `tool_calls` delta once it closes (text that may begin a block waits for
    the next piece). Log probabilities of held text go with the next chunk written."""

    def __init__(self, gen, model: str, tools: bool, index: int = 0):
        self.gen, self.model, self.index = gen, model, index
        self.calls = CallStream() if tools else None
        self.logprobs: list | None = None

    def _take_logprobs(self):
        lp, self.logprobs = self.logprobs, None
        return lp

    def delta(self, text: str, logprobs):
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(logprobs)
        if self.calls is None:
            yield _chunk(self.gen, self.model, {"content": text}, logprobs=self._take_logprobs(),
                         index=self.index)
            return
        for kind, value in self.calls.feed(text):
            if kind == "text":
                yield _chunk(self.gen, self.model, {"content": value}, logprobs=self._take_logprobs(),
                             index=self.index)
            else:
                call = ToolCallDelta.model_validate({"index": self.calls.calls - 1, **cast("FoundCall", value).to_dict()})
                yield _chunk(self.gen, self.model, {"tool_calls": [call]}, logprobs=self._take_logprobs(),
                             index=self.index)

    def end(self, reason: str, boxes):
        held = self.calls.finish() if self.calls is not None else ""
        if held:
            yield _chunk(self.gen, self.model, {"content": held}, logprobs=self._take_logprobs(),
                         index=self.index)
        called = self.calls is not None and self.calls.calls > 0
        yield _chunk(self.gen, self.model, {}, _finish(reason, called), logprobs=self._take_logprobs(),
                     index=self.index, grounding=boxes)
