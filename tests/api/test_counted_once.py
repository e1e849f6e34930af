"""Every chat request is counted once in /metrics (`vlservice_requests_total{status}`), by the
status its answer ends with, and leaves `vlservice_requests_in_flight` at 0: answered (JSON or
SSE), refused before or inside the route (bad JSON, invalid, no key, too large, busy) or cancelled.
The cancel and models endpoints are not chat requests. Against the real server (Gunicorn)."""

from __future__ import annotations

import os

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import ARTIFACTS, wait_until

pytestmark = pytest.mark.server

KEY = "counted-once-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
HI = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
LONG = {"model": "demo", "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 8000,
        "min_tokens": 8000, "result_cache": False, "stream": True}
MAX_BODY = 100_000


@pytest.fixture(scope="module")
def srv(cache_dir):
    """One request at a time and no room to wait (a second request while one runs is refused), an
    API key and a small body limit: every kind of refusal is one request away."""
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_MAX_BATCH": "1", "VL_QUEUE_SIZE": "0", "VL_API_KEY": KEY, "VL_MAX_REQUEST_BYTES": str(MAX_BODY),
           "VL_MAX_TOKENS_CAP": "8000"}
    proc = ServerProcess(env, ARTIFACTS / "server-counted-once.log").start()
    try:
        yield proc
    finally:
        proc.stop()


def counts(srv) -> tuple[dict, float]:
    """(requests by status, requests in flight) from /metrics."""
    by_status, in_flight = {}, None
    metrics = requests.get(srv.url + "/metrics", headers=AUTH, timeout=10)  # the metrics follow the key
    for family in text_string_to_metric_families(metrics.text):
        for sample in family.samples:
            if sample.name == "vlservice_requests_total":
                by_status[sample.labels["status"]] = sample.value
            elif sample.name == "vlservice_requests_in_flight":
                in_flight = sample.value
    return by_status, in_flight


def delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0) - before.get(k, 0) for k in {*before, *after} if after.get(k, 0) != before.get(k, 0)}


CASES = [  # (name, method, path, request kwargs, status answered, counted)
    ("answered", "POST", CHAT, {"json": HI}, 200, {"200": 1}),
    ("streamed", "POST", CHAT, {"json": {**HI, "stream": True}}, 200, {"200": 1}),
    ("bad_json", "POST", CHAT, {"data": "{", "headers": {**AUTH, "Content-Type": "application/json"}}, 400,
     {"400": 1}),
    ("invalid", "POST", CHAT, {"json": {**HI, "max_tokens": 0}}, 400, {"400": 1}),
    ("no_key", "POST", CHAT, {"json": HI, "headers": {}}, 401, {"401": 1}),
    ("too_large", "POST", CHAT, {"json": {**HI, "user": "x" * MAX_BODY}}, 413, {"413": 1}),
    ("cancel_unknown", "POST", CHAT + "/chatcmpl-nope/cancel", {}, 404, {}),
    ("models", "GET", "/v1/models", {}, 200, {}),
    ("wrong_method", "GET", CHAT, {}, 405, {}),
]


@pytest.mark.parametrize("name,method,path,kwargs,status,counted", CASES, ids=[c[0] for c in CASES])
def test_each_answer_is_counted_once(srv, name, method, path, kwargs, status, counted):
    before, _ = counts(srv)
    kwargs = {"headers": AUTH, **kwargs}
    r = requests.request(method, srv.url + path, timeout=60, **kwargs)
    assert r.status_code == status, r.text
    if name == "streamed":
        assert r.text.rstrip().endswith("data: [DONE]")
    after, in_flight = counts(srv)  # counted before the answer reached the client
    assert delta(before, after) == counted
    assert in_flight == 0


def first_text(lines) -> None:
    """Read a stream until its first generated text: the model is working on it."""
    for line in lines:
        if line.startswith("data: ") and '"content"' in line and '"content": ""' not in line:
            return
    raise AssertionError("the stream ended without text")


def settled(srv) -> dict:
    """The counts once the requests of earlier tests have all been answered (in flight 0)."""
    def idle():
        by_status, in_flight = counts(srv)
        return (by_status,) if in_flight == 0 else None  # a tuple: an empty count is still an answer

    return wait_until(idle, "the requests of earlier tests answered (in flight 0)", timeout=15)[0]


def test_busy_and_a_stream_whose_client_left_are_counted_once(srv):
    before = settled(srv)
    with requests.post(srv.url + CHAT, json=LONG, headers=AUTH, stream=True, timeout=60) as r:
        # keep the line iterator: once collected, urllib3 closes the connection under it (the
        # client would leave early, and the garbage collector decides when)
        lines = r.iter_lines(decode_unicode=True)
        first_text(lines)
        busy = requests.post(srv.url + CHAT, json=HI, headers=AUTH, timeout=30)
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "server_busy"
        assert delta(before, counts(srv)[0]) == {"429": 1}
    # the connection is closed with the stream unread: the generation is cancelled and counted
    wait_until(lambda: delta(before, counts(srv)[0]) == {"429": 1, "499": 1}, "the stream counted as 499")
    assert counts(srv)[1] == 0
    wait_until(lambda: requests.get(srv.url + "/api/stats", headers=AUTH, timeout=10).json()["busy"] is False,
               "the model free")


def test_a_stream_cancelled_through_the_api_is_counted_once(srv):
    before, _ = counts(srv)
    with requests.post(srv.url + CHAT, json=LONG, headers=AUTH, stream=True, timeout=60) as r:
        lines = r.iter_lines(decode_unicode=True)
        first_text(lines)
        cancel = requests.post(f"{srv.url}{CHAT}/{r.headers['X-Request-Id']}/cancel", headers=AUTH, timeout=10)
        assert cancel.status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    assert '"cancelled"' in rest[-2] and rest[-1] == "data: [DONE]"
    assert delta(before, counts(srv)[0]) == {"499": 1}  # the cancel call itself is no chat request
    assert counts(srv)[1] == 0
