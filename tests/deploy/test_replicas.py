"""Two real replicas (Gunicorn, the demo model) behind a real nginx running the shipped
deploy/nginx template, sharing a real redis-server: sessions stick to their replica and reuse its
KV cache, images and greedy answers are shared, streams pass unbuffered, Redis may go away and
come back, and a replica that dies hands its sessions to the other.

The replicas share no disk tier (VL_DISK_CACHE_MB=0): Redis is the only path between them. Redis
requires a password, as compose.scale.yaml and deploy/k8s/redis.yaml run it: replica a gets it as
they pass it (VL_REDIS_PASSWORD beside a bare VL_REDIS_URL), replica b inside its VL_REDIS_URL."""

from __future__ import annotations

import json
import os
import re
import signal
import threading

import pytest
import requests

from conftest import ARTIFACTS, image_message, png_bytes, scene, wait_until
from server import ServerProcess
from vlservice.tools.services import NginxProcess, RedisProcess

pytestmark = pytest.mark.server  # real replicas, Redis and nginx: slow tier

QUESTION = "Describe this image."
REDIS_PASSWORD = "s3cret-test-Pa55"  # never to be seen in a log or in /api/stats


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, cache_dir):
    ARTIFACTS.mkdir(exist_ok=True)
    work = tmp_path_factory.mktemp("cluster")
    redis_proc = RedisProcess(work, password=REDIS_PASSWORD).start()
    replicas = {}
    credentials = {"a": {"VL_REDIS_URL": redis_proc.url, "VL_REDIS_PASSWORD": REDIS_PASSWORD},
                   "b": {"VL_REDIS_URL": redis_proc.url_with_password}}
    try:
        for name in ("a", "b"):
            env = {"VL_MODEL": "demo", "VL_CACHE_DIR": str(cache_dir), "VL_DISK_CACHE_MB": "0",
                   **credentials[name], "VL_REPLICA_NAME": name, "VL_QUEUE_SIZE": "4",
                   "VL_GRACEFUL_TIMEOUT": "120"}
            replicas[name] = ServerProcess(env, ARTIFACTS / f"replica-{name}.log").start()
        nginx = NginxProcess(work / "nginx", [f"127.0.0.1:{replicas[n].port}" for n in ("a", "b")]).start()
        yield {"redis": redis_proc, "nginx": nginx, **replicas}
        nginx.stop()
    finally:
        for proc in replicas.values():
            proc.stop()
        redis_proc.stop()


@pytest.fixture(scope="module")
def sessions(cluster):
    """Session ids by the replica nginx hashes them onto (found by asking), at least two each."""
    found: dict[str, list[str]] = {"a": [], "b": []}
    for i in range(40):
        r = post(cluster["nginx"].url, [{"role": "user", "content": "Hi"}], session=f"probe-{i}", max_tokens=1)
        assert r.status_code == 200, r.text
        assert r.headers["X-Session-Id"] == f"probe-{i}"
        found[r.headers["X-Served-By"]].append(f"probe-{i}")
    assert len(found["a"]) >= 2 and len(found["b"]) >= 2, f"sessions did not spread over both replicas: {found}"
    return found


def post(url: str, messages: list, session: str | None = None, stream: bool = False, **body):
    headers = {"X-Session-Id": session} if session else {}
    payload = {"messages": messages, "max_tokens": 6, "temperature": 0, "stream": stream, **body}
    return requests.post(url + "/v1/chat/completions", json=payload, headers=headers, stream=stream, timeout=120)


def photo(seed: int) -> bytes:
    return png_bytes(scene(seed=seed))


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_a_session_stays_on_its_replica_and_reuses_its_kv(cluster, sessions):
    nginx = cluster["nginx"].url
    for replica, ids in sessions.items():
        session = ids[0]
        history = image_message(photo(201 if replica == "a" else 202), QUESTION)
        for question in ("What colour is it?", "And the shape?", "How many?"):
            r = post(nginx, history, session=session, result_cache=False)
            assert r.status_code == 200, r.text
            assert (r.headers["X-Served-By"], r.headers["X-Session-Id"]) == (replica, session)
            answer = r.json()
            if len(history) > 1:  # a follow-up: the conversation's KV cache is on this replica
                assert answer["timings"]["cache_n"] > 0
            history = history + [{"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": question}]


