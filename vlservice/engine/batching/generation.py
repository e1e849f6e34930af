"""One submitted request's life as its caller sees it: a queue of events, cancel, the result.

The scheduler publishes to it and nowhere else: tokens as `delta` events, the end as `done()` or
`fail()`. Whoever submitted it (the service) is told of its end through the `on_end` it gave, once,
before the caller sees the final event: the owner's books (slots, counters, result cache) are
settled by the time a client reads its answer."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...errors import APIError, EngineError
from ..types import ChatRequest, Event
from ..media.video import PreparedVideo

if TYPE_CHECKING:
    from ..output.constrain import Constraint
    from ..media.images import Prepared
    from ..prompt import Prompt


@dataclass
class Work:
    """What the submitting thread prepared for the model: everything the scheduler and the service
    need of a request past submission, in one typed record (the engine's own: the HTTP layer reads
    the `Generation`'s properties, never this)."""

    prepared: list[Prepared | PreparedVideo]  # the media, decoded and preprocessed, in prompt order
    keys: list[str]  # each medium's feature-cache key
    prompt: Prompt  # the rendered chat template, tokenized
    images: list[tuple[int, int, str]]  # (start, end, key) of each medium's span in the prompt
    result_key: str | None  # the result cache's key; None: the answer is not to be cached
    constraint: Constraint | None  # `response_format`'s matcher, built at submission (not on the model's thread)
    timings: dict  # what submission measured (decode, preprocess, grammar compile, submit ms)
    t_submit: float  # perf_counter when it was queued: queue time-outs, ttft and total time count from here
    queue_position: int  # requests running or waiting ahead of it when it was queued


class Generation:
    """A submitted request: iterate `events()`; `cancel()` stops it."""

    def __init__(self, request: ChatRequest, work: Work, on_end: Callable[[Generation, Event, str], None] | None = None):
        self.request = request
        self._on_end = on_end
        self.id = request.id
        self.work = work
        self.cancelled = threading.Event()
        self.queue: queue.Queue = queue.Queue()
        self.created = int(time.time())

    @property
    def image_sizes(self) -> list[tuple[int, int]]:
        """(width, height) of each image of the request as decoded (EXIF orientation applied): the
        pixels its answer's grounding coordinates are converted to (videos are not images here)."""
        return [(p.source_size[1], p.source_size[0]) for p in self.work.prepared if not isinstance(p, PreparedVideo)]

    @property
    def queue_position(self) -> int:
        """Requests running or waiting ahead of this one when it was queued (X-Queue-Position)."""
        return self.work.queue_position

    def cancel(self) -> None:
        self.cancelled.set()

    # ----------------------------------------------------------------- the producer's side
    def done(self, timings: dict, finish: str, usage: dict, choices: list | None = None, text: str = "") -> None:
        """Answered: the final event with the finish reason, usage and timings (floats rounded to
        two places); with several choices, `choices` gives each one's index and finish reason.
        `text` (the first choice's whole answer) is for the owner's books, not the event."""
        data = {"finish_reason": finish, "usage": usage,
                "timings": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in timings.items()}}
        if choices is not None:
            data["choices"] = choices
        self._end(Event("done", data=data), text)

    def fail(self, error: APIError) -> None:
        self._end(Event("error", error=error))

    def _end(self, event: Event, text: str = "") -> None:
        if self._on_end is not None:
            self._on_end(self, event, text)
        self.queue.put(event)

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
        entries of every token, when the request asked for them) of the first choice, and
        'choices': each choice's {'index', 'text', 'finish_reason'} (and 'logprobs'); or raise the
        APIError. `usage` counts the prompt once and every choice's tokens."""
        count = max(1, self.request.choices)
        parts: list[list[str]] = [[] for _ in range(count)]
        entries: list[list[dict]] = [[] for _ in range(count)]
        for ev in self.events():
            if ev.kind == "delta":
                parts[ev.choice].append(ev.text)
                entries[ev.choice].extend(ev.data.get("logprobs", ()))
            elif ev.kind == "error":
                raise ev.error
            elif ev.kind == "done":
                finishes = ev.data.get("choices") or [{"index": 0, "finish_reason": ev.data["finish_reason"]}]
                choices = [{"index": c["index"], "text": "".join(parts[c["index"]]), "finish_reason": c["finish_reason"]}
                           for c in finishes]
                if self.request.sampling.logprobs is not None:
                    for c in choices:
                        c["logprobs"] = entries[c["index"]]
                out = {**choices[0], **ev.data, "choices": choices}
                del out["index"]
                return out
        raise EngineError("generation ended without a result")
