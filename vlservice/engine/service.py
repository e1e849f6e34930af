"""`VLModelService`: the model, loaded once, answering chat requests about images.

The workflow of one request, and where each knob acts:

1. `submit(request)` runs in the caller's thread: first admission (a full queue raises `Busy` at
   once, before any media is decoded), then, holding its place, decode and check the images and
   clips (at most `VL_MEDIA_DECODES` at once in the process), preprocess them, hash them, render
   the chat template and count tokens (`prepare.py`). Bad input raises an `APIError` here (and
   gives the place back), before anything is queued; an identical greedy request is answered from
   the result cache right here, with no model work.
2. The scheduler (`scheduler.py`), the one thread that touches the model, admits requests into
   up to `VL_MAX_BATCH` slots by (priority, arrival), takes their features from the cache or
   the vision encoder, prefills their prompts in chunks and decodes every running request in one
   batched forward pass per token, pushing events (`stage`, `delta`, `done`, `error`). A request
   of several choices (`ChatRequest.choices`, OpenAI's `n`, at most `VL_MAX_BATCH`) takes that
   many slots: one prefill, then each choice its own sequence (`delta` events carry their choice,
   and each choice's end is a `choice_done` event before the request's `done`).
3. The caller iterates `Generation.events()`; a caller that goes away calls `cancel()` (or closes
   the iterator), and the request leaves the batch within a step, freeing its slot.

It knows no Flask and no HTTP. Torch and ONNX Runtime thread pools are not fork-safe: `load()`
only reads weights (one thread); `start()` (after Gunicorn forks) sets the threads, opens the
ONNX Runtime session, warms up and starts the scheduler.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ..config import Settings
from ..errors import Busy, Cancelled, ContextLengthExceeded, InvalidRequest, NotReady
from .media import images as imgs
from .media import video as vid
from .caches import FeatureCache, FeatureShape, PrefixCache, ResultCache, SharedStore
from .model.checkpoints import DEMO_NOTICE, ModelSource, resolve
from .output.constrain import GrammarError, Grammars, explain, param_of
from .counters import Counters
from .media.features import FeatureSource
from .batching.generation import Generation, Work
from .model.inputs import ModelInputs
from .model.lm import SeqPos
from .model.runners import load_lm
from .media.prepare import MediaPreparer, chat_prompt, check_text_fits, media_tokens
from .prompt import Prompt, encode
from .reclaim import malloc_trim, release_file_pages
from .batching.scheduler import Scheduler
from .batching.tenants import TenantShares
from .types import ChatRequest, Event, ImageInput, Message, Sampling

if TYPE_CHECKING:
    from .model.vision import Encoder

log = logging.getLogger(__name__)


def sampling_defaults(gen) -> dict:
    """The checkpoint's `generation_config` as the sampling a request gets when it names none."""
    return {"temperature": float(getattr(gen, "temperature", None) or 0.0) if gen.do_sample else 0.0,
            "top_p": float(getattr(gen, "top_p", None) or 1.0),
            "top_k": int(getattr(gen, "top_k", None) or 0),
            "repetition_penalty": float(getattr(gen, "repetition_penalty", None) or 1.0)}


