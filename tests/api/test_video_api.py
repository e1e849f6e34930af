"""Video through the real server (Gunicorn subprocess, a tiny real checkpoint) with the official
`openai` client: vLLM's `video_url` part, streamed and not; every kind of bad clip is a 4xx with
its code and the server keeps serving; no temporary file outlives its request; a second question
about the same clip is a feature-cache hit."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import ARTIFACTS, make_clip, png_bytes, scene

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def vserver(tmp_path_factory, tiny_model_dir, cache_dir):
    from server import ServerProcess

    tmp = tmp_path_factory.mktemp("server-tmp")  # the server's TMPDIR: where FFmpeg's input files go
    env = {"VL_MODEL": str(tiny_model_dir), "VL_CACHE_DIR": str(cache_dir), "TMPDIR": str(tmp),
           "VL_MAX_VIDEO_SECONDS": "4", "VL_MAX_VIDEO_BYTES": "200000", "VL_MAX_IMAGE_PIXELS": "100000",
           "VL_MAX_VIDEO_FRAMES": "16"}
    ARTIFACTS.mkdir(exist_ok=True)
    proc = ServerProcess(env, ARTIFACTS / "server-video.log").start()
    proc.tmp = tmp
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("clips")
    return {
        "webm": make_clip(folder, "VP90", fps=10.0, frames=30),
        "mp4": make_clip(folder, "mp4v", fps=10.0, frames=30),
        "long": make_clip(folder, "VP80", fps=10.0, frames=50, size=(32, 32)),  # 5 s > 4 s
        "wide": make_clip(folder, "VP80", fps=10.0, frames=10, size=(400, 300)),  # 120000 pixels > 100000
    }


def video_part(data: bytes, media="video/webm", **extra) -> dict:
    url = f"data:{media};base64," + base64.b64encode(data).decode()
    return {"type": "video_url", "video_url": {"url": url, **extra}}


def messages(*parts, text="Describe this video.") -> list:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def leftovers(server) -> list:
    return sorted(p.name for p in server.tmp.iterdir() if p.name.startswith("vlservice-video-"))


def test_openai_client_non_streamed_and_cache_hit(vserver, clips):
    c = client(vserver)
    first = c.chat.completions.create(model="m", messages=messages(video_part(clips["webm"], fps=2, max_frames=8)),
                                      max_tokens=6, temperature=0)
    assert first.choices[0].message.content and first.choices[0].finish_reason in ("stop", "length")
    t = first.model_extra["timings"]
    assert t["video_frames"] == 6 and t["video_tokens"] > 0 and t["vision_cache_hit"] is False
    assert t["video_decode_ms"] > 0 and t["video_preprocess_ms"] > 0 and t["vision_encode_ms"] > 0
    assert first.usage.prompt_tokens > t["video_tokens"]
    again = c.chat.completions.create(model="m", messages=messages(video_part(clips["webm"], fps=2, max_frames=8),
                                                                   text="What happens?"),
                                      max_tokens=6, temperature=0)
    assert again.model_extra["timings"]["vision_cache_hit"] is True
    assert again.model_extra["timings"]["vision_encode_ms"] == 0.0
    assert leftovers(vserver) == []


def test_openai_client_streamed_mp4(vserver, clips):
    stream = client(vserver).chat.completions.create(
        model="m", messages=messages(video_part(clips["mp4"], "video/mp4", detail="low")), max_tokens=6,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].model_extra["timings"]["video_frames"] == 6
    assert leftovers(vserver) == []


def bad_requests(clips) -> list:
    png = png_bytes(scene(40, 40, seed=1))
    webm = clips["webm"]
    return [
        ("not a video", messages(video_part(png, "video/mp4")), "invalid_video"),
        ("declared type differs", messages(video_part(webm, "video/mp4")), "invalid_video"),
        ("unsupported media type", messages(video_part(webm, "video/ogg")), "invalid_video"),
        ("empty", messages(video_part(b"")), "invalid_video"),
        ("truncated", messages(video_part(clips["mp4"][: len(clips["mp4"]) // 3], "video/mp4")), "invalid_video"),
        ("garbage behind an MP4 magic", messages(video_part(b"\0\0\0\x18ftypisom" + bytes(range(256)) * 40,
                                                            "video/mp4")), "invalid_video"),
        ("too long", messages(video_part(clips["long"])), "video_too_large"),
        ("frames over the pixel limit", messages(video_part(clips["wide"])), "video_too_large"),
        ("too many bytes", messages(video_part(b"\x1a\x45\xdf\xa3" + bytes(210000))), "video_too_large"),
        ("two videos", messages(video_part(webm), video_part(webm)), "too_many_videos"),
        ("max_frames over the limit", messages(video_part(webm, max_frames=18)), "invalid_value"),
        ("fps zero", messages(video_part(webm, fps=0)), "invalid_value"),
        ("http scheme refused", messages({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}),
         "remote_images_disabled"),
        ("video in a system message", [{"role": "system", "content": [video_part(webm)]},
                                       {"role": "user", "content": "hi"}], "invalid_value"),
    ]


def test_bad_videos_are_400_and_the_server_keeps_serving(vserver, clips):
    for name, msgs, code in bad_requests(clips):
        r = requests.post(vserver.url + CHAT, json={"messages": msgs, "max_tokens": 4}, timeout=60)
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["code"] == code, (name, err)
        assert err["param"] and err["param"].startswith("messages["), (name, err)
    ok = requests.post(vserver.url + CHAT, json={"messages": messages(video_part(clips["webm"])), "max_tokens": 4},
                       timeout=120)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
    assert leftovers(vserver) == []
    stats = requests.get(vserver.url + "/api/stats", timeout=10).json()
    assert stats["counters"]["errors"] == 0  # refused before the model: nothing failed inside