def test_the_user_field_is_the_session_key_without_the_header(cluster):
    r = post(cluster["nginx"].url, [{"role": "user", "content": "Hi"}], user="alice", max_tokens=1)
    assert r.status_code == 200 and r.headers["X-Session-Id"] == "alice"
    assert r.headers["X-Served-By"] in ("a", "b")
    bad = post(cluster["nginx"].url, [{"role": "user", "content": "Hi"}], session="no spaces, please")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Session-Id"


def test_an_image_and_an_answer_from_one_replica_are_reused_by_the_other(cluster, sessions):
    nginx = cluster["nginx"].url
    on_a, on_b = sessions["a"][1], sessions["b"][1]
    first = post(nginx, image_message(photo(203), QUESTION), session=on_a)
    assert first.headers["X-Served-By"] == "a" and first.json()["timings"]["vision_cache_hit"] is False
    other_question = post(nginx, image_message(photo(203), "What is in it?"), session=on_b, result_cache=False)
    assert other_question.headers["X-Served-By"] == "b"
    assert other_question.json()["timings"]["vision_cache_hit"] is True  # encoded on A, read from Redis
    same = post(nginx, image_message(photo(203), QUESTION), session=on_b)
    assert same.headers["X-Served-By"] == "b"
    assert same.json()["timings"]["result_cache_hit"] is True
    assert same.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]


def test_redis_is_reached_with_its_password_which_is_never_shown(cluster, sessions):
    for name in ("a", "b"):
        stats = requests.get(cluster[name].url + "/api/stats", timeout=10).json()["shared_cache"]
        assert stats["up"] is True and stats["writes"] + stats["hits"] > 0, stats
        assert REDIS_PASSWORD not in json.dumps(stats) and str(cluster["redis"].port) in stats["url"]
        assert REDIS_PASSWORD not in requests.get(cluster[name].url + "/metrics", timeout=10).text
        assert REDIS_PASSWORD not in cluster[name].log_text()


def test_a_stream_passes_through_unbuffered(cluster, sessions):
    nginx, session = cluster["nginx"].url, sessions["a"][0]
    r = post(nginx, [{"role": "user", "content": "Tell a long story."}], session=session, stream=True,
             max_tokens=1024, min_tokens=1024, result_cache=False)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["X-Served-By"] == "a"
    events = r.iter_lines(decode_unicode=True)
    deltas, request_id = 0, None
    for line in events:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            request_id = chunk["id"]
            deltas += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
            if deltas >= 3:
                break
    # The first tokens reached us while the generation still runs (a buffering proxy would hold
    # them until the 1024th): it can still be cancelled, through nginx, on the same replica.
    cancel = requests.post(f"{nginx}/v1/chat/completions/{request_id}/cancel", json={},
                           headers={"X-Session-Id": session}, timeout=10)
    assert cancel.status_code == 200, cancel.text
    assert cancel.headers["X-Served-By"] == "a"
    rest = [line for line in events if line]
    assert rest[-1] == "data: [DONE]" and any('"code": "cancelled"' in line for line in rest)


