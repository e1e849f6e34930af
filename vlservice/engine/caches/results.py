"""Answers to identical greedy requests: the whole answer at once, no model work."""

from __future__ import annotations

import hashlib
import threading

from cachetools import LRUCache


class ResultCache:
    """Answers to greedy requests, keyed by everything that decides them (bounded LRU)."""

    def __init__(self, entries: int):
        self.capacity = entries
        self._items: LRUCache[str, dict] = LRUCache(maxsize=entries)
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def key(model_fp: str, backend: str, input_ids, image_keys, sampling) -> str:
        raw = repr((model_fp, backend, tuple(input_ids), tuple(image_keys), sampling.max_tokens, sampling.min_tokens,
                    sampling.repetition_penalty, sampling.frequency_penalty, sampling.presence_penalty,
                    tuple(sampling.stop))).encode()
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    def get(self, key: str) -> dict | None:
        with self._lock:
            item = self._items.get(key)  # a hit becomes the most recently used
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            return item

    def put(self, key: str, item: dict) -> None:
        if self.capacity <= 0:  # VL_RESULT_CACHE_ENTRIES=0 turns it off
            return
        with self._lock:
            self._items[key] = item  # past the capacity the least recently used goes

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._items), "capacity": self.capacity, "hits": self.hits, "misses": self.misses}
