"""Gunicorn settings for vlservice; every value can be overridden from the environment.

- preload_app: the app (weights, ONNX export) is built once in the master, before the fork, so
  the weights are shared copy-on-write between workers instead of loaded twice.
- gthread workers: one thread streams a generation while others answer /healthz, /api/stats and
  the page. The model itself is serialised by the service's lock and bounded wait queue.
- post_worker_init: torch and ONNX Runtime thread pools are not fork-safe, so each worker sets
  its threads, opens its ONNX Runtime session and warms up after the fork (in a background
  thread: /healthz answers at once, /readyz says 503 until the warm-up is done).
- worker_exit: a worker that is done leaves with os._exit (keeping its exit code) once its logs
  are flushed. Interpreter shutdown would run the native libraries' static destructors while
  their pool threads still wait on them, and the worker aborted ("terminate called after throwing
  std::system_error"); there is nothing left to save at that point (the disk cache is written
  entry by entry).
- timeout: the gthread worker's heartbeat runs in its main loop, so a long generation does not
  trip it; it only catches a stuck worker.
"""

import os

os.environ.setdefault("VL_DEFER_START", "1")  # wsgi.py: start in post_worker_init, after the fork

bind = os.environ.get("VL_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("VL_WORKERS", "1"))
worker_class = "gthread"
threads = int(os.environ.get("VL_HTTP_THREADS", "16"))
preload_app = True
timeout = int(os.environ.get("VL_WORKER_TIMEOUT", "120"))
graceful_timeout = int(os.environ.get("VL_GRACEFUL_TIMEOUT", "30"))
keepalive = 5
accesslog = os.environ.get("VL_ACCESS_LOG", "-")
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss'
loglevel = os.environ.get("VL_LOG_LEVEL", "info").lower()


def post_worker_init(worker):
    worker.wsgi.extensions["vlservice"].start_in_background()


def worker_exit(server, worker):
    import logging
    import sys

    exc = sys.exc_info()[1]  # Gunicorn calls this hook while the worker's SystemExit propagates
    code = exc.code if isinstance(exc, SystemExit) else (1 if exc else 0)
    code = code if isinstance(code, int) else (0 if code is None else 1)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF)
