"""The shared tier in Redis (`VL_REDIS_URL`): what one replica computed, every replica reuses.

Vision features and whole greedy answers are content-addressed (their keys hash the pixels or the
prompt, the model's fingerprint and the vision backend), so they mean the same on every replica:
an image encoded on replica A is a hit on replica B. The conversation's KV cache is not shared (it
is large, and lives beside the model that made it); the load balancer keeps a session on its
replica instead.

Redis is a cache, never a dependency: every call has a short deadline and no retries, and any
failure (down, slow, full, an entry that does not decode) makes the call a miss or a skipped
write, counted, and the request goes on with the local tiers. The first failure of an outage is
logged (once); for `RETRY_S` after it Redis is not asked at all, so a dead Redis costs requests
nothing; then it is tried again, and the first success ends the outage (logged too). Entries
expire after `VL_REDIS_TTL_S`; Redis' own `maxmemory` with `allkeys-lru` bounds the whole tier
(deploy/k8s/redis.yaml, compose.scale.yaml).

The deadline (`VL_REDIS_TIMEOUT_S`) is per call, not per socket operation: redis-py's
socket_timeout bounds each connect, send and recv on its own, so a Redis that answers slowly (a
large value trickling in, a connect and a send and a recv each just under the timeout) could hold
a request many times longer. Each call therefore runs on a small pool of its own threads and the
request waits for it at most the deadline; past it the call is a fallback like any failure (the
late call, still bounded by socket_timeout, ends in its pool thread and its result is dropped).

Features travel as bytes with their shapes and dtypes (`pack_features`), with a checksum, so a
truncated or foreign value is refused, not fed to the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from ..model.vision import VisionFeatures

log = logging.getLogger(__name__)

RETRY_S = 1.0  # after a failure, Redis is left alone this long (requests go on locally meanwhile)
POOL_THREADS = 4  # Redis calls in flight at once per process (a late call holds one until socket_timeout)
MAGIC = b"VLF1"
_HEAD = struct.Struct("<4sI")  # magic, length of the JSON header that follows


class CorruptEntry(ValueError):
    """A stored value that does not decode into what its key promises."""


def redact_url(url: str) -> str:
    """`url` fit to log or show: its user name and password (and any query, which redis-py also
    reads a password from) replaced; a URL that does not parse shows only its scheme."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return url.split(":", 1)[0] + "://***"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    auth = "***@" if parts.username or parts.password or "@" in parts.netloc else ""
    query = "?***" if parts.query else ""
    return f"{parts.scheme}://{auth}{host}{port}{parts.path}{query}"


def pack_features(feats: VisionFeatures) -> bytes:
    arrays = [np.ascontiguousarray(a) for a in (feats.embeds, *feats.deepstack)]
    body = b"".join(a.tobytes() for a in arrays)
    header = json.dumps({"arrays": [[a.dtype.str, list(a.shape)] for a in arrays],
                         "sum": hashlib.blake2b(body, digest_size=16).hexdigest()}).encode()
    return _HEAD.pack(MAGIC, len(header)) + header + body


def unpack_features(data: bytes) -> VisionFeatures:
    try:
        magic, n = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise CorruptEntry("not a feature entry")
        header = json.loads(data[_HEAD.size:_HEAD.size + n])
        body = memoryview(data)[_HEAD.size + n:]
        if hashlib.blake2b(body, digest_size=16).hexdigest() != header["sum"]:
            raise CorruptEntry("checksum mismatch")
        arrays, offset = [], 0
        for dtype, shape in header["arrays"]:
            dt = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            arrays.append(np.frombuffer(body, dt, count, offset).reshape(shape).copy())
            offset += count * dt.itemsize
        if offset != len(body) or not arrays:
            raise CorruptEntry("length mismatch")
    except CorruptEntry:
        raise
    except Exception as exc:  # struct, JSON, numpy: whatever a garbled value trips
        raise CorruptEntry(f"{type(exc).__name__}: {exc}") from None
    return VisionFeatures(embeds=arrays[0], deepstack=arrays[1:])


class SharedStore:
    """One Redis connection pool for both caches, failing open, with its own counters."""

    def __init__(self, url: str, namespace: str, timeout_s: float, ttl_s: int, password: str = ""):
        """`password`: Redis' (AUTH), unless `url` carries one (`redis://:password@host`), which wins.
        Neither is ever logged or shown: only `url_shown`, the URL without its credentials."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url_shown = redact_url(url)  # never log a password
        self.namespace = namespace
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        extra = {"password": password} if password else {}
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0), **extra)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._lock = threading.Lock()
        # threads start on the first call (after the fork, in the worker), not here
        self._pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="vl-redis")
        self._down_until = 0.0
        self.up = True
        self.counts = {name: 0 for name in ("hits", "misses", "writes", "fallbacks", "outages", "corrupt")}

    # ----------------------------------------------------------------- bytes in, bytes out
    def get(self, kind: str, key: str) -> bytes | None:
        """The value, or None: a miss, or Redis unusable (a fallback)."""
        value = self._call(lambda: self._redis.get(self._key(kind, key)))
        if value is not None:
            self._count("hits")
        elif self.up:
            self._count("misses")
        return value

    def put(self, kind: str, key: str, value: bytes) -> None:
        if self._call(lambda: self._redis.set(self._key(kind, key), value, ex=self.ttl_s or None)):
            self._count("writes")

    def corrupt(self, kind: str, key: str, why: str) -> None:
        """A value that did not decode: counted, logged, and removed so that it is written anew."""
        log.warning("ignoring a corrupt %s entry in Redis (%s)", kind, why)
        self.drop(kind, key)

    def drop(self, kind: str, key: str) -> None:
        """A value its reader refused (the caller logs why): counted as corrupt, and removed."""
        self._count("corrupt")
        self._call(lambda: self._redis.delete(self._key(kind, key)))

    def stats(self) -> dict:
        with self._lock:
            return {"url": self.url_shown, "up": self.up, **self.counts}

    # ----------------------------------------------------------------- failing open
    def _key(self, kind: str, key: str) -> str:
        return f"{self.namespace}:{kind}:{key}"

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _call(self, op):
        if time.monotonic() < self._down_until:
            self._count("fallbacks")
            return None
        future = self._pool.submit(op)
        try:
            result = future.result(timeout=self.timeout_s)
        except (*self._errors, FutureTimeout) as exc:
            future.cancel()  # if it has not started yet (the pool was busy), it never runs
            with self._lock:
                self.counts["fallbacks"] += 1
                self._down_until = time.monotonic() + RETRY_S
                first = self.up
                if first:
                    self.up = False
                    self.counts["outages"] += 1
            if first:
                why = f"no answer within {self.timeout_s} s" if isinstance(exc, FutureTimeout) else exc
                log.warning("Redis at %s unusable (%s: %s): serving from local caches until it is back",
                            self.url_shown, type(exc).__name__, why)
            return None
        if not self.up:
            with self._lock:
                back, self.up = not self.up, True
            if back:
                log.warning("Redis at %s is back: the shared caches are used again", self.url_shown)
        return result
