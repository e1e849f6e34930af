"""Prometheus metrics (`/metrics`): requests by status, per-stage latency, tokens, cache, queue.

`prometheus_client` with a registry per app, so tests can build several apps in one process.
A chat request is counted through one `ChatRecord`: in flight from its start, counted by status
exactly once when it ends, whichever of its possible ends comes first. The shared Redis tier's
counters are read from the service when scraped (`SharedCacheCollector`).
"""

from __future__ import annotations

import threading

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

STAGES = ("queue_ms", "image_decode_ms", "preprocess_ms", "vision_encode_ms", "prompt_ms", "ttft_ms",
          "predicted_ms", "total_ms")
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class Metrics:
    def __init__(self, service):
        self.service = service
        self.registry = r = CollectorRegistry()
        self.requests = Counter("vlservice_requests", "Chat completion requests by HTTP status", ["status"],
                                registry=r)
        self.stage = Histogram("vlservice_stage_seconds", "Per-stage latency of completed requests", ["stage"],
                               buckets=BUCKETS, registry=r)
        self.tokens = Counter("vlservice_tokens", "Tokens processed", ["kind"], registry=r)
        self.cache = Counter("vlservice_vision_cache", "Vision feature cache lookups", ["result"], registry=r)
        self.in_flight = Gauge("vlservice_requests_in_flight", "Chat requests started and not yet answered", registry=r)
        queue = Gauge("vlservice_queue_depth", "Requests waiting for the model", registry=r)
        queue.set_function(service.queue_depth)
        busy = Gauge("vlservice_model_busy", "1 while the model is working", registry=r)
        busy.set_function(lambda: int(service.running() > 0))
        running = Gauge("vlservice_running_requests", "Requests holding a slot (encoding, prefilling or decoding)",
                        registry=r)
        running.set_function(service.running)
        slots = Gauge("vlservice_slots", "Requests that can run at once (VL_MAX_BATCH)", registry=r)
        slots.set(service.settings.max_batch)
        self.batch = Histogram("vlservice_decode_batch_size", "Sequences in each batched decode step",
                               buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)
        service.step_listeners.append(self.batch.observe)
        r.register(SharedCacheCollector(service))

    def chat_started(self) -> ChatRecord:
        return ChatRecord(self)

    def _observe(self, result: dict) -> None:
        """Latency, tokens and cache use of a completed generation."""
        t = result.get("timings", {})
        for name in STAGES:
            if name in t:
                self.stage.labels(name[:-3]).observe(t[name] / 1000.0)
        usage = result.get("usage", {})
        self.tokens.labels("prompt").inc(usage.get("prompt_tokens", 0))
        self.tokens.labels("completion").inc(usage.get("completion_tokens", 0))
        if t.get("image_tokens"):
            self.cache.labels("hit" if t.get("vision_cache_hit") else "miss").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ChatRecord:
    """One chat request in the metrics. Several paths may try to end it (the stream's last event,
    the stream being closed, the response hook); only the first `finish` counts, so every request
    is counted once and leaves `in_flight` exactly once."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics
        self._lock = threading.Lock()
        self._open = True
        self.result: dict | None = None  # a completed generation's usage and timings, when there is one
        metrics.in_flight.inc()

    def finish(self, status: int) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        m = self._metrics
        m.in_flight.dec()
        m.requests.labels(str(status)).inc()
        if self.result and status == 200:
            m._observe(self.result)


class SharedCacheCollector:
    """The Redis tier's counters (`VL_REDIS_URL`), read from the service at each scrape; nothing
    when there is no shared tier. `fallbacks` counts calls answered locally because Redis was
    down, slow or refusing; `outages` the times it went from usable to not."""

    HELP = {"hits": "Shared-cache lookups found in Redis", "misses": "Shared-cache lookups not in Redis",
            "writes": "Entries written to Redis", "fallbacks": "Redis calls skipped or failed (local caches only)",
            "outages": "Times Redis went from usable to unusable", "corrupt": "Redis entries ignored as corrupt"}

    def __init__(self, service):
        self.service = service

    def describe(self):
        return []  # the families exist only when the service has a shared tier

    def collect(self):
        shared = getattr(self.service, "shared", None)
        if shared is None:
            return
        stats = shared.stats()
        for name, text in self.HELP.items():
            yield CounterMetricFamily(f"vlservice_redis_{name}", text, value=stats[name])
        yield GaugeMetricFamily("vlservice_redis_up", "1 while Redis answers", value=int(stats["up"]))
