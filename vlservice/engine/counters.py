"""The service's counters (requests, completed, errors, cancelled, busy, tokens), safe to update from
every thread at once.

Callers' threads (submit: `requests`, `busy`) and generation threads (`completed`, `errors`, ...)
bump them concurrently; a bare `dict[name] += 1` is a read-modify-write that loses counts when two
threads interleave, so every change goes through one lock. `/api/stats` and the soak read a
consistent snapshot.

Kept beside prometheus_client on purpose: the engine does not import it (obs/metrics.py reads the
service, never the reverse), and `/api/stats` and the soak need one consistent snapshot of all of
these as plain ints, which prometheus_client's separately locked metrics give only through their
private values.
"""

from __future__ import annotations

import threading


class Counters:
    def __init__(self, *names: str):
        self._values = dict.fromkeys(names, 0)
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
