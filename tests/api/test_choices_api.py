"""Several choices (`n`) through the real server (Gunicorn subprocess, the bundled demo model) with
the official `openai` client: streamed and not, the same choices; each its `index`; usage counts
the prompt once; a cancel frees every slot; too many choices is an OpenAI-shaped 400."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import image_message, png_bytes, scene, wait_until

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
SLOTS = 4  # the server's VL_MAX_BATCH (the default)


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_streamed_and_not_give_the_same_choices_each_the_request_alone_with_its_seed(server):
    msgs = image_message(png_bytes(scene(seed=51)), "Describe this image.")
    c = client(server)
    ask = dict(model="demo", messages=msgs, max_tokens=10, temperature=2.0, seed=77, extra_body={"min_tokens": 10})
    answer = c.chat.completions.create(n=3, logprobs=True, **ask)
    assert [ch.index for ch in answer.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in answer.choices]
    assert len(set(texts)) > 1
    for ch in answer.choices:
        assert ch.finish_reason == "length" and len(ch.logprobs.content) == 10

    chunks = list(c.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ask))
    streamed, finish = {0: "", 1: "", 2: ""}, {}
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        streamed[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            assert choice.index not in finish  # once per choice
            finish[choice.index] = choice.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert finish == {0: "length", 1: "length", 2: "length"}

    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.model_dump() == answer.usage.model_dump()
    assert usage.completion_tokens == 3 * 10
    alone = c.chat.completions.create(**{**ask, "seed": 77 + 2})
    assert usage.prompt_tokens == alone.usage.prompt_tokens  # the prompt counted once
    assert alone.choices[0].message.content == texts[2]


def test_greedy_choices_are_the_greedy_answer(server):
    msgs = image_message(png_bytes(scene(seed=52)), "What is this?")
    c = client(server)
    one = c.chat.completions.create(model="demo", messages=msgs, max_tokens=8, temperature=0)
    two = c.chat.completions.create(model="demo", messages=msgs, max_tokens=8, temperature=0, n=2)
    assert [(ch.index, ch.message.content) for ch in two.choices] == [(0, one.choices[0].message.content),
                                                                      (1, one.choices[0].message.content)]
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens


def test_cancelling_a_request_of_several_choices_frees_every_slot(server):
    body = {"messages": image_message(png_bytes(scene(seed=53)), "Describe this image."), "n": SLOTS,
            "max_tokens": 400, "min_tokens": 400, "temperature": 0.9, "stream": True}
    with requests.post(server.url + CHAT, json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        answering, last = set(), None
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                last = event
                continue
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    answering.add(choice["index"])
            if answering == set(range(SLOTS)) and last is None:
                stats = requests.get(server.url + "/api/stats", timeout=10).json()
                assert stats["batch"]["running"] == SLOTS  # one slot per choice
                cancel = requests.post(f"{server.url}{CHAT}/{r.headers['X-Request-Id']}/cancel", timeout=10)
                assert cancel.status_code == 200
                last = {}
    assert last["error"]["code"] == "cancelled"
    wait_until(lambda: requests.get(server.url + "/api/stats", timeout=10).json()["batch"]["running"] == 0,
               "every slot of the cancelled choices free")


@pytest.mark.parametrize("n", [SLOTS + 1, 0])
def test_too_many_or_no_choices_are_an_openai_shaped_400(server, n):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], n=n)
    error = err.value.body.get("error", err.value.body)  # the client hands over the inner object
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "n", "invalid_value")
    assert f"got {n}" in error["message"]
    if n > SLOTS:
        assert f"between 1 and {SLOTS}" in error["message"] and "VL_MAX_BATCH" in error["message"]
