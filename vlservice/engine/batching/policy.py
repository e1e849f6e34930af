"""The scheduler's decisions as pure functions of plain state: who leaves the queue and why, who
takes a free slot, which sequences share the next forward pass, how long its prompt chunk is.

No model, no threads, no clock: the scheduler (scheduler.py) measures, asks these and carries out
the answer, so the rules can be read in one place and tested without a model
(tests/unit/test_policy.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..types import PRIORITIES

GAP_STEPS = 3  # a pass carrying a prompt's chunk costs about this many decode steps (auto chunk size)
ALONE_CHUNK = 512  # prompt tokens per pass when no stream is waiting for its next token
MIN_CHUNK = 8  # the smallest auto-sized chunk; smaller chunks also teach nothing about a token's cost
FIRST_CHUNK = 32  # beside streams, until a decode step and a prompt token have been measured
SMOOTHING = 0.2  # weight of the newest measurement in a prompt token's running mean cost

CANCELLED = "cancelled"
TIMED_OUT = "timed_out"


def rank(priority: str) -> int:
    """A request's place among priorities (lower goes first); an unknown name counts as default."""
    return PRIORITIES.get(priority, PRIORITIES["default"])


@dataclass(frozen=True)
class Waiter:
    """What the policy knows of a queued request."""

    priority: int  # `rank()` of its priority
    arrival: int  # submission order: ties within a priority go first come, first served
    t_submit: float  # when it was submitted (perf_counter seconds)
    cancelled: bool = False  # its caller gave up
    tenant: str = ""  # whose request it is (an API key's tenant; "" without keys)
    slots: int = 1  # slots it takes: one per choice (OpenAI's `n`), all at once


def leaving(cancelled: bool, waited_s: float, timeout_s: float) -> str | None:
    """Why a request that waited `waited_s` must leave the queue unserved (`CANCELLED` wins over
    `TIMED_OUT`), or None: it may start."""
    if cancelled:
        return CANCELLED
    if waited_s > timeout_s:
        return TIMED_OUT
    return None


class Admission(NamedTuple):
    """Indices into the waiters: those leaving with their error, those starting now (in order)."""

    gone: list[int]
    admit: list[int]


def admit(waiting: list[Waiter], free: int, now: float, timeout_s: float,
          running: dict[str, int] | None = None) -> Admission:
    """Cancelled and timed-out waiters leave, then the others take the `free` slots in turn: the
    best priority first, within it the tenant with the fewest sequences running (`running`,
    counting those admitted here), then the earliest arrival. So a tenant gets its fair share of
    the batch while others wait, and all of it when alone. A waiter takes its `slots` all at once
    or waits, and then nobody behind it overtakes it: a request of several choices is never
    starved by single ones. Leaving holds no slot: it cannot keep a live request waiting."""
    gone = [i for i, w in enumerate(waiting) if leaving(w.cancelled, now - w.t_submit, timeout_s)]
    left = set(gone)
    rest = [i for i in range(len(waiting)) if i not in left]
    counts = dict(running or {})
    chosen: list[int] = []
    while rest and free > 0:
        best = min(rest, key=lambda i: (waiting[i].priority, counts.get(waiting[i].tenant, 0), waiting[i].arrival))
        if waiting[best].slots > free:
            break
        rest.remove(best)
        chosen.append(best)
        free -= waiting[best].slots
        counts[waiting[best].tenant] = counts.get(waiting[best].tenant, 0) + waiting[best].slots
    return Admission(gone, chosen)


def fair_share(places: int, tenants: int) -> int:
    """Queue places (waiting or running) one tenant may hold while `tenants` tenants are active:
    an equal share, rounded up, at least one."""
    return max(1, -(-places // max(1, tenants)))


def ready(waiting: int, running: int, max_batch: int, runnable: bool) -> bool:
    """Work for the loop now: a waiter and a free slot, or a running sequence with something to
    do (`runnable`: a token to decode, a prompt to prefill, a finished encode)."""
    return (waiting > 0 and running < max_batch) or runnable


class SeqState(NamedTuple):
    """What the policy knows of a running sequence."""

    decoding: bool  # it has a token to feed at the next decode step
    prefilling: bool  # its prompt's inputs are ready and some are not yet through the model


def batch(running: list[SeqState]) -> tuple[list[int], int | None]:
    """Indices of the sequences in the next pass: every decoding one, and the first (oldest
    admitted) prompt still prefilling, whose chunk rides along. One prompt at a time: the
    streams' wait is bounded by one chunk per pass."""
    decoding = [i for i, s in enumerate(running) if s.decoding]
    prefilling = next((i for i, s in enumerate(running) if s.prefilling and not s.decoding), None)
    return decoding, prefilling


def step_s(step_times: dict[int, list], size: int) -> float | None:
    """Mean forward time of a decode-only step at batch `size`, or at the nearest measured size
    (the smaller on a tie); None before any was measured. `step_times[b][0:2]`: steps, forward s."""
    if not step_times:
        return None
    nearest = min(step_times, key=lambda k: (abs(k - size), k))
    n, forward = step_times[nearest][0], step_times[nearest][1]
    return forward / n if n else None


def chunk_len(decoding: int, fixed: int, step: float | None, token_s: float | None) -> int:
    """Prompt tokens for this pass. Alone: `ALONE_CHUNK` (or `fixed`, when larger). Beside
    `decoding` streams: `fixed` (VL_PREFILL_CHUNK) when set, else as many tokens as fit in
    `GAP_STEPS` decode steps by the measured decode `step` and a prompt token's cost `token_s`,
    so a new prompt slows the streams down but never stalls them."""
    if not decoding:
        return max(ALONE_CHUNK, fixed)
    if fixed:
        return fixed
    if step is None or token_s is None:
        return FIRST_CHUNK
    if token_s <= 0.0:  # prompt tokens measured as free beside a step (a tiny model)
        return ALONE_CHUNK
    return int(min(ALONE_CHUNK, max(MIN_CHUNK, (GAP_STEPS - 1) * step / token_s)))


def token_cost(mean: float | None, spent: float, step: float | None, n: int) -> float | None:
    """A prompt token's share of a pass, as a running mean: what a chunk of `n` tokens added to a
    pass (`spent` s) that would have cost a decode `step` without it. Unchanged without a measured
    step or when the chunk is too small to tell."""
    if step is None or n < MIN_CHUNK:
        return mean
    share = max(spent - step, 0.0) / n
    return share if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * share
