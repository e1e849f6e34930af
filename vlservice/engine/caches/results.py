"""Answers to identical greedy requests: the whole answer at once, no model work.

With `VL_REDIS_URL` the answers are shared between replicas (`shared.py`): an answer one replica
computed is found by the others; a stored value that is not such an answer is ignored."""

from __future__ import annotations

import hashlib
import json
import threading

from cachetools import LRUCache

from .shared import SharedStore


class ResultCache:
    """Answers to greedy requests, keyed by everything that decides them (bounded LRU)."""

    def __init__(self, entries: int, shared: SharedStore | None = None):
        self.capacity = entries
        self.shared = shared if entries > 0 else None
        self._items: LRUCache[str, dict] = LRUCache(maxsize=entries)
        self._lock = threading.Lock()
        self.hits = self.misses = self.shared_hits = 0

    @staticmethod
    def key(model_fp: str, backend: str, input_ids, image_keys, sampling) -> str:
        parts: tuple = (model_fp, backend, tuple(input_ids), tuple(image_keys), sampling.max_tokens,
                        sampling.min_tokens, sampling.repetition_penalty, sampling.frequency_penalty,
                        sampling.presence_penalty, tuple(sampling.stop))
        if getattr(sampling, "grammar", None):  # `response_format` (unconstrained keys stay as they were)
            parts += (sampling.grammar,)
        raw = repr(parts).encode()
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    def get(self, key: str) -> dict | None:
        with self._lock:
            item = self._items.get(key)  # a hit becomes the most recently used
            if item is not None:
                self.hits += 1
                return item
        item = self._shared_get(key)
        with self._lock:
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            self.shared_hits += 1
            self._items[key] = item
        return item

    def put(self, key: str, item: dict) -> None:
        if self.capacity <= 0:  # VL_RESULT_CACHE_ENTRIES=0 turns it off
            return
        with self._lock:
            self._items[key] = item  # past the capacity the least recently used goes
        if self.shared:
            self.shared.put("results", key, json.dumps(item).encode())

    def _shared_get(self, key: str) -> dict | None:
        data = self.shared.get("results", key) if self.shared else None
        if data is None:
            return None
        try:
            item = json.loads(data)
            if not (isinstance(item["text"], str) and isinstance(item["finish_reason"], str)
                    and isinstance(item["usage"]["prompt_tokens"], int)
                    and isinstance(item["usage"]["completion_tokens"], int)):
                raise ValueError("fields of the wrong type")
        except Exception as exc:  # not JSON, or not an answer: a miss, and the entry goes
            assert self.shared is not None
            self.shared.corrupt("results", key, f"{type(exc).__name__}: {exc}")
            return None
        return item

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._items), "capacity": self.capacity, "hits": self.hits, "misses": self.misses,
                    "shared_hits": self.shared_hits}
