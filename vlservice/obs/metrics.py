"""Prometheus metrics (`/metrics`): requests by status, per-stage latency, tokens, cache, queue.

`prometheus_client` with a registry per app, so tests can build several apps in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.in_flight = Gauge("vlservice_requests_in_flight", "Requests accepted and not finished", registry=r)
        queue = Gauge("vlservice_queue_depth", "Requests waiting for the model", registry=r)
        queue.set_function(lambda: service.lock.waiting)
        busy = Gauge("vlservice_model_busy", "1 while the model is working", registry=r)
        busy.set_function(lambda: int(service.lock.held))

    def request_started(self) -> None:
        self.in_flight.inc()

    def request_finished(self, status: int, result: dict | None) -> None:
        self.in_flight.dec()
        self.requests.labels(str(status)).inc()
        if result:
            t = result.get("timings", {})
            for name in STAGES:
                if name in t:
                    self.stage.labels(name[:-3]).observe(t[name] / 1000.0)
            usage = result.get("usage", {})
            self.tokens.labels("prompt").inc(usage.get("prompt_tokens", 0))
            self.tokens.labels("completion").inc(usage.get("completion_tokens", 0))
            if t.get("image_tokens"):
                self.cache.labels("hit" if t.get("vision_cache_hit") else "miss").inc()

    def refused(self, status: int) -> None:
        self.requests.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
