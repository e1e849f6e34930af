"""The peers' spellings of media options through the real server (Gunicorn subprocess, the
bundled demo model): Qwen's per-item `max_pixels` / `min_pixels`, vLLM's `mm_processor_kwargs`,
llama.cpp's `input_video`; each changes the prompt's image (or video) token count as the
precedence says, and a value above the server's limit is a 400 naming the field."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import data_url, make_clip, png_bytes, scene

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
# The demo model's processor takes 16384 to 102400 pixels (16 to 100 tokens of 32 x 32 pixels).
BIG = png_bytes(scene(h=300, w=400, seed=31))  # 120000 pixels: resized to at most 102400
SMALL = png_bytes(scene(h=64, w=64, seed=32))  # 4096 pixels: scaled up to at least 16384
BUDGET = 40_960  # 40 tokens' worth


def ask(server, *parts, **top) -> dict:
    body = {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What?"}]}],
            "max_tokens": 1, "temperature": 0, "result_cache": False, **top}
    r = requests.post(server.url + CHAT, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(answer: dict) -> tuple[int, int]:
    return answer["usage"]["prompt_tokens"], answer["timings"]["image_tokens"]


def image(data: bytes, inner: dict | None = None, **outer) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data), **(inner or {})}, **outer}


def test_pixel_options_change_the_image_token_count(server):
    prompt0, image0 = tokens(ask(server, image(BIG)))
    # Qwen's per-part spelling
    prompt1, image1 = tokens(ask(server, image(BIG, max_pixels=BUDGET)))
    assert image1 <= BUDGET // (32 * 32) < image0
    assert prompt0 - prompt1 == image0 - image1  # only the image's tokens changed
    # inside the image_url object: the same budget, the same count
    assert tokens(ask(server, image(BIG, {"max_pixels": BUDGET}))) == (prompt1, image1)
    # vLLM's request-level spelling: the same budget, the same count
    assert tokens(ask(server, image(BIG), mm_processor_kwargs={"max_pixels": BUDGET})) == (prompt1, image1)
    # precedence: the item's own over the request's, the object's over the part's
    assert tokens(ask(server, image(BIG, max_pixels=BUDGET), mm_processor_kwargs={"max_pixels": 20_000})) == (
        prompt1, image1)
    assert tokens(ask(server, image(BIG, {"max_pixels": BUDGET}, max_pixels=20_000))) == (prompt1, image1)
    # `detail` is the item's, so it beats the request-level budget
    low = tokens(ask(server, image(BIG, {"detail": "low"})))
    assert tokens(ask(server, image(BIG, {"detail": "low"}), mm_processor_kwargs={"max_pixels": BUDGET})) == low


def test_min_pixels_scales_a_small_image_up(server):
    _, small = tokens(ask(server, image(SMALL)))
    _, up = tokens(ask(server, image(SMALL, min_pixels=65_536)))
    assert up >= 65_536 // (32 * 32) > small
    assert tokens(ask(server, image(SMALL), mm_processor_kwargs={"min_pixels": 65_536}))[1] == up


@pytest.mark.parametrize("part, top, param", [
    ({"max_pixels": 10 ** 8}, {}, "messages[0].content[0].max_pixels"),
    ({"max_pixels": 0}, {}, "messages[0].content[0].max_pixels"),
    ({"min_pixels": 300_000, "max_pixels": 200_000}, {}, "messages[0].content[0].min_pixels"),
    ({}, {"mm_processor_kwargs": {"max_pixels": 10 ** 8}}, "mm_processor_kwargs.max_pixels"),
    ({}, {"mm_processor_kwargs": {"fps": -1}}, "mm_processor_kwargs.fps"),
])
def test_values_beyond_the_servers_limits_are_400_naming_the_field(server, part, top, param):
    body = {"messages": [{"role": "user", "content": [image(SMALL, **part), {"type": "text", "text": "?"}]}],
            "max_tokens": 1, **top}
    r = requests.post(server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_llama_cpps_input_video_and_qwens_video_options(server, tmp_path):
    clip = make_clip(tmp_path, "VP80", fps=10.0, frames=30, size=(96, 64))  # 3 s
    raw = base64.b64encode(clip).decode()
    vurl = {"type": "video_url", "video_url": {"url": data_url(clip, "video/webm")}}
    as_video_url = ask(server, vurl)
    as_input = ask(server, {"type": "input_video", "input_video": {"data": raw}})
    assert as_input["usage"]["prompt_tokens"] == as_video_url["usage"]["prompt_tokens"]
    assert as_input["timings"]["video_frames"] == as_video_url["timings"]["video_frames"] == 6  # 3 s at 2 fps
    # Qwen's per-part fps and vLLM's request-level fps: fewer frames (4, the least), fewer tokens
    one = ask(server, {**vurl, "fps": 1})
    assert one["timings"]["video_frames"] == 4
    assert one["usage"]["prompt_tokens"] < as_video_url["usage"]["prompt_tokens"]
    kw = ask(server, {"type": "input_video", "input_video": raw}, mm_processor_kwargs={"fps": 1})
    assert kw["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    # min_frames raises the count; the object's fps beats the part's (which would give 9 frames)
    more = ask(server, {"type": "video_url", "video_url": {"url": data_url(clip, "video/webm"), "fps": 1},
                        "fps": 3, "min_frames": 8})
    assert more["timings"]["video_frames"] == 8
