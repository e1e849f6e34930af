"""glibc's `malloc_trim`, for when the model goes idle: the freed heap goes back to the system."""

from __future__ import annotations

import ctypes
from typing import Literal


def malloc_trim() -> bool:
    """glibc's `malloc_trim(0)`: return free heap pages to the system. False where there is none."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if not _LIBC:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC: ctypes.CDLL | Literal[False] | None = None  # None: not looked up yet; False: there is none
