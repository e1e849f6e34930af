"""The one place that turns an error into an HTTP response: OpenAI's error JSON (message, type,
param, code), the status, and `Retry-After` where the client should come back."""

from __future__ import annotations

import json
import logging

from flask import Flask, Response, request
from gunicorn.http.errors import NoMoreData, ParseException
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from ..config import Settings
from ..errors import APIError, EngineError, InvalidRequest, NotFound, PayloadTooLarge

log = logging.getLogger(__name__)


def error_response(exc: APIError) -> Response:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(int(max(1, round(exc.retry_after))))
    return Response(json.dumps(exc.to_dict(), ensure_ascii=False), status=exc.status, mimetype="application/json",
                    headers=headers)


def init_app(app: Flask, settings: Settings) -> None:
    """Error handlers only write the answer; the metrics count a chat request by the status its
    response ends with (vlservice/http/openai.py), so an error is never counted here as well."""

    @app.errorhandler(APIError)
    def api_error(exc: APIError):
        if exc.status >= 500 and not isinstance(exc, EngineError):
            log.info("refused: %s", exc.message)
        return error_response(exc)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc):
        return api_error(PayloadTooLarge(
            f"the request body is larger than the limit of {settings.max_request_bytes} bytes"))

    @app.errorhandler(ParseException)
    @app.errorhandler(NoMoreData)
    def bad_framing(exc):
        """Gunicorn frames the body as the route reads it: a malformed chunk (a size of `-5`,
        `0x2`, `+2`) or a body cut short is the client's fault. Gunicorn then closes the
        connection, since the next request's start cannot be found."""
        return api_error(InvalidRequest(f"the request body's framing is malformed ({type(exc).__name__})",
                                        code="invalid_framing"))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        err = NotFound(exc.description or exc.name, code=exc.name.lower().replace(" ", "_"))
        err.status = exc.code or 500
        response = api_error(err)
        for name, value in exc.get_headers():  # keep werkzeug's own (Allow on a 405, ...)
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    def unexpected(exc):
        log.exception("unhandled error on %s", request.path)
        return api_error(EngineError(f"internal error: {type(exc).__name__}"))
