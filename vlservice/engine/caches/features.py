"""The vision-feature cache: a second question about the same image skips the encoder.

Keys are content hashes (the resized pixels, the grid, the resolution budget, the model
fingerprint and the vision backend), never file names or URLs, so the same picture sent twice by
any client hits. Two tiers: an in-memory LRU bounded in bytes (cachetools), and an optional disk
tier bounded in bytes that survives a restart; a disk entry that cannot be read is a miss and is
deleted.

The disk tier keeps its own account (file -> size, least recently used first) so that `stats()`,
polled every second by the page, never walks the folder: the folder is walked once at start and
the account updated on every write and eviction. Other Gunicorn workers write to the same folder,
so every write also stamps the folder (`.stamp`'s modification time); a worker that finds the
stamp is not its own walks the folder again before it counts, and the budget holds for the folder,
not per worker. With one worker that never happens.

With `VL_REDIS_URL` a third tier sits behind these two (`shared.py`): what another replica
encoded is found there, and every new entry is written there too.

What comes back from disk or Redis is checked before use against what the image's grid implies
(`FeatureShape`: grid_t*grid_h*grid_w / merge_size**2 tokens, the model's hidden size, its number of
deepstack layers, float32, finite values): a file or a Redis value may be stale, damaged or forged
(whoever can write Redis can plant one, with a valid checksum). A mismatch is a miss: the encoder
runs, the entry is replaced, `mismatched` counts it, and the first one is logged (the later ones
are only counted).

Why not diskcache (issue 32): measured in one run against a diskcache tier doing the same (npz bytes,
`eviction_policy="least-recently-used"`), features of Qwen3-VL-2B's shape (4 arrays of (tokens, 2048)
float32), medians on the 2-core dev box under load: a get of 2 MB took 6.5 ms here against 9-12 ms,
of 8 MB 13-15 ms against 30-51 ms (its LRU writes a SQLite row on every read, and the value is read
whole before it is parsed); a put was no faster (2 MB: 24 ms against 19-39 ms). Nor does it hold
the budget as this does: over its `size_limit` a put deletes `cull_limit` (default 10) entries at
once, so two processes writing 2 MB entries under a 12 MB budget left 1.5 MB in the folder (ours
12.0 MB), while `cull_limit=1` lets one large entry push the folder over; and its size counts its
SQLite file, so a budget of a few entries (the tests') holds nothing.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from ..model.vision import VisionFeatures
from .shared import CorruptEntry, SharedStore, pack_features, unpack_features

log = logging.getLogger(__name__)


def feature_key(digest: str, grid_thw: tuple, budget: int, model_fp: str, backend: str) -> str:
    raw = f"{digest}|{tuple(grid_thw)}|{budget}|{model_fp}|{backend}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True)
class FeatureShape:
    """What one image's (or clip's) features must be: `tokens` rows of `hidden` floats of `dtype`,
    in the embeds and in each of `layers` deepstack arrays."""

    tokens: int
    hidden: int
    layers: int
    dtype: str = "float32"

    @classmethod
    def of(cls, grid_thw: tuple, merge_size: int, hidden: int, layers: int) -> "FeatureShape":
        t, h, w = (int(x) for x in grid_thw)
        return cls(tokens=t * h * w // (merge_size * merge_size), hidden=hidden, layers=layers)

    def mismatch(self, feats: VisionFeatures) -> str | None:
        """Why `feats` cannot be this image's features, or None when they fit."""
        if not isinstance(feats.deepstack, list) or len(feats.deepstack) != self.layers:
            return f"{len(feats.deepstack)} deepstack layers, expected {self.layers}"
        want = (self.tokens, self.hidden)
        for name, a in (("embeds", feats.embeds), *((f"deepstack {i}", d) for i, d in enumerate(feats.deepstack))):
            if not isinstance(a, np.ndarray) or a.dtype != np.dtype(self.dtype) or a.shape != want:
                return (f"{name} is {getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}, "
                        f"expected {self.dtype} {want}")
            if not np.isfinite(a.sum()):  # one pass, no temporary: NaN or inf anywhere (or overflow) shows
                return f"{name} has values that are not finite"
        return None


