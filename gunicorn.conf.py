"""Gunicorn settings for vlservice, from the `VL_*` environment through `Settings` (the README's
settings table: VL_BIND, VL_WORKERS, VL_HTTP_THREADS, VL_WORKER_TIMEOUT, VL_GRACEFUL_TIMEOUT,
VL_ACCESS_LOG, VL_LOG_LEVEL). Gunicorn runs this file from the repository root, so `vlservice`
imports; `vlservice.config` is cheap to import (no torch).

- preload_app: the app (weights, ONNX export) is built once in the master, before the fork, so
  the weights are shared copy-on-write between workers instead of loaded twice.
- gthread workers: one thread streams a generation while others answer /healthz, /api/stats and
  the page. The model itself belongs to one scheduler thread per worker, which batches the
  running requests (VL_MAX_BATCH) while the rest wait in a bounded queue (VL_QUEUE_SIZE).
- HTTP framing is Gunicorn's own (stock gthread, its parser and its request limits below), never
  ours. A malformed request gets Gunicorn's 400 (in OpenAI's error shape:
  vlservice/http/parse_errors.py) and the worker goes on. What stock gthread does not
  bound is time: a client that sends its headers or body slowly holds a thread (after a 5 s wait
  for its first byte) for as long as it keeps sending, and a `Connection: close` peer that never
  closes is drained for 2 s on the main loop. So direct Gunicorn is for a trusted network; anything
  a network reaches goes through nginx, which buffers whole requests before Gunicorn sees them
  (the Docker image runs it in front; README, Settings and deployment).
- the allocator: glibc's malloc keeps what a long-running worker frees (issue 45), so the master
  starts on jemalloc when it is installed (VL_ALLOCATOR; docs/operations.md, memory over hours).
- post_worker_init: torch and ONNX Runtime thread pools are not fork-safe, so each worker sets
  its threads, opens its ONNX Runtime session and warms up after the fork (in a background
  thread: /healthz answers at once, /readyz says 503 until the warm-up is done). VL_DEFER_START
  tells wsgi.py not to start the service in the master.
- post_worker_init also replaces the worker's SIGTERM handler with a drain: the service refuses
  new requests at once (503 `draining` with Retry-After, /readyz 503, so balancers move on) while
  the running ones finish; once none is left (or VL_GRACEFUL_TIMEOUT has nearly passed) the
  worker stops as Gunicorn's own handler would. Its listening socket stays open meanwhile, so a
  request that still arrives gets that 503 instead of a refused connection.
- worker_exit: a worker that is done leaves with os._exit (keeping its exit code) once its logs
  are flushed. Interpreter shutdown would run the native libraries' static destructors while
  their pool threads still wait on them, and the worker aborted ("terminate called after throwing
  std::system_error"); there is nothing left to save at that point (the disk cache is written
  entry by entry).
- timeout: the gthread worker's heartbeat runs in its main loop, so a long generation does not
  trip it; it only catches a stuck worker.
"""

import os

from vlservice import allocator as _allocator
from vlservice.config import Settings
from vlservice.http import parse_errors

parse_errors.install()  # Gunicorn's refusals (malformed requests) in OpenAI's error shape

os.environ.setdefault("VL_DEFER_START", "1")  # for wsgi.py: start in post_worker_init, after the fork
_settings = Settings.from_env()  # names starting with "_" are not Gunicorn settings
# The allocator (VL_ALLOCATOR, default jemalloc when installed): a master not yet on it re-executes
# itself here, once, with the library preloaded; its workers inherit it (vlservice/allocator.py).
_allocator.ensure(_settings.allocator)

bind = _settings.bind
workers = _settings.workers
worker_class = "gthread"
# Gunicorn's own request limits: the request line, the number of header
# fields and the size of one; larger gets Gunicorn's 400 (431 through nginx's smaller buffers).
limit_request_line = 8190  # nginx's front reads request lines up to its 8k header buffers
limit_request_fields = 100
limit_request_field_size = 8190
# No `gunicornc` control socket: one per user home, shared by every Gunicorn that user runs (the
# tests run several), and nothing here uses it.
control_socket_disable = True
threads = _settings.http_threads
preload_app = True
timeout = _settings.worker_timeout
graceful_timeout = _settings.graceful_timeout
keepalive = 5
accesslog = _settings.access_log
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss'
loglevel = _settings.log_level.lower()


def post_worker_init(worker):
    import signal

    ctx = worker.wsgi.extensions["vlservice"]
    ctx.start_in_background()
    stop = worker.handle_exit  # Gunicorn's: the worker's loop ends, in-flight requests get graceful_timeout

    def drain(sig, frame):
        ctx.drain_then(lambda: stop(sig, frame), worker.cfg.graceful_timeout)

    signal.signal(signal.SIGTERM, drain)


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
