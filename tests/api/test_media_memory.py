"""Memory per request, bounded by design (issue 31, item 3), against Gunicorn as users start it.

Admission comes before any decode: with every slot taken, a request's image is never decoded
(a corrupt one gets 429, not 400). The worst media the default limits allow (a 16-bit RGBA PNG and
a clip of 64 sampled frames, both at `VL_MAX_IMAGE_PIXELS`, small on disk) grow the worker by a
bounded amount, measured as the kernel's peak resident size of the worker process (`VmHWM`, reset
through /proc/PID/clear_refs before each case). The bounds are generous (about 1.5x what was
measured, docs/operations.md "Memory per request"); the code before this change needed several GiB for them.
"""

from __future__ import annotations

import base64
import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
import requests

from conftest import ARTIFACTS

pytestmark = pytest.mark.server

CHAT = "/v1/chat/completions"
SIDE = 6320  # 6320 x 6320 = 39,942,400 pixels: just under the default VL_MAX_IMAGE_PIXELS (40,000,000)
MiB = 2**20


@pytest.fixture(scope="module")
def srv(cache_dir):
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_MAX_BATCH": "1", "VL_QUEUE_SIZE": "3"}  # 4 slots; VL_MEDIA_DECODES: its default (2)
    proc = ServerProcess(env, ARTIFACTS / "server-media-memory.log").start()
    yield proc
    proc.stop()


def _url(data: bytes, media: str) -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def _image_body(data: bytes, **extra) -> dict:
    return {"model": "demo", "max_tokens": 2, "result_cache": False, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _url(data, "image/png"), "detail": "high"}},
        {"type": "text", "text": "What is this?"}]}], **extra}


def _bomb_png() -> bytes:
    """16 bits per channel with alpha at the pixel limit: 320 MB decoded, about 0.3 MB on disk."""
    img = np.zeros((SIDE, SIDE, 4), np.uint16)
    img[..., 2] = 50000
    img[..., 3] = 65535
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok
    return buf.tobytes()


def _bomb_clip(path) -> bytes:
    """64 frames at 1 fps (all 64 sampled at the default 2 fps), each at the pixel limit: a few MB."""
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 1.0, (SIDE, SIDE))
    assert out.isOpened()
    frame = np.full((SIDE, SIDE, 3), 128, np.uint8)
    for i in range(64):
        frame[:64, :64] = 2 * i
        out.write(frame)
    out.release()
    return path.read_bytes()


class Worker:
    """The one worker's memory, from the kernel."""

    def __init__(self, server):
        self.pid = requests.get(server.url + "/api/stats", timeout=10).json()["pid"]

    def status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def reset_peak(self) -> int:
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")  # the peak resident size restarts from the current one
        return self.status("VmRSS")

    def growth(self, base: int) -> int:
        return self.status("VmHWM") - base


def _report(name: str, growth: int) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "media-memory.txt", "a") as f:
        f.write(f"{name}: peak RSS growth {growth / MiB:.0f} MiB\n")
    print(f"{name}: peak RSS growth {growth / MiB:.0f} MiB")


def _corrupt_png() -> bytes:
    """A valid 64x64 header, then garbage: decoding it is a 400 invalid_image."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
            + b"\x00garbage" * 64)


def test_a_full_server_refuses_before_decoding(srv):
    assert requests.post(srv.url + CHAT, json=_image_body(_corrupt_png()), timeout=60).json()["error"]["code"] \
        == "invalid_image"  # the premise: when admitted, this image fails its decode
    long_body = {"model": "demo", "max_tokens": 1000, "min_tokens": 1000, "stream": True, "result_cache": False,
                 "messages": [{"role": "user", "content": "Go on."}]}
    # Each stream's headers come back once submit() has given it a slot: one runs, three wait.
    held = [requests.post(srv.url + CHAT, json=long_body, stream=True, timeout=120) for _ in range(4)]
    try:
        assert [r.status_code for r in held] == [200] * 4
        refused = requests.post(srv.url + CHAT, json=_image_body(_corrupt_png()), timeout=60)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "server_busy" and error["type"] == "unavailable_error"
        assert int(refused.headers["Retry-After"]) >= 1
    finally:
        for r in held:
            requests.post(srv.url + f"{CHAT}/{r.headers.get('X-Request-Id')}/cancel", timeout=30)
        for r in held:  # each stream's last event comes after its slot was given back
            assert any(line == b"data: [DONE]" for line in r.iter_lines())
            r.close()
    # the slots are free again: the same image is decoded (and refused for what it is)
    assert requests.post(srv.url + CHAT, json=_image_body(_corrupt_png()), timeout=60).json()["error"]["code"] \
        == "invalid_image"


def test_bomb_png_grows_the_worker_by_a_bounded_amount(srv):
    data = _bomb_png()
    assert len(data) < 1 * MiB
    worker = Worker(srv)
    base = worker.reset_peak()
    r = requests.post(srv.url + CHAT, json=_image_body(data), timeout=300)
    assert r.status_code == 200, r.text
    growth = worker.growth(base)
    _report("one 6320x6320 RGBA 16-bit PNG (detail high)", growth)
    assert growth < 1024 * MiB


def test_bomb_pngs_at_once_share_the_decode_budget(srv):
    """Four at once, all admitted (four slots here), at most VL_MEDIA_DECODES=2 decoding at any time:
    without that budget the four decodes overlap (about 2.4 GiB)."""
    data = _bomb_png()
    worker = Worker(srv)
    base = worker.reset_peak()
    start = threading.Barrier(4)

    def one(_):
        start.wait()
        return requests.post(srv.url + CHAT, json=_image_body(data), timeout=600).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(one, range(4)))
    assert codes == [200] * 4, codes
    growth = worker.growth(base)
    _report("four such PNGs at once (VL_MEDIA_DECODES=2)", growth)
    assert growth < 1536 * MiB


def test_bomb_clip_grows_the_worker_by_a_bounded_amount(srv, tmp_path):
    data = _bomb_clip(tmp_path / "bomb.mp4")
    assert len(data) < 8 * MiB
    worker = Worker(srv)
    base = worker.reset_peak()
    body = {"model": "demo", "max_tokens": 2, "result_cache": False, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": _url(data, "video/mp4"), "detail": "low"}},
        {"type": "text", "text": "What happens?"}]}]}
    r = requests.post(srv.url + CHAT, json=body, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["video_frames"] == 64
    growth = worker.growth(base)
    _report("one clip of 64 sampled 6320x6320 frames (detail low: high needs more than the 8192-token context)", growth)
    assert growth < 1536 * MiB


@pytest.mark.parametrize("case", ["8 MB array of numbers in an unknown field", "9 MB of English text",
                                  "9 MB of Chinese text without spaces", "100,000 messages"])
def test_work_before_admission_costs_at_most_about_four_times_the_body(srv, case):
    """The bodies of the adversarial table (vlservice/tools/edge.py) built to cost the server before
    a slot protects it: each refused, growing the worker by at most 4x its size and 32 MiB (an 8 MB
    array of numbers grew it by 750 MiB, and 8 MB of text by 1.5 GiB, before the shape check and
    the text bound)."""
    from vlservice.tools.edge import body_cases

    body = next(c.data for c in body_cases() if c.name == case)
    worker = Worker(srv)
    base = worker.reset_peak()
    r = requests.post(srv.url + CHAT, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    growth = worker.growth(base)
    _report(f"{case} ({len(body) / MiB:.1f} MiB body), refused", growth)
    assert growth < 4 * len(body) + 32 * MiB
