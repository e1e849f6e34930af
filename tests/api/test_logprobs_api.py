"""`logprobs` / `top_logprobs` through the real server (Gunicorn subprocess, the bundled demo
model) with the official `openai` client: OpenAI's shape, streamed and not, the same entries
either way under greedy decoding, and the bounds."""

from __future__ import annotations

import math

import pytest
import requests

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_logprobs_streamed_and_not_agree_and_are_consistent(server):
    msgs = image_message(png_bytes(scene(seed=41)), "Describe this image.")
    c = client(server)
    a = c.chat.completions.create(model="demo", messages=msgs, max_tokens=12, temperature=0, logprobs=True,
                                  top_logprobs=4)
    content = a.choices[0].logprobs.content
    assert len(content) == a.usage.completion_tokens >= 1
    for e in content:
        assert len(e.top_logprobs) == 4
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) <= 1 + 1e-5
        assert e.logprob == pytest.approx(values[0], abs=1e-6) and e.token == e.top_logprobs[0].token  # greedy
        assert e.logprob <= 0 and e.bytes == list(e.token.encode()) or "\ufffd" in e.token
    joined = bytes(b for e in content for b in e.bytes).decode("utf-8", errors="replace")
    assert joined.startswith(a.choices[0].message.content)

    chunks = list(c.chat.completions.create(model="demo", messages=msgs, max_tokens=12, temperature=0, stream=True,
                                            logprobs=True, top_logprobs=4))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == a.choices[0].message.content
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    for s, n in zip(streamed, content):
        assert s.logprob == pytest.approx(n.logprob, abs=1e-5)
        assert [t.token for t in s.top_logprobs] == [t.token for t in n.top_logprobs]
    for ch in chunks:  # a chunk with text carries its tokens' entries
        if ch.choices and ch.choices[0].delta.content:
            assert ch.choices[0].logprobs is not None and ch.choices[0].logprobs.content


def test_logprobs_without_top_and_absent_when_not_asked(server):
    msgs = image_message(png_bytes(scene(seed=42)), "What is this?")
    c = client(server)
    a = c.chat.completions.create(model="demo", messages=msgs, max_tokens=6, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in a.choices[0].logprobs.content)
    b = c.chat.completions.create(model="demo", messages=msgs, max_tokens=6, temperature=0)
    assert b.choices[0].logprobs is None and b.choices[0].message.content == a.choices[0].message.content
    # sampled: the token drawn need not be the best, but its entry is there and the alternatives are sorted
    s = c.chat.completions.create(model="demo", messages=msgs, max_tokens=6, temperature=1.0, seed=5,
                                  logprobs=True, top_logprobs=20)
    for e in s.choices[0].logprobs.content:
        values = [t.logprob for t in e.top_logprobs]
        assert len(values) == 20 and values == sorted(values, reverse=True) and e.logprob <= values[0] + 1e-6


@pytest.mark.parametrize("extra, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
])
def test_bad_logprobs_requests_are_400(server, extra, param):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    r = requests.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
