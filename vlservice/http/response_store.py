"""Stored responses, for `previous_response_id` and `GET` / `DELETE /v1/responses/{id}`.

Each tenant (API key) has its own store, bounded by count (`VL_RESPONSES_STORE_ENTRIES`), bytes
(`VL_RESPONSES_STORE_MB`, the JSON of what is kept) and age (`VL_RESPONSES_STORE_TTL_S`, from
creation); past a bound the least recently used entries go first. An entry keeps only its own
turn (the input items it was given and the output items it made) and the id of the response it
continued, so an image sent in the first turn is held once, not once per turn; a chain is read
back by walking those ids, which also marks its ancestors as used. If one of them is gone
(evicted, expired, deleted) the chain cannot be rebuilt and the continuation is refused.

The store lives in the worker process's memory: a chain continues only within that process's
lifetime and only on that worker (with several Gunicorn workers or replicas, a request may reach
one that does not hold the id); after a restart every id answers 404. docs/api.md says so.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Stored:
    id: str
    previous_id: str | None
    items: list  # this turn's input items, then its output items (Responses shapes, plain JSON)
    response: dict  # the response object, as GET answers it
    created: float = 0.0
    size: int = field(default=0)

    def __post_init__(self):
        if not self.size:
            self.size = len(json.dumps(self.items, ensure_ascii=False)) + len(json.dumps(self.response,
                                                                                       ensure_ascii=False))


class ChainBroken(KeyError):
    """A response of the chain is no longer stored (its id is the argument)."""


class ResponseStore:
    def __init__(self, entries: int, max_bytes: int, ttl_s: float, clock=time.monotonic):
        self.entries, self.max_bytes, self.ttl_s, self.clock = entries, max_bytes, ttl_s, clock
        self._tenants: dict[str, OrderedDict[str, Stored]] = {}
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, entry: Stored) -> bool:
        """Keeps `entry` (False: it alone is over the byte bound, or the store is off)."""
        if self.entries <= 0 or entry.size > self.max_bytes:
            return False
        entry.created = self.clock()
        with self._lock:
            kept = self._tenants.setdefault(tenant, OrderedDict())
            self._drop_expired(tenant, kept)
            kept[entry.id] = entry
            self._bytes[tenant] = self._bytes.get(tenant, 0) + entry.size
            while len(kept) > self.entries or self._bytes[tenant] > self.max_bytes:
                self._remove(tenant, kept, next(iter(kept)))
        return True

    def get(self, tenant: str, rid: str) -> Stored | None:
        with self._lock:
            kept = self._tenants.get(tenant)
            entry = kept.get(rid) if kept is not None else None
            if entry is None or kept is None:
                return None
            if self._expired(entry):
                self._remove(tenant, kept, rid)
                return None
            kept.move_to_end(rid)
            return entry

    def chain(self, tenant: str, rid: str) -> list[Stored]:
        """The stored turns up to `rid`, oldest first; `ChainBroken(id)` names the first one missing."""
        out: list[Stored] = []
        at: str | None = rid
        while at is not None:
            entry = self.get(tenant, at)
            if entry is None or len(out) > self.entries:
                raise ChainBroken(at)
            out.append(entry)
            at = entry.previous_id
        return out[::-1]

    def delete(self, tenant: str, rid: str) -> bool:
        with self._lock:
            kept = self._tenants.get(tenant)
            if kept is None or rid not in kept:
                return False
            expired = self._expired(kept[rid])
            self._remove(tenant, kept, rid)
            return not expired

    def stats(self) -> dict:
        with self._lock:
            return {"entries": sum(len(k) for k in self._tenants.values()), "bytes": sum(self._bytes.values())}

    def _expired(self, entry: Stored) -> bool:
        return self.ttl_s > 0 and self.clock() - entry.created > self.ttl_s

    def _drop_expired(self, tenant: str, kept: OrderedDict) -> None:
        for rid in [rid for rid, e in kept.items() if self._expired(e)]:
            self._remove(tenant, kept, rid)

    def _remove(self, tenant: str, kept: OrderedDict, rid: str) -> None:
        self._bytes[tenant] -= kept.pop(rid).size
