"""The OpenAI-compatible API against the real server (Gunicorn subprocess), with the official
`openai` client, streamed and not, and the operational endpoints."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from conftest import image_message, png_bytes, scene, wait_until

pytestmark = pytest.mark.server


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_client_non_streamed(server):
    r = client(server).chat.completions.create(
        model="demo", messages=image_message(png_bytes(scene(seed=21)), "Describe this image."),
        max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > r.usage.completion_tokens
    timings = r.model_extra["timings"]
    for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                "predicted_per_second", "cache_n", "queue_ms", "image_decode_ms", "preprocess_ms",
                "vision_encode_ms", "image_tokens", "vision_cache_hit"):
        assert key in timings


def test_openai_client_streamed_with_usage(server):
    stream = client(server).chat.completions.create(
        model="demo", messages=image_message(png_bytes(scene(seed=22)), "Describe this image."),
        max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and text
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens >= 1
    assert "vision_encode_ms" in usage.model_extra["timings"]
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_and_non_stream_agree_and_second_ask_hits_the_cache(server):
    msgs = image_message(png_bytes(scene(seed=23)), "Describe this image.")
    c = client(server)
    a = c.chat.completions.create(model="demo", messages=msgs, max_tokens=10, temperature=0)
    s = c.chat.completions.create(model="demo", messages=msgs, max_tokens=10, temperature=0, stream=True,
                                  stream_options={"include_usage": True})
    chunks = list(s)
    assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == a.choices[0].message.content
    assert chunks[-1].model_extra["timings"]["vision_cache_hit"] is True


def test_sse_wire_format(server):
    body = {"model": "demo", "messages": image_message(png_bytes(scene(seed=24)), "Describe this image."),
            "max_tokens": 4, "stream": True}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["X-Request-Id"].startswith("chatcmpl-")
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[0].startswith(":")  # a comment first: headers reach the client at once
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    for d in data[:-1]:
        assert json.loads(d)["object"] == "chat.completion.chunk"


def test_models_and_operational_endpoints(server):
    models = requests.get(server.url + "/v1/models").json()
    entry = models["data"][0]
    assert entry["input_modalities"] == ["text", "image", "video"]
    assert requests.get(server.url + "/healthz").json() == {"status": "ok"}
    ready = requests.get(server.url + "/readyz").json()
    assert ready["status"] == "ready"
    stats = requests.get(server.url + "/api/stats").json()
    assert len(stats["cpu"]["per_core"]) >= 1 and stats["rss_bytes"] > 10 * 2**20
    assert {"hits", "misses", "bytes"} <= set(stats["cache"]) and "queue_depth" in stats
    heap = stats["heap"]  # glibc's view of the worker's heap (Linux with glibc, as every test host)
    assert heap["in_use"] > 0 and heap["free"] >= 0 and heap["rss_anon"] >= heap["in_use"] // 2
    metrics = requests.get(server.url + "/metrics").text
    for name in ("vlservice_requests_total", "vlservice_stage_seconds_bucket", "vlservice_tokens_total",
                 "vlservice_queue_depth", "vlservice_vision_cache_total"):
        assert name in metrics
    page = requests.get(server.url + "/")
    assert page.status_code == 200 and "vlservice" in page.text


def test_cpu_history_moves_while_generating(server):
    """The sampler runs at a fixed interval (0.5 s): polled during a generation, it shows new samples
    and a busy CPU."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 512,
            "min_tokens": 512, "result_cache": False}
    done = threading.Event()

    def generate():
        try:
            for _ in range(4):  # about two seconds of model work, whatever the model's speed
                requests.post(server.url + "/v1/chat/completions", json=body, timeout=600)
        finally:
            done.set()  # also when a request failed: the loop below must end

    t0 = time.time()
    threading.Thread(target=generate, daemon=True).start()
    seen = {}
    while not done.is_set():
        for t, total in requests.get(server.url + "/api/stats").json()["cpu"]["history"]:
            seen[t] = total
        done.wait(0.3)  # look again soon, or at once when the generations ended
    during = {t: v for t, v in seen.items() if t > t0}
    assert len(during) >= 2  # new samples arrived while the model worked
    assert max(during.values()) > 20.0  # and they show the model's threads at work


def counters(server) -> dict:
    return requests.get(server.url + "/api/stats", timeout=10).json()["counters"]


def test_cancel_endpoint_and_disconnect_free_the_model(server):
    body = {"model": "demo", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 500, "min_tokens": 500, "stream": True}
    before = counters(server)
    # 1. the cancel endpoint
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        rid = r.headers["X-Request-Id"]
        lines = r.iter_lines(decode_unicode=True)
        for line in lines:
            if line.startswith("data: ") and '"content"' in line and '"content": ""' not in line:
                break
        assert requests.post(f"{server.url}/v1/chat/completions/{rid}/cancel").json()["cancelled"] is True
        rest = [line for line in lines if line.startswith("data: ")]
    assert any('"cancelled"' in line for line in rest) and rest[-1] == "data: [DONE]"
    # 2. a client that goes away
    r = requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=60)
    for line in r.iter_lines(decode_unicode=True):
        if '"content"' in line and '"content": ""' not in line:
            break
    r.close()
    quick = requests.post(server.url + "/v1/chat/completions",
                          json={"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                "result_cache": False}, timeout=120)
    assert quick.status_code == 200 and quick.json()["usage"]["completion_tokens"] >= 1
    # both long requests were cancelled, neither ran its 500 tokens to the end: only `quick` completed
    wait_until(lambda: counters(server)["cancelled"] >= before["cancelled"] + 2, "both long requests cancelled",
               timeout=30)
    after = counters(server)
    assert after["cancelled"] == before["cancelled"] + 2
    assert after["completed"] == before["completed"] + 1
    assert requests.post(f"{server.url}/v1/chat/completions/nope/cancel").status_code == 404


def test_text_only_request_is_answered(server):
    r = client(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=4, extra_body={"min_tokens": 2})
    assert r.usage.completion_tokens >= 2 and r.usage.prompt_tokens > 0
