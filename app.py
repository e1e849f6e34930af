"""The Flask app: blueprints, limits, auth, CORS and the one error handler, around one service.

`create_app(settings=None, service=None, start_service=True)`: configuration is the factory's
argument, so tests never patch globals. Under Gunicorn, `wsgi.py` builds the app (and loads the
weights) once before forking and `gunicorn.conf.py` starts the service in each worker.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from vlservice.config import Settings
from vlservice.errors import APIError, AuthenticationError, EngineError, NotFound, PayloadTooLarge

log = logging.getLogger("vlservice.app")


class AppContext:
    """What the handlers share: settings, the service, the CPU sampler and the metrics."""

    def __init__(self, settings: Settings, service):
        from vlservice.metrics import Metrics
        from vlservice.monitor import CpuSampler
        from vlservice.remote import RemoteFetcher

        self.settings = settings
        self.service = service
        self.sampler = CpuSampler()
        self.metrics = Metrics(service)
        self.started = time.time()
        self.fetch_remote = RemoteFetcher(settings) if settings.remote_images else None
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """In the worker process: the sampler thread, then the model's threads and warm-up."""
        with self._start_lock:
            self.sampler.start()
            self.service.start()

    def start_in_background(self) -> threading.Thread:
        t = threading.Thread(target=self._start_logged, name="vlservice-start", daemon=True)
        t.start()
        return t

    def _start_logged(self) -> None:
        try:
            self.start()
        except Exception:
            log.exception("the service failed to start")

    def encode_ms_per_token(self):
        t = self.service.last_timings
        if t.get("vision_encode_ms") and t.get("image_tokens"):
            return round(t["vision_encode_ms"] / t["image_tokens"], 3)
        return None


def create_app(settings: Settings | None = None, service=None, start_service: bool = True) -> Flask:
    from vlservice import api, web
    from vlservice.service import load_service

    settings = settings or Settings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if service is None:
        service = load_service(settings, start=False)
    app = Flask(__name__, template_folder="templates", static_folder="static")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.ensure_ascii = False
    ctx = AppContext(settings, service)
    app.extensions["vlservice"] = ctx
    app.register_blueprint(api.bp)
    app.register_blueprint(web.bp)
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
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, X-Request-Priority"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Vary"] = "Origin"
        return response

    @app.errorhandler(APIError)
    def api_error(exc: APIError):
        if exc.status >= 500 and not isinstance(exc, EngineError):
            log.info("refused: %s", exc.message)
        headers = {}
        if exc.retry_after is not None:
            headers["Retry-After"] = str(int(max(1, round(exc.retry_after))))
        if request.path.startswith("/v1/chat/completions"):
            ctx.metrics.refused(exc.status)
        return Response(_json(exc.to_dict()), status=exc.status, mimetype="application/json", headers=headers)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc):
        return api_error(PayloadTooLarge(
            f"the request body is larger than the limit of {settings.max_request_bytes} bytes"))

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

    if start_service:
        ctx.start()
    return app


def _json(obj) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False)
