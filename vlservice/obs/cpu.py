"""CPU utilisation, sampled by one background thread at a fixed interval with psutil.

The page shows per-core bars and a short history while a generation runs; `/api/stats` reads the
latest sample and the history from here instead of blocking a request thread in
`psutil.cpu_percent(interval=...)`. Threads do not survive a fork, so each Gunicorn worker starts
its own sampler after forking.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
from pathlib import Path

import psutil


@functools.cache
def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """This CPU's model name and feature flags (`/proc/cpuinfo`: "unknown" and none elsewhere)."""
    model, flags = "unknown", frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


class CpuSampler:
    def __init__(self, interval: float = 0.5, history: int = 120):
        self.interval = interval
        self.history: collections.deque = collections.deque(maxlen=history)
        self.per_core: list[float] = []
        self.total = 0.0
        self.process = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> "CpuSampler":
        if self._thread and self._thread.is_alive() and self.process.pid == os.getpid():
            return self
        self.process = psutil.Process(os.getpid())
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to measure
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            per_core = psutil.cpu_percent(percpu=True)
            total = sum(per_core) / max(1, len(per_core))
            with self._lock:
                self.per_core, self.total = per_core, total
                self.history.append((round(time.time(), 2), round(total, 1)))

    def snapshot(self) -> dict:
        with self._lock:
            return {"total": round(self.total, 1), "per_core": [round(x, 1) for x in self.per_core],
                    "history": list(self.history), "interval_s": self.interval,
                    "cores_logical": psutil.cpu_count(), "cores_physical": psutil.cpu_count(logical=False)}

    def rss_bytes(self) -> int:
        return self.process.memory_info().rss
