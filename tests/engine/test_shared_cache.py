"""The caches' shared tier against a real redis-server: two services on the tiny model stand for
two replicas (each its own memory caches, one Redis). What one encoded or answered, the other
reuses; Redis going away costs requests nothing but the sharing, and coming back restores it; a
corrupt entry is ignored and counted."""

from __future__ import annotations

import json
import logging

import pytest

from vlservice.engine.caches import shared
from vlservice.engine.service import load_service
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

from conftest import png_bytes, scene, wait_until
from vlservice.tools.services import RedisProcess


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory):
    with RedisProcess(tmp_path_factory.mktemp("redis")) as proc:
        yield proc


@pytest.fixture(scope="module")
def replicas(settings_for, redis_proc):
    """Two services sharing one Redis and nothing else (no disk tier: it would be a second path)."""
    made = [load_service(settings_for(redis_url=redis_proc.url, disk_cache_mb=0)) for _ in range(2)]
    yield made
    for svc in made:
        svc.close()


def ask(svc, seed: int, question: str = "Describe this image.", **kw) -> dict:
    request = ChatRequest([Message("user", [ImageInput(png_bytes(scene(seed=seed))), question])],
                          Sampling(max_tokens=6), **kw)
    return svc.chat(request)


def test_an_image_encoded_by_one_replica_is_a_hit_on_the_other(replicas):
    a, b = replicas
    first = ask(a, seed=101)
    assert first["timings"]["vision_cache_hit"] is False
    calls = b.encoder_calls
    theirs = ask(b, seed=101, question="What colour is it?", result_cache=False)
    assert theirs["timings"]["vision_cache_hit"] is True
    assert b.encoder_calls == calls  # B never ran its encoder for it
    assert b.cache.stats()["shared_hits"] == 1
    # the features B read are A's, bit for bit: A answers the same question the same way
    assert ask(a, seed=101, question="What colour is it?", result_cache=False)["text"] == theirs["text"]


def test_a_greedy_answer_is_shared(replicas):
    a, b = replicas
    mine = ask(a, seed=102)
    assert mine["timings"]["result_cache_hit"] is False
    theirs = ask(b, seed=102)
    assert theirs["timings"]["result_cache_hit"] is True
    assert (theirs["text"], theirs["usage"]) == (mine["text"], mine["usage"])
    assert b.results.stats()["shared_hits"] == 1


def test_redis_down_means_local_caches_and_back_means_shared_again(replicas, redis_proc, caplog):
    a, b = replicas
    before = a.shared.stats()
    redis_proc.stop()
    with caplog.at_level(logging.WARNING, logger=shared.__name__):
        answers = [ask(a, seed=seed) for seed in (103, 104, 103)]  # every request answers
    assert all(r["text"] is not None and r["usage"]["completion_tokens"] >= 1 for r in answers)
    assert answers[2]["timings"]["result_cache_hit"] is True  # the local tiers still work
    during = a.shared.stats()
    assert during["up"] is False
    assert during["outages"] == before["outages"] + 1
    assert during["fallbacks"] > before["fallbacks"]
    assert sum("unusable" in r.getMessage() for r in caplog.records) == 1  # logged once per outage

    redis_proc.start()  # same port, empty (no persistence)
    seeds = iter(range(301, 10_000))

    def back_up():
        ask(a, seed=next(seeds))  # a new image: past the back-off, its lookups reach Redis again
        return a.shared.stats()["up"]

    # asked again every quarter of the back-off until one of them reaches Redis
    wait_until(back_up, "the shared cache back up after Redis restarted", timeout=5 * shared.RETRY_S + 10,
               interval=shared.RETRY_S / 4)
    assert a.shared.stats()["up"] is True
    ask(a, seed=106)
    assert ask(b, seed=106, question="And the shape?", result_cache=False)["timings"]["vision_cache_hit"] is True


def test_corrupt_entries_are_ignored_and_counted(replicas, redis_proc):
    a, b = replicas
    client = redis_proc.client()
    client.flushdb()
    ask(a, seed=107)  # one feature entry and one result entry in Redis
    keys = {kind: client.keys(f"*:{kind}:*") for kind in ("features", "results")}
    assert [len(keys["features"]), len(keys["results"])] == [1, 1]
    for k in keys["features"]:
        client.set(k, client.get(k)[:-7])  # truncated
    for k in keys["results"]:
        client.set(k, b'{"text": 3}')  # JSON, but not an answer
    corrupt = b.shared.stats()["corrupt"]
    calls = b.encoder_calls
    again = ask(b, seed=107)
    assert again["timings"]["result_cache_hit"] is False and again["timings"]["vision_cache_hit"] is False
    assert b.encoder_calls == calls + 1
    assert b.shared.stats()["corrupt"] == corrupt + 2
    # written anew by B: the next replica finds them whole
    assert shared.unpack_features(client.get(keys["features"][0])).embeds.size
    assert json.loads(client.get(keys["results"][0]))["text"] == again["text"]
