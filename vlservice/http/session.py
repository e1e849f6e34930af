"""Session affinity's two headers: which conversation a request belongs to, which replica answered.

A load balancer in front of several replicas hashes the session key onto one replica (nginx's
`hash $http_x_session_id consistent`, deploy/nginx/), so a conversation's follow-ups find its KV
cache there. The key is the `X-Session-Id` header, else the OpenAI `user` field (which the
balancer cannot read from the body: clients that want affinity send the header). A chat answer
echoes the key in `X-Session-Id`; every answer names its replica in `X-Served-By`
(`VL_REPLICA_NAME`, else the host name: the pod's name in Kubernetes, the container's in
Compose).
"""

from __future__ import annotations

import hashlib
import re
import socket

from flask import Flask, Response, g, request

from ..config import Settings
from ..errors import InvalidRequest

HEADER = "X-Session-Id"
TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # safe to echo in a header and to log


def session_key(body: dict) -> str | None:
    """The request's session key (remembered for the answer's header); a malformed header is a 400."""
    header = request.headers.get(HEADER)
    if header is not None:
        if not TOKEN.fullmatch(header):
            raise InvalidRequest(f"the `{HEADER}` header must be 1-128 characters of A-Z a-z 0-9 . _ : -, "
                                 f"got {header[:40]!r}", param=HEADER, code="invalid_value")
        g.session_key = header
    elif isinstance(body.get("user"), str) and body["user"]:
        user = body["user"]  # free text by OpenAI's definition: echoed as is only when it is a token
        g.session_key = user if TOKEN.fullmatch(user) else \
            "user-" + hashlib.blake2b(user.encode(), digest_size=8).hexdigest()
    return g.get("session_key")


def init_app(app: Flask, settings: Settings) -> None:
    replica = settings.replica_name or socket.gethostname()

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers["X-Served-By"] = replica
        if g.get("session_key"):
            response.headers[HEADER] = g.session_key
        return response
