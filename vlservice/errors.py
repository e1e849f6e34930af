"""One error type for everything a caller can be told, mapped once to OpenAI's error JSON.

The engine raises `APIError` subclasses (it knows no HTTP, but it knows which kind of failure
it is); the HTTP layer turns any of them into `{"error": {"message", "type", "param", "code"}}`
with the status the subclass carries. Messages name the field, the bound and the value given.
"""

from __future__ import annotations


class APIError(Exception):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(APIError):
    pass


class InvalidImage(APIError):
    code = "invalid_image"


class ImageTooLarge(APIError):
    code = "image_too_large"


class InvalidVideo(APIError):
    code = "invalid_video"


class VideoTooLarge(APIError):
    code = "video_too_large"


class ContextLengthExceeded(APIError):
    code = "context_length_exceeded"


class PayloadTooLarge(APIError):
    status = 413
    code = "request_too_large"


class AuthenticationError(APIError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(APIError):
    status = 404
    code = "not_found"


class Busy(APIError):
    """The wait queue is full: refused at once (backpressure), never an unbounded wait."""

    status = 429
    type = "unavailable_error"
    code = "server_busy"


class QueueTimeout(APIError):
    status = 503
    type = "unavailable_error"
    code = "queue_timeout"


class NotReady(APIError):
    status = 503
    type = "unavailable_error"
    code = "not_ready"


class Cancelled(APIError):
    status = 499
    type = "invalid_request_error"
    code = "cancelled"


class EngineError(APIError):
    status = 500
    type = "server_error"
    code = "engine_error"


class ModelLoadError(RuntimeError):
    """Startup could not load the model: says what was tried and how to fix it."""


ECHO_CHARS = 100  # a client's value is echoed in an error message to at most this many characters


def brief(value, limit: int = ECHO_CHARS, quote: bool = True) -> str:
    """A client's value as an error message shows it: its repr (`quote`, else its text), at most
    `limit` characters, with "…" and the full length when cut (a 200 KB bad value must not come
    back whole)."""
    text = repr(value) if quote else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"
