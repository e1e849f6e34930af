"""What every generating route (chat, Responses, Messages, completions) does the same way: read the
JSON body within its limit, give the request its session, tenant and priority, and answer a stream
whose closing cancels what nobody is left to read."""

from __future__ import annotations

from flask import Response, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..errors import InvalidRequest
from ..protocol import load_body
from .appstate import current
from .disconnect import watch_stream
from .session import session_key

PRIORITIES = ("interactive", "default", "batch")


def check_length() -> None:
    """A `Content-Length` over the limit: a 413 from the header alone, before anything is read
    (werkzeug would hand the route an empty body)."""
    limit = request.max_content_length
    if limit is not None and (request.content_length or 0) > limit:
        raise RequestEntityTooLarge()


def read_body() -> bytes:
    """The request body, at most `MAX_CONTENT_LENGTH` bytes, else a 413 (http/errors.py). Werkzeug
    refuses a larger Content-Length, but a chunked body (no Content-Length) it cuts at the limit
    without a word, so a body over the limit became a JSON error (400) from its first part."""
    limit = request.max_content_length
    data = request.get_data(cache=False)
    if limit is not None and len(data) >= limit and request.input_stream.read(1):
        raise RequestEntityTooLarge()
    return data


def read_json():
    """The request body's JSON, its size and shape bounded before it is parsed (413 over the limit,
    400 not JSON)."""
    check_length()
    if not request.is_json:
        raise InvalidRequest("the request body must be valid JSON (Content-Type: application/json)",
                             code="invalid_json")
    return load_body(read_body())


def admit(req, body: dict, tenant: str | None = None) -> None:
    """What the HTTP request says about the engine request: its session key (echoed in the answer's
    X-Session-Id header), tenant (the API key's name) and queue priority (where the tenant may set it)."""
    session_key(body)
    req.tenant = g.get("tenant", "") if tenant is None else tenant
    priority = request.headers.get("X-Request-Priority", "default")
    if current().priority_allowed(req.tenant):
        req.priority = priority if priority in PRIORITIES else "default"


def request_headers(gen) -> dict:
    return {"X-Request-Id": gen.id, "X-Queue-Position": str(gen.queue_position)}


def sse_response(gen, body, record) -> Response:
    """`body` (the route's SSE events) as a streamed answer that notices a client gone between
    events, and whose closing ends the request (`stream_closed`)."""
    response = Response(watch_stream(gen, request.environ, body), mimetype="text/event-stream",
                        headers={**request_headers(gen), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    response.call_on_close(lambda: stream_closed(gen, record))
    return response


def stream_closed(gen, record) -> None:
    """A stream's response is closed (the WSGI server always does, however it ended, even before
    the first chunk): a client gone before the last event leaves nobody to generate for."""
    gen.cancel()  # no-op when finished
    record.finish(499)  # no-op when the stream counted its end


def count_requests(endpoint: str, response: Response) -> Response:
    """Counts a generating request once in the chat metrics, by the status its answer ends with: a
    JSON answer or an error (raised in the route, or before it ran: a refused API key); a stream
    counts itself when it ends. Requests to other endpoints pass untouched."""
    if request.endpoint != endpoint or request.method != "POST":
        return response
    record = g.pop("chat_record", None) or current().metrics.chat_started()
    if not response.is_streamed:
        record.finish(response.status_code)
    return response
