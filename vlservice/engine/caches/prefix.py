"""Reuse of the conversation's KV cache: a follow-up prefills only its new tokens.

Chat clients resend the whole history with every question. After each request we keep the LLM's
KV cache together with the tokens it holds (the prompt and the answer tokens fed back) and the
content keys of its images. A new request looks for the stored sequence sharing the longest
prefix with its prompt (token ids equal and, where images stand, the same images), crops that
cache to the shared prefix and prefills only the rest; images inside the prefix are neither
encoded nor even looked up. An identical repeated request prefills one token.

Entries are evicted least recently used, bounded in bytes (`VL_KV_CACHE_MB`). An entry is taken
out while a request extends it (so no two sequences write one entry) and stored back, extended,
afterwards; the scheduler's thread takes and puts, and `stats()` may read from any thread.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # no torch at import time
    import torch

    from ..model.kv import SeqKV


MIN_REUSE = 32  # a shorter shared prefix (the chat template's first tokens) is not worth a copy


@dataclass
class Entry:
    ids: np.ndarray  # token ids the cache holds, in order
    images: list  # [(start, end, key)] image runs inside `ids`
    cache: SeqKV  # the scheduler's per-sequence KV cache
    nbytes: int = 0
    prompt_len: int = 0  # the prompt that started this entry, and the logits that followed it
    prompt_logits: torch.Tensor | None = None
    tenant: str = ""  # whose conversation: another tenant's prompt never reuses it (nor learns of it)


def cache_bytes(cache) -> int:
    if hasattr(cache, "nbytes"):  # kv.SeqKV counts its own buffers (capacity included)
        return int(cache.nbytes)
    total = 0  # a transformers DynamicCache: its layers' key and value tensors
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if t is not None and hasattr(t, "nbytes"):
                total += t.nbytes
    return total


def shared_prefix(a_ids: np.ndarray, a_images: list, b_ids: np.ndarray, b_images: list) -> int:
    """Tokens shared by two sequences, never ending inside an image, and only over equal images."""
    n = min(len(a_ids), len(b_ids))
    diff = np.nonzero(a_ids[:n] != b_ids[:n])[0]
    common = int(diff[0]) if len(diff) else n
    for (sa, ea, ka), (sb, eb, kb) in zip(a_images, b_images):
        if sa >= common:
            break
        if (sa, ea, ka) != (sb, eb, kb) or ea > common:
            return sa  # cut before the first image that differs or is not whole in the prefix
    return common


class PrefixCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next = 0
        self._used = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.reused_tokens = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def take(self, ids: np.ndarray, images: list, tenant: str = "") -> tuple[Entry | None, int]:
        """The entry of `tenant` sharing the longest prefix with (ids, images), removed from the
        cache, and that length (0 and None on a miss)."""
        if not self.enabled:
            return None, 0
        with self._lock:
            best, best_len = None, 0
            for key, e in self._entries.items():
                if e.tenant != tenant:
                    continue
                n = shared_prefix(e.ids, e.images, ids, images)
                if n > best_len:
                    best, best_len = key, n
            if best is None or best_len < MIN_REUSE and best_len < len(ids) - 1:
                self.misses += 1
                return None, 0
            entry = self._entries[best]
            self.hits += 1
            self.reused_tokens += best_len
            if best_len < len(entry.ids):
                # A branch off a longer conversation: leave that one whole, work on a copy.
                return Entry(ids=entry.ids[:best_len], images=[i for i in entry.images if i[1] <= best_len],
                             cache=copy.deepcopy(entry.cache), prompt_len=entry.prompt_len,
                             prompt_logits=entry.prompt_logits, tenant=tenant), best_len
            del self._entries[best]  # the usual follow-up: extend this very entry
            self._used -= entry.nbytes
            return entry, best_len

    def put(self, ids: np.ndarray, images: list, cache, prompt_len: int = 0, prompt_logits=None,
            tenant: str = "") -> None:
        if not self.enabled or len(ids) == 0:
            return
        if prompt_logits is not None and prompt_logits.untyped_storage().nbytes() > prompt_logits.nbytes:
            prompt_logits = prompt_logits.clone()  # a row of a batch's logits: keep the row, not the batch
        extra = prompt_logits.nbytes if prompt_logits is not None else 0
        entry = Entry(ids=ids, images=images, cache=cache, nbytes=cache_bytes(cache) + extra,
                      prompt_len=prompt_len, prompt_logits=prompt_logits, tenant=tenant)
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            # a stored sequence that is a prefix of this one is now redundant
            for key in [k for k, e in self._entries.items()
                        if e.tenant == tenant and len(e.ids) <= len(ids)
                        and shared_prefix(e.ids, e.images, ids, images) == len(e.ids)]:
                self._used -= self._entries.pop(key).nbytes
            self._entries[self._next] = entry
            self._next += 1
            self._used += entry.nbytes
            while self._used > self.max_bytes and self._entries:
                _, old = self._entries.popitem(last=False)
                self._used -= old.nbytes
                self.evictions += 1

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._used, "capacity_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "reused_tokens": self.reused_tokens,
                    "evictions": self.evictions}
