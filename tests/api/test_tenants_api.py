"""Several API keys, each a tenant, through Gunicorn as users start it (the demo model): a tenant
holds at most its fair share of the places while another is active, cancels only its own
requests, learns nothing of another's from the caches, and sets X-Request-Priority only where the
operator allows it; the stats follow the key."""

from __future__ import annotations

import json
import os
import threading

import pytest
import requests

from conftest import ARTIFACTS, image_message, png_bytes, scene, wait_until

pytestmark = pytest.mark.server

KEYS = {"alice": "sk-alice-" + "a" * 20, "bob": "sk-bob-" + "b" * 20}


@pytest.fixture(scope="module")
def server(cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_API_KEYS": ",".join(f"{name}:{key}" for name, key in KEYS.items()),
           "VL_QUEUE_SIZE": "2", "VL_MAX_BATCH": "1", "VL_MAX_TOKENS_CAP": "8000", "VL_PRIORITY_TENANTS": "alice"}
    with ServerProcess(env, ARTIFACTS / "server-tenants.log") as proc:
        yield proc


def headers(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS[name]}", "Content-Type": "application/json"}


def chat(server, name: str, body: dict, **kw) -> requests.Response:
    return requests.post(server.url + "/v1/chat/completions", headers=headers(name),
                         data=json.dumps({"model": "demo", **body}), timeout=120, **kw)


LONG = {"messages": [{"role": "user", "content": "Tell a very long story."}], "max_tokens": 8000,
        "min_tokens": 8000, "result_cache": False, "stream": True}


class Stream:
    """A long streamed request held open in a thread until cancelled; `id` once its headers came."""

    def __init__(self, server, name: str):
        self.server, self.name = server, name
        self.response = chat(server, name, LONG, stream=True)
        self.id = self.response.headers.get("X-Request-Id")
        self.thread = threading.Thread(target=lambda: [None for _ in self.response.iter_lines()], daemon=True)
        self.thread.start()

    def cancel(self, as_name: str | None = None) -> requests.Response:
        return requests.post(f"{self.server.url}/v1/chat/completions/{self.id}/cancel",
                             headers=headers(as_name or self.name), timeout=10)


def stats(server) -> dict:
    return requests.get(server.url + "/api/stats", headers=headers("alice"), timeout=10).json()


def test_a_tenant_cancels_only_its_own_requests(server):
    s = Stream(server, "alice")
    try:
        assert s.response.status_code == 200
        other = s.cancel("bob")
        assert other.status_code == 404 and other.json()["error"]["param"] == "id"  # not even told it exists
        assert s.cancel().status_code == 200
    finally:
        s.cancel()
        s.thread.join(30)
    wait_until(lambda: not stats(server)["busy"], "the model free again", timeout=30)


def test_a_tenant_holds_its_fair_share_while_another_is_active(server):
    """3 places (VL_QUEUE_SIZE 2 + VL_MAX_BATCH 1). Bob asks first; Alice then gets 2 of the 3
    (her share beside Bob), never the third, and Bob still gets his place beside hers."""
    held = [Stream(server, "bob")]
    try:
        assert held[0].response.status_code == 200
        held += [Stream(server, "alice") for _ in range(2)]
        assert [s.response.status_code for s in held] == [200, 200, 200]
        wait_until(lambda: stats(server)["counters"]["requests"] >= 3, "three requests admitted")
        third = chat(server, "alice", {**LONG, "stream": False})
        assert third.status_code == 429 and "fair share" in third.json()["error"]["message"]
        assert int(third.headers["Retry-After"]) >= 1
    finally:
        for s in held:
            s.cancel()
            s.thread.join(30)
    wait_until(lambda: not stats(server)["busy"], "the model free again", timeout=30)
    alone = [Stream(server, "alice") for _ in range(3)]  # Bob idle, but within his window: still 2 of 3
    try:
        assert [s.response.status_code for s in alone] == [200, 200, 429]
    finally:
        for s in alone:
            if s.id:
                s.cancel()
            s.thread.join(30)
    wait_until(lambda: not stats(server)["busy"], "the model free again", timeout=30)


def test_one_tenant_learns_nothing_of_anothers_requests_from_the_caches(server):
    question = {"messages": image_message(png_bytes(scene(seed=41)), "What is in this picture?"), "max_tokens": 4}
    first = chat(server, "alice", question).json()["timings"]
    again = chat(server, "alice", question).json()["timings"]
    assert first["result_cache_hit"] is False and again["result_cache_hit"] is True
    theirs = chat(server, "bob", question).json()["timings"]
    assert theirs["result_cache_hit"] is False and theirs["vision_cache_hit"] is False
    assert chat(server, "bob", question).json()["timings"]["result_cache_hit"] is True  # bob's own, now


def test_priority_is_honoured_only_for_the_tenants_the_operator_named():
    from vlservice.config import Settings
    from vlservice.http.appstate import AppState

    named = AppState.__new__(AppState)
    named.settings = Settings(api_keys="alice:ka,bob:kb", priority_tenants="alice")
    assert named.priority_allowed("alice") and not named.priority_allowed("bob")
    named.settings = Settings(api_keys="alice:ka", priority_tenants="*")
    assert named.priority_allowed("anyone")
    named.settings = Settings()  # no keys: one tenant, who only reorders its own requests
    assert named.priority_allowed("")
