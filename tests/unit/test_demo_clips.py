"""The demo model's generated clips (vlservice/demo/clips.py): what the answer says is what the
server's sampled frames show, in the question's language, the same for the same seed."""

from __future__ import annotations

import re

import numpy as np

from vlservice.demo.clips import iter_clips, make_clip
from vlservice.demo.data import COLORS
from vlservice.demo.phrasings import HELD_OUT, TRAIN
from vlservice.demo.prompts import VIDEO_PRESETS
from vlservice.engine.media import video as V

CJK = re.compile(r"[\u4e00-\u9fff]")
SPEC = V.VideoSpec()


def shape_pixels(frame: np.ndarray, rgb) -> np.ndarray:
    """(row, column) of the pixels close to a shape colour (the clip is lossy MPEG-4)."""
    return np.argwhere(np.abs(frame.astype(int) - np.asarray(rgb)).sum(-1) < 60)


def test_the_sampled_frames_show_what_the_answer_says():
    for clip in iter_clips(21, 40):
        frames, indices, header = V.decode(clip.data, SPEC)
        assert 4 <= len(frames) <= 10 and header.fps == clip.fps and header.frames == clip.frames
        first, last = (COLORS[c] for c in clip.colors)
        if clip.event == "move":
            a, b = shape_pixels(frames[0], first), shape_pixels(frames[-1], first)
            assert len(a) > 50 and len(b) > 50
            moved = b[:, 1].mean() - a[:, 1].mean()
            assert abs(moved) > 0.3 * frames[0].shape[1]
            assert ("right" if moved > 0 else "left") == clip.direction
            assert clip.answer == (f"The {clip.colors[0]} {clip.shape} moves to the {clip.direction}."
                                   if clip.lang == "en" else clip.answer) and ("向左" in clip.answer) == (
                                       clip.lang == "zh" and clip.direction == "left")
        else:
            assert clip.colors[0] != clip.colors[1] and clip.direction is None
            assert len(shape_pixels(frames[0], first)) > 50 and len(shape_pixels(frames[-1], last)) > 50
            # both colours are in the sampled frames, the first before the last
            shows = [len(shape_pixels(f, last)) > len(shape_pixels(f, first)) for f in frames]
            assert shows == sorted(shows) and 0 < sum(shows) < len(shows)
        assert bool(CJK.search(clip.answer)) == (clip.lang == "zh") == bool(CJK.search(clip.question))


def test_clips_are_deterministic_both_events_both_languages_and_questions_from_their_pool():
    a = list(iter_clips(5, 12))
    assert [c.data for c in a] == [c.data for c in iter_clips(5, 12)]
    assert {c.event for c in a} == {"move", "change"} and {c.lang for c in a} == {"en", "zh"}
    for lang in ("en", "zh"):
        assert TRAIN[lang]["describe_video"][0] == VIDEO_PRESETS["describe_video"][lang]
        assert not set(TRAIN[lang]["describe_video"]) & set(HELD_OUT[lang]["describe_video"])
    rng = np.random.default_rng(3)
    held = [make_clip(rng, pool="held_out") for _ in range(10)]
    assert all(c.question in HELD_OUT[c.lang]["describe_video"] for c in held)
    preset = make_clip(rng, lang="zh", pool="preset")
    assert preset.question == "描述这段视频。" and preset.answer.endswith("。")
