"""API keys and CORS.

Keys: every `/v1/` route needs `Authorization: Bearer <key>` when `VL_API_KEY` is set (new routes
are protected by default); the token is compared with every key in constant time, whatever
matches. Health, readiness, metrics and the page stay public. CORS is off unless origins are
listed; there is no wildcard.
"""

from __future__ import annotations

import secrets

from flask import Flask, Response, request

from ..config import Settings
from ..errors import AuthenticationError


def init_app(app: Flask, settings: Settings) -> None:
    keys = [k.strip() for k in settings.api_key.split(",") if k.strip()]
    origins = {o.strip() for o in settings.cors_origins.split(",") if o.strip()}

    @app.before_request
    def authenticate():
        if not keys or not request.path.startswith("/v1/") or request.method == "OPTIONS":
            return None
        given = request.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        ok = False
        for key in keys:  # compare with every key, in constant time, whatever matches
            ok |= secrets.compare_digest(token.encode(), key.encode())
        if not ok:
            raise AuthenticationError("a valid API key is required: send `Authorization: Bearer <key>`")
        return None

    @app.after_request
    def cors(response: Response):
        origin = request.headers.get("Origin")
        if origin and origin in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, X-Request-Priority, X-Session-Id"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Vary"] = "Origin"
        return response
