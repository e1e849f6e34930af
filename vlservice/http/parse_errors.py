"""Gunicorn's own refusals (a malformed request line, headers or framing, found by its parser
before the app runs) in OpenAI's error shape, like every other error of the API.

Gunicorn writes them with `gunicorn.util.write_error` as a small HTML page; `install()` (called by
gunicorn.conf.py, before the workers fork) swaps in this writer. Only the body changes: Gunicorn
still chooses the status and closes the connection. Its message can quote the request (a header's
name, a request line), so at most `ECHO` characters of it are kept.
"""

from __future__ import annotations

import json

ECHO = 120


def write_error(sock, status_int: int, reason: str, mesg: str) -> None:
    from gunicorn import util

    message = str(mesg or reason)
    if len(message) > ECHO:
        message = message[:ECHO] + f"... ({len(message)} characters)"
    body = json.dumps({"error": {"message": f"{reason}: {message}" if message != reason else reason,
                                 "type": "invalid_request_error", "param": None,
                                 "code": reason.lower().replace(" ", "_")}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    util.write_nonblock(sock, head + body)


def install() -> None:
    from gunicorn import util

    util.write_error = write_error