class VLModelService:
    def __init__(self, settings: Settings, source: ModelSource | None = None, model=None):
        """`model`: an already loaded `Qwen3VLForConditionalGeneration` of `source` to share (the
        benchmark runs several configurations over one copy of the weights)."""
        import torch
        from transformers import AutoTokenizer

        self.settings = settings
        t0 = time.perf_counter()
        self.source = source or resolve(settings.model)
        torch.set_num_threads(1)  # no thread pool before a fork; start() sets the real count
        path = self.source.path
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        if not self.tokenizer.chat_template and (path / "chat_template.json").is_file():
            self.tokenizer.chat_template = json.loads((path / "chat_template.json").read_text())["chat_template"]
        pre = json.loads((path / "preprocessor_config.json").read_text())
        self.spec = imgs.ImageSpec.from_preprocessor_config(pre)
        self.video_spec = vid.VideoSpec.from_checkpoint(path, pre)
        loaded = load_lm(settings, path, model)
        self.model, self.lean = loaded.model, loaded.runner
        self.quantize_s, self.llm_int8_stats = loaded.quantize_s, loaded.int8_stats
        self.prepack_stats, self.decoder_stats = loaded.prepack_stats, loaded.decoder_stats
        gen = self.model.generation_config
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, (list, tuple)) else [gen.eos_token_id]
        eos = [e for e in eos if e is not None] or [self.tokenizer.eos_token_id]
        self.inputs = ModelInputs(self.model, eos)
        self.grammars = Grammars(self.tokenizer, self.inputs.eos_ids)  # `response_format` matchers
        vision_cfg = self.model.config.vision_config  # what the encoder gives per token: a cached entry must match
        self.feature_width = (int(vision_cfg.out_hidden_size), len(vision_cfg.deepstack_visual_indexes))
        self.generation_defaults = sampling_defaults(gen)
        self.limits = imgs.Limits(max_bytes=settings.max_image_bytes, max_pixels=settings.max_image_pixels,
                                  max_aspect_ratio=settings.max_aspect_ratio)
        self.video_limits = vid.Limits(max_bytes=settings.max_video_bytes, max_seconds=settings.max_video_seconds,
                                       max_frames=settings.max_video_frames, max_pixels=settings.max_image_pixels)
        # decodes media in the callers' threads, VL_MEDIA_DECODES at once: the bound on decode memory
        self.media = MediaPreparer(settings, self.spec, self.video_spec, self.limits, self.video_limits,
                                   self.retry_after)
        self.load_s = time.perf_counter() - t0
        # encoder, cache and scheduler: set by start() (after the fork), before `ready` is True
        self.encoder: Encoder | None = None
        self.export_stats: dict = {}
        self.ready = False
        self.draining = False  # set on SIGTERM (drain()): no new requests, the running ones finish
        self.warmup_s = 0.0
        self.scheduler: Scheduler | None = None
        self.step_listeners: list = []  # callables(batch size) after every decode step (metrics)
        # the running requests (VL_MAX_BATCH) and the ones allowed to wait for a slot
        self._slots = threading.BoundedSemaphore(settings.queue_size + settings.max_batch)
        self.tenants = TenantShares(settings.queue_size + settings.max_batch, settings.queue_timeout_s)
        self._active: dict[str, Generation] = {}
        self._active_lock = threading.Lock()
        self.cache: FeatureCache | None = None
        self.shared: SharedStore | None = None  # the Redis tier of both caches (VL_REDIS_URL)
        self.model_fp = ""
        self.last_timings: dict = {}
        self.counters = Counters("requests", "completed", "errors", "cancelled", "busy", "prompt_tokens",
                                 "completion_tokens")
        self.features: FeatureSource | None = None  # cache, else encoder: made by start()
        log.info("loaded %s from %s in %.1f s%s", self.source.name, path, self.load_s,
                 " (DEMO model)" if self.source.is_demo else "")

    # ----------------------------------------------------------------- lifecycle
    @property
    def model_name(self) -> str:
        return self.source.name

    @property
    def is_demo(self) -> bool:
        return self.source.is_demo

    def prepare_files(self) -> None:
        """Export/quantise the ONNX encoder if needed (once, before forking workers)."""
        from .model.vision import ensure_onnx, fingerprint

        self.model_fp = fingerprint(self.source.path)
        if self.settings.vision_backend != "torch":
            _, self.export_stats = ensure_onnx(self.source.path, self.model.model.visual,
                                               self.settings.cache_path, self.settings.vision_backend)

    def start(self) -> "VLModelService":
        """Threads, encoder session, caches and warm-up: after the fork, in each worker."""
        import torch

        from .model.vision import fingerprint, load_encoder

        if self.ready:
            return self
        t0 = time.perf_counter()
        threads = self.settings.num_threads
        torch.set_num_threads(threads)
        if not self.model_fp:
            self.model_fp = fingerprint(self.source.path)
        self.encoder, stats = load_encoder(self.settings.vision_backend, self.source.path,
                                           self.model.model.visual, self.settings.cache_path, threads)
        self.export_stats = {**stats, **{k: v for k, v in self.export_stats.items() if v}}
        self.lean.start()  # its thread pools, if it has its own (after the fork: they are not fork-safe)
        disk_dir = self.settings.cache_path / "features" if self.settings.disk_cache_mb > 0 else None
        if self.settings.redis_url:  # a connection pool per worker: sockets do not survive a fork
            self.shared = SharedStore(self.settings.redis_url, f"vlservice:{self.model_fp[:16]}",
                                      self.settings.redis_timeout_s, self.settings.redis_ttl_s,
                                      password=self.settings.redis_password)
        self.cache = FeatureCache(self.settings.feature_cache_mb << 20, disk_dir, self.settings.disk_cache_mb << 20,
                                  shared=self.shared)
        self.kv = PrefixCache(self.settings.kv_cache_mb << 20)
        self.results = ResultCache(self.settings.result_cache_entries, shared=self.shared)
        if self.settings.warmup:
            self._warmup()
        self.features = FeatureSource(self.cache, self.encoder, self.spec, self.video_spec, self.feature_width)
        self.scheduler = Scheduler(
            self.lean, self.kv, self.features, self.inputs, self.tokenizer, self.grammars,
            max_batch=self.settings.max_batch, prefill_chunk=self.settings.prefill_chunk,
            queue_timeout_s=self.settings.queue_timeout_s, threads=self.settings.num_threads,
            malloc_trim=self.settings.malloc_trim, trim_busy_s=self.settings.malloc_trim_busy_s,
            listeners=self.step_listeners)
        self.scheduler.start()
        self.warmup_s = time.perf_counter() - t0
        self.ready = True
        log.info("ready: vision=%s threads=%d warm-up %.1f s", self.encoder.name, threads, self.warmup_s)
        return self

    def drain(self) -> None:
        """Take no new requests (they get 503 `draining`, to be retried elsewhere); the running and
        queued ones go on. The worker's SIGTERM handler calls it, then waits for `idle()`."""
        self.draining = True

    def idle(self) -> bool:
        """No request running, queued or being replayed."""
        with self._active_lock:
            return not self._active

    def close(self, timeout: float = 30) -> None:
        """Stop the scheduler once the step it is in ends (before the process exits)."""
        if self.scheduler is not None:
            self.scheduler.stop(timeout)
            self.scheduler = None
            self.ready = False

    def _warmup(self) -> None:
        """One small request through every stage, so the first user pays no one-time cost."""
        assert self.encoder is not None, "start() loads the encoder before the warm-up"
        rgb = np.full((64, 64, 3), 200, dtype=np.uint8)
        prepared = imgs.prepare(rgb, self.spec, self.settings.detail_low_pixels)
        feats = [self.encoder(prepared.pixel_values, prepared.grid_thw)]
        prompt = chat_prompt(self.tokenizer, [Message("user", [ImageInput(b""), "Hi"])], [prepared])
        (embeds, positions, mask, deepstack), pos = self.inputs.prefill_inputs(prompt, feats)
        kv = self.lean.new_kv()
        logits = self.lean.prefill(kv, embeds, positions, mask, deepstack)
        token = int(logits.argmax())
        self.lean.decode([token, token], [kv, self.lean.new_kv(1)], [pos, SeqPos(pos.next_pos, pos.delta)])

    # ----------------------------------------------------------------- submit (caller's thread)
    def submit(self, request: ChatRequest) -> Generation:
        if not self.ready:
            raise NotReady("the model is still loading; retry shortly", code="not_ready")
        if self.draining:
            raise NotReady("this replica is shutting down; retry (another replica will answer)", code="draining",
                           retry_after=1)
        assert self.encoder is not None, "ready: start() loaded the encoder"
        self._check_sampling(request.sampling)
        self._check_choices(request.choices)
        t0 = time.perf_counter()
        # Admission first: a full queue, or a tenant past its share, is refused before any image or
        # clip is decoded.
        share = self.tenants.enter(request.tenant)
        if share is None or not self._slots.acquire(blocking=False):
            if share is not None:
                self.tenants.leave(request.tenant)
            self.counters.add("busy")
            raise Busy(f"the server is busy ({self.settings.queue_size} requests already waiting); retry later"
                       if share is not None else "this API key has its fair share of the server's places in use "
                       "while other keys wait; retry later", retry_after=self.retry_after())
        try:
            work = self._work(request, t0)
        except BaseException:
            self._slots.release()  # not registered yet: nothing else gives the slot back
            self.tenants.leave(request.tenant)
            raise
        self.counters.add("requests")
        gen = Generation(request, work, self._ended)
        # Registered before anything can finish it: a result-cache replay ends (and unregisters)
        # at once, and registering after that kept every such request alive for good.
        with self._active_lock:
            self._active[gen.id] = gen
        try:
            gen.queue.put(Event("queued", data={"position": work.queue_position}))
            cached = self.results.get(work.result_key) if work.result_key else None
            if cached is not None:
                self._replay(gen, cached, dict(work.timings))
            else:
                assert self.scheduler is not None, "ready: start() started the scheduler"
                self.scheduler.submit(gen)
        except Exception:
            self._leave(gen)
            raise
        return gen

    def _work(self, request: ChatRequest, t0: float) -> Work:
        """What the scheduler needs of an admitted request (it holds a slot): its media decoded
        (one decode turn each), its prompt, its cache keys."""
        assert self.encoder is not None, "ready: start() loaded the encoder"
        s = request.sampling
        check_text_fits(self.tokenizer, request.messages, request.tools, s.max_tokens, self.settings.max_context_tokens)
        constraint, compile_s = None, 0.0
        if s.grammar:  # `response_format`: the matcher is built here (a bad schema is refused before any
            t = time.perf_counter()  # decode), never on the scheduler's thread
            try:
                constraint = self.grammars.constraint(s.grammar)
            except GrammarError as exc:
                raise InvalidRequest(f"`{param_of(s.grammar)}` cannot be used with this model's tokenizer: "
                                     f"{explain(exc)}", param=param_of(s.grammar), code="invalid_schema") from None
            compile_s = time.perf_counter() - t
        space = self.model_fp + (f"/{request.tenant}" if request.tenant else "")  # no cache shared across tenants
        prepared, keys, media_timings = self.media.prepare(request.media, space, self.encoder.name, request.gone.is_set)
        prompt = self._prompt(request, prepared)
        if len(prompt) + s.max_tokens > self.settings.max_context_tokens:
            raise ContextLengthExceeded(
                f"this request needs {len(prompt)} prompt tokens (including "
                f"{sum(p.num_tokens for p in prepared)} image and video tokens) plus max_tokens={s.max_tokens}, "
                f"more than the context limit of {self.settings.max_context_tokens} tokens",
                param="messages")
        spans = prompt.media_spans(self.inputs.image_token_id, self.inputs.video_token_id)
        images = [(a, b, k) for (a, b), k in zip(spans, keys)]
        result_key = None
        # the cache keeps one answer and no log probabilities; several choices are never looked up
        # (a cached answer is one choice) nor stored (their key would not say how many there were)
        if request.result_cache and s.greedy and s.logprobs is None and request.choices == 1:
            result_key = ResultCache.key(space, self.encoder.name, prompt.input_ids, keys, s)
        timings = {**media_timings,
                   **({"grammar_compile_ms": compile_s * 1e3} if constraint is not None else {}),
                   "submit_ms": (time.perf_counter() - t0) * 1e3}
        return Work(prepared=prepared, keys=keys, prompt=prompt, images=images, result_key=result_key,
                    constraint=constraint, timings=timings, t_submit=time.perf_counter(),
                    queue_position=self.queue_depth() + self.running())

    def _prompt(self, request: ChatRequest, prepared: list) -> Prompt:
        """The messages through the chat template, or a raw prompt (`/v1/completions`) as it is; both
        tokenized as text: a marker a client typed is never a control token."""
        if request.raw_prompt is not None:
            return Prompt(input_ids=encode(self.tokenizer, [(request.raw_prompt, False)]))
        return chat_prompt(self.tokenizer, request.messages, prepared, request.tools)

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The token ids `submit` would prefill for `request`, computed without running it
        (`count_tokens`, `/tokenize`): the text bounded by the context first, the media decoded to
        count their tokens; nothing is queued or cached."""
        check_text_fits(self.tokenizer, request.messages, request.tools, 0, self.settings.max_context_tokens)
        prepared, _, _ = self.media.prepare(request.media, self.model_fp, "count", request.gone.is_set)
        return self._prompt(request, prepared).input_ids

    def cancel(self, request_id: str, tenant: str = "") -> bool:
        """Cancels a running request of `tenant` (another tenant's is not found)."""
        with self._active_lock:
            gen = self._active.get(request_id)
        if gen is None or gen.request.tenant != tenant:
            return False
        gen.cancel()
        if self.scheduler is not None:
            self.scheduler.wake()
        return True

    def _check_sampling(self, s: Sampling) -> None:
        if not 1 <= s.max_tokens <= self.settings.max_tokens_cap:
            raise InvalidRequest(f"`max_tokens` must be between 1 and {self.settings.max_tokens_cap}, "
                                 f"got {s.max_tokens}", param="max_tokens", code="invalid_value")

    def _check_choices(self, choices: int) -> None:
        limit = self.settings.max_batch
        if not 1 <= choices <= limit:
            raise InvalidRequest(f"`n` must be between 1 and {limit} (each choice takes one of the {limit} batch "
                                 f"slots, VL_MAX_BATCH), got {choices}", param="n", code="invalid_value")

    def retry_after(self) -> int:
        return max(1, int(round(self.last_timings.get("total_ms", 5000) / 1000)))

    @property
    def encoder_calls(self) -> int:
        """Vision encoder runs so far (feature cache misses)."""
        return self.features.calls if self.features is not None else 0

    def feature_shape(self, prepared) -> FeatureShape:
        """What the encoder's features of one prepared image or clip are (`FeatureSource.shape`)."""
        assert self.features is not None, "start() made the feature source"
        return self.features.shape(prepared)

    def _replay(self, gen: Generation, cached: dict, timings: dict) -> None:
        """An identical greedy request answered from the result cache: no model work, no queue."""
        gen.queue.put(Event("started"))
        if cached["text"]:
            gen.queue.put(Event("delta", text=cached["text"]))
        usage = dict(cached["usage"])
        n = usage["completion_tokens"]
        timings.update({"queue_ms": 0.0, "cache_lookup_ms": 0.0, "vision_encode_ms": 0.0, "vision_cache_hit": True,
                        **media_tokens(gen.work.prepared), "prompt_ms": 0.0,
                        "prompt_n": 0, "cache_n": usage["prompt_tokens"], "prompt_per_second": 0.0,
                        "predicted_n": n, "predicted_ms": 0.0, "predicted_per_second": 0.0,
                        "result_cache_hit": True,
                        "ttft_ms": (time.perf_counter() - gen.work.t_submit) * 1e3})
        timings["total_ms"] = timings["ttft_ms"]
        gen.done(timings, cached["finish_reason"], usage)

    def _ended(self, gen: Generation, event: Event, text: str) -> None:
        """A request's end, told by its `Generation` (whoever ended it: the scheduler, a replay, a
        failure before the queue) before its caller sees the final event: the books, the result
        cache, and its place freed."""
        if event.kind == "done":
            usage = event.data["usage"]
            self.counters.add("completed")
            self.counters.add("prompt_tokens", usage["prompt_tokens"])
            self.counters.add("completion_tokens", usage["completion_tokens"])
            self.last_timings = event.data["timings"]
            log.info("%s done: %s", gen.id, " ".join(f"{k}={v}" for k, v in self.last_timings.items()))
            if gen.work.result_key and not event.data["timings"].get("result_cache_hit"):
                self.results.put(gen.work.result_key, {"text": text, "finish_reason": event.data["finish_reason"],
                                                       "usage": usage})
        else:
            self.counters.add("cancelled" if isinstance(event.error, Cancelled) else "errors")
        self._leave(gen)

    def _leave(self, gen: Generation) -> None:
        """Its place in the queue and its id are free again (once, whatever ended it)."""
        with self._active_lock:
            if self._active.pop(gen.id, None) is None:
                return
        self._slots.release()
        self.tenants.leave(gen.request.tenant)

    # ----------------------------------------------------------------- convenience and stats
    def chat(self, request: ChatRequest) -> dict:
        return self.submit(request).result()

    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return self.scheduler.waiting if self.scheduler else 0

    def running(self) -> int:
        """Sequences holding a slot (being encoded, prefilled or decoded; a request of n choices
        holds n)."""
        return len(self.scheduler.running) if self.scheduler else 0

    def info(self) -> dict:
        return {
            "model": self.model_name, "demo": self.is_demo, "demo_notice": DEMO_NOTICE if self.is_demo else None,
            "vision_backend": self.settings.vision_backend, "llm": self.settings.llm_quant or "float32",
            "threads": self.settings.num_threads, "load_s": round(self.load_s, 2),
            "warmup_s": round(self.warmup_s, 2), "ready": self.ready,
            "export": self.export_stats, **({"llm_decoder": self.decoder_stats} if self.decoder_stats else {}),
        }

    def stats(self) -> dict:
        return {
            "queue_depth": self.queue_depth(), "busy": self.running() > 0,
            "batch": self.scheduler.stats() if self.scheduler else {},
            "cache": self.cache.stats() if self.cache else {},
            "kv_cache": self.kv.stats() if self.cache else {},
            "result_cache": self.results.stats() if self.cache else {},
            "shared_cache": self.shared.stats() if self.shared else None,
            "last_timings": self.last_timings, "counters": self.counters.snapshot(),
            "encoder_calls": self.encoder_calls,
        }


def load_service(settings: Settings | None = None, start: bool = True) -> VLModelService:
    settings = settings or Settings.from_env()
    service = VLModelService(settings)
    service.prepare_files()
    if settings.vision_backend != "torch":
        from .model.quant import release_torch_vision

        log.info("freed %.0f MB of PyTorch vision weights (ONNX Runtime runs the encoder)",
                 release_torch_vision(service.model) / 2**20)
    if settings.malloc_trim:
        malloc_trim()  # loading leaves freed buffers (conversions, packing) in the heap
    released = release_file_pages(service.source.path)
    if released:
        log.info("released %.0f MB of checkpoint pages that loading left mapped", released / 2**20)
    if start:
        service.start()
    return service


__all__ = ["VLModelService", "load_service"]

