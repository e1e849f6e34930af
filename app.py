"""The Flask app: blueprints, limits, auth, CORS and the one error handler, around one service.

`create_app(settings=None, service=None, start_service=True)`: configuration is the factory's
argument, so tests never patch globals. Under Gunicorn, `wsgi.py` builds the app (and loads the
weights) once before forking and `gunicorn.conf.py` starts the service in each worker.
"""

from __future__ import annotations

import logging

from flask import Flask

from vlservice.config import Settings


def create_app(settings: Settings | None = None, service=None, start_service: bool = True) -> Flask:
    from vlservice.engine.service import load_service
    from vlservice.http import anthropic, auth, completions, errors, openai, ops, responses, session, tokenize
    from vlservice.http.appstate import AppState

    settings = settings or Settings.from_env()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if service is None:
        service = load_service(settings, start=False)
    app = Flask(__name__, template_folder="templates", static_folder="static")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.ensure_ascii = False
    ctx = AppState(settings, service)
    app.extensions["vlservice"] = ctx
    app.register_blueprint(openai.bp)
    app.register_blueprint(ops.bp)
    for extra in (anthropic, completions, tokenize):  # the other APIs clients speak, over the chat path
        app.register_blueprint(extra.bp)
    responses.init_app(app, settings)
    auth.init_app(app, settings)
    session.init_app(app, settings)
    errors.init_app(app, settings)
    if start_service:
        ctx.start()
    return app
