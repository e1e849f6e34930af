"""The page's token estimates against the server's own counts, as tables.

The page scales an image to the pixel budget of its `detail` and says how many image tokens it
will cost; for a clip, how many frames the server samples and what they cost. Its functions
(static/js/images.js `planImage`, static/js/video.js `sampledFrames` and `videoTokens`) run here in
Chromium, with the numbers of /api/config; the server's counts come from the engine's own resizing
(vlservice/engine/media/images.py and video.py, called as the service calls them), and a few cases from
the real server's `timings` (image_tokens, video_tokens). They must agree exactly.

Two model specs: the demo model the test server serves (its /api/config as served), and
Qwen3-VL-2B's (min 65536, max 16777216 pixels), whose /api/config is built here as
vlservice/http/ops.py builds it (checked against the served one for the demo spec).
"""

from __future__ import annotations

import json
import math
import random

import pytest
import requests

from conftest import make_clip, png_bytes

pytestmark = [pytest.mark.browser, pytest.mark.server]

DETAILS = ("low", "auto", "high")

# Source sizes (width, height): tiny, odd, around the rounding and budget edges, photos and
# screenshots, very wide and very tall (aspect ratio up to the server's limit of 200), and a seeded
# spread of random ones.
SIZES = [(1, 1), (8, 8), (15, 15), (16, 16), (17, 31), (31, 33), (32, 32), (48, 48), (100, 100),
         (128, 127), (200, 160), (255, 257), (320, 240), (333, 777), (480, 480), (512, 512), (640, 480),
         (800, 600), (1000, 1000), (1023, 769), (1024, 1024), (1280, 720), (1366, 768), (1920, 1080),
         (2000, 3000), (2560, 1440), (3024, 4032), (4000, 100), (100, 4000), (4096, 4096), (6000, 4000),
         (2000, 15), (15, 2000), (7000, 35), (10000, 51), (40, 8000)]
_rng = random.Random(32)
SIZES += [(_rng.randint(1, 5000), _rng.randint(1, 5000)) for _ in range(40)]
SIZES = [(w, h) for w, h in SIZES if max(w, h) / min(w, h) <= 200]

# Clips: (frames in the file, its frame rate, width, height). The page knows a clip's duration, not
# its frame count, so every clip here has at least as many frames as the server samples from it
# (the server also caps the sample at the frame count; such a clip is a few frames long).
CLIPS = [(5, 10.0, 96, 64), (30, 10.0, 160, 96), (60, 30.0, 320, 240), (75, 25.0, 640, 480),
         (240, 24.0, 1280, 720), (900, 30.0, 1920, 1080), (1800, 30.0, 3840, 2160), (3000, 25.0, 854, 480),
         (301, 29.97, 1080, 1920), (450, 15.0, 20, 400), (90, 30.0, 17, 17), (3600, 30.0, 640, 360)]


# --------------------------------------------------------------------------- the server's side