def test_redis_stopped_mid_run_then_back(cluster, sessions):
    nginx, redis_proc = cluster["nginx"].url, cluster["redis"]
    urls = {n: cluster[n].url for n in ("a", "b")}
    before = {n: metric(u, "vlservice_redis_fallbacks_total") for n, u in urls.items()}
    redis_proc.stop()
    for i, replica in enumerate(("a", "b", "a", "b")):
        r = post(nginx, image_message(photo(210 + i), QUESTION), session=sessions[replica][0])
        assert r.status_code == 200, r.text  # every request answers
        assert r.headers["X-Served-By"] == replica
    for n, u in urls.items():
        assert metric(u, "vlservice_redis_fallbacks_total") > before[n]
        assert metric(u, "vlservice_redis_up") == 0

    redis_proc.start()  # same port, empty
    seeds = iter(range(400, 10_000))

    def redis_up_again(replica):  # once the back-off has passed, a new image's lookups reach Redis again
        def check():
            if metric(urls[replica], "vlservice_redis_up") != 0:
                return True
            post(nginx, image_message(photo(next(seeds)), QUESTION), session=sessions[replica][0], max_tokens=1)
            return False

        wait_until(check, f"replica {replica} using Redis again", timeout=20, interval=0.3)

    redis_up_again("a")
    post(nginx, image_message(photo(220), QUESTION), session=sessions["a"][0])
    redis_up_again("b")
    hit = post(nginx, image_message(photo(220), "What is in it?"), session=sessions["b"][0], result_cache=False)
    assert hit.headers["X-Served-By"] == "b" and hit.json()["timings"]["vision_cache_hit"] is True


def test_sigterm_drains_a_replica_without_cutting_its_stream(cluster, sessions):
    nginx, a, session = cluster["nginx"].url, cluster["a"], sessions["a"][0]
    r = post(nginx, [{"role": "user", "content": "Tell a long story."}], session=session, stream=True,
             max_tokens=1024, min_tokens=1024, result_cache=False)
    assert r.headers["X-Served-By"] == "a"
    events = r.iter_lines(decode_unicode=True)
    for line in events:
        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
            break  # the answer is streaming
    os.kill(a.proc.pid, signal.SIGTERM)  # Gunicorn's master passes it to the worker, as `docker stop` does
    wait_until(lambda: requests.get(a.url + "/readyz", timeout=5).status_code != 200, "replica a draining",
               timeout=20)
    ready = requests.get(a.url + "/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    refused = post(a.url, [{"role": "user", "content": "Hi"}], max_tokens=1)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert refused.headers["Retry-After"] == "1"
    moved = post(nginx, [{"role": "user", "content": "Hi"}], session=session, max_tokens=1)
    assert moved.status_code == 200 and moved.headers["X-Served-By"] == "b"  # nginx passed the 503 on
    rest = [line for line in events if line]
    assert rest[-1] == "data: [DONE]"
    final = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in final if c["choices"]][-1] == "length"  # whole
    assert a.proc.wait(60) == 0  # then the replica stops by itself

    a.start()  # back on its port; nginx tries it again once its 10 s of failure have passed
    wait_until(lambda: post(nginx, [{"role": "user", "content": "Hi"}], session=session, max_tokens=1)
               .headers["X-Served-By"] == "a", "nginx sending replica a's session to it again", timeout=30,
               interval=0.5)


def test_a_killed_replica_hands_its_sessions_to_the_other(cluster, sessions):
    """Last: it kills replica a (and then b)."""
    nginx = cluster["nginx"].url
    in_flight: dict = {}

    def long_request():  # running on A when it dies: retried on B by nginx, or a clean error
        r = post(nginx, [{"role": "user", "content": "Tell a long story."}], session=sessions["a"][0],
                 max_tokens=1024, min_tokens=1024, result_cache=False)
        in_flight["status"], in_flight["body"] = r.status_code, r.text

    t = threading.Thread(target=long_request)
    t.start()
    wait_until(lambda: metric(cluster["a"].url, "vlservice_requests_in_flight") >= 1, "the long request on a",
               timeout=30)
    os.killpg(cluster["a"].proc.pid, signal.SIGKILL)
    cluster["a"].proc.wait(10)
    t.join(120)
    assert in_flight["status"] == 200 or "error" in json.loads(in_flight["body"]), in_flight

    for session in sessions["a"] + sessions["b"]:  # a's sessions move to b, b's stay: none is lost
        r = post(nginx, image_message(photo(230), QUESTION), session=session)
        assert r.status_code == 200, r.text
        assert r.headers["X-Served-By"] == "b"

    cluster["b"].stop()  # no replica left: the OpenAI error shape, not nginx's HTML page
    r = post(nginx, [{"role": "user", "content": "Hi"}], session=sessions["b"][0])
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert r.json()["error"]["code"] == "no_replica"
