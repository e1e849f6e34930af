"""Who gets the model next: a lock whose waiters are served by (priority, arrival), with a timeout
and cancellation; and glibc's `malloc_trim` for when the model goes idle."""

from __future__ import annotations

import heapq
import itertools
import threading
import time


def malloc_trim() -> bool:
    """glibc's `malloc_trim(0)`: return free heap pages to the system. False where there is none."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if not _LIBC:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC = None


class PriorityLock:
    """One holder at a time; waiters served by (priority, arrival). Counts who waits."""

    def __init__(self):
        self._cond = threading.Condition()
        self._held = False
        self._waiters: list = []
        self._seq = itertools.count()

    def acquire(self, priority: int, timeout: float, cancelled: threading.Event) -> bool:
        with self._cond:
            me = (priority, next(self._seq))
            heapq.heappush(self._waiters, me)
            deadline = time.monotonic() + timeout
            try:
                while self._held or self._waiters[0] != me:
                    left = deadline - time.monotonic()
                    if left <= 0 or cancelled.is_set():
                        return False
                    self._cond.wait(min(left, 0.25))
                self._held = True
                return True
            finally:
                self._waiters.remove(me)
                heapq.heapify(self._waiters)
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def held(self) -> bool:
        return self._held
