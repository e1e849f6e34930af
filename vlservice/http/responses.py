"""HTTP glue for the OpenAI Responses API: `POST /v1/responses` (JSON or typed SSE events),
`GET` and `DELETE /v1/responses/{id}`.

A request becomes the chat route's request (`protocol/responses.py`, `chat_body`, then the chat
route's own `parse_chat`), so the same validation, media, grammars, caches, queue, cancellation and
tenant rules apply; the answer's text is read into Responses' output items by one builder
(`_Output`) for both the JSON answer and the stream, so the two cannot differ. Answers are kept
for `previous_response_id` per API key in this worker's memory (`response_store.py`).
"""

from __future__ import annotations

import json
import uuid

from flask import Blueprint, Flask, Response, current_app, g, request
from pydantic import ValidationError

from ..config import Settings
from ..engine.output.toolcalls import CallStream
from ..errors import APIError, InvalidRequest, NotFound, brief
from ..protocol import parse_chat
from ..protocol.answers import answer
from ..protocol.errors import _explain
from ..protocol.parse import check_tree
from ..protocol.responses import Origins, chat_body, echo_format, echo_tools, explain, items_of, responses_model
from ..protocol.responses_answers import ResponseDeleted, ResponseObject
from .appstate import current
from .common import admit, count_requests, read_json, request_headers, sse_response
from .disconnect import cancel_on_disconnect
from .openai import PING_EVERY_S
from .response_store import ChainBroken, ResponseStore, Stored

bp = Blueprint("responses", __name__)
STORE = "vlservice.responses"  # the app's extension: this worker's ResponseStore


def init_app(app: Flask, settings: Settings) -> None:
    app.extensions[STORE] = ResponseStore(settings.responses_store_entries, settings.responses_store_mb << 20,
                                          settings.responses_store_ttl_s)
    app.register_blueprint(bp)


def _store() -> ResponseStore:
    return current_app.extensions[STORE]


@bp.after_app_request
def _count(response: Response) -> Response:
    """Counted in the chat metrics like a chat request (`common.count_requests`)."""
    return count_requests(f"{bp.name}.create", response)


def _parse(body, settings: Settings):
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    check_tree(body)
    model = responses_model(settings)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        message, param, code = explain(err) or _explain(err, model)
        raise InvalidRequest(message, param=param or None, code=code) from None


def _renamed(exc: APIError, origins: Origins) -> APIError:
    """A chat-route error in this request's words (its `param` and the field names in its message)."""
    new = origins.rename(exc.param)
    exc.message = origins.message(exc.message, exc.param, new)
    exc.param = new
    return exc


def _earlier(tenant: str, previous_id: str) -> list[dict]:
    """The stored items of `previous_id`'s chain, oldest first; a clear 404 when any turn is gone."""
    try:
        return [item for turn in _store().chain(tenant, previous_id) for item in turn.items]
    except ChainBroken as gone:
        which = "" if gone.args[0] == previous_id else f" (its earlier turn {brief(gone.args[0])})"
        raise NotFound(f"previous response {brief(previous_id)}{which} is not stored here: responses are kept in the "
                       "memory of the worker that made them, per API key, for a bounded time and number; this one "
                       "expired, was deleted, was made with `store: false`, lives in another worker or replica, or "
                       "the server restarted", param="previous_response_id",
                       code="previous_response_not_found") from None


@bp.post("/v1/responses")
def create():
    ctx = current()
    record = g.chat_record = ctx.metrics.chat_started()
    body = read_json()
    r = _parse(body, ctx.settings)
    tenant = g.get("tenant", "")
    earlier = _earlier(tenant, r.previous_response_id) if r.previous_response_id is not None else []
    items = items_of(r)
    chat, origins = chat_body(r, earlier, items)
    try:
        req, opts = parse_chat(chat, ctx.settings, ctx.service.generation_defaults, ctx.fetch_remote)
    except APIError as exc:
        raise _renamed(exc, origins) from None
    admit(req, body, tenant)
    req.id = "resp_" + uuid.uuid4().hex[:24]
    try:
        with cancel_on_disconnect(req, request.environ):  # a client that leaves stops its media's decoding
            gen = ctx.service.submit(req)
    except APIError as exc:
        raise _renamed(exc, origins) from None
    answer_of = _Answer(r, gen, ctx.service.model_name, req.sampling, opts["tools"], items, tenant, _store())
    if r.stream:
        return sse_response(gen, _sse(gen, answer_of, record, origins), record)
    try:
        with cancel_on_disconnect(gen, request.environ):
            result = record.result = gen.result()
    except APIError as exc:
        raise _renamed(exc, origins) from None
    out = answer_of.output()
    out.feed(result["text"])
    out.end(result["finish_reason"])
    return _json(answer_of.finish(out, result), request_headers(gen))


