"""Stage events on the stream, against the real server: a request with
`stream_options.include_stages` gets named `vlservice.stage` events (queued, vision_encode unless the
image's features are cached, prefill) before its first token; one without gets none, so the official
`openai` client (tests/api/test_api.py) keeps parsing every event as a chunk."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import image_message, png_bytes, scene

pytestmark = pytest.mark.server


def raw_events(server, body) -> list[tuple[str, str]]:
    """The stream as it comes: ("comment", text) for ":" lines and (event name, data) per event."""
    out, name, data = [], "message", []
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith(":"):
                out.append(("comment", line[1:].strip()))
            elif line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
            elif not line and data:
                out.append((name, "\n".join(data)))
                name, data = "message", []
    return out


def stages_then_chunks(events) -> tuple[list[dict], list[str]]:
    """The stage events and, in order, the kinds of everything else that carried data."""
    stages, order = [], []
    for name, data in events:
        if name == "vlservice.stage":
            stages.append(json.loads(data))
            order.append("stage")
        elif name == "message":
            chunk = None if data == "[DONE]" else json.loads(data)
            order.append("done" if chunk is None else "content" if any(
                c["delta"].get("content") for c in chunk["choices"]) else "chunk")
    return stages, order


def body_for(image: bytes, question: str, **stream_options) -> dict:
    return {"model": "demo", "messages": image_message(image, question), "max_tokens": 6, "temperature": 0,
            "result_cache": False, "stream": True, "stream_options": {"include_usage": True, **stream_options}}


def test_stage_events_come_in_order_before_the_answer(server):
    image = png_bytes(scene(seed=9061))  # no other test draws it: its encode is a miss whatever ran before
    events = raw_events(server, body_for(image, "Describe this image.", include_stages=True))
    stages, order = stages_then_chunks(events)
    assert [s["stage"] for s in stages] == ["queued", "vision_encode", "prefill"]
    assert isinstance(stages[0]["position"], int) and stages[0]["position"] >= 0
    assert "content" in order and order[-1] == "done"
    assert max(i for i, kind in enumerate(order) if kind == "stage") < order.index("content")
    # the comments for proxies are still there, exactly as without stages
    comments = [text for name, text in events if name == "comment"]
    assert comments[0] == f"queued {stages[0]['position']}"
    assert [c for c in comments if c in ("vision_encode", "prefill")] == ["vision_encode", "prefill"]

    # the same image again: its features come from the cache, so no vision_encode stage
    events = raw_events(server, body_for(image, "How many shapes are there?", include_stages=True))
    stages, order = stages_then_chunks(events)
    assert [s["stage"] for s in stages] == ["queued", "prefill"]
    final = json.loads([d for name, d in events if name == "message"][-2])
    assert final["timings"]["vision_cache_hit"] is True


@pytest.mark.parametrize(("options", "seed"), [({}, 62), ({"include_stages": False}, 63)])
def test_no_stage_events_unless_asked(server, options, seed):
    events = raw_events(server, body_for(png_bytes(scene(seed=seed)), "Describe this image.", **options))
    assert {name for name, _ in events} == {"comment", "message"}
    assert "vision_encode" in [text for name, text in events if name == "comment"]


def test_include_stages_must_be_a_boolean(server):
    body = body_for(png_bytes(scene(seed=64)), "Describe this image.", include_stages="yes")
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream_options.include_stages"
