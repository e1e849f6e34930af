"""Shared fixtures: real tiny Qwen3-VL checkpoints built once per test session.

Everything is real: transformers' Qwen3-VL classes, a real Qwen tokenizer, a real ONNX export
and ONNX Runtime. Nothing is downloaded. Slow tests are marked `slow` and run by default
(deselect with `-m "not slow"` while iterating).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from vlservice.build.checkpoints import make_model

    return make_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vl-cache")


@pytest.fixture(scope="session")
def settings_for(cache_dir, tiny_model_dir):
    from vlservice.config import Settings

    def make(**kw):
        base = dict(model=str(tiny_model_dir), cache_dir=str(cache_dir), threads=2)
        base.update(kw)
        return Settings(**base)

    return make


@pytest.fixture(scope="session")
def service_for(settings_for):
    """Services by vision backend, built once each for the session."""
    from vlservice.engine.service import load_service

    made = {}

    def get(backend="onnx-int8"):
        if backend not in made:
            made[backend] = load_service(settings_for(vision_backend=backend))
        return made[backend]

    return get


def png_bytes(rgb: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]))
    assert ok
    return buf.tobytes()


def scene(h=120, w=200, seed=0) -> np.ndarray:
    """A small deterministic picture with structure (so features depend on it)."""
    import cv2

    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), rng.integers(150, 240, 3), dtype=np.uint8)
    for _ in range(3):
        color = tuple(int(c) for c in rng.integers(0, 255, 3))
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.circle(img, center, int(rng.integers(2, 40)), color, -1, cv2.LINE_AA)
    return img


# What this opencv-python-headless can write (no H.264 encoder: tests/fixtures has one H.264 clip).
VIDEO_WRITERS = {"mp4v": ".mp4", "VP80": ".webm", "VP90": ".webm", "MJPG": ".avi"}


def make_clip(folder: Path, fourcc="VP80", fps=10.0, frames=30, size=(96, 64)) -> bytes:
    """A clip whose frame i says i in its colour: RGB (8 * (i % 32), 8 * (i // 32), 128)."""
    import cv2

    path = folder / f"clip-{fourcc}-{fps}-{frames}-{size[0]}x{size[1]}{VIDEO_WRITERS[fourcc]}"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, size)
    assert w.isOpened(), f"this OpenCV cannot write {fourcc}"
    for i in range(frames):
        w.write(np.full((size[1], size[0], 3), (128, 8 * (i // 32), 8 * (i % 32)), np.uint8))  # BGR
    w.release()
    return path.read_bytes()


# The suite runs in tiers, fastest first, each marked by its folder: a broken unit fails in
# seconds, before the server, browser and tool tiers start.
TIERS = ("unit", "engine", "api", "browser", "tools", "deploy")


def _tier(item) -> str:
    parts = Path(str(item.path)).relative_to(ROOT / "tests").parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier(item)
        item.add_marker(getattr(pytest.mark, tier))
        if tier in ("api", "browser", "tools") or "server" in item.keywords:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: TIERS.index(_tier(item)))  # stable: file order kept within a tier


_current_tier: dict = {"name": None, "parallel": False}


def pytest_configure(config):
    # in several processes (pytest-xdist) the tiers' tests interleave: no headers then
    _current_tier["parallel"] = bool(getattr(config.option, "numprocesses", None))


def pytest_runtest_logstart(nodeid, location):
    if _current_tier["parallel"]:
        return
    parts = Path(location[0]).parts
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "unit"
    if tier != _current_tier["name"]:
        _current_tier["name"] = tier
        sys.stdout.write(f"\n---- tier: {tier} ----\n")
        sys.stdout.flush()


def wait_until(check, what: str, timeout: float = 10.0, interval: float = 0.05):
    """Poll `check()` until it returns something true and return that; fail (AssertionError naming
    `what`) when it never does. Tests wait on the event itself with this, not on a fixed sleep: the
    deadline only tells "it never happens" from "it happened", it measures no speed; `interval` is
    only how often to look."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)


def wait_for_a_later_mtime(folder: Path) -> None:
    """Until a file written now gets a later modification time than every entry (*/*.npz) in
    `folder`: the disk tier orders its entries by mtime, and the filesystem's clock is coarse."""
    newest = max((p.stat().st_mtime_ns for p in folder.glob("*/*.npz")), default=0)
    probe = folder / ".tick"  # outside the entries' glob

    def later():
        probe.touch()
        return probe.stat().st_mtime_ns > newest

    wait_until(later, "the filesystem's clock past the newest entry", timeout=5, interval=0.001)
    probe.unlink()


def data_url(data: bytes, media: str = "image/png") -> str:
    import base64

    return f"data:{media};base64," + base64.b64encode(data).decode()


def image_message(data: bytes, text: str, media: str = "image/png", detail: str = "auto") -> list:
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(data, media), "detail": detail}},
        {"type": "text", "text": text}]}]


@pytest.fixture(scope="session")
def server(tmp_path_factory, cache_dir):
    """The real server (Gunicorn subprocess) serving the bundled demo model, shared by the session."""
    from server import ServerProcess

    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VL_MODEL": os.environ.get("VL_TEST_MODEL", "demo"), "VL_CACHE_DIR": str(cache_dir),
           "VL_QUEUE_SIZE": "4", "VL_MAX_TOKENS_CAP": "512"}
    proc = ServerProcess(env, ARTIFACTS / "server.log").start()
    yield proc
    proc.stop()


# Debian's Chromium, driven by Playwright (no browser download); the page tests share one per module.
CHROMIUM = os.environ.get("VL_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()
