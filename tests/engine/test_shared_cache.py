"""The caches' shared tier against a real redis-server: two services on the tiny model stand for
two replicas (each its own memory caches, one Redis). What one encoded or answered, the other
reuses; Redis going away costs requests nothing but the sharing, and coming back restores it; a
corrupt entry is ignored and counted. Redis requires a password, as the shipped configs run it: a
wrong or missing one costs what an unreachable Redis costs, and is never shown."""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

import numpy as np
import pytest

from vlservice.engine.caches import FeatureCache, shared
from vlservice.engine.service import load_service
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

from conftest import png_bytes, scene, wait_until
from vlservice.tools.services import RedisProcess


PASSWORD = "pa55-Wörd:@/x"  # URL-unsafe on purpose: VL_REDIS_PASSWORD needs no quoting


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory):
    with RedisProcess(tmp_path_factory.mktemp("redis"), password=PASSWORD) as proc:
        yield proc


@pytest.fixture(scope="module")
def replicas(settings_for, redis_proc):
    """Two services sharing one Redis and nothing else (no disk tier: it would be a second path)."""
    made = [load_service(settings_for(redis_url=redis_proc.url, redis_password=PASSWORD, disk_cache_mb=0))
            for _ in range(2)]
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


@pytest.mark.slow  # over 10 s: out of the --fast tier
def test_a_wrong_password_is_an_outage_not_an_error(settings_for, redis_proc, replicas, caplog):
    """The request is answered from the local tiers, the failure counted and logged once (naming
    the refusal, never a password), exactly as when Redis cannot be reached."""
    password = "wrong"
    svc = load_service(settings_for(redis_url=redis_proc.url, redis_password=password, disk_cache_mb=0))
    try:
        with caplog.at_level(logging.WARNING, logger=shared.__name__):
            answers = [ask(svc, seed=seed) for seed in (108, 109, 108)]
        assert all(r["usage"]["completion_tokens"] >= 1 for r in answers)
        assert answers[2]["timings"]["result_cache_hit"] is True  # the local tiers still work
        stats = svc.shared.stats()
        assert stats["up"] is False and stats["outages"] == 1 and stats["fallbacks"] >= 1
        assert stats["hits"] == stats["writes"] == 0
        warnings = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
        assert len(warnings) == 1 and "Authentication" in warnings[0], warnings
        assert not any(p in r.getMessage() for r in caplog.records for p in (PASSWORD, password))
    finally:
        svc.close()


def test_a_missing_password_is_an_outage_too(redis_proc, caplog):
    store = shared.SharedStore(redis_proc.url, "t", 2.0, 60)
    with caplog.at_level(logging.WARNING, logger=shared.__name__):
        assert store.get("features", "k") is None
        store.put("features", "k", b"v")  # within the back-off: not even tried
    stats = store.stats()
    assert stats["up"] is False and stats["outages"] == 1 and stats["fallbacks"] == 2 and stats["writes"] == 0
    assert sum("unusable" in r.getMessage() and "Authentication" in r.getMessage() for r in caplog.records) == 1
    cache = FeatureCache(1 << 20, shared=store)  # the feature cache over it: a plain miss
    assert cache.get("k") is None and cache.stats()["misses"] == 1


def test_a_password_in_the_url_works_and_is_never_shown(redis_proc, caplog):
    store = shared.SharedStore(redis_proc.url_with_password.replace(PASSWORD, quote(PASSWORD, safe="")), "t",
                               2.0, 60)
    store.put("results", "k", b"v")
    assert store.get("results", "k") == b"v" and store.stats()["up"] is True
    assert PASSWORD not in store.url_shown and quote(PASSWORD, safe="") not in store.url_shown
    assert store.url_shown == f"redis://***@127.0.0.1:{redis_proc.port}/0"
    wrong = shared.SharedStore(f"redis://:nope@127.0.0.1:{redis_proc.port}/0", "t", 2.0, 60)
    with caplog.at_level(logging.WARNING, logger=shared.__name__):
        assert wrong.get("results", "k") is None
    assert wrong.stats()["outages"] == 1 and "nope" not in caplog.text and "nope" not in json.dumps(wrong.stats())


