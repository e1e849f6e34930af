"""A video clip on the page in Chromium against the real server: pick a clip, the browser draws the
frames the server will sample and says what they cost, the video preset appears (and only then),
the answer streams in with the video's timings."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import ARTIFACTS, make_clip

pytestmark = [pytest.mark.browser, pytest.mark.server]

CHAT = "/v1/chat/completions"


def test_clip_frame_strip_preset_and_answer(server, browser, tmp_path):
    data = make_clip(tmp_path, "VP80", fps=10.0, frames=30, size=(160, 96))  # 3 s: 6 frames at 2 fps
    path = tmp_path / "clip.webm"
    path.write_bytes(data)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server.url + "/")
    page.evaluate("localStorage.setItem('vlservice.lang', 'en')")
    page.reload()
    page.wait_for_selector("#presets button")
    presets = {p["name"]: p for p in requests.get(server.url + "/api/config").json()["presets"]}
    assert presets["describe_video"]["media"] == "video"
    assert page.query_selector('#presets button[data-preset="describe_video"]') is None  # no clip yet
    bodies = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.url.endswith(CHAT) else None)

    page.set_input_files("#file-input", str(path))
    page.wait_for_selector("#video-info[data-tokens]")
    page.wait_for_function("document.querySelectorAll('#video-strip canvas').length == 6", timeout=20000)
    assert page.get_attribute("#video-info", "data-frames") == "6"
    assert "video tokens" in page.inner_text("#video-info")
    # the strip is drawn from the clip: its frames differ (the colour encodes the frame index)
    colours = page.evaluate("""() => [...document.querySelectorAll('#video-strip canvas')].map(
        (c) => Array.from(c.getContext('2d').getImageData(c.width >> 1, c.height >> 1, 1, 1).data.slice(0, 3)))""")
    assert len({tuple(c) for c in colours}) == 6
    assert page.query_selector('#presets button[data-preset="describe"]') is None  # image presets hidden

    page.click('#presets button[data-preset="describe_video"]')
    page.wait_for_selector('#state[data-state="done"]', timeout=120000)
    assert page.inner_text("#messages .msg.assistant .content").strip()
    part = bodies[0]["messages"][-1]["content"][0]
    assert part["type"] == "video_url" and part["video_url"]["url"].startswith("data:video/webm;base64,")
    assert bodies[0]["messages"][-1]["content"][1]["text"] == presets["describe_video"]["en"]
    for key in ("video_decode_ms", "video_preprocess_ms", "video_tokens", "vision_encode_ms"):
        assert page.query_selector(f'#timings [data-key="{key}"]') is not None, key
    served_tokens = page.inner_text('#timings [data-key="video_tokens"] .t-value')
    assert served_tokens == page.get_attribute("#video-info", "data-tokens")  # the estimate was exact
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page-video.png"), full_page=True)

    page.click("#remove-video")
    page.wait_for_selector('#presets button[data-preset="describe"]')
    page.close()