@bp.get("/v1/responses/<response_id>")
def retrieve(response_id: str):
    entry = _store().get(g.get("tenant", ""), response_id)
    if entry is None:
        raise NotFound(f"no stored response with id {brief(response_id)} (kept in this worker's memory, per API "
                       "key, for a bounded time and number)", param="response_id")
    return Response(json.dumps(entry.response, ensure_ascii=False), mimetype="application/json")


@bp.delete("/v1/responses/<response_id>")
def delete(response_id: str):
    if not _store().delete(g.get("tenant", ""), response_id):
        raise NotFound(f"no stored response with id {brief(response_id)}", param="response_id")
    return _json(ResponseDeleted(id=response_id, object="response.deleted", deleted=True))


def _json(model, headers: dict | None = None) -> Response:
    return Response(answer(model), mimetype="application/json", headers=headers)


class _Answer:
    """One request's response object: its fields from the request, its output from `_Output`."""

    def __init__(self, r, gen, model: str, sampling, tools: bool, items: list[dict], tenant: str,
                 store: ResponseStore):
        self.r, self.gen, self.model, self.sampling, self.tools = r, gen, model, sampling, tools
        self.items, self.tenant, self.store = items, tenant, store  # the stream ends outside the app context

    def output(self) -> "_Output":
        return _Output(self.tools)

    def snapshot(self, status: str, output: list | None = None, usage=None, error=None, timings=None,
                 incomplete: bool = False) -> ResponseObject:
        r = self.r
        fields = dict(
            id=self.gen.id, object="response", created_at=self.gen.created, status=status, error=error,
            incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
            instructions=r.instructions, max_output_tokens=r.max_output_tokens, model=self.model,
            output=output or [], parallel_tool_calls=r.parallel_tool_calls is not False,
            previous_response_id=r.previous_response_id, store=r.store, temperature=self.sampling.temperature,
            top_p=self.sampling.top_p, text={"format": echo_format(r)},
            tool_choice=(r.tool_choice if isinstance(r.tool_choice, str) else r.tool_choice.model_dump()
                         if r.tool_choice is not None else "auto"),
            tools=echo_tools(r), truncation="disabled", background=False, metadata=r.metadata or {}, user=r.user,
            usage=usage)
        if timings is not None:
            fields["timings"] = timings
        return ResponseObject.model_validate(fields)

    def finish(self, out: "_Output", result: dict) -> ResponseObject:
        """The finished response, stored unless `store` is false."""
        u = result["usage"]
        usage = {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                 "total_tokens": u["total_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                 "input_tokens_details": {"cached_tokens": int(result["timings"].get("cache_n", 0))}}
        incomplete = result["finish_reason"] == "length"
        body = self.snapshot("incomplete" if incomplete else "completed", out.items, usage,
                             timings=result["timings"], incomplete=incomplete)
        if self.r.store:
            self.store.put(self.tenant, Stored(self.gen.id, self.r.previous_response_id, self.items + _kept(out.items),
                                             json.loads(answer(body))))
        return body


def _kept(output: list[dict]) -> list[dict]:
    """The output items as a later turn's input items (what `previous_response_id` continues)."""
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                   "text": i["content"][0]["text"]}]}
            if i["type"] == "message" else {k: i[k] for k in ("type", "call_id", "name", "arguments")}
            for i in output]