@pytest.mark.parametrize("url, shown", [
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis://:pw@h:6379/0", "redis://***@h:6379/0"),
    ("rediss://user:p@ss@h/1", "rediss://***@h/1"),
    ("redis://[::1]:6380/0?password=pw", "redis://[::1]:6380/0?***"),
    ("redis://:pw@h:notaport/0", "redis://***"),
])
def test_urls_are_shown_without_credentials(url, shown):
    assert shared.redact_url(url) == shown


def forge(feats, how: str):
    """A planted feature entry: packed with a valid checksum, but not what the image's grid implies."""
    from vlservice.engine.model.vision import VisionFeatures

    if how == "tokens":  # another image's features: fewer rows
        return VisionFeatures(feats.embeds[:-4].copy(), [d[:-4].copy() for d in feats.deepstack])
    if how == "nan":
        bad = feats.embeds.copy()
        bad[0, 0] = np.nan
        return VisionFeatures(bad, feats.deepstack)
    if how == "layers":
        return VisionFeatures(feats.embeds, feats.deepstack[:-1])
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["tokens", "nan", "layers"])
def test_a_forged_feature_entry_in_redis_is_a_miss_and_is_replaced(replicas, redis_proc, how):
    """Whoever can write Redis can plant an entry that decodes: it is checked against the image's
    grid and the model's widths, and one that does not fit is recomputed, never used."""
    a, b = replicas
    client = redis_proc.client()
    client.flushdb()
    seed = {"tokens": 111, "nan": 112, "layers": 113}[how]
    mine = ask(a, seed=seed, result_cache=False)
    (key,) = client.keys("*:features:*")
    good = shared.unpack_features(client.get(key))
    client.set(key, shared.pack_features(forge(good, how)))
    mismatched, corrupt, calls = b.cache.stats()["mismatched"], b.shared.stats()["corrupt"], b.encoder_calls
    theirs = ask(b, seed=seed, result_cache=False)
    assert theirs["timings"]["vision_cache_hit"] is False and b.encoder_calls == calls + 1
    assert b.cache.stats()["mismatched"] == mismatched + 1 and b.shared.stats()["corrupt"] == corrupt + 1
    assert theirs["text"] == mine["text"]  # B's own features, not the planted ones
    rewritten = shared.unpack_features(client.get(key))  # written anew by B: whole again
    assert rewritten.embeds.shape == good.embeds.shape and np.array_equal(rewritten.embeds, good.embeds)


def test_a_forged_feature_entry_on_disk_is_a_miss_and_is_replaced(service_for):
    """The disk tier of a running service: an entry planted under an image's key before it is
    asked about is refused, and the encoder's features replace it."""
    from vlservice.engine.caches import FeatureCache
    from vlservice.engine.model.vision import VisionFeatures

    svc = service_for("onnx-int8")
    assert svc.cache.disk_dir is not None
    image = ImageInput(png_bytes(scene(seed=114)))
    (prepared,), (key,), _ = svc.media.prepare([image], svc.model_fp, svc.encoder.name)
    expect = svc.feature_shape(prepared)
    planted = np.ones((expect.tokens + 8, expect.hidden), np.float32)
    FeatureCache(0, svc.cache.disk_dir, 1 << 30).put(key, VisionFeatures(planted, [planted] * expect.layers))
    mismatched, calls = svc.cache.stats()["mismatched"], svc.encoder_calls
    answer = svc.chat(ChatRequest([Message("user", [image, "Describe this image."])], Sampling(max_tokens=6)))
    assert answer["timings"]["vision_cache_hit"] is False and svc.encoder_calls == calls + 1
    assert svc.cache.stats()["mismatched"] == mismatched + 1
    again = FeatureCache(0, svc.cache.disk_dir, 1 << 30).get(key, expect)  # the encoder's, on disk now
    assert again is not None and expect.mismatch(again) is None