class Spec:
    """One model's image and video specs and the server's settings, and its counts."""

    def __init__(self, name: str, image_spec, video_spec):
        from vlservice.config import Settings

        self.name, self.image, self.video = name, image_spec, video_spec
        self.settings = Settings.from_env()  # the test server's settings: it inherits this environment

    def config(self) -> dict:
        """What /api/config says of these specs (vlservice/http/ops.py)."""
        s, spec, v = self.settings, self.image, self.video
        return {"detail_max_pixels": {d: min(s.detail_pixels(d), spec.max_pixels) for d in DETAILS},
                "min_pixels": spec.min_pixels, "token_factor": spec.factor,
                "video": {"max_frames": s.max_video_frames, "fps": v.fps, "min_frames": v.min_frames,
                          "detail_frame_pixels": {d: s.video_frame_pixels(d) for d in DETAILS},
                          "min_pixels": v.min_pixels, "max_pixels": v.max_pixels,
                          "frame_cap_pixels": v.max_video_tokens * v.factor ** 2}}

    def image_tokens(self, w: int, h: int, detail: str) -> int:
        """The tokens the service counts for a w x h upload (images.load -> prepare: the grid)."""
        from vlservice.engine.media import images

        spec, budget = self.image, self.settings.detail_pixels(detail)
        th, tw = images.smart_resize(h, w, spec.factor, images._floor(spec, images._budget(spec, budget), None),
                                     images._budget(spec, budget))
        grid = (1, th // spec.patch_size, tw // spec.patch_size)
        return grid[1] * grid[2] // spec.merge_size ** 2

    def sampled(self, frames: int, fps: float) -> int:
        """How many frames the service samples from the clip (video.decode)."""
        from vlservice.engine.media import video

        s, spec = self.settings, self.video
        cap = min(s.max_video_frames, s.max_video_frames, spec.max_frames)
        cap -= cap % spec.temporal_patch_size
        return len(video.sample_indices(frames, fps, spec.fps, spec.min_frames, cap))

    def video_tokens(self, n: int, w: int, h: int, detail: str) -> int:
        """The tokens of n sampled frames of w x h (video.prepare: one size, padded to pairs)."""
        from vlservice.engine.media import video

        spec = self.video
        th, tw = video.target_size(n, h, w, spec, self.settings.video_frame_pixels(detail))
        t = math.ceil(n / spec.temporal_patch_size)
        return t * (th // spec.patch_size) * (tw // spec.patch_size) // spec.merge_size ** 2


def demo_spec() -> Spec:
    from vlservice.engine.media import images, video
    from vlservice.engine.model.checkpoints import bundled_demo_path

    path = bundled_demo_path()
    pre = json.loads((path / "preprocessor_config.json").read_text())
    return Spec("demo", images.ImageSpec.from_preprocessor_config(pre), video.VideoSpec.from_checkpoint(path, pre))


def qwen3_vl_2b_spec() -> Spec:
    """Qwen3-VL-2B-Instruct's processor settings (size.shortest_edge 65536, longest_edge 16777216)."""
    from vlservice.engine.media import images, video

    pre = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
           "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
    return Spec("qwen3-vl-2b", images.ImageSpec.from_preprocessor_config(pre), video.VideoSpec())


SPECS = {"demo": demo_spec, "qwen3-vl-2b": qwen3_vl_2b_spec}


# --------------------------------------------------------------------------- the page's side

# The page's own modules, as the page loaded them (the same instances: `config` is the page's),
# run with `cfg` put over the served config for the time of the call.
PAGE_ESTIMATES = """async ({cfg, images, clips}) => {
  const api = await import('/static/js/api.js');
  const img = await import('/static/js/images.js');
  const vid = await import('/static/js/video.js');
  const saved = structuredClone(api.config);
  Object.assign(api.config, cfg);
  try {
    return {
      images: images.map(([w, h, detail]) => img.planImage(w, h, detail)),
      clips: clips.map(([frames, fps, w, h, detail]) => {
        const n = vid.sampledFrames(frames / fps);
        return {n, tokens: vid.videoTokens(n, w, h, detail)};
      }),
    };
  } finally {
    for (const key of Object.keys(api.config)) delete api.config[key];
    Object.assign(api.config, saved);
  }
}"""

IMAGE_CASES = [(w, h, d) for w, h in SIZES for d in DETAILS]
CLIP_CASES = [(*c, d) for c in CLIPS for d in DETAILS]


@pytest.fixture(scope="module")
def page(server, browser):
    page = browser.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#presets button")  # the presets arrive with /api/config
    yield page
    page.close()


@pytest.fixture(scope="module")
def estimates(page):
    """The page's estimates for every case, by spec."""
    out = {}
    for name, make in SPECS.items():
        spec = make()
        out[name] = (spec, page.evaluate(PAGE_ESTIMATES, {"cfg": spec.config(), "images": IMAGE_CASES,
                                                          "clips": CLIP_CASES}))
    return out


def test_the_served_config_is_the_one_built_here(server):
    served = requests.get(server.url + "/api/config").json()
    built = demo_spec().config()
    assert {k: served[k] for k in ("detail_max_pixels", "min_pixels", "token_factor")} == \
        {k: built[k] for k in ("detail_max_pixels", "min_pixels", "token_factor")}
    assert {k: served["video"][k] for k in built["video"]} == built["video"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("w", "h", "detail"), IMAGE_CASES, ids=[f"{w}x{h}-{d}" for w, h, d in IMAGE_CASES])
def test_image_tokens(estimates, spec, w, h, detail):
    model, page = estimates[spec]
    plan = page["images"][IMAGE_CASES.index((w, h, detail))]
    # the page sends the image scaled down to the detail's budget; the server counts what it is sent
    budget = model.config()["detail_max_pixels"][detail]
    assert (plan["w"], plan["h"]) == (w, h) if w * h <= budget else plan["w"] * plan["h"] <= budget
    assert max(plan["w"], plan["h"]) <= 200 * min(plan["w"], plan["h"])  # what the processor accepts
    assert plan["tokens"] == model.image_tokens(plan["w"], plan["h"], detail)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize(("frames", "fps", "w", "h", "detail"), CLIP_CASES,
                         ids=[f"{n}f@{fps}-{w}x{h}-{d}" for n, fps, w, h, d in CLIP_CASES])
def test_clip_frames_and_tokens(estimates, spec, frames, fps, w, h, detail):
    model, page = estimates[spec]
    est = page["clips"][CLIP_CASES.index((frames, fps, w, h, detail))]
    n = model.sampled(frames, fps)
    assert n < frames  # the premise: the frame count (which the page does not know) caps nothing
    assert est["n"] == n
    assert est["tokens"] == model.video_tokens(n, w, h, detail)


# --------------------------------------------------------------------------- the real server

@pytest.mark.parametrize(("w", "h", "detail"), [(1, 1, "low"), (200, 160, "auto"), (333, 777, "high"),
                                                (1920, 1080, "low"), (4000, 100, "high")])
def test_image_estimate_is_what_the_server_counts(server, estimates, w, h, detail):
    import numpy as np

    plan = estimates["demo"][1]["images"][IMAGE_CASES.index((w, h, detail))]
    rgb = np.random.default_rng(w * h).integers(0, 255, (plan["h"], plan["w"], 3), dtype=np.uint8)
    body = {"model": "demo", "max_tokens": 1, "result_cache": False,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png_bytes(rgb)),
                                                    "detail": detail}},
                {"type": "text", "text": "What is it?"}]}]}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["image_tokens"] == plan["tokens"]


@pytest.mark.parametrize("detail", ["low", "high"])
def test_clip_estimate_is_what_the_server_counts(server, page, tmp_path, detail):
    frames, fps, size = 30, 10.0, (320, 240)
    data = make_clip(tmp_path, "VP80", fps=fps, frames=frames, size=size)
    est = page.evaluate("""async ([frames, fps, w, h, detail]) => {
      const vid = await import('/static/js/video.js');
      const n = vid.sampledFrames(frames / fps);
      return {n, tokens: vid.videoTokens(n, w, h, detail)};
    }""", [frames, fps, *size, detail])
    body = {"model": "demo", "max_tokens": 1, "result_cache": False,
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": "data:video/webm;base64," + b64(data), "detail": detail}},
                {"type": "text", "text": "What happens?"}]}]}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    timings = r.json()["timings"]
    assert (timings["video_frames"], timings["video_tokens"]) == (est["n"], est["tokens"])


def b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
