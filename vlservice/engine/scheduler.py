"""The one thread that touches the model: slots, admission by priority, chunked prefill, and one
batched decode step for every running sequence.

On a CPU a decode step is bound by streaming the weights from memory, so one step over several
sequences costs little more than one step over one. The scheduler therefore keeps up to
`VL_MAX_BATCH` requests running at once and loops:

1. admit: while a slot is free, the waiting request with the best (priority, arrival) starts:
   its conversation's KV cache is looked up and the images it still needs go to the encoder
   thread (feature cache, else ONNX Runtime), so the running streams keep decoding while a new
   photo is encoded; requests that waited past `VL_QUEUE_TIMEOUT_S` or were cancelled leave the
   queue with their error;
2. prefill: one chunk of at most `VL_PREFILL_CHUNK` prompt tokens of the oldest request still
   prefilling, so the streams already answering keep getting tokens while a new photo is read;
3. decode: one forward pass over every sequence that is answering; each samples with its own
   parameters, seed and stop strings, and leaves the batch the moment it finishes or is
   cancelled, freeing its slot.

`VL_MAX_BATCH=1` gives one request at a time. Nothing here knows HTTP; callers see events on
their `Generation`'s queue.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ..errors import APIError, Cancelled, EngineError, NotReady, QueueTimeout
from .heap import malloc_trim
from .lm import SeqPos
from .sampling import Sampler
from .textstream import TextStream
from .types import PRIORITIES, Event

if TYPE_CHECKING:
    import torch

    from .kv import SeqKV

log = logging.getLogger(__name__)

_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """At exit, let every scheduler leave the model first: a process that exits while a thread is
    inside torch aborts ("terminate called without an active exception")."""
    for scheduler in list(_live):
        scheduler.stop(timeout=10)


class Sequence:
    """One admitted request's state on the model side."""

    def __init__(self, gen, now: float):
        self.gen = gen
        work = gen.work
        self.prompt = work["prompt"]
        self.images = work["images"]
        self.sampling = gen.request.sampling
        self.timings = dict(work["timings"])
        self.timings["wait_ms"] = 0.0  # other requests' prefill chunks while this one ran
        self.admitted = now
        self.kv: SeqKV | None = None  # set by admission (`_setup`)
        self.pos = SeqPos()
        self.start = 0  # prompt tokens reused from the conversation's KV cache
        self.cursor = 0  # next prompt token to prefill
        # (embeds, positions, visual mask, deepstack) of the prompt from `start`, while it prefills
        self.needed: list[int] = []  # images after `start`, whose features the prompt needs
        self.encoding: Future | None = None  # the encoder thread's future for them
        # (embeds, positions, visual mask, deepstack) of the prompt from `start`
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None] | None = None
        self.prompt_logits: torch.Tensor | None = None
        self.prefill_s = 0.0
        self.sampler = Sampler(self.sampling)
        self.stream = TextStream(gen.service.tokenizer, self.sampling.stop)
        self.seen = list(self.prompt.input_ids)
        self.fed = list(self.prompt.input_ids)
        self.n = 0
        self.pending: int | None = None  # the token to feed at the next decode step
        self.t_first = 0.0

    @property
    def decoding(self) -> bool:
        return self.pending is not None


