"""Short generated clips for the demo model's video task (issue 16.6).

One shape on a pale or grey background either moves across the picture (to the left or to the
right) or stays where it is and changes colour part-way through. Asked "Describe this video." /
"描述这段视频。" (or another phrasing of `phrasings`' "describe_video"), the only correct answer is
"The red circle moves to the right." / "红色的圆形向右移动。" or "The circle turns from red to blue." /
"圆形从红色变成蓝色。".

A clip is written as an MPEG-4 (`mp4v`, which every opencv-python-headless can write) at 8-24 fps
for 2-5 seconds, so the server samples it at its default 2 fps into 4-10 frames, exactly as it
samples an upload: training reads the clip through `vlservice.engine.media.video.load`, the serving
path, and evaluation sends the same bytes through the API. The rules that keep the answer
unambiguous: the two colours differ, both stand out from the background (`data._background`'s
rule), a move covers at least 40% of the width and a colour change happens between 35% and 65%
of the clip, so that sampled frames show both colours and both ends.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from .data import COLORS, COLORS_ZH, SHAPES, SHAPES_ZH, _ask, _background, _draw_shape, _phrase

EVENTS = ("move", "change")
FPS_CHOICES = (8.0, 10.0, 12.0, 15.0, 24.0)


@dataclass(frozen=True)
class Clip:
    """A clip (MP4 bytes) with a question about it and its only correct answer."""

    data: bytes
    question: str
    answer: str
    lang: str
    event: str  # "move" or "change"
    shape: str
    colors: tuple  # (first, last): equal for a move
    direction: str | None  # "left" / "right" for a move
    fps: float
    frames: int
    task: str = "video"
    media: str = "video/mp4"


def answer(event: str, shape: str, colors: tuple, direction: str | None, lang: str) -> str:
    """The description of what happens in a clip, in the question's language."""
    if event == "move":
        if lang == "en":
            return f"The {_phrase(shape, colors[0], lang)} moves to the {direction}."
        return f"{_phrase(shape, colors[0], lang)}向{'左' if direction == 'left' else '右'}移动。"
    if lang == "en":
        return f"The {shape} turns from {colors[0]} to {colors[1]}."
    return f"{SHAPES_ZH[shape]}从{COLORS_ZH[colors[0]]}变成{COLORS_ZH[colors[1]]}。"


def frames_of(rng: np.random.Generator, event: str) -> tuple[list[np.ndarray], dict]:
    """The RGB frames of one clip and what they show: shape, colours, direction, fps."""
    width, height = int(rng.integers(112, 257)), int(rng.integers(96, 193))
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    names = list(COLORS)
    first, last = (names[i] for i in rng.permutation(len(names))[:2])
    if event == "move":
        last = first
    background = _background(rng, width, height, [first, last])
    r = int(rng.integers(12, max(13, min(height // 3, 36))))
    fps = float(FPS_CHOICES[int(rng.integers(len(FPS_CHOICES)))])
    n = max(8, round(float(rng.uniform(2.0, 5.0)) * fps))
    cy = int(rng.integers(r + 2, height - r - 1))
    direction = None
    if event == "move":
        left = int(rng.integers(r + 2, max(r + 3, width // 3 - r)))
        right = int(rng.integers(min(width - r - 3, left + int(0.4 * width)), width - r - 1))
        direction = "right" if rng.random() < 0.5 else "left"
        xs = np.linspace(left, right, n) if direction == "right" else np.linspace(right, left, n)
        switch = n
    else:
        xs = np.full(n, int(rng.integers(r + 2, width - r - 1)))
        switch = int(round(n * float(rng.uniform(0.35, 0.65))))
    frames = []
    for i in range(n):
        frame = background.copy()
        _draw_shape(frame, shape, first if i < switch else last, int(round(xs[i])), cy, r)
        frames.append(frame)
    return frames, {"shape": shape, "colors": (first, last), "direction": direction, "fps": fps}


def encode_mp4(frames: list[np.ndarray], fps: float) -> bytes:
    """MPEG-4 part 2 bytes of RGB frames (a temporary file: OpenCV writes only to paths)."""
    h, w = frames[0].shape[:2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
        if not writer.isOpened():
            raise RuntimeError("this OpenCV cannot write MPEG-4 (mp4v)")
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        return path.read_bytes()


def make_clip(rng: np.random.Generator, lang: str | None = None, pool: str = "train",
              event: str | None = None) -> Clip:
    """One clip with a question phrased from ``pool`` ("preset", "train", "held_out")."""
    lang = lang or ("en" if rng.random() < 0.5 else "zh")
    event = event or EVENTS[int(rng.integers(len(EVENTS)))]
    frames, what = frames_of(rng, event)
    question = _ask(rng, pool, lang, "describe_video")
    text = answer(event, what["shape"], what["colors"], what["direction"], lang)
    return Clip(encode_mp4(frames, what["fps"]), question, text, lang, event, what["shape"], what["colors"],
                what["direction"], what["fps"], len(frames))


def iter_clips(seed, n: int, pool: str = "train") -> Iterator[Clip]:
    """``n`` clips fully determined by ``seed`` (an int or a list of ints, as NumPy seeds)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield make_clip(rng, pool=pool)
