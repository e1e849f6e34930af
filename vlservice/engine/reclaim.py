"""Giving memory back to the system: glibc's `malloc_trim` when the model goes idle, and the
pages of the checkpoint that loading left mapped in the process."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Literal

MADV_DONTNEED = 4
_VMA = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$")


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
            _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def malloc_trim() -> bool:
    """glibc's `malloc_trim(0)`: return free heap pages to the system. False where there is none."""
    libc = _libc()
    if not libc:
        return False
    libc.malloc_trim(0)
    return True


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap() -> dict | None:
    """Where the process's heap is, by glibc (`mallinfo2`, all arenas): bytes in use by live
    allocations (`in_use`), free but held by the allocator (`free`: what `malloc_trim` could give
    back, or fragments it cannot), mmapped blocks (`mmapped`); and the kernel's anonymous resident
    bytes (`rss_anon`). None where there is no glibc (musl, a preloaded jemalloc or tcmalloc answer
    with their own numbers, or none)."""
    libc = _libc()
    if not libc or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    out = {"in_use": int(info.uordblks), "free": int(info.fordblks), "mmapped": int(info.hblkhd),
           "arena": int(info.arena)}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                out["rss_anon"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def mapped_file_pages(directory: Path) -> list[dict]:
    """This process's mappings of files under `directory`: address range, resident kilobytes and
    those copied on write (Linux `/proc/self/smaps`; empty elsewhere)."""
    root = str(Path(directory).resolve()) + "/"
    out: list[dict] = []
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return out
    cur: dict | None = None
    for line in lines:
        m = _VMA.match(line)
        if m:
            cur = None
            if m.group(3).startswith(root):
                cur = {"start": int(m.group(1), 16), "end": int(m.group(2), 16), "path": m.group(3),
                       "Rss": 0, "Anonymous": 0}
                out.append(cur)
        elif cur is not None:
            key, _, value = line.partition(":")
            if key in cur:
                cur[key] = int(value.split()[0])
    return out


def release_file_pages(directory: Path) -> int:
    """Drop from this process the resident pages of its read-only use of files under `directory`;
    returns the bytes released.

    Loading reads the whole checkpoint through a memory map that stays open while any tensor of it
    lives (the vision tower's, the norms'), so every page read while the weights were converted or
    packed stays in the process: for the real-size float32 checkpoint 6.4 GiB, counted in the
    Gunicorn master's RSS and private memory, which no worker maps. `madvise(MADV_DONTNEED)` takes
    them out of the process; they stay in the page cache for the kernel to keep or reclaim, and a
    tensor still backed by the file reads them again from there when touched. Only mappings with
    no page written privately (copied on write: `Anonymous` in smaps) are released, since dropping
    those would lose the writes; pages merely dirty in the page cache (a checkpoint just written)
    are the file's own and stay there."""
    libc = _libc()
    if not libc:
        return 0
    released = 0
    for vma in mapped_file_pages(directory):
        if vma["Rss"] and not vma["Anonymous"]:
            if libc.madvise(vma["start"], vma["end"] - vma["start"], MADV_DONTNEED) == 0:
                released += vma["Rss"] * 1024
    return released


_LIBC: ctypes.CDLL | Literal[False] | None = None  # None: not looked up yet; False: there is none
