"""The shared tier's deadline is per call, not per socket operation, against a real redis-server:
a Redis that answers slowly (a value trickling in, each piece well within redis-py's
socket_timeout) or that is paused (SIGSTOP) in the middle of a request costs that request at most
`VL_REDIS_TIMEOUT_S` per call; the call is a miss and the request is served."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from conftest import png_bytes, scene
from vlservice.engine.caches.shared import SharedStore
from vlservice.engine.service import load_service
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling
from vlservice.tools.services import RedisProcess

TIMEOUT_S = 0.25  # VL_REDIS_TIMEOUT_S' default
SLACK_S = 0.25  # thread hand-over and a busy shared machine


@pytest.fixture
def redis_proc(tmp_path):
    with RedisProcess(tmp_path) as proc:
        yield proc
        if proc.proc and proc.proc.poll() is None:
            os.kill(proc.proc.pid, signal.SIGCONT)  # a test that failed while it was paused


class TrickleProxy:
    """A TCP proxy in front of Redis that passes requests at once and answers in 1 KB pieces,
    one every 50 ms: every recv of the client gets bytes long before a 0.25 s socket_timeout."""

    def __init__(self, port: int):
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, 1024), daemon=True).start()

    def _pipe(self, src, dst, piece):
        try:
            while not self.stop.is_set():
                data = src.recv(piece or 65536)
                if not data:
                    return
                dst.sendall(data)
                if piece:
                    self.stop.wait(0.05)  # the slowness being simulated, not a synchronisation
        except OSError:
            return

    def close(self):
        self.stop.set()
        self.listener.close()


def test_a_slow_answer_is_cut_at_the_deadline_for_the_whole_call(redis_proc):
    value = os.urandom(200_000)  # 196 pieces: about 10 s at the proxy's pace
    direct = SharedStore(redis_proc.url, "t", TIMEOUT_S, 60)
    direct.put("features", "k", value)
    assert direct.get("features", "k") == value  # Redis itself is fine

    proxy = TrickleProxy(redis_proc.port)
    try:
        slow = SharedStore(f"redis://127.0.0.1:{proxy.port}/0", "t", TIMEOUT_S, 60)
        assert slow._call(lambda: slow._redis.ping())  # connected, small answers arrive in time
        t0 = time.monotonic()
        got = slow.get("features", "k")
        took = time.monotonic() - t0
    finally:
        proxy.close()
    assert got is None  # a miss, not an error
    assert took < TIMEOUT_S + SLACK_S, f"a trickling answer held the call {took:.2f} s"
    stats = slow.stats()
    assert stats["fallbacks"] == 1 and stats["outages"] == 1 and stats["up"] is False


@pytest.fixture
def service(settings_for, redis_proc):
    svc = load_service(settings_for(redis_url=redis_proc.url, disk_cache_mb=0))
    yield svc
    svc.close()


def test_redis_paused_mid_request_costs_at_most_the_deadline_and_the_request_is_served(service, redis_proc):
    store = service.shared
    assert store is not None and store.timeout_s == TIMEOUT_S
    durations: list[float] = []
    real_call = store._call
    paused = threading.Event()

    def call(op):
        if not paused.is_set():  # the request's first Redis call: Redis stops right now
            os.kill(redis_proc.proc.pid, signal.SIGSTOP)
            paused.set()
        t0 = time.monotonic()
        try:
            return real_call(op)
        finally:
            durations.append(time.monotonic() - t0)

    store._call = call
    request = ChatRequest([Message("user", [ImageInput(png_bytes(scene(seed=301))), "Describe this image."])],
                          Sampling(max_tokens=6))
    try:
        answer = service.chat(request)
    finally:
        os.kill(redis_proc.proc.pid, signal.SIGCONT)
    assert paused.is_set() and durations, "the request never reached Redis"
    assert answer["text"] and answer["usage"]["completion_tokens"] > 0  # served from the local tiers
    assert max(durations) < TIMEOUT_S + SLACK_S, f"Redis calls took {[round(d, 2) for d in durations]} s"
    stats = store.stats()
    assert stats["fallbacks"] >= 1 and stats["outages"] == 1

    # back: the next call after the retry window is answered by Redis again
    store._down_until = 0.0
    assert store._call(lambda: store._redis.ping()) is True
    assert store.stats()["up"] is True
