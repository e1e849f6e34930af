"""Grounding in the API, against the real server: the `grounding` field of a non-streamed answer and
of the stream's finish chunk is exactly what the parser finds in the answer's text, in pixels of the
request's last image (absent when the text holds no box or point), and the text is the same either
way. (The parser and the conversion on model-style answers: tests/unit/test_grounding.py.)"""

from __future__ import annotations

import json

import pytest
import requests

from conftest import data_url, png_bytes, scene
from vlservice.demo.prompts import PROMPTS
from vlservice.engine.output.grounding import grounding, parse

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


def locate(*images: bytes, **extra) -> dict:
    """The page's "Find objects" question about `images` (the last one is the one it is about)."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": PROMPTS["en"]["locate"]}]}],
            "max_tokens": 96, "temperature": 0, "result_cache": False, **extra}


def stream_chunks(server, body) -> list[dict]:
    with requests.post(server.url + CHAT, json={**body, "stream": True}, stream=True, timeout=300) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_field_is_the_parsed_text_in_pixels_of_the_last_image(server):
    small, wide = png_bytes(scene(h=64, w=64, seed=3)), png_bytes(scene(h=120, w=200, seed=4))
    body = locate(small, wide)
    answer = requests.post(server.url + CHAT, json=body, timeout=300).json()
    text = answer["choices"][0]["message"]["content"]
    expected = grounding(parse(text), [(64, 64), (200, 120)])
    assert answer.get("grounding") == expected  # absent when the text holds none

    chunks = stream_chunks(server, body)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == text
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0] is chunks[-1]
    assert finish[0].get("grounding") == expected
    assert not any("grounding" in c for c in chunks[:-1])  # only the finish chunk carries it
