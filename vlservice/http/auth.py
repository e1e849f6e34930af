"""API keys and CORS.

Keys: every `/v1/` route needs `Authorization: Bearer <key>` when `VL_API_KEY` or `VL_API_KEYS` is
set (new routes are protected by default); the token is compared with every key in constant time,
whatever matches. Each key is a tenant (`g.tenant`, its name): a tenant gets its fair share of the
queue and the batch, cancels only its own requests, and shares no cache with another
(docs/operations.md, Tenants). `/api/stats` and `/metrics` need a key too (`PROTECTED`);
health, readiness, the page and its `/api/config` stay public. CORS is off unless origins are
listed; there is no wildcard.
"""

from __future__ import annotations

import secrets

from flask import Flask, Response, g, request

from ..config import Settings
from ..errors import AuthenticationError


# What a key guards: the API (new routes under /v1/ are protected by default; /tokenize and
# /detokenize at the root, where vLLM and llama.cpp serve them) and the statistics,
# which tell who is using the server how much (Prometheus sends the key as `Authorization: Bearer`).
PROTECTED = ("/v1/", "/api/stats", "/metrics", "/tokenize", "/detokenize")


def tenant_keys(settings: Settings) -> dict[str, str]:
    """key -> tenant name. `VL_API_KEYS` names its keys (`name:key,...`); the keys of `VL_API_KEY`
    (one, or several separated by commas) are tenants `default`, or `key1`, `key2`, ..."""
    plain = [k.strip() for k in settings.api_key.split(",") if k.strip()]
    keys = {key: ("default" if len(plain) == 1 else f"key{i + 1}") for i, key in enumerate(plain)}
    for entry in filter(None, (e.strip() for e in settings.api_keys.split(","))):
        name, _, key = entry.partition(":")
        keys[key.strip()] = name.strip()
    return keys


def init_app(app: Flask, settings: Settings) -> None:
    named = tenant_keys(settings)
    keys = list(named)
    origins = {o.strip() for o in settings.cors_origins.split(",") if o.strip()}

    @app.before_request
    def authenticate():
        if not keys or not request.path.startswith(PROTECTED) or request.method == "OPTIONS":
            return None
        given = request.headers.get("Authorization", "")
        # the bearer (OpenAI's clients), else `x-api-key` (Anthropic's)
        token = given[7:] if given.startswith("Bearer ") else request.headers.get("x-api-key", "")
        tenant = None
        for key in keys:  # compare with every key, in constant time, whatever matches
            if secrets.compare_digest(token.encode(), key.encode()):
                tenant = named[key]
        if tenant is None:
            raise AuthenticationError("a valid API key is required: send `Authorization: Bearer <key>` or "
                                      "`x-api-key: <key>`")
        g.tenant = tenant
        return None

    @app.after_request
    def cors(response: Response):
        origin = request.headers.get("Origin")
        if origin and origin in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, X-Request-Priority, X-Session-Id, " \
                "x-api-key, anthropic-version"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            response.headers["Vary"] = "Origin"
        return response
