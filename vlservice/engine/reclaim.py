"""Giving memory back to the system: glibc's `malloc_trim` when the model goes idle, and the
pages of the checkpoint that loading left mapped in the process."""

from __future__ import annotations

import ctypes
import re
import time
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
    """glibc's `malloc_trim(0)`: return free heap pages to the system. False where there is none,
    or where the process runs on another allocator (jemalloc and tcmalloc return pages themselves)."""
    from ..allocator import loaded

    libc = _libc()
    if not libc or loaded() != "glibc":
        return False
    libc.malloc_trim(0)
    return True


class Trimmer:
    """glibc's `malloc_trim` for the scheduler: when the model goes idle (at most once a second,
    `VL_MALLOC_TRIM`) and, with `busy_s` > 0, while it is busy too (at most every `busy_s` seconds,
    `VL_MALLOC_TRIM_BUSY_S`). `trims` counts the calls that reached glibc."""

    def __init__(self, enabled: bool, busy_s: float = 0.0, clock=time.monotonic):
        self.enabled, self.busy_s, self.clock = enabled, busy_s, clock
        self.last = 0.0  # monotonic time of the last trim
        self.trims = 0

    def idle(self) -> None:
        if self.enabled and self.clock() - self.last >= 1.0:
            self._trim()

    def busy(self) -> None:
        if self.enabled and self.busy_s and self.clock() - self.last >= self.busy_s:
            self._trim()

    def _trim(self) -> None:
        self.last = self.clock()
        if malloc_trim():  # glibc's; jemalloc and tcmalloc give pages back by themselves
            self.trims += 1


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _glibc_heap(libc) -> dict | None:
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    return {"in_use": int(info.uordblks), "free": int(info.fordblks), "mmapped": int(info.hblkhd),
            "arena": int(info.arena)}


def _jemalloc_heap() -> dict | None:
    """jemalloc's `stats.allocated` (live) and `stats.resident` less it (held: dirty pages, metadata),
    after refreshing its `epoch`."""
    try:
        mallctl = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                        ctypes.c_size_t]
    epoch, size = ctypes.c_uint64(1), ctypes.c_size_t(8)
    mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), 8)
    out = {}
    for key, name in (("in_use", b"stats.allocated"), ("resident", b"stats.resident"), ("active", b"stats.active"),
                      ("metadata", b"stats.metadata"), ("mapped", b"stats.mapped"), ("retained", b"stats.retained")):
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
            return None
        out[key] = int(value.value)
    return {"in_use": out["in_use"], "free": max(0, out["resident"] - out["in_use"]), "mmapped": 0,
            "arena": out["resident"], **{k: out[k] for k in ("active", "metadata", "mapped", "retained")}}


def _tcmalloc_heap() -> dict | None:
    """gperftools' `generic.current_allocated_bytes` (live) and its page heap's free bytes (held)."""
    try:
        prop = ctypes.CDLL(None).MallocExtension_GetNumericProperty
    except (OSError, AttributeError):
        return None
    prop.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
    out = {}
    for key, name in (("in_use", b"generic.current_allocated_bytes"), ("arena", b"generic.heap_size"),
                      ("free", b"tcmalloc.pageheap_free_bytes")):
        value = ctypes.c_size_t(0)
        if not prop(name, ctypes.byref(value)):
            return None
        out[key] = int(value.value)
    return {**out, "mmapped": 0}


def heap() -> dict | None:
    """Where the process's heap is, by the allocator it runs on (`allocator`: glibc's `mallinfo2`
    over all arenas, or a preloaded jemalloc's or tcmalloc's own statistics): bytes in use by live
    allocations (`in_use`), free but held by the allocator (`free`: what `malloc_trim` or a decay
    could give back, or fragments it cannot), mmapped blocks (`mmapped`, glibc's large blocks); and
    the kernel's anonymous resident bytes (`rss_anon`). None where the allocator has no statistics."""
    from ..allocator import loaded

    name = loaded()
    if name == "jemalloc":
        out = _jemalloc_heap()
    elif name == "tcmalloc":
        out = _tcmalloc_heap()
    else:
        libc = _libc()
        out = _glibc_heap(libc) if libc else None
    if out is None:
        return None
    out["allocator"] = name
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
