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
2. step: one forward pass over every sequence that is answering and, when a request is still
   prefilling, a chunk of its prompt in the same pass (the weights are streamed once for both:
   chunked prefill). While streams are answering the chunk is sized so that the pass costs
   about `GAP_STEPS` decode steps (measured as the server runs; `VL_PREFILL_CHUNK` fixes it
   instead), so a new photo slows the running streams down but never stalls them; with nobody
   answering, a prompt goes through in chunks of up to `ALONE_CHUNK` tokens. Each sequence samples
   with its own parameters, seed and stop strings, and leaves the batch the moment it finishes or
   is cancelled, freeing its slot.

A request of several choices (OpenAI's `n`) takes that many slots at once: its first sequence
prefills the prompt, the others wait in their slots and start from copies of its KV cache when
its logits are there, each sampling with its own seed (`sequence.choice_seed`) and grammar
matcher; it ends when all have finished, and a failure or a cancel ends all of them.

`VL_MAX_BATCH=1` gives one request at a time. The rules themselves (who leaves the queue, who
takes a slot, who shares a pass, how long its chunk is) are pure functions in `policy.py`: this
loop measures, asks them and carries out the answers. Nothing here knows HTTP. Data flows one way:
built with what it works with (runner, prefix cache, feature source, input builder, tokenizer,
grammars), it publishes each request's events, answer or error to its `Generation`, never calling
back into whoever submitted it.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ...errors import APIError, Cancelled, EngineError, NotReady, QueueTimeout
from . import policy
from ..output.logprobs import TokenText
from ..reclaim import Trimmer
from .sequence import Choices, Sequence
from ..types import Event

if TYPE_CHECKING:
    from ..caches import PrefixCache
    from ..output.constrain import Grammars
    from ..media.features import FeatureSource
    from .generation import Generation
    from ..model.inputs import ModelInputs
    from ..model.lm import LMRunner

log = logging.getLogger(__name__)

_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """At exit, let every scheduler leave the model first: a process that exits while a thread is
    inside torch aborts ("terminate called without an active exception")."""
    for scheduler in list(_live):
        scheduler.stop(timeout=10)


class Scheduler:
    def __init__(self, runner: LMRunner, prefix: PrefixCache, features: FeatureSource, inputs: ModelInputs,
                 tokenizer, grammars: Grammars, *, max_batch: int, prefill_chunk: int, queue_timeout_s: float,
                 threads: int, malloc_trim: bool = False, trim_busy_s: float = 0.0, listeners: list | None = None):
        self.lean, self.prefix, self.features, self.inputs = runner, prefix, features, inputs
        self.tokenizer, self.grammars = tokenizer, grammars
        self.trimmer, self._last_total_s = Trimmer(malloc_trim, trim_busy_s), 5.0  # last answer's time: Retry-After
        self.max_batch = max(1, max_batch)
        self.prefill_chunk = max(0, prefill_chunk)  # 0: sized by time (`_chunk_len`)
        self._token_s: float | None = None  # a prompt token's share of a pass, seconds (running mean)
        self.last_chunk = 0  # prompt tokens in the last pass that carried some
        self.mixed_steps = 0  # decode steps that carried a prompt's chunk too
        self.queue_timeout_s = queue_timeout_s
        self._cond = threading.Condition()
        self._waiting: list[tuple[int, int, Generation]] = []  # (priority rank, arrival, gen), by arrival
        self._arrival = itertools.count()
        self.running: list[Sequence] = []
        self._thread: threading.Thread | None = None
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlservice-encoder")
        self._stop = False
        self.steps = 0
        self.last_batch = 0
        self.batch_hist: dict[int, int] = {}
        # per batch size: [steps, forward s, step s (forward, sampling, text out), cycles, cycle s]; a
        # cycle is one step start to the next with nothing else in between (no admission, no
        # prefill chunk): what a token costs each running stream, overhead of the loop included
        self.step_times: dict[int, list] = {}
        self._last_start: tuple[float, int] | None = None
        self._threads = max(1, threads)
        self._torch_threads = self._threads
        self.listeners = listeners if listeners is not None else []  # callables(batch size) per decode step
        self.token_text = TokenText(tokenizer)  # `logprobs` entries' text and bytes

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
            self._waiting.append((policy.rank(gen.request.priority), next(self._arrival), gen))
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
                "prefill_chunk": self.prefill_chunk, "last_chunk": self.last_chunk, "mixed_steps": self.mixed_steps,
                "prefill_token_ms": round(self._token_s * 1e3, 3) if self._token_s is not None else None,
                "steps": self.steps, "last_batch": self.last_batch,
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
            self.trimmer.busy()

        for seq in list(self.running):
            self._drop(seq, NotReady("the server is shutting down; retry", code="shutting_down"))
        for gen in waiting:
            gen.fail(NotReady("the server is shutting down; retry", code="shutting_down"))
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def _ready(self) -> bool:
        """Something to do now: a free slot for a waiter, a finished encode, a prompt to prefill,
        tokens to decode. Called with the condition held."""
        runnable = any(s.decoding or s.inputs is not None or (s.encoding is not None and s.encoding.done())
                       for s in self.running)
        if not policy.ready(len(self._waiting), len(self.running), self.max_batch, runnable):
            return False
        # a free slot is not enough for a request of several choices: it waits until all fit
        return runnable or any(self._admission())

    def _idle(self) -> None:
        """Give the freed heap back to the system when the model goes idle (at most once a second)."""
        self.trimmer.idle()

    def _admission(self) -> policy.Admission:
        """What `policy.admit` lets leave the queue now. Called with the condition held."""
        waiters = [policy.Waiter(rank, arrival, gen.work.t_submit, gen.cancelled.is_set(), gen.request.tenant,
                                 gen.request.choices)
                   for rank, arrival, gen in self._waiting]
        running: dict[str, int] = {}
        for seq in self.running:
            running[seq.gen.request.tenant] = running.get(seq.gen.request.tenant, 0) + 1
        return policy.admit(waiters, self.max_batch - len(self.running), time.perf_counter(),
                            self.queue_timeout_s, running)

    def _take_admissible(self) -> list:
        """Take out of the queue what `policy.admit` lets leave now: cancelled or timed-out waiters
        (`_admit` gives them their error) and, while slots are free, the best waiters. Called with
        the condition held."""
        gone, admit = self._admission()
        if not gone and not admit:
            return []
        taken = set(gone) | set(admit)
        out = [self._waiting[i][2] for i in gone + admit]
        self._waiting = [item for i, item in enumerate(self._waiting) if i not in taken]
        return out

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
        decoding, prefilling = policy.batch([s.state for s in self.running])
        if decoding or prefilling is not None:
            self._step([self.running[i] for i in decoding], None if prefilling is None else self.running[prefilling])

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
        now = time.perf_counter()
        why = policy.leaving(gen.cancelled.is_set(), now - gen.work.t_submit, self.queue_timeout_s)
        if why == policy.CANCELLED:
            return gen.fail(Cancelled("the request was cancelled while it waited"))
        if why == policy.TIMED_OUT:
            return gen.fail(QueueTimeout(f"the request waited {self.queue_timeout_s:.0f} s for the model; "
                                         f"retry later", retry_after=max(1, round(self._last_total_s))))
        try:
            family = Choices(gen, now, self.grammars, self.tokenizer)
        except Exception as exc:  # e.g. a grammar the tokenizer cannot serve
            log.error("could not start %s: %r", gen.id, exc)
            return gen.fail(exc if isinstance(exc, APIError) else EngineError(f"the engine failed: "
                                                                              f"{type(exc).__name__}"))
        seq = family.leader  # it prefills; the other choices hold their slots until it is through
        seq.timings["queue_ms"] = (now - gen.work.t_submit) * 1e3
        gen.queue.put(Event("started"))
        self.running.extend(family.members)
        try:
            self._setup(seq)
        except Exception as exc:
            self._drop(seq, exc)

    def _setup(self, seq: Sequence) -> None:
        """KV from the conversation cache, the features still needed, the prompt's inputs."""
        prompt = seq.prompt
        ids = np.asarray(prompt.input_ids, dtype=np.int64)
        entry, shared = self.prefix.take(ids, seq.images, seq.gen.request.tenant)
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
            seq.encoding = self._encoder.submit(self.features, seq.gen, seq.timings, seq.needed)
            seq.encoding.add_done_callback(lambda _: self.wake())
        else:
            self._inputs_ready(seq, self.features(seq.gen, seq.timings, []))  # timings say: nothing to encode

    def _inputs_ready(self, seq: Sequence, feats: list) -> None:
        if seq.gen.cancelled.is_set():
            raise Cancelled("the request was cancelled")
        if len(seq.needed) < len(seq.images):
            seq.timings["vision_cache_hit"] = True  # inside the reused prefix: not even looked up
        seq.gen.queue.put(Event("stage", data={"stage": "prefill"}))
        inputs, seq.pos = self.inputs.prefill_inputs(seq.prompt, feats, seq.start)
        if seq.prompt_logits is not None:
            self._first_token(seq, seq.prompt_logits)
        else:
            seq.inputs = inputs

    # ----------------------------------------------------------------- one pass
    def _chunk_len(self, decoding: int) -> int:
        """Prompt tokens for this pass beside `decoding` streams (`policy.chunk_len`), from what
        this scheduler has measured so far."""
        return policy.chunk_len(decoding, self.prefill_chunk, policy.step_s(self.step_times, decoding), self._token_s)

    def _step(self, batch: list, seq: Sequence | None) -> None:
        """One forward pass: a token for every sequence in `batch` and, with `seq`, its prompt's
        next chunk."""
        t0 = time.perf_counter()
        if seq is None and self._last_start is not None:
            times = self.step_times.setdefault(self._last_start[1], [0, 0.0, 0.0, 0, 0.0])
            times[3] += 1
            times[4] += t0 - self._last_start[0]
        # a cycle is a decode-only step to the next; a pass with a chunk is no such cycle
        self._last_start = (t0, len(batch)) if seq is None else None
        chunk = None
        try:
            if seq is not None:
                chunk = seq.chunk(self._chunk_len(len(batch)))
            if seq is None:
                logits, last = self.lean.decode([s.pending for s in batch], [s.kv for s in batch],
                                                [s.pos for s in batch]), None
            else:
                logits, last = self.lean.step([s.pending for s in batch], [s.kv for s in batch],
                                              [s.pos for s in batch], chunk)
        except Exception as exc:
            log.exception("a pass failed for %d sequences%s", len(batch), " and a prompt chunk" if seq else "")
            for s in batch + ([seq] if seq is not None else []):
                self._drop(s, exc)
            return
        t1 = time.perf_counter()
        if seq is not None:
            self._chunk_done(seq, chunk, last, t1 - t0, len(batch))
        if batch:
            self._sample(batch, logits, t0, t1)

    def _chunk_done(self, seq: Sequence, chunk, logits, spent: float, beside: int) -> None:
        n = self.last_chunk = chunk.embeds.shape[1]
        # what the chunk's tokens added to a pass that would have cost a decode step without them
        # (alone too: a pass streams the weights whatever it carries)
        step_s = policy.step_s(self.step_times, max(beside, 1))
        self._token_s = policy.token_cost(self._token_s, spent, step_s, n)
        seq.cursor += n
        seq.prefill_s += spent
        # the others waited for what the chunk added to their step
        self._charge_others(seq, max(spent - step_s, 0.0) if beside and step_s is not None else spent)
        try:
            if seq.gen.cancelled.is_set():
                raise Cancelled("the request was cancelled")
            if chunk.logits:
                seq.inputs = None
                seq.prompt_logits = logits
                self._first_token(seq, logits)
        except Exception as exc:
            self._drop(seq, exc)

    def _charge_others(self, seq: Sequence, seconds: float) -> None:
        """Running requests waited `seconds` for `seq`'s encode or prefill."""
        for other in self.running:
            if other is not seq:
                other.timings["wait_ms"] += seconds * 1e3

    def _first_token(self, seq: Sequence, logits) -> None:
        """The prompt is through: the first token of each of its choices, from its logits."""
        forbid = self.inputs.eos_ids if seq.sampling.min_tokens > 0 else None
        token = seq.sampler(logits, seq.seen, forbid=forbid)
        now = time.perf_counter()
        seq.t_first = now
        seq.timings["prompt_ms"] = seq.prefill_s * 1e3
        seq.timings["ttft_ms"] = (now - seq.gen.work.t_submit) * 1e3
        others = self._fork(seq)  # before the leader's token: finishing hands its cache to the prefix cache
        self._accept(seq, token)
        for other in others:
            if seq.family.over:
                return
            self._accept(other, other.sampler(logits, other.seen, forbid=forbid))

    def _fork(self, leader: Sequence) -> list[Sequence]:
        """The request's other choices start from copies of `leader`'s KV cache (its prompt)."""
        others = leader.family.followers
        assert leader.kv is not None, "the leader's prompt is through"
        for other in others:
            other.start_from(leader, leader.kv.copy(len(leader.prompt) + leader.sampling.max_tokens))
        return others

    # ----------------------------------------------------------------- decode
    def _sample(self, batch: list, logits, t0: float, t1: float) -> None:
        self.steps += 1
        self.last_batch = len(batch)
        self.batch_hist[len(batch)] = self.batch_hist.get(len(batch), 0) + 1
        for listener in self.listeners:
            listener(len(batch))
        eos = self.inputs.eos_ids
        for i, s in enumerate(batch):
            if s.family.over:  # another choice of its request failed in this step: it left with it
                continue
            s.fed.append(s.pending)
            try:
                token = s.sampler(logits[i], s.seen, forbid=eos if s.n < s.sampling.min_tokens else None)
                self._accept(s, token)
            except Exception as exc:
                self._drop(s, exc)
        if self._last_start is None:
            self.mixed_steps += 1
        else:  # decode-only steps: the step times by batch size
            times = self.step_times.setdefault(len(batch), [0, 0.0, 0.0, 0, 0.0])
            times[0] += 1
            times[1] += t1 - t0
            times[2] += time.perf_counter() - t0

    def _accept(self, seq: Sequence, token: int) -> None:
        """A sampled token: the end, or text out and the next step."""
        seq.pending = None
        if token in self.inputs.eos_ids:
            return self._finish(seq, "stop")
        seq.n += 1
        seq.seen.append(token)
        if seq.sampler.last is not None:  # each delta carries the entries of the tokens it completes
            seq.logprobs.append(self.token_text.entry(*seq.sampler.last))
        delta = seq.stream.push(token)
        if delta:
            seq.gen.queue.put(self._delta(seq, delta))
        if seq.stream.stopped:
            return self._finish(seq, "stop")
        if seq.n >= seq.sampling.max_tokens:
            return self._finish(seq, "length")
        if seq.gen.cancelled.is_set():
            return self._drop(seq, Cancelled("the request was cancelled"))
        seq.pending = token

    @staticmethod
    def _delta(seq: Sequence, text: str) -> Event:
        if seq.sampling.logprobs is None:
            return Event("delta", text=text, choice=seq.choice)
        entries, seq.logprobs = seq.logprobs, []
        return Event("delta", text=text, data={"logprobs": entries}, choice=seq.choice)

    # ----------------------------------------------------------------- leaving
    def _release(self, seq: Sequence) -> None:
        """Out of the batch; its KV goes to the conversation cache (consistent between tokens)."""
        if seq in self.running:
            self.running.remove(seq)
        kv = seq.kv
        if kv is not None:
            self.lean.release(kv)  # its storage its own again (ortdecode's batch arena)
        if kv is not None and kv.length:
            whole = kv.length >= len(seq.prompt)  # the prompt's logits belong to a whole prompt only
            self.prefix.put(np.asarray(seq.fed[:kv.length], dtype=np.int64),
                                [im for im in seq.images if im[1] <= kv.length], kv,
                                prompt_len=len(seq.prompt) if whole else 0,
                                prompt_logits=seq.prompt_logits if whole else None, tenant=seq.gen.request.tenant)

    def _finish(self, seq: Sequence, finish: str) -> None:
        self._release(seq)
        tail = seq.stream.flush()
        if tail or seq.logprobs:
            seq.gen.queue.put(self._delta(seq, tail))
        now = time.perf_counter()
        seq.finish_timings(now)
        family = seq.family
        family.finished[seq.choice] = (finish, seq.n)
        if family.count > 1:
            seq.gen.queue.put(Event("choice_done", data={"finish_reason": finish, "completion_tokens": seq.n},
                                    choice=seq.choice))
        if family.done:
            usage, choices = family.summary(seq.timings, now)
            self._last_total_s = seq.timings["total_ms"] / 1e3
            leader = family.leader
            leader.gen.done(seq.timings, family.finished[0][0], usage, choices, text=leader.stream.text_sent())
            family.close()

    def _drop(self, seq: Sequence, exc: Exception) -> None:
        """`seq` failed or was cancelled: its request ends with the error, every choice of it
        leaving the batch (once, whichever of them fails first)."""
        family = seq.family
        for member in family.members:
            if member in self.running:
                self._release(member)
        if family.over:
            return
        family.over = True
        if isinstance(exc, APIError):
            err = exc
        else:
            log.error("engine error in %s: %r", seq.gen.id, exc)
            err = EngineError(f"the engine failed: {type(exc).__name__}")
        seq.gen.fail(err)
        family.close()
