"""The process's memory allocator: which one is loaded, and starting Gunicorn with the chosen one.

glibc's malloc keeps the memory a long-running worker frees, in per-thread arenas it seldom gives
back (issue 45: under constant load a worker's RSS less its caches grew 40-70 MB/min, all of it
free-but-held heap). An allocator is chosen before the process starts (`LD_PRELOAD`), so
`gunicorn.conf.py` calls `ensure()` first thing: with `VL_ALLOCATOR=jemalloc` (the default,
`auto`, takes it when the library is installed) the master re-executes itself once with the library
preloaded, and its workers inherit it. Imports nothing heavy (gunicorn.conf.py runs it in the
master before anything else)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

CHOICES = ("auto", "jemalloc", "tcmalloc", "glibc")
# Debian/Ubuntu's packages (libjemalloc2, libtcmalloc-minimal4), by architecture
LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2",),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
}
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
_MARK = "VL_ALLOCATOR_EXEC"  # set across the one re-exec, so that it happens at most once


def find(name: str) -> str | None:
    """The installed library of allocator `name` (a path), or None."""
    for directory in LIB_DIRS:
        for lib in LIBRARIES.get(name, ()):
            path = os.path.join(directory, lib)
            if os.path.isfile(path):
                return path
    return None


@functools.cache
def loaded() -> str:
    """The allocator this process runs on: "jemalloc" or "tcmalloc" when its library is mapped,
    else "glibc" (Linux; elsewhere "glibc" as well, which is what it means there: the system's).
    Read once: a process's allocator does not change after it starts."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    for name, libs in LIBRARIES.items():
        if any("/" + lib in maps for lib in libs):
            return name
    return "glibc"


def wanted(setting: str) -> str | None:
    """The allocator `VL_ALLOCATOR=setting` asks for: None for glibc (nothing to preload)."""
    if setting == "glibc":
        return None
    if setting == "auto":
        return "jemalloc" if find("jemalloc") else None
    return setting


def ensure(setting: str, *, execv=os.execve) -> str:
    """Run on the allocator `setting` names: return the one loaded, re-executing this process
    (same interpreter, same arguments) with its library in `LD_PRELOAD` when it is not loaded yet.
    Raises ValueError for an unknown setting or a named allocator that is not installed (`auto` falls
    back to glibc without a word: the README's start command works on a machine without jemalloc)."""
    if setting not in CHOICES:
        raise ValueError(f"VL_ALLOCATOR={setting!r}: choose one of {', '.join(CHOICES)}")
    name = wanted(setting)
    current = loaded()
    if name is None or current == name:
        return current
    lib = find(name)
    if lib is None:
        raise ValueError(f"VL_ALLOCATOR={setting}: {name} is not installed (Debian: apt-get install "
                         f"{'libjemalloc2' if name == 'jemalloc' else 'libtcmalloc-minimal4'}), or set "
                         "VL_ALLOCATOR=glibc")
    if os.environ.get(_MARK) == lib:  # preloaded and still not mapped: the loader refused it
        raise ValueError(f"VL_ALLOCATOR={setting}: {lib} did not load with LD_PRELOAD")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join([lib, *[p for p in env.get("LD_PRELOAD", "").split(":") if p and p != lib]])
    env[_MARK] = lib
    sys.stdout.flush()
    sys.stderr.flush()
    execv(sys.executable, list(sys.orig_argv), env)
    return name  # only reached when `execv` is a test's stand-in
