"""HTTP glue for OpenAI's legacy Completions API: `POST /v1/completions` (JSON or SSE).

The request is read as the chat request its sampling means (`protocol.completions.chat_body`,
checked by `parse_chat`), then its prompt is sent to the engine as a raw prompt: the text as it
is, no chat template, tokenized as text. Submission, caches, limits, tenants, cancellation and the
metrics are the chat's own.
"""

from __future__ import annotations

import json
import uuid

from flask import Blueprint, Response, g, request

from ..errors import APIError
from ..protocol import parse_chat
from ..protocol.answers import Usage, answer
from ..protocol.completions import (Completion, CompletionChoice, CompletionLogprobs, chat_body, completion_model,
                                    explain, rename, validate)
from .appstate import current
from .common import admit, count_requests, read_json, request_headers, sse_response
from .disconnect import cancel_on_disconnect
from .openai import PING_EVERY_S

bp = Blueprint("completions", __name__)


@bp.after_app_request
def _count(response: Response) -> Response:
    return count_requests(f"{bp.name}.completions", response)


@bp.post("/v1/completions")
def completions():
    ctx = current()
    record = g.chat_record = ctx.metrics.chat_started()
    body = read_json()
    r = validate(completion_model(ctx.settings), body, explain)
    try:
        req, _ = parse_chat(chat_body(r), ctx.settings, ctx.service.generation_defaults, None)
        req.raw_prompt = r.text  # the text as it is: no chat template
        req.id = "cmpl-" + uuid.uuid4().hex[:24]
        admit(req, body)
        with cancel_on_disconnect(req, request.environ):
            gen = ctx.service.submit(req)
    except APIError as exc:
        exc.message, exc.param = exc.message.replace(f"`{exc.param}`", f"`{rename(exc.param)}`"), rename(exc.param)
        raise
    model = ctx.service.model_name
    headers = request_headers(gen)
    if r.stream:
        usage = bool(r.stream_options and r.stream_options.include_usage)
        return sse_response(gen, _sse(gen, model, usage, record), record)
    with cancel_on_disconnect(gen, request.environ):
        result = record.result = gen.result()
    choices = [CompletionChoice(index=c["index"], text=c["text"], finish_reason=c["finish_reason"],
                                logprobs=_Logprobs().take(c["logprobs"]) if r.logprobs is not None else None)
               for c in result["choices"]]
    out = Completion(id=gen.id, object="text_completion", created=gen.created, model=model, choices=choices,
                     usage=Usage.model_validate(result["usage"]), timings=result["timings"],
                     system_fingerprint=ctx.service.model_fp)
    return Response(answer(out), mimetype="application/json", headers=headers)


class _Logprobs:
    """OpenAI's legacy `logprobs` from the engine's entries, a piece at a time (offsets run on)."""

    def __init__(self) -> None:
        self.offset = 0

    def take(self, entries) -> CompletionLogprobs:
        tokens, offsets = [], []
        for e in entries:
            tokens.append(e["token"])
            offsets.append(self.offset)
            self.offset += len(e["token"])
        return CompletionLogprobs(tokens=tokens, token_logprobs=[e["logprob"] for e in entries],
                                  top_logprobs=[{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                                  text_offset=offsets)


def _chunk(gen, model, text: str | None, finish=None, logprobs=None, index: int = 0, **extra) -> str:
    choices = [] if text is None else [CompletionChoice(index=index, text=text, finish_reason=finish,
                                                        logprobs=logprobs)]
    chunk = Completion(id=gen.id, object="text_completion", created=gen.created, model=model, choices=choices,
                       **extra)
    return "data: " + answer(chunk) + "\n\n"


def _sse(gen, model, include_usage: bool, record):
    """The SSE body: `text_completion` chunks, the last with `finish_reason`, then `[DONE]`. It
    counts its request at its last event."""
    yield f": queued {gen.queue_position}\n\n"  # the first bytes: headers reach the client now
    count = max(1, gen.request.choices)
    lps = [_Logprobs() if gen.request.sampling.logprobs is not None else None for _ in range(count)]
    for ev in gen.events(ping_every=PING_EVERY_S):
        if ev is None:
            yield ": ping\n\n"
        elif ev.kind == "stage":
            yield f": {ev.data['stage']}\n\n"
        elif ev.kind == "delta":
            entries, lp = ev.data.get("logprobs"), lps[ev.choice]
            if ev.text or entries:
                yield _chunk(gen, model, ev.text, logprobs=lp.take(entries or []) if lp else None, index=ev.choice)
        elif ev.kind == "choice_done":  # one of several choices ended (a single one ends with `done`)
            lp = lps[ev.choice]
            yield _chunk(gen, model, "", ev.data["finish_reason"], logprobs=lp.take([]) if lp else None,
                         index=ev.choice)
        elif ev.kind == "error":
            record.finish(ev.error.status)
            yield "data: " + answer_error(ev.error) + "\n\n"
            yield "data: [DONE]\n\n"
            return
        elif ev.kind == "done":
            record.result = ev.data
            record.finish(200)
            if count == 1:
                lp = lps[0]
                yield _chunk(gen, model, "", ev.data["finish_reason"], logprobs=lp.take([]) if lp else None)
            if include_usage:
                yield _chunk(gen, model, None, usage=Usage.model_validate(ev.data["usage"]),
                             timings=ev.data["timings"])
            yield "data: [DONE]\n\n"
            return


def answer_error(error: APIError) -> str:
    return json.dumps(error.to_dict(), ensure_ascii=False)