class _MemoryTier(LRUCache):
    """Features by key, bounded in bytes; counts what it evicts."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes, getsizeof=lambda feats: feats.nbytes)
        self.evictions = 0

    def popitem(self):
        item = super().popitem()
        self.evictions += 1
        return item


class _DiskIndex(LRUCache):
    """The disk tier's files (path -> size), bounded in bytes; evicting an entry deletes its file."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes, getsizeof=lambda size: size)

    def popitem(self):
        path, size = super().popitem()
        path.unlink(missing_ok=True)
        return path, size


class FeatureCache:
    def __init__(self, memory_bytes: int, disk_dir: Path | None = None, disk_bytes: int = 0,
                 shared: SharedStore | None = None):
        self.memory_bytes = memory_bytes
        self.shared = shared
        self.disk_dir = Path(disk_dir) if disk_dir and disk_bytes > 0 else None
        self.disk_bytes = disk_bytes
        self._mem = _MemoryTier(memory_bytes)
        self._lock = threading.Lock()
        self.hits = self.misses = self.disk_hits = self.shared_hits = self.corrupt = self.mismatched = 0
        if self.disk_dir:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        self._stamp_seen = self._stamp_ns()
        self._disk = self._disk_scan()

    # ----------------------------------------------------------------- public
    def get(self, key: str, expect: FeatureShape | None = None) -> VisionFeatures | None:
        """The features stored under `key`, or None. `expect`: what they must be (the image's
        grid and the model's widths); an entry from disk or Redis that differs is a miss, and goes."""
        with self._lock:
            feats = self._mem.get(key)  # a hit becomes the most recently used
            if feats is not None:  # only what the encoder made or a checked read gets here
                self.hits += 1
                return feats
        feats = self._disk_get(key, expect)
        tier = "disk_hits"
        if feats is None:
            feats, tier = self._shared_get(key, expect), "shared_hits"
        with self._lock:
            if feats is None:
                self.misses += 1
                return None
            self.hits += 1
            setattr(self, tier, getattr(self, tier) + 1)
            self._mem_put(key, feats)
        return feats

    def put(self, key: str, feats: VisionFeatures) -> None:
        with self._lock:
            self._mem_put(key, feats)
        self._disk_put(key, feats)
        if self.shared:
            self.shared.put("features", key, pack_features(feats))

    def stats(self) -> dict:
        with self._lock:
            return {
                "hits": self.hits, "misses": self.misses, "disk_hits": self.disk_hits,
                "entries": len(self._mem), "bytes": self._mem.currsize, "capacity_bytes": self.memory_bytes,
                "evictions": self._mem.evictions, "corrupt": self.corrupt, "shared_hits": self.shared_hits,
                "mismatched": self.mismatched,
                "disk_bytes": self._disk.currsize, "disk_entries": len(self._disk),
            }

    # ----------------------------------------------------------------- memory
    def _mem_put(self, key: str, feats: VisionFeatures) -> None:
        if feats.nbytes <= self.memory_bytes:  # larger than the whole tier: not kept
            self._mem[key] = feats

    def _mismatch(self, tier: str, key: str, feats: VisionFeatures, expect: FeatureShape | None) -> bool:
        """True (counted, the first one logged) when `feats`, read from `tier`, are not what `expect` says."""
        why = expect.mismatch(feats) if expect is not None else None
        if why is None:
            return False
        with self._lock:
            self.mismatched += 1
            first = self.mismatched == 1
        (log.warning if first else log.debug)(
            "ignoring a feature entry in %s that does not fit its image (%s; key %s): encoding it again%s",
            tier, why, key[:12], " (further ones are counted in the feature cache's `mismatched`, not logged)"
            if first else "")
        return True

    # ----------------------------------------------------------------- shared (Redis)
    def _shared_get(self, key: str, expect: FeatureShape | None = None) -> VisionFeatures | None:
        data = self.shared.get("features", key) if self.shared else None
        if data is None:
            return None
        assert self.shared is not None
        try:
            feats = unpack_features(data)
        except CorruptEntry as exc:  # a miss: the encoder runs and the entry is written anew
            self.shared.corrupt("features", key, str(exc))
            return None
        if self._mismatch("Redis", key, feats, expect):
            self.shared.drop("features", key)  # counted there too; written anew by the encoder's put
            return None
        return feats

    # ----------------------------------------------------------------- disk
    def _path(self, key: str) -> Path:
        assert self.disk_dir is not None, "the disk tier's helpers run only when it is on"
        return self.disk_dir / key[:2] / f"{key}.npz"

    def _stamp_ns(self) -> int | None:
        try:
            return (self.disk_dir / ".stamp").stat().st_mtime_ns if self.disk_dir else None
        except FileNotFoundError:
            return None

    def _stamp(self) -> None:
        """Mark the folder as written by this process (a time of our own, read back as the
        filesystem stored it)."""
        assert self.disk_dir is not None, "the disk tier's helpers run only when it is on"
        path = self.disk_dir / ".stamp"
        path.touch()
        now = time.time_ns()
        os.utime(path, ns=(now, now))
        self._stamp_seen = self._stamp_ns()

    def _disk_scan(self) -> _DiskIndex:
        """The folder's entries, oldest first (mtime: a hit touches its file); beyond the budget the
        oldest are deleted."""
        index = _DiskIndex(self.disk_bytes)
        if not self.disk_dir:
            return index
        found = []
        for path in self.disk_dir.glob("*/*.npz"):
            try:
                st = path.stat()
            except FileNotFoundError:  # another worker evicted it meanwhile
                continue
            found.append((st.st_mtime, str(path), st.st_size))
        for _, name, size in sorted(found):
            if size > self.disk_bytes:  # the budget was lowered since it was written
                Path(name).unlink(missing_ok=True)
            else:
                index[Path(name)] = size
        return index

    def _disk_get(self, key: str, expect: FeatureShape | None = None) -> VisionFeatures | None:
        if not self.disk_dir:
            return None
        path = self._path(key)
        try:
            with np.load(path, allow_pickle=False) as data:
                n = int(data["n_deepstack"])
                feats = VisionFeatures(embeds=data["embeds"].copy(),
                                       deepstack=[data[f"deepstack_{i}"].copy() for i in range(n)])
            os.utime(path)  # recently used: evicted last, by this process and by the next scan
            size = path.stat().st_size
        except FileNotFoundError:  # never written, or evicted by another worker: a plain miss
            with self._lock:
                self._disk.pop(path, None)
            return None
        except Exception as exc:  # truncated, garbage, wrong keys: a miss, and the file goes
            log.warning("removing unreadable feature cache entry %s (%s)", path.name, type(exc).__name__)
            with self._lock:
                self.corrupt += 1
                self._disk.pop(path, None)
            path.unlink(missing_ok=True)
            return None
        if self._mismatch("the disk cache", key, feats, expect):
            with self._lock:
                self._disk.pop(path, None)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._disk[path] = size  # most recently used (and known, if another worker wrote it)
        return feats

    def _disk_put(self, key: str, feats: VisionFeatures) -> None:
        if not self.disk_dir or feats.nbytes > self.disk_bytes:
            return
        path = self._path(key)
        buf = io.BytesIO()
        arrays = {f"deepstack_{i}": d for i, d in enumerate(feats.deepstack)}
        np.savez(buf, embeds=feats.embeds, n_deepstack=np.int64(len(feats.deepstack)), **arrays)
        data = buf.getvalue()
        if len(data) > self.disk_bytes:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk must not fail the request
            log.warning("could not write the feature cache entry: %s", exc)
            return
        with self._lock:
            if self._stamp_ns() != self._stamp_seen:  # another worker wrote or evicted since our last look
                self._disk = self._disk_scan()  # what is really there (this entry too), oldest beyond the budget go
            else:
                self._disk[path] = len(data)  # the least recently used beyond the budget go
            self._stamp()
