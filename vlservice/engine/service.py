"""`VLModelService`: the model, loaded once, answering chat requests about images.

The workflow of one request, and where each knob acts:

1. `submit(request)` runs in the caller's thread, outside the model lock: decode and check the
   images, preprocess them, hash them, render the chat template and count tokens. Bad input
   raises an `APIError` here, before anything is queued. A full queue raises `Busy` at once.
2. A worker thread waits for the model (`PriorityLock`: interactive before batch, FIFO within a
   priority, `VL_QUEUE_TIMEOUT_S`), then: features from the cache or the vision encoder, prefill,
   and the token loop, pushing events (`stage`, `delta`, `done`, `error`) to the caller.
3. The caller iterates `Generation.events()`; a caller that goes away calls `cancel()` (or closes
   the iterator), the loop stops within a token and the lock is released.

It knows no Flask and no HTTP. Torch and ONNX Runtime thread pools are not fork-safe: `load()`
only reads weights (one thread); `start()` (after Gunicorn forks) sets the threads, opens the
ONNX Runtime session and warms up.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np

from ..config import Settings
from ..errors import (APIError, Busy, Cancelled, ContextLengthExceeded, EngineError, InvalidRequest,
                      NotReady, QueueTimeout)
from . import images as imgs
from .caches import FeatureCache, PrefixCache, ResultCache, feature_key
from .checkpoints import DEMO_NOTICE, ModelSource, resolve
from .decoder import Decoder
from .generation import Generation
from .lock import PriorityLock, malloc_trim
from .prompt import build_prompt
from .sampling import Sampler
from .textstream import TextStream
from .types import PRIORITIES, ChatRequest, Event, ImageInput, Message, Sampling

log = logging.getLogger(__name__)


class VLModelService:
    def __init__(self, settings: Settings, source: ModelSource | None = None, model=None):
        """`model`: an already loaded `Qwen3VLForConditionalGeneration` of `source` to share (the
        benchmark runs several configurations over one copy of the weights)."""
        import torch
        from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

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
        self.quantize_s = 0.0
        self.llm_int8_stats: dict = {}
        if model is None and settings.llm_quant == "int8":
            from .quant import load_int8_model
            from .vision import onnx_ready

            need_vision = not onnx_ready(path, settings.cache_path, settings.vision_backend)
            model, self.llm_int8_stats = load_int8_model(path, settings.cache_path, need_vision)
            self.quantize_s = self.llm_int8_stats["build_s"]
        elif model is None:
            model = Qwen3VLForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
        elif settings.llm_quant == "int8":  # a shared float model (the benchmark): quantise in place
            from .quant import quantize_llm_int8

            self.quantize_s = quantize_llm_int8(model)
        self.model = model.eval()
        self.model.requires_grad_(False)
        gen = self.model.generation_config
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, (list, tuple)) else [gen.eos_token_id]
        eos = [e for e in eos if e is not None] or [self.tokenizer.eos_token_id]
        self.decoder = Decoder(self.model, eos)
        self.generation_defaults = {
            "temperature": float(getattr(gen, "temperature", None) or 0.0) if gen.do_sample else 0.0,
            "top_p": float(getattr(gen, "top_p", None) or 1.0),
            "top_k": int(getattr(gen, "top_k", None) or 0),
            "repetition_penalty": float(getattr(gen, "repetition_penalty", None) or 1.0),
        }
        self.limits = imgs.Limits(max_bytes=settings.max_image_bytes, max_pixels=settings.max_image_pixels,
                                  max_aspect_ratio=settings.max_aspect_ratio)
        self.load_s = time.perf_counter() - t0
        self.encoder = None
        self.export_stats: dict = {}
        self.ready = False
        self.warmup_s = 0.0
        self.lock = PriorityLock()
        self._slots = threading.BoundedSemaphore(settings.queue_size + 1)
        self._active: dict[str, Generation] = {}
        self._active_lock = threading.Lock()
        self.cache: FeatureCache | None = None
        self.model_fp = ""
        self.last_timings: dict = {}
        self.counters = {"requests": 0, "completed": 0, "errors": 0, "cancelled": 0, "busy": 0,
                         "prompt_tokens": 0, "completion_tokens": 0}
        self.encoder_calls = 0
        self._last_trim = 0.0
        self.listeners: list = []  # callables(timings) for metrics
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
        from .vision import ensure_onnx, fingerprint

        self.model_fp = fingerprint(self.source.path)
        if self.settings.vision_backend != "torch":
            _, self.export_stats = ensure_onnx(self.source.path, self.model.model.visual,
                                               self.settings.cache_path, self.settings.vision_backend)

    def start(self) -> "VLModelService":
        """Threads, encoder session, caches and warm-up: after the fork, in each worker."""
        import torch

        from .vision import fingerprint, load_encoder

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
        disk_dir = self.settings.cache_path / "features" if self.settings.disk_cache_mb > 0 else None
        self.cache = FeatureCache(self.settings.feature_cache_mb << 20, disk_dir, self.settings.disk_cache_mb << 20)
        self.kv = PrefixCache(self.settings.kv_cache_mb << 20)
        self.results = ResultCache(self.settings.result_cache_entries)
        if self.settings.warmup:
            self._warmup()
        self.warmup_s = time.perf_counter() - t0
        self.ready = True
        log.info("ready: vision=%s threads=%d warm-up %.1f s", self.encoder.name, threads, self.warmup_s)
        return self

    def _warmup(self) -> None:
        """One small request through every stage, so the first user pays no one-time cost."""
        rgb = np.full((64, 64, 3), 200, dtype=np.uint8)
        prepared = imgs.prepare(rgb, self.spec, self.settings.detail_low_pixels)
        feats = [self.encoder(prepared.pixel_values, prepared.grid_thw)]
        prompt = self._prompt([Message("user", [ImageInput(b""), "Hi"])], [prepared])
        cache = self.decoder.new_cache()
        logits = self.decoder.prefill(prompt, feats, cache)
        self.decoder.step(int(logits.argmax()), cache)

    # ----------------------------------------------------------------- submit (caller's thread)
    def submit(self, request: ChatRequest) -> Generation:
        if not self.ready:
            raise NotReady("the model is still loading; retry shortly", code="not_ready")
        self._check_sampling(request.sampling)
        t0 = time.perf_counter()
        decode_s = prep_s = 0.0
        prepared, keys, budgets = [], [], []
        for img in request.images:
            t = time.perf_counter()
            try:
                rgb = imgs.decode(img.data, self.limits)
            except APIError as exc:
                exc.param = exc.param or img.param
                raise
            decode_s += time.perf_counter() - t
            t = time.perf_counter()
            budget = self.settings.detail_pixels(img.detail)
            try:
                p = imgs.prepare(rgb, self.spec, budget)
            except APIError as exc:
                exc.param = exc.param or img.param
                raise
            prep_s += time.perf_counter() - t
            prepared.append(p)
            budgets.append(budget)
            keys.append(feature_key(p.digest, p.grid_thw, budget, self.model_fp, self.encoder.name))
        prompt = self._prompt(request.messages, prepared)
        s = request.sampling
        if len(prompt) + s.max_tokens > self.settings.max_context_tokens:
            raise ContextLengthExceeded(
                f"this request needs {len(prompt)} prompt tokens (including "
                f"{sum(p.num_tokens for p in prepared)} image tokens) plus max_tokens={s.max_tokens}, "
                f"more than the context limit of {self.settings.max_context_tokens} tokens",
                param="messages")
        if not self._slots.acquire(blocking=False):
            self.counters["busy"] += 1
            raise Busy(f"the server is busy ({self.settings.queue_size} requests already waiting); retry later",
                       retry_after=self._retry_after())
        spans = prompt.image_spans(self.decoder.image_token_id)
        images = [(a, b, k) for (a, b), k in zip(spans, keys)]
        result_key = None
        if request.result_cache and s.greedy:
            result_key = ResultCache.key(self.model_fp, self.encoder.name, prompt.input_ids, keys, s)
        work = {"prepared": prepared, "keys": keys, "prompt": prompt, "images": images, "result_key": result_key,
                "timings": {"image_decode_ms": decode_s * 1e3, "preprocess_ms": prep_s * 1e3,
                            "submit_ms": (time.perf_counter() - t0) * 1e3},
                "t_submit": time.perf_counter(), "queue_position": self.lock.waiting + int(self.lock.held)}
        self.counters["requests"] += 1
        try:
            gen = Generation(self, request, work)
        except Exception:
            self._slots.release()
            raise
        # Registered before its thread starts: a result-cache replay can finish (and unregister)
        # within microseconds, and registering after that kept every such request alive for good.
        with self._active_lock:
            self._active[gen.id] = gen
        try:
            return gen.start()
        except Exception:
            with self._active_lock:
                self._active.pop(gen.id, None)
            self._slots.release()
            raise

    def cancel(self, request_id: str) -> bool:
        with self._active_lock:
            gen = self._active.get(request_id)
        if gen is None:
            return False
        gen.cancel()
        return True

    def _check_sampling(self, s: Sampling) -> None:
        if not 1 <= s.max_tokens <= self.settings.max_tokens_cap:
            raise InvalidRequest(f"`max_tokens` must be between 1 and {self.settings.max_tokens_cap}, got {s.max_tokens}",
                                 param="max_tokens", code="invalid_value")

    def _retry_after(self) -> int:
        return max(1, int(round(self.last_timings.get("total_ms", 5000) / 1000)))

    def _prompt(self, messages: list, prepared: list):
        chat, it = [], iter(prepared)
        for m in messages:
            if all(isinstance(p, str) for p in m.parts):
                chat.append({"role": m.role, "content": "".join(m.parts)})
                continue
            content = []
            for p in m.parts:
                if isinstance(p, ImageInput):
                    next(it)
                    content.append({"type": "image"})
                else:
                    content.append({"type": "text", "text": p})
            chat.append({"role": m.role, "content": content})
        return build_prompt(self.tokenizer, chat, [p.num_tokens for p in prepared],
                            [p.grid_thw for p in prepared])

    # ----------------------------------------------------------------- run (worker thread)
    def _run(self, gen: Generation) -> None:
        work, put = gen.work, gen.queue.put
        timings = dict(work["timings"])
        got_lock = False
        try:
            put(Event("queued", data={"position": work["queue_position"]}))
            cached = self.results.get(work["result_key"]) if work["result_key"] else None
            if cached is not None:
                self._replay(gen, cached, timings)
                return
            t = time.perf_counter()
            got_lock = self.lock.acquire(PRIORITIES.get(gen.request.priority, 1), self.settings.queue_timeout_s,
                                         gen.cancelled)
            timings["queue_ms"] = (time.perf_counter() - t) * 1e3
            if not got_lock:
                if gen.cancelled.is_set():
                    raise Cancelled("the request was cancelled while it waited")
                raise QueueTimeout(f"the request waited {self.settings.queue_timeout_s:.0f} s for the model; "
                                   f"retry later", retry_after=self._retry_after())
            put(Event("started"))
            self._generate(gen, timings)
        except APIError as exc:
            self.counters["cancelled" if isinstance(exc, Cancelled) else "errors"] += 1
            put(Event("error", error=exc))
        except Exception as exc:  # an engine fault: this request fails, the service goes on
            log.exception("engine error in %s", gen.id)
            self.counters["errors"] += 1
            put(Event("error", error=EngineError(f"the engine failed: {type(exc).__name__}")))
        finally:
            if got_lock:
                if self.settings.malloc_trim:
                    self._trim()
                self.lock.release()
            self._slots.release()
            with self._active_lock:
                self._active.pop(gen.id, None)

    def _trim(self) -> None:
        """Give the freed heap back to the system (glibc keeps it otherwise: the soak's slow RSS
        growth). Called while this request still holds the model lock, so no inference runs
        meanwhile; at most once a second, a few milliseconds each."""
        now = time.monotonic()
        if now - self._last_trim >= 1.0:
            self._last_trim = now
            malloc_trim()

    def _features(self, gen: Generation, timings: dict, needed: list) -> list:
        """Features of the images `needed` (indices): from the cache, else the encoder."""
        work = gen.work
        feats, hit_all, lookup_s, encode_s = [], True, 0.0, 0.0
        for i in needed:
            p, key = work["prepared"][i], work["keys"][i]
            t = time.perf_counter()
            f = self.cache.get(key) if key else None
            lookup_s += time.perf_counter() - t
            if f is None:
                hit_all = False
                gen.queue.put(Event("stage", data={"stage": "vision_encode"}))
                t = time.perf_counter()
                f = self.encoder(p.pixel_values, p.grid_thw)
                self.encoder_calls += 1
                encode_s += time.perf_counter() - t
                if key:
                    self.cache.put(key, f)
            feats.append(f)
            if gen.cancelled.is_set():
                raise Cancelled("the request was cancelled")
        timings["cache_lookup_ms"] = lookup_s * 1e3
        timings["vision_encode_ms"] = encode_s * 1e3
        timings["vision_cache_hit"] = bool(work["prepared"]) and hit_all
        timings["image_tokens"] = sum(p.num_tokens for p in work["prepared"])
        return feats

    def _generate(self, gen: Generation, timings: dict) -> None:
        prompt, images = gen.work["prompt"], gen.work["images"]
        t_start = time.perf_counter()
        ids = np.asarray(prompt.input_ids, dtype=np.int64)
        entry, shared = self.kv.take(ids, images)
        logits = None
        if entry is not None:
            cache = entry.cache
            if shared == len(prompt) == entry.prompt_len and entry.prompt_logits is not None:
                # The same prompt again: its next-token logits were kept, no forward pass at all.
                start, logits = len(prompt), entry.prompt_logits
            else:
                start = min(shared, len(prompt) - 1)  # at least one token to prefill: its logits
            cache.crop(start - cache.get_seq_length())
        else:
            cache, start = self.decoder.new_cache(), 0
        needed = [i for i, (a, _, _) in enumerate(images) if a >= start]
        feats = self._features(gen, timings, needed)
        if len(needed) < len(images):
            timings["vision_cache_hit"] = True  # inside the reused prefix: not even looked up
        gen.queue.put(Event("stage", data={"stage": "prefill"}))
        t = time.perf_counter()
        fed = list(prompt.input_ids)
        kept = {}
        try:
            self._decode(gen, timings, prompt, feats, cache, start, fed, t, t_start, logits, kept)
        except (Cancelled, KeyboardInterrupt):
            self.kv.put(np.asarray(fed, dtype=np.int64), images, cache, **kept)  # consistent between tokens
            raise
        else:
            self.kv.put(np.asarray(fed, dtype=np.int64), images, cache, **kept)

    def _decode(self, gen, timings, prompt, feats, cache, start, fed, t, t_start, logits, kept) -> None:
        s = gen.request.sampling
        if logits is None:
            logits = self.decoder.prefill(prompt, feats, cache, start)
        else:
            self.decoder.resume(prompt)
        kept.update(prompt_len=len(prompt), prompt_logits=logits)
        sampler = Sampler(s)
        stream = TextStream(self.tokenizer, s.stop)
        seen = list(prompt.input_ids)
        eos = self.decoder.eos_ids
        token = sampler(logits, seen, forbid=eos if s.min_tokens > 0 else None)
        prefill_s = time.perf_counter() - t
        timings["prompt_ms"] = prefill_s * 1e3
        timings["ttft_ms"] = (time.perf_counter() - gen.work["t_submit"]) * 1e3
        n, finish = 0, "length"
        t_decode = time.perf_counter()
        while True:
            if token in eos:
                finish = "stop"
                break
            n += 1
            seen.append(token)
            delta = stream.push(token)
            if delta:
                gen.queue.put(Event("delta", text=delta))
            if stream.stopped:
                finish = "stop"
                break
            if n >= s.max_tokens:
                break
            if gen.cancelled.is_set():
                raise Cancelled("the request was cancelled")
            logits = self.decoder.step(token, cache)
            fed.append(token)
            token = sampler(logits, seen, forbid=eos if n < s.min_tokens else None)
        tail = stream.flush()
        if tail:
            gen.queue.put(Event("delta", text=tail))
        decode_s = time.perf_counter() - t_decode
        timings.update({
            "prompt_n": len(prompt) - start, "cache_n": start, "result_cache_hit": False,
            "prompt_per_second": (len(prompt) - start) / prefill_s if prefill_s else 0.0,
            "predicted_n": n, "predicted_ms": decode_s * 1e3,
            "predicted_per_second": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
            "total_ms": (time.perf_counter() - gen.work["t_submit"]) * 1e3,
            "model_ms": (time.perf_counter() - t_start) * 1e3,
        })
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
        if gen.work["result_key"]:
            self.results.put(gen.work["result_key"], {"text": stream.text_sent(), "finish_reason": finish,
                                                      "usage": usage})
        self._finish(gen, timings, finish, usage)

    def _replay(self, gen: Generation, cached: dict, timings: dict) -> None:
        """An identical greedy request answered from the result cache: no model work, no queue."""
        gen.queue.put(Event("started"))
        if cached["text"]:
            gen.queue.put(Event("delta", text=cached["text"]))
        usage = dict(cached["usage"])
        n = usage["completion_tokens"]
        timings.update({"queue_ms": 0.0, "cache_lookup_ms": 0.0, "vision_encode_ms": 0.0, "vision_cache_hit": True,
                        "image_tokens": sum(p.num_tokens for p in gen.work["prepared"]), "prompt_ms": 0.0,
                        "prompt_n": 0, "cache_n": usage["prompt_tokens"], "prompt_per_second": 0.0,
                        "predicted_n": n, "predicted_ms": 0.0, "predicted_per_second": 0.0,
                        "result_cache_hit": True,
                        "ttft_ms": (time.perf_counter() - gen.work["t_submit"]) * 1e3})
        timings["total_ms"] = timings["ttft_ms"]
        self._finish(gen, timings, cached["finish_reason"], usage)

    def _finish(self, gen: Generation, timings: dict, finish: str, usage: dict) -> None:
        n = usage["completion_tokens"]
        self.counters["completed"] += 1
        self.counters["prompt_tokens"] += usage["prompt_tokens"]
        self.counters["completion_tokens"] += n
        self.last_timings = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in timings.items()}
        for listener in self.listeners:
            listener(self.last_timings)
        log.info("%s done: %s", gen.id, " ".join(f"{k}={v}" for k, v in self.last_timings.items()))
        gen.queue.put(Event("done", data={"finish_reason": finish, "usage": usage, "timings": self.last_timings}))

    # ----------------------------------------------------------------- convenience and stats
    def chat(self, request: ChatRequest) -> dict:
        return self.submit(request).result()

    def info(self) -> dict:
        return {
            "model": self.model_name, "demo": self.is_demo, "demo_notice": DEMO_NOTICE if self.is_demo else None,
            "vision_backend": self.settings.vision_backend, "threads": self.settings.num_threads,
            "load_s": round(self.load_s, 2), "warmup_s": round(self.warmup_s, 2), "ready": self.ready,
            "export": self.export_stats,
        }

    def stats(self) -> dict:
        return {
            "queue_depth": self.lock.waiting, "busy": self.lock.held,
            "cache": self.cache.stats() if self.cache else {},
            "kv_cache": self.kv.stats() if self.cache else {},
            "result_cache": self.results.stats() if self.cache else {},
            "last_timings": self.last_timings, "counters": dict(self.counters),
            "encoder_calls": self.encoder_calls,
        }


def load_service(settings: Settings | None = None, start: bool = True) -> VLModelService:
    settings = settings or Settings.from_env()
    service = VLModelService(settings)
    service.prepare_files()
    if settings.vision_backend != "torch":
        from .quant import release_torch_vision

        log.info("freed %.0f MB of PyTorch vision weights (ONNX Runtime runs the encoder)",
                 release_torch_vision(service.model) / 2**20)
    if settings.malloc_trim:
        malloc_trim()  # loading leaves freed buffers (conversions, packing) in the heap
    if start:
        service.start()
    return service


__all__ = ["VLModelService", "load_service"]
