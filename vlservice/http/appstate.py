"""A worker's app state, what the HTTP handlers share: settings, the service, the CPU sampler and
the metrics; and its lifecycle (started after the fork, drained on SIGTERM)."""

from __future__ import annotations

import logging
import threading
import time

from flask import current_app

from ..config import Settings
from ..obs.cpu import CpuSampler
from ..obs.metrics import Metrics
from .remote import RemoteFetcher

log = logging.getLogger(__name__)


class AppState:
    def __init__(self, settings: Settings, service):
        self.settings = settings
        self.service = service
        self.sampler = CpuSampler()
        self.metrics = Metrics(service)
        self.started = time.time()
        self.fetch_remote = RemoteFetcher(settings) if settings.remote_images else None
        self._start_lock = threading.Lock()

    def priority_allowed(self, tenant: str) -> bool:
        """Whether `tenant` may set X-Request-Priority: always without API keys (one tenant only
        reorders its own requests); with keys, the tenants VL_PRIORITY_TENANTS names ("*": all)."""
        if not self.settings.auth:
            return True
        allowed = {t.strip() for t in self.settings.priority_tenants.split(",") if t.strip()}
        return "*" in allowed or tenant in allowed

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

    def drain_then(self, stop, grace_s: float) -> None:
        """Refuse new requests now; call `stop()` once the running ones are done, or a second before
        `grace_s` ends (Gunicorn's master kills the worker then). Returns at once (a signal handler)."""
        self.service.drain()
        deadline = time.monotonic() + max(0.0, grace_s - 1.0)

        def wait():
            while not self.service.idle() and time.monotonic() < deadline:
                time.sleep(0.1)
            log.info("drained (%s); stopping", "idle" if self.service.idle() else "grace period over")
            stop()

        threading.Thread(target=wait, name="vlservice-drain", daemon=True).start()

    def encode_ms_per_token(self):
        t = self.service.last_timings
        if t.get("vision_encode_ms") and t.get("image_tokens"):
            return round(t["vision_encode_ms"] / t["image_tokens"], 3)
        return None


def current() -> AppState:
    """The current app's state (inside a request)."""
    return current_app.extensions["vlservice"]