class _Output:
    """The answer's text read into output items: text as `message` items, each closed call block
    (with tools offered) as a `function_call` item, in answer order; `events` gets the stream's
    item events as they happen. Fed the whole text at once (the JSON answer) or a piece at a time
    (the stream), it makes the same items."""

    def __init__(self, tools: bool):
        self.calls = CallStream() if tools else None
        self.items: list[dict] = []
        self.events: list[tuple[str, dict]] = []
        self.open: dict | None = None  # the message item being written

    def feed(self, text: str) -> None:
        pieces = self.calls.feed(text) if self.calls is not None else [("text", text)]
        for kind, value in pieces:
            if kind == "text":
                self._text(str(value))
            else:
                self._close("completed")
                self._call(value)

    def end(self, finish_reason: str) -> None:
        held = self.calls.finish() if self.calls is not None else ""
        if held:
            self._text(held)
        if not self.items:
            self._text("", force=True)
        self._close("incomplete" if finish_reason == "length" else "completed")

    def _index(self) -> int:
        return len(self.items) - 1

    def _text(self, text: str, force: bool = False) -> None:
        if not text and not force:
            return
        if self.open is None:
            self.open = {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "status": "in_progress",
                         "role": "assistant", "content": []}
            self.items.append(self.open)
            self.events.append(("response.output_item.added", {"output_index": self._index(),
                                                               "item": json.loads(json.dumps(self.open))}))
            self.open["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            self.events.append(("response.content_part.added", {
                "item_id": self.open["id"], "output_index": self._index(), "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}))
        if text:
            self.open["content"][0]["text"] += text
            self.events.append(("response.output_text.delta", {
                "item_id": self.open["id"], "output_index": self._index(), "content_index": 0, "delta": text,
                "logprobs": []}))

    def _close(self, status: str) -> None:
        item, self.open = self.open, None
        if item is None:
            return
        item["status"] = status
        where = {"item_id": item["id"], "output_index": self._index(), "content_index": 0}
        part = item["content"][0]
        self.events.append(("response.output_text.done", {**where, "text": part["text"], "logprobs": []}))
        self.events.append(("response.content_part.done", {**where, "part": dict(part)}))
        self.events.append(("response.output_item.done", {"output_index": self._index(),
                                                          "item": json.loads(json.dumps(item))}))

    def _call(self, call) -> None:
        item = {"id": "fc_" + uuid.uuid4().hex[:24], "type": "function_call", "status": "in_progress",
                "call_id": call.id, "name": call.name, "arguments": ""}
        self.items.append(item)
        i = self._index()
        self.events.append(("response.output_item.added", {"output_index": i, "item": dict(item)}))
        self.events.append(("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": i,
                                                                       "delta": call.arguments}))
        self.events.append(("response.function_call_arguments.done", {"item_id": item["id"], "output_index": i,
                                                                      "name": call.name,
                                                                      "arguments": call.arguments}))
        item.update(arguments=call.arguments, status="completed")
        self.events.append(("response.output_item.done", {"output_index": i, "item": dict(item)}))

    def take(self) -> list[tuple[str, dict]]:
        events, self.events = self.events, []
        return events


class _Events:
    """The stream's SSE text: `event: <type>` and its JSON, numbered in order."""

    def __init__(self):
        self.sequence = 0

    def __call__(self, kind: str, data: dict) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: " + json.dumps(payload, ensure_ascii=False) + "\n\n"


def _sse(gen, answer_of: _Answer, record, origins: Origins):
    """The stream: created, in_progress, the items' events as the text comes, then completed (or
    incomplete when `max_output_tokens` cut it); a failure after the start is an `error` event then
    `response.failed`. It counts its request at its last event."""
    event = _Events()
    started = json.loads(answer(answer_of.snapshot("in_progress")))
    yield event("response.created", {"response": started})
    yield event("response.in_progress", {"response": started})
    out = answer_of.output()
    for ev in gen.events(ping_every=PING_EVERY_S):
        if ev is None:
            yield ": ping\n\n"
        elif ev.kind == "stage":
            yield f": {ev.data.get('stage', '')}\n\n"
        elif ev.kind == "delta":
            out.feed(ev.text)
            for kind, data in out.take():
                yield event(kind, data)
        elif ev.kind == "error":
            err = _renamed(ev.error, origins)
            record.finish(err.status)
            yield event("error", {"code": err.code, "message": err.message, "param": err.param})
            failed = answer_of.snapshot("failed", out.items, error={"code": err.code, "message": err.message})
            yield event("response.failed", {"response": json.loads(answer(failed))})
            return
        elif ev.kind == "done":
            out.end(ev.data["finish_reason"])
            for kind, data in out.take():
                yield event(kind, data)
            result = {"text": "", **ev.data}
            record.result = result
            body = answer_of.finish(out, result)
            record.finish(200)
            kind = "response.incomplete" if body.status == "incomplete" else "response.completed"
            yield event(kind, {"response": json.loads(answer(body))})
            return
