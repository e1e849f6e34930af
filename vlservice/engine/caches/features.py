"""The vision-feature cache: a second question about the same image skips the encoder.

Keys are content hashes (the resized pixels, the grid, the resolution budget, the model
fingerprint and the vision backend), never file names or URLs, so the same picture sent twice by
any client hits. Two tiers: an in-memory LRU bounded in bytes, and an optional disk tier bounded in
bytes that survives a restart; a disk entry that cannot be read is a miss and is deleted.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..vision import VisionFeatures

log = logging.getLogger(__name__)


def feature_key(digest: str, grid_thw: tuple, budget: int, model_fp: str, backend: str) -> str:
    raw = f"{digest}|{tuple(grid_thw)}|{budget}|{model_fp}|{backend}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


class FeatureCache:
    def __init__(self, memory_bytes: int, disk_dir: Path | None = None, disk_bytes: int = 0):
        self.memory_bytes = memory_bytes
        self.disk_dir = Path(disk_dir) if disk_dir and disk_bytes > 0 else None
        self.disk_bytes = disk_bytes
        self._mem: OrderedDict[str, VisionFeatures] = OrderedDict()
        self._mem_used = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = self.evictions = self.corrupt = 0
        if self.disk_dir:
            self.disk_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------- public
    def get(self, key: str) -> VisionFeatures | None:
        with self._lock:
            feats = self._mem.get(key)
            if feats is not None:
                self._mem.move_to_end(key)
                self.hits += 1
                return feats
        feats = self._disk_get(key)
        with self._lock:
            if feats is None:
                self.misses += 1
                return None
            self.hits += 1
            self.disk_hits += 1
            self._mem_put(key, feats)
        return feats

    def put(self, key: str, feats: VisionFeatures) -> None:
        with self._lock:
            self._mem_put(key, feats)
        self._disk_put(key, feats)

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()
            self._mem_used = 0

    def stats(self) -> dict:
        with self._lock:
            return {
                "hits": self.hits, "misses": self.misses, "disk_hits": self.disk_hits,
                "entries": len(self._mem), "bytes": self._mem_used, "capacity_bytes": self.memory_bytes,
                "evictions": self.evictions, "corrupt": self.corrupt,
                "disk_bytes": self._disk_usage() if self.disk_dir else 0,
            }

    # ----------------------------------------------------------------- memory
    def _mem_put(self, key: str, feats: VisionFeatures) -> None:
        if feats.nbytes > self.memory_bytes:
            return
        old = self._mem.pop(key, None)
        if old is not None:
            self._mem_used -= old.nbytes
        self._mem[key] = feats
        self._mem_used += feats.nbytes
        while self._mem_used > self.memory_bytes:
            _, evicted = self._mem.popitem(last=False)
            self._mem_used -= evicted.nbytes
            self.evictions += 1

    # ----------------------------------------------------------------- disk
    def _path(self, key: str) -> Path:
        return self.disk_dir / key[:2] / f"{key}.npz"

    def _disk_get(self, key: str) -> VisionFeatures | None:
        if not self.disk_dir:
            return None
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                n = int(data["n_deepstack"])
                feats = VisionFeatures(embeds=data["embeds"].copy(),
                                       deepstack=[data[f"deepstack_{i}"].copy() for i in range(n)])
            os.utime(path)  # recently used: evicted last
            return feats
        except Exception as exc:  # truncated, garbage, wrong keys: a miss, and the file goes
            log.warning("removing unreadable feature cache entry %s (%s)", path.name, type(exc).__name__)
            self.corrupt += 1
            path.unlink(missing_ok=True)
            return None

    def _disk_put(self, key: str, feats: VisionFeatures) -> None:
        if not self.disk_dir or feats.nbytes > self.disk_bytes:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            arrays = {f"deepstack_{i}": d for i, d in enumerate(feats.deepstack)}
            np.savez(buf, embeds=feats.embeds, n_deepstack=np.int64(len(feats.deepstack)), **arrays)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, path)
            self._disk_evict()
        except OSError as exc:  # a full or read-only disk must not fail the request
            log.warning("could not write the feature cache entry: %s", exc)

    def _entries(self):
        return [p for p in self.disk_dir.glob("*/*.npz")]

    def _disk_usage(self) -> int:
        total = 0
        for p in self._entries():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def _disk_evict(self) -> None:
        entries = []
        for p in self._entries():
            try:
                st = p.stat()
                entries.append((st.st_mtime, st.st_size, p))
            except FileNotFoundError:
                pass
        total = sum(e[1] for e in entries)
        for _, size, p in sorted(entries):
            if total <= self.disk_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
