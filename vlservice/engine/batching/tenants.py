"""Each API key is a tenant; a tenant holds at most its fair share of the server's places
(waiting or running) while other tenants are active, and all of them when alone.

A tenant is active while it has a request in flight or sent one within the last `window_s`: a
tenant that filled every place before another arrived cannot refill them once the other has
asked (`policy.fair_share`). Which of the admitted requests run next is `policy.admit`'s choice,
also by tenant.
"""

from __future__ import annotations

import threading
import time

from . import policy


class TenantShares:
    def __init__(self, places: int, window_s: float):
        self.places, self.window_s = places, window_s
        self._in_flight: dict[str, int] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def enter(self, tenant: str) -> int | None:
        """Takes a place for `tenant`; None when it already holds its fair share (nothing taken),
        else the share it had."""
        now = time.monotonic()
        with self._lock:
            self._seen[tenant] = now
            for name, t in list(self._seen.items()):
                if now - t > self.window_s and not self._in_flight.get(name):
                    del self._seen[name]
            share = policy.fair_share(self.places, len(self._seen))
            if self._in_flight.get(tenant, 0) >= share:
                return None
            self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
            return share

    def leave(self, tenant: str) -> None:
        with self._lock:
            left = self._in_flight.get(tenant, 0) - 1
            if left > 0:
                self._in_flight[tenant] = left
            else:
                self._in_flight.pop(tenant, None)

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return dict(self._in_flight)
