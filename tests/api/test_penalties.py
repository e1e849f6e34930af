"""`frequency_penalty` and `presence_penalty` through the real server: accepted, applied to the
greedy answer of the demo model, and kept apart from unpenalised answers by the result cache."""

from __future__ import annotations

import pytest
import requests

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def ask(server, **extra) -> dict:
    # min_tokens keeps the model talking past its answer, where a greedy decoder repeats itself.
    body = {"model": "demo", "messages": image_message(png_bytes(scene(seed=31)), "Describe this image."),
            "max_tokens": 32, "min_tokens": 32, "temperature": 0, **extra}
    r = requests.post(server.url + CHAT, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def repeats(text: str) -> int:
    words = text.split()
    return len(words) - len(set(words))


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty"])
def test_a_penalty_changes_the_greedy_answer(server, name):
    plain = ask(server)
    penalised = ask(server, **{name: 2.0})
    assert penalised["timings"]["result_cache_hit"] is False  # not the plain answer from the result cache
    assert penalised["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
    again = ask(server, **{name: 2.0}, result_cache=False)
    assert again["choices"][0]["message"]["content"] == penalised["choices"][0]["message"]["content"]
    favoured = ask(server, **{name: -2.0}, result_cache=False)  # negative: repeats are favoured
    assert repeats(favoured["choices"][0]["message"]["content"]) >= repeats(
        penalised["choices"][0]["message"]["content"])
