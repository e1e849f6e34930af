"""HTTP glue for the OpenAI-compatible API: `/v1/chat/completions` (JSON or SSE), `/v1/models`.

Handlers return a response or raise an `APIError`; `app.py` has the one place that writes the
error JSON. Nothing here touches the model except through `VLModelService`.
"""

from __future__ import annotations

import json
import time

from flask import Blueprint, Response, request

from .context import current
from ..errors import APIError, InvalidRequest, NotFound
from ..protocol import parse_chat

bp = Blueprint("api", __name__)

PING_EVERY_S = 2.0  # an SSE comment at least this often, so clients and proxies do not time out


@bp.get("/v1/models")
def models():
    ctx = current()
    svc = ctx.service
    entry = {"id": svc.model_name, "object": "model", "created": int(ctx.started), "owned_by": "vlservice",
             "input_modalities": ["text", "image"], "output_modalities": ["text"],
             "max_context_length": ctx.settings.max_context_tokens, "demo": svc.is_demo}
    if svc.is_demo:
        entry["notice"] = svc.info()["demo_notice"]["en"]
    return {"object": "list", "data": [entry]}


@bp.post("/v1/chat/completions/<request_id>/cancel")
def cancel(request_id: str):
    if not current().service.cancel(request_id):
        raise NotFound(f"no running request with id {request_id!r}", param="id")
    return {"id": request_id, "object": "chat.completion.cancel", "cancelled": True}


@bp.post("/v1/chat/completions")
def chat_completions():
    ctx = current()
    body = request.get_json(silent=True)
    if body is None:
        raise InvalidRequest("the request body must be valid JSON (Content-Type: application/json)",
                             code="invalid_json")
    req, opts = parse_chat(body, ctx.settings, ctx.service.generation_defaults, ctx.fetch_remote)
    priority = request.headers.get("X-Request-Priority", "default")
    req.priority = priority if priority in ("interactive", "default", "batch") else "default"
    t0 = time.perf_counter()
    gen = ctx.service.submit(req)
    ctx.metrics.request_started()
    model = ctx.service.model_name
    headers = {"X-Request-Id": gen.id, "X-Queue-Position": str(gen.work["queue_position"])}
    if opts["stream"]:
        return Response(_sse(gen, model, opts["include_usage"], ctx, t0), mimetype="text/event-stream",
                        headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        result = gen.result()
    except APIError as exc:
        ctx.metrics.request_finished(exc.status, None)
        raise
    ctx.metrics.request_finished(200, result)
    body = {
        "id": gen.id, "object": "chat.completion", "created": gen.created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result["text"]},
                     "finish_reason": result["finish_reason"], "logprobs": None}],
        "usage": result["usage"], "timings": result["timings"], "system_fingerprint": ctx.service.model_fp,
    }
    return Response(json.dumps(body, ensure_ascii=False), mimetype="application/json", headers=headers)


def _chunk(gen, model, delta=None, finish=None, **extra) -> str:
    body = {"id": gen.id, "object": "chat.completion.chunk", "created": gen.created, "model": model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                                  "logprobs": None}],
            "usage": None}
    body.update(extra)
    return "data: " + json.dumps(body, ensure_ascii=False) + "\n\n"


def _sse(gen, model, include_usage, ctx, t0):
    """The SSE body. Closing this generator (the client went away) cancels the generation."""
    status = 499
    try:
        yield f": queued {gen.work['queue_position']}\n\n"  # headers reach the client now
        yield _chunk(gen, model, {"role": "assistant", "content": ""})
        for ev in gen.events(ping_every=PING_EVERY_S):
            if ev is None:
                yield ": ping\n\n"
            elif ev.kind == "stage":
                yield f": {ev.data.get('stage', 'working')}\n\n"
            elif ev.kind == "delta":
                yield _chunk(gen, model, {"content": ev.text})
            elif ev.kind == "error":
                status = ev.error.status
                yield "data: " + json.dumps(ev.error.to_dict()) + "\n\n"
                yield "data: [DONE]\n\n"
                return
            elif ev.kind == "done":
                status = 200
                ctx.metrics.request_finished(200, ev.data)
                yield _chunk(gen, model, {}, ev.data["finish_reason"])
                if include_usage:
                    yield _chunk(gen, model, None, usage=ev.data["usage"], timings=ev.data["timings"])
                yield "data: [DONE]\n\n"
                return
    finally:
        gen.cancel()  # no-op when finished; frees the model when the client disconnected
        if status != 200:
            ctx.metrics.request_finished(status, None)
