"""One submitted request's life as its caller sees it: a queue of events, cancel, the result."""

from __future__ import annotations

import queue
import threading
import time

from ..errors import EngineError
from .types import ChatRequest
from .video import PreparedVideo


class Generation:
    """A submitted request: iterate `events()`; `cancel()` stops it."""

    def __init__(self, service, request: ChatRequest, work: dict):
        self.service = service
        self.request = request
        self.id = request.id
        self.work = work
        self.cancelled = threading.Event()
        self.queue: queue.Queue = queue.Queue()
        self.created = int(time.time())

    @property
    def image_sizes(self) -> list[tuple[int, int]]:
        """(width, height) of each image of the request as decoded (EXIF orientation applied): the
        pixels its answer's grounding coordinates are converted to (videos are not images here)."""
        return [(p.source_size[1], p.source_size[0]) for p in self.work["prepared"] if not isinstance(p, PreparedVideo)]

    def cancel(self) -> None:
        self.cancelled.set()

    def events(self, ping_every: float | None = None):
        """Events until `done` or `error`; `None` when nothing happened for `ping_every` seconds."""
        try:
            while True:
                try:
                    ev = self.queue.get(timeout=ping_every)
                except queue.Empty:
                    yield None
                    continue
                if ev.kind in ("done", "error"):
                    yield ev
                    return
                yield ev
        finally:
            self.cancel()  # a consumer that stops early (client gone) frees the model

    def result(self) -> dict:
        """Run to the end: {'text', 'finish_reason', 'usage', 'timings'} (and 'logprobs', the
        entries of every token, when the request asked for them) or raise the APIError."""
        parts: list[str] = []
        entries: list[dict] = []
        for ev in self.events():
            if ev.kind == "delta":
                parts.append(ev.text)
                entries.extend(ev.data.get("logprobs", ()))
            elif ev.kind == "error":
                raise ev.error
            elif ev.kind == "done":
                out = {"text": "".join(parts), **ev.data}
                if self.request.sampling.logprobs is not None:
                    out["logprobs"] = entries
                return out
        raise EngineError("generation ended without a result")
