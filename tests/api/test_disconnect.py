"""A client that goes away frees the model, streamed or not: its generation is cancelled (counted
as cancelled, not completed), the model lock is released and the next request is served. Against
the real server (Gunicorn gthread workers, where nothing is written to a non-streamed client until
its answer is whole, so only watching the socket can notice it left)."""

from __future__ import annotations

import http.client
import json
import os

import pytest
import requests

from conftest import ARTIFACTS, wait_until

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
LONG = {"model": "demo", "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": 8000, "min_tokens": 8000, "result_cache": False}


@pytest.fixture(scope="module")
def srv(cache_dir):
    """Room for generations far longer than the test waits (8000 tokens)."""
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_MAX_TOKENS_CAP": "8000"}
    proc = ServerProcess(env, ARTIFACTS / "server-disconnect.log").start()
    try:
        yield proc
    finally:
        proc.stop()


def stats(srv) -> dict:
    return requests.get(srv.url + "/api/stats", timeout=10).json()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_client_that_goes_away_frees_the_model(srv, stream):
    before = stats(srv)["counters"]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", CHAT, json.dumps({**LONG, "stream": stream}), {"Content-Type": "application/json"})
    response = conn.getresponse() if stream else None  # a stream's headers come at once; JSON's never
    wait_until(lambda: stats(srv)["busy"], "the model working on the request")
    if response is not None:
        response.close()
    conn.close()  # the client goes away

    def cancelled_and_free():
        s = stats(srv)
        return s["counters"] if not s["busy"] and s["counters"]["cancelled"] > before["cancelled"] else None

    after = wait_until(cancelled_and_free, "the generation cancelled and the model free")
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]  # stopped, not run to its end for nobody
    quick = requests.post(srv.url + CHAT, json={"model": "demo", "messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 2}, timeout=30)
    assert quick.status_code == 200


def test_a_client_that_stays_gets_its_whole_answer(srv):
    """The watcher never mistakes a waiting client for a gone one (a long JSON answer arrives)."""
    r = requests.post(srv.url + CHAT, json={**LONG, "max_tokens": 300, "min_tokens": 300}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 300
