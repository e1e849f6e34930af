"""Two Gunicorn workers (`VL_WORKERS=2`) behind one port: both are Gunicorn's own children, both
take requests, and concurrent chat requests are all answered whole. `/api/stats` names the worker
(`pid`) whose service, queue and counters it reports."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests

from conftest import ARTIFACTS, wait_until

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def two(cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir)}
    with ServerProcess(env, ARTIFACTS / "server-two-workers.log", workers=2) as proc:
        yield proc


def stats(srv) -> dict:
    with requests.Session() as s:  # a connection of its own: any worker may take it
        return s.get(srv.url + "/api/stats", timeout=30).json()


def stats_by_worker(srv, want: int = 2, wait_s: float = 120) -> dict[int, dict]:
    """/api/stats of each worker, asked on new connections until `want` workers answered ready.
    The server counts as started when one worker answers /readyz; the other may still be warming
    up, so a worker's latest answer replaces its earlier one until every worker is ready."""
    seen: dict[int, dict] = {}
    with ThreadPoolExecutor(8) as pool:
        def all_ready():
            for st in pool.map(lambda _: stats(srv), range(8)):
                seen[st["pid"]] = st
            return len(seen) >= want and all(st["ready"] for st in seen.values())

        wait_until(all_ready, f"{want} workers answering ready", timeout=wait_s)
    return seen


def test_both_workers_serve_and_are_gunicorns_children(two):
    workers = {c.pid for c in psutil.Process(two.proc.pid).children()}
    assert len(workers) == 2
    seen = stats_by_worker(two)
    assert set(seen) == workers  # both answered, and nothing else did
    assert all(st["ready"] for st in seen.values())


def test_concurrent_requests_are_all_answered(two):
    before = {pid: st["counters"]["completed"] for pid, st in stats_by_worker(two).items()}

    def ask(i):
        body = {"model": "demo", "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
                "max_tokens": 24, "min_tokens": 24, "result_cache": False}
        return requests.post(two.url + CHAT, json=body, timeout=300)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(ask, range(6)))
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    assert all(a.json()["usage"]["completion_tokens"] == 24 for a in answers)
    after = {pid: st["counters"]["completed"] for pid, st in stats_by_worker(two).items()}
    assert set(after) == set(before)  # the same two workers: none died and was replaced
    assert sum(after.values()) - sum(before.values()) == 6  # each answer counted once, by its worker