class Scheduler:
    def __init__(self, service, max_batch: int, prefill_chunk: int, queue_timeout_s: float):
        self.service = service
        self.lean = service.lean
        self.max_batch = max(1, max_batch)
        self.prefill_chunk = max(1, prefill_chunk)
        self.queue_timeout_s = queue_timeout_s
        self._cond = threading.Condition()
        self._waiting: list = []  # heap of (priority, arrival, gen)
        self._arrival = itertools.count()
        self.running: list[Sequence] = []
        self._thread: threading.Thread | None = None
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlservice-encoder")
        self._stop = False
        self._last_trim = 0.0
        self.trims = 0
        self.steps = 0
        self.last_batch = 0
        self.batch_hist: dict[int, int] = {}
        # per batch size: [steps, forward s, step s (forward, sampling, text out), cycles, cycle s]; a
        # cycle is one step start to the next with nothing else in between (no admission, no
        # prefill chunk): what a token costs each running stream, overhead of the loop included
        self.step_times: dict[int, list] = {}
        self._last_start: tuple[float, int] | None = None
        self._threads = max(1, service.settings.num_threads)
        self._torch_threads = self._threads
        self.listeners = service.step_listeners  # callables(batch size) per decode step (metrics)

    # ----------------------------------------------------------------- callers' side
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="vlservice-scheduler", daemon=True)
            self._thread.start()
            _live.add(self)

    def stop(self, timeout: float = 30) -> None:
        """Stop after the current step; requests still running or waiting get an error."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def submit(self, gen) -> None:
        with self._cond:
            if self._stop:
                raise NotReady("the server is shutting down; retry", code="shutting_down")
            heapq.heappush(self._waiting, (PRIORITIES.get(gen.request.priority, 1), next(self._arrival), gen))
            self._cond.notify_all()

    def wake(self) -> None:
        """A waiting request was cancelled: let the loop see it now."""
        with self._cond:
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self._waiting), "slots": self.max_batch,
                "prefill_chunk": self.prefill_chunk, "steps": self.steps, "last_batch": self.last_batch,
                "batch_sizes": dict(sorted(self.batch_hist.items())),
                "step_ms": self.step_ms(),
                "kv_bytes": sum(s.kv.nbytes for s in list(self.running) if s.kv is not None)}

    def step_ms(self) -> dict:
        """Mean decode-step times by batch size: the forward pass, the whole step, the whole cycle."""
        out = {}
        for b, (n, fwd, step, cycles, cycle_s) in sorted(self.step_times.items()):
            out[b] = {"steps": n, "forward_ms": round(fwd / n * 1e3, 2), "step_ms": round(step / n * 1e3, 2),
                      "cycles": cycles, "cycle_ms": round(cycle_s / cycles * 1e3, 2) if cycles else None}
        return out

    # ----------------------------------------------------------------- the loop
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._ready():
                    if not self.running and not self._waiting:
                        self._idle()
                    # waiters are checked for time-outs and cancels at least this often
                    self._cond.wait(0.1 if self._waiting else 0.5)
                if self._stop:
                    waiting, self._waiting = [item[2] for item in self._waiting], []
                    break
                admit = self._take_admissible()
            for gen in admit:
                self._admit(gen)
            try:
                self._work()
            except Exception:  # never let the one model thread die
                log.exception("scheduler step failed")

        for seq in list(self.running):
            self._drop(seq, NotReady("the server is shutting down; retry", code="shutting_down"))
        for gen in waiting:
            self.service.fail(gen, NotReady("the server is shutting down; retry", code="shutting_down"))
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def _ready(self) -> bool:
        """Something to do now: a free slot for a waiter, a finished encode, a prompt to prefill,
        tokens to decode. Called with the condition held."""
        if self._waiting and len(self.running) < self.max_batch:
            return True
        return any(s.decoding or s.inputs is not None or (s.encoding is not None and s.encoding.done())
                   for s in self.running)

    def _idle(self) -> None:
        """Give the freed heap back to the system when the model goes idle (at most once a second)."""
        if self.service.settings.malloc_trim and time.monotonic() - self._last_trim >= 1.0:
            self._last_trim = time.monotonic()
            malloc_trim()
            self.trims += 1

    def _take_admissible(self) -> list:
        """Pop what may leave the queue now: cancelled or timed-out waiters (with their error) and,
        while slots are free, the best waiters. Called with the condition held."""
        out, now, keep = [], time.perf_counter(), []
        for item in self._waiting:
            gen = item[2]
            if gen.cancelled.is_set() or now - gen.work["t_submit"] > self.queue_timeout_s:
                out.append(gen)
            else:
                keep.append(item)
        if len(keep) != len(self._waiting):
            heapq.heapify(keep)
            self._waiting = keep
        free = self.max_batch - len(self.running) - sum(1 for g in out if not self._expired(g))
        while free > 0 and self._waiting:
            out.append(heapq.heappop(self._waiting)[2])
            free -= 1
        return out

    def _expired(self, gen) -> bool:
        return gen.cancelled.is_set() or time.perf_counter() - gen.work["t_submit"] > self.queue_timeout_s

    def _work(self) -> None:
        for seq in list(self.running):
            future = seq.encoding
            if future is None or not future.done():
                continue
            seq.encoding = None
            try:
                self._inputs_ready(seq, future.result())
            except Exception as exc:
                self._drop(seq, exc)
        self._share_cores()
        prefilling = [s for s in self.running if s.inputs is not None and not s.decoding]
        if prefilling:
            self._prefill_chunk(prefilling[0])
        decoding = [s for s in self.running if s.decoding]
        if decoding:
            self._decode_step(decoding)

    def _share_cores(self) -> None:
        """One PyTorch thread while an image is encoded beside the model's steps, all of them
        otherwise. The encoder's pool and PyTorch's each want every core; oversubscribed, every
        parallel region of PyTorch waits at its barrier for a thread that is not running (an INT8
        product measured 0.3 ms on one thread, 8 ms on two with the other core busy)."""
        want = 1 if any(s.encoding is not None for s in self.running) else self._threads
        if want != self._torch_threads:
            import torch

            torch.set_num_threads(want)
            self._torch_threads = want

    # ----------------------------------------------------------------- admission
    def _admit(self, gen) -> None:
        self._last_start = None  # the next decode step's cycle includes this admission
        svc = self.service
        now = time.perf_counter()
        if gen.cancelled.is_set():
            return svc.fail(gen, Cancelled("the request was cancelled while it waited"))
        if now - gen.work["t_submit"] > self.queue_timeout_s:
            return svc.fail(gen, QueueTimeout(f"the request waited {self.queue_timeout_s:.0f} s for the model; "
                                              f"retry later", retry_after=svc.retry_after()))
        seq = Sequence(gen, now)
        seq.timings["queue_ms"] = (now - gen.work["t_submit"]) * 1e3
        gen.queue.put(Event("started"))
        self.running.append(seq)
        try:
            self._setup(seq)
        except Exception as exc:
            self._drop(seq, exc)

    def _setup(self, seq: Sequence) -> None:
        """KV from the conversation cache, the features still needed, the prompt's inputs."""
        svc, prompt = self.service, seq.prompt
        ids = np.asarray(prompt.input_ids, dtype=np.int64)
        entry, shared = svc.kv.take(ids, seq.images)
        if entry is not None:
            seq.kv = entry.cache
            if shared == len(prompt) == entry.prompt_len and entry.prompt_logits is not None:
                # The same prompt again: its next-token logits were kept, no forward pass at all.
                seq.start, seq.prompt_logits = len(prompt), entry.prompt_logits
            else:
                seq.start = min(shared, len(prompt) - 1)  # at least one token to prefill: its logits
            seq.kv.truncate(seq.start)
        else:
            seq.kv = self.lean.new_kv()
        seq.kv.reserve(len(prompt) + seq.sampling.max_tokens)
        seq.cursor = seq.start
        seq.needed = [i for i, (a, _, _) in enumerate(seq.images) if a >= seq.start]
        if seq.needed:  # off this thread: the running streams keep decoding meanwhile
            seq.encoding = self._encoder.submit(svc.features, seq.gen, seq.timings, seq.needed)
            seq.encoding.add_done_callback(lambda _: self.wake())
        else:
            self._inputs_ready(seq, svc.features(seq.gen, seq.timings, []))  # timings say: nothing to encode

    def _inputs_ready(self, seq: Sequence, feats: list) -> None:
        if seq.gen.cancelled.is_set():
            raise Cancelled("the request was cancelled")
        if len(seq.needed) < len(seq.images):
            seq.timings["vision_cache_hit"] = True  # inside the reused prefix: not even looked up
        seq.gen.queue.put(Event("stage", data={"stage": "prefill"}))
        inputs, seq.pos = self.service.decoder.prefill_inputs(seq.prompt, feats, seq.start)
        if seq.prompt_logits is not None:
            self._first_token(seq, seq.prompt_logits)
        else:
            seq.inputs = inputs

    # ----------------------------------------------------------------- prefill
    def _prefill_chunk(self, seq: Sequence) -> None:
        self._last_start = None  # the next decode step's cycle includes this chunk
        t0 = time.perf_counter()
        try:
            assert seq.inputs is not None, "a sequence prefills between `_setup` and its last chunk"
            embeds, positions, visual, deepstack = seq.inputs
            a = seq.cursor - seq.start
            b = min(len(seq.prompt) - seq.start, a + self.prefill_chunk)
            mask = chunk_ds = None
            if visual is not None:
                assert deepstack is not None, "the decoder gives the image mask and deepstack together"
                mask = visual[:, a:b]
                before, inside = int(visual[:, :a].sum()), int(mask.sum())
                if inside:
                    chunk_ds = [d[before:before + inside] for d in deepstack]
                else:
                    mask = None
            last = seq.start + b == len(seq.prompt)
            logits = self.lean.prefill(seq.kv, embeds[:, a:b], positions[:, :, a:b], mask, chunk_ds, logits=last)
            seq.cursor = seq.start + b
            if seq.gen.cancelled.is_set():
                raise Cancelled("the request was cancelled")
            spent = time.perf_counter() - t0
            seq.prefill_s += spent
            if last:
                seq.inputs = None
                seq.prompt_logits = logits
                self._first_token(seq, logits)
        except Exception as exc:
            self._drop(seq, exc)
            spent = time.perf_counter() - t0
        self._charge_others(seq, spent)

    def _charge_others(self, seq: Sequence, seconds: float) -> None:
        """Running requests waited `seconds` for `seq`'s encode or prefill."""
        for other in self.running:
            if other is not seq:
                other.timings["wait_ms"] += seconds * 1e3

    def _first_token(self, seq: Sequence, logits) -> None:
        s = seq.sampling
        token = seq.sampler(logits, seq.seen, forbid=self.service.decoder.eos_ids if s.min_tokens > 0 else None)
        now = time.perf_counter()
        seq.t_first = now
        seq.timings["prompt_ms"] = seq.prefill_s * 1e3
        seq.timings["ttft_ms"] = (now - seq.gen.work["t_submit"]) * 1e3
        self._accept(seq, token)

    # ----------------------------------------------------------------- decode
    def _decode_step(self, batch: list) -> None:
        t0 = time.perf_counter()
        if self._last_start is not None:
            times = self.step_times.setdefault(self._last_start[1], [0, 0.0, 0.0, 0, 0.0])
            times[3] += 1
            times[4] += t0 - self._last_start[0]
        self._last_start = (t0, len(batch))
        try:
            logits = self.lean.decode([s.pending for s in batch], [s.kv for s in batch], [s.pos for s in batch])
        except Exception as exc:
            log.exception("decode step failed for %d sequences", len(batch))
            for s in batch:
                self._drop(s, exc)
            return
        t1 = time.perf_counter()
        self.steps += 1
        self.last_batch = len(batch)
        self.batch_hist[len(batch)] = self.batch_hist.get(len(batch), 0) + 1
        for listener in self.listeners:
            listener(len(batch))
        eos = self.service.decoder.eos_ids
        for i, s in enumerate(batch):
            s.fed.append(s.pending)
            try:
                token = s.sampler(logits[i], s.seen, forbid=eos if s.n < s.sampling.min_tokens else None)
                self._accept(s, token)
            except Exception as exc:
                self._drop(s, exc)
        times = self.step_times.setdefault(len(batch), [0, 0.0, 0.0, 0, 0.0])
        times[0] += 1
        times[1] += t1 - t0
        times[2] += time.perf_counter() - t0

    def _accept(self, seq: Sequence, token: int) -> None:
        """A sampled token: the end, or text out and the next step."""
        seq.pending = None
        if token in self.service.decoder.eos_ids:
            return self._finish(seq, "stop")
        seq.n += 1
        seq.seen.append(token)
        delta = seq.stream.push(token)
        if delta:
            seq.gen.queue.put(Event("delta", text=delta))
        if seq.stream.stopped:
            return self._finish(seq, "stop")
        if seq.n >= seq.sampling.max_tokens:
            return self._finish(seq, "length")
        if seq.gen.cancelled.is_set():
            return self._drop(seq, Cancelled("the request was cancelled"))
        seq.pending = token

    # ----------------------------------------------------------------- leaving
    def _release(self, seq: Sequence) -> None:
        """Out of the batch; its KV goes to the conversation cache (consistent between tokens)."""
        if seq in self.running:
            self.running.remove(seq)
        kv = seq.kv
        if kv is not None and kv.length:
            whole = kv.length >= len(seq.prompt)  # the prompt's logits belong to a whole prompt only
            self.service.kv.put(np.asarray(seq.fed[:kv.length], dtype=np.int64),
                                [im for im in seq.images if im[1] <= kv.length], kv,
                                prompt_len=len(seq.prompt) if whole else 0,
                                prompt_logits=seq.prompt_logits if whole else None)

    def _finish(self, seq: Sequence, finish: str) -> None:
        self._release(seq)
        tail = seq.stream.flush()
        if tail:
            seq.gen.queue.put(Event("delta", text=tail))
        now = time.perf_counter()
        decode_s = now - seq.t_first
        n, prompt_n = seq.n, len(seq.prompt) - seq.start
        seq.timings.update({
            "prompt_n": prompt_n, "cache_n": seq.start, "result_cache_hit": False,
            "prompt_per_second": prompt_n / seq.prefill_s if seq.prefill_s else 0.0,
            "predicted_n": n, "predicted_ms": decode_s * 1e3,
            "predicted_per_second": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
            "total_ms": (now - seq.gen.work["t_submit"]) * 1e3,
            "model_ms": (now - seq.admitted) * 1e3,
        })
        usage = {"prompt_tokens": len(seq.prompt), "completion_tokens": n, "total_tokens": len(seq.prompt) + n}
        self.service.complete(seq.gen, seq.timings, finish, usage, seq.stream.text_sent())

    def _drop(self, seq: Sequence, exc: Exception) -> None:
        if seq in self.running:
            self._release(seq)
        if isinstance(exc, APIError):
            err = exc
        else:
            log.error("engine error in %s: %r", seq.gen.id, exc)
            err = EngineError(f"the engine failed: {type(exc).__name__}")
        self.service.fail(seq.gen, err)
