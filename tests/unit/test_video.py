"""Video decoding and sampling (vlservice/engine/media/video.py) against the reference's own code.

Clips are made here with OpenCV's VideoWriter (this opencv-python-headless build writes MPEG-4
part 2 `mp4v`, VP8 and VP9 WebM, MJPEG and Xvid AVI; it has no H.264 encoder), plus one H.264 MP4
and one streamed VP8 WebM without a frame count, made once with Debian's ffmpeg (tests/fixtures,
30 frames of a grey ramp at 10 fps). Frame `i`
of a made clip is coloured (8 * (i % 32), 8 * (i // 32), 128), so a decoded frame tells its index.

Compared with the reference (transformers' Qwen3-VL code, called directly: it runs without
torchvision for these parts): frame sampling (`Qwen3VLVideoProcessor.sample_frames`), timestamps
(`Qwen3VLProcessor._calculate_timestamps`), the target size with the per-frame cap (the
processor's own `resize`, with only torchvision's pixel resize underneath replaced), the
patch layout (`patchify`) and the prompt placeholder (`replace_video_token`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from vlservice.engine.media import video
from vlservice.errors import InvalidVideo, VideoTooLarge

from conftest import VIDEO_WRITERS, make_clip

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "gray-ramp-h264-10fps-3s.mp4"
SPEC = video.VideoSpec()


def frame_index(rgb: np.ndarray) -> int:
    r, g = float(rgb[..., 0].mean()), float(rgb[..., 1].mean())
    return int(round(r / 8)) + 32 * int(round(g / 8))


def reference_video_processor(**kw):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return Qwen3VLVideoProcessor(size={"shortest_edge": SPEC.min_pixels, "longest_edge": SPEC.max_pixels},
                                 cap_pixels_per_frame=True, **kw)


def reference_timestamps(indices, fps):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    return Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, SPEC.temporal_patch_size)


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("fourcc", sorted(VIDEO_WRITERS))
def test_each_codec_decodes_the_sampled_frames(tmp_path, fourcc):
    data = make_clip(tmp_path, fourcc, fps=10.0, frames=30)
    frames, indices, header = video.decode(data, SPEC)
    assert (header.fps, header.frames, header.width, header.height) == (10.0, 30, 96, 64)
    assert list(indices) == [0, 6, 12, 17, 23, 29]  # 3 s at 2 fps, linspace over the 30 frames
    assert [frame_index(f) for f in frames] == list(indices)
    assert frames[0].shape == (64, 96, 3) and frames[0].dtype == np.uint8


def test_streamed_webm_without_a_frame_count_is_counted():
    # as a browser's MediaRecorder writes WebM: no duration, no cues; OpenCV reports a negative count
    data = (FIXTURE.parent / "gray-ramp-vp8-10fps-3s-streamed.webm").read_bytes()
    frames, indices, header = video.decode(data, SPEC)
    assert (header.fps, header.frames) == (10.0, 30) and list(indices) == [0, 6, 12, 17, 23, 29]
    assert [round(float(f.mean()) / 8) for f in frames] == list(indices)
    with pytest.raises(VideoTooLarge):
        video.decode(data, SPEC, video.Limits(max_seconds=2.0))


def test_h264_mp4_decodes():
    frames, indices, header = video.decode(FIXTURE.read_bytes(), SPEC)
    assert (header.fps, header.frames) == (10.0, 30)
    assert [round(float(f.mean()) / 8) for f in frames] == list(indices)  # grey level 8 * i


@pytest.mark.parametrize("video_fps, frames, fps, max_frames", [
    (10.0, 30, 2.0, 64),   # 6 frames
    (10.0, 25, 2.0, 64),   # 5: odd, the last one repeats
    (10.0, 10, 2.0, 64),   # 1 s: 2 frames, raised to the minimum of 4
    (30.0, 300, 2.0, 8),   # 10 s: 20 frames, capped at 8
    (25.0, 100, 1.0, 64),  # per-request fps
    (10.0, 3, 2.0, 64),    # fewer frames than the minimum: all of them (3, padded to 4)
    (30.0, 90, 4.0, 9),    # an odd max_frames counts as the even number below
])
def test_sampling_and_timestamps_match_the_reference(tmp_path, video_fps, frames, fps, max_frames):
    from transformers.video_utils import VideoMetadata

    data = make_clip(tmp_path, "VP80", fps=video_fps, frames=frames, size=(64, 64))
    prepared = video.load(data, SPEC, video.Limits(max_frames=max_frames), fps=fps)
    ref = reference_video_processor(fps=fps, max_frames=max_frames - max_frames % 2)
    ref_indices = ref.sample_frames(VideoMetadata(total_num_frames=frames, fps=video_fps, width=64, height=64))
    assert prepared.frame_indices == list(ref_indices)
    assert prepared.timestamps == reference_timestamps(ref_indices, video_fps)
    n = len(ref_indices)
    assert prepared.grid_thw[0] == (n + 1) // 2 and 2 * prepared.grid_thw[0] <= max_frames + 1
    assert prepared.pixel_values.shape[0] == prepared.grid_thw[0] * prepared.grid_thw[1] * prepared.grid_thw[2]


def test_timestamps_of_known_clip():
    # frames 0, 6 | 12, 17 | 23, 29 at 10 fps: each patch's time is the mean of its two frames
    assert video.timestamps([0, 6, 12, 17, 23, 29], 10.0, 2) == pytest.approx([0.3, 1.45, 2.6])
    assert video.timestamps([0, 10, 20], 10.0, 2) == pytest.approx([0.5, 2.0])  # odd: the last repeats


# --------------------------------------------------------------------------- resize and layout


def reference_size(n, h, w, frame_tokens, monkeypatch):
    """The reference `resize` decides the size; torchvision's pixel resize under it is replaced by
    one that returns the size it was asked for."""
    from transformers.image_utils import SizeDict

    proc = reference_video_processor(max_video_tokens=frame_tokens)
    parent = next(c for c in type(proc).__mro__[1:] if "resize" in c.__dict__)
    monkeypatch.setattr(parent, "resize", lambda self, image, size, resample: (size.height, size.width))
    clip = SimpleNamespace(shape=(1, n, 3, h, w))
    return proc.resize(clip, size=SizeDict(shortest_edge=SPEC.min_pixels, longest_edge=SPEC.max_pixels),
                       resample=None, factor=SPEC.factor, temporal_factor=SPEC.temporal_patch_size,
                       cap_pixels_per_frame=True)


@pytest.mark.parametrize("n", [2, 4, 6, 20, 64, 768])
@pytest.mark.parametrize("h, w", [(64, 96), (480, 640), (1080, 1920), (2160, 3840), (720, 1280), (50, 700), (31, 31)])
@pytest.mark.parametrize("frame_tokens", [64, 256, 768])
def test_target_size_is_the_reference_resize(monkeypatch, n, h, w, frame_tokens):
    ours = video.target_size(n, h, w, SPEC, frame_pixels=frame_tokens * SPEC.factor ** 2)
    assert ours == reference_size(n, h, w, frame_tokens, monkeypatch)
    proc = reference_video_processor(max_video_tokens=frame_tokens)
    patches = proc.get_num_of_video_patches(n, h, w)
    assert (n + n % 2) // 2 * (ours[0] // 16) * (ours[1] // 16) == patches


def test_patch_layout_is_the_reference_patchify():
    import torch

    rng = np.random.default_rng(0)
    frames = rng.standard_normal((4, 64, 96, 3)).astype(np.float32)
    ours, grid = video.patchify(frames, SPEC)
    ref, t, h, w = reference_video_processor().patchify(torch.from_numpy(frames).permute(0, 3, 1, 2)[None],
                                                        patch_size=16, merge_size=2, temporal_patch_size=2)
    assert grid == (t, h, w) == (2, 4, 6)
    np.testing.assert_array_equal(ours, ref[0].numpy())


def test_odd_count_pads_like_the_reference():
    import torch

    frames = [np.full((64, 64, 3), 40 * i, np.uint8) for i in range(3)]
    header = video.Header(64, 64, 10.0, 30)
    prepared = video.prepare(frames, [0, 14, 29], header, SPEC)
    normalised = (np.stack(frames).astype(np.float32) / 255 - 0.5) / 0.5
    ref, t, h, w = reference_video_processor().patchify(torch.from_numpy(normalised).permute(0, 3, 1, 2)[None],
                                                        patch_size=16, merge_size=2, temporal_patch_size=2)
    assert prepared.grid_thw == (t, h, w) == (2, 4, 4)
    np.testing.assert_allclose(prepared.pixel_values, ref[0].numpy(), atol=1e-6)


def test_placeholder_is_the_reference_replace_video_token():
    import torch
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    header = video.Header(64, 96, 10.0, 30)
    frames = [np.zeros((64, 96, 3), np.uint8)] * 5
    prepared = video.prepare(frames, [0, 7, 14, 22, 29], header, SPEC)
    proc = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           video_token="<|video_pad|>", vision_start_token="<|vision_start|>",
                           vision_end_token="<|vision_end|>")
    proc._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(proc, *a)
    inputs = {"video_grid_thw": torch.tensor([prepared.grid_thw]),
              "video_metadata": [VideoMetadata(total_num_frames=30, fps=10.0, frames_indices=[0, 7, 14, 22, 29])]}
    assert video.placeholder(prepared) == Qwen3VLProcessor.replace_video_token(proc, inputs, 0)
    assert video.placeholder(prepared).startswith("<0.3 seconds><|vision_start|><|video_pad|>")


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temporary files' folder, watched: nothing may be left in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    assert list(folder.iterdir()) == []


def bad_cases(tmp_path: Path) -> list:
    good = make_clip(tmp_path, "mp4v", fps=10.0, frames=30)
    empty_path = tmp_path / "empty.webm"
    w = cv2.VideoWriter(str(empty_path), cv2.VideoWriter_fourcc(*"VP80"), 10.0, (64, 64))
    w.release()
    return [
        ("empty", b"", video.Limits(), InvalidVideo),
        ("png", cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes(), video.Limits(), InvalidVideo),
        ("random bytes behind an MP4 magic", b"\0\0\0\x18ftypisom" + bytes(range(256)) * 8, video.Limits(), InvalidVideo),
        ("truncated", good[: len(good) // 3], video.Limits(), InvalidVideo),
        ("no frames", empty_path.read_bytes() if empty_path.exists() else b"\x1a\x45\xdf\xa3", video.Limits(),
         InvalidVideo),
        ("too many bytes", good, video.Limits(max_bytes=len(good) - 1), VideoTooLarge),
        ("too long", good, video.Limits(max_seconds=2.5), VideoTooLarge),
        ("frames too large", good, video.Limits(max_pixels=96 * 64 - 1), VideoTooLarge),
    ]


def test_bad_videos_are_refused_and_leave_no_file(tmp_path, private_tmp):
    for name, data, limits, error in bad_cases(tmp_path):
        with pytest.raises(error) as exc:
            video.load(data, SPEC, limits)
        assert exc.value.status == 400, name
        assert exc.value.code == ("invalid_video" if error is InvalidVideo else "video_too_large"), name


def test_a_good_clip_leaves_no_file(tmp_path, private_tmp):
    prepared = video.load(make_clip(tmp_path), SPEC)
    assert prepared.num_tokens > 0 and prepared.digest


# --------------------------------------------------------------------------- frames resized as read (issue 31)

@pytest.mark.parametrize("pixels", [None, 64 * 32 * 32])
def test_frames_resized_as_read_give_the_same_bits(pixels):
    """`load` resizes each frame as it is read (never a full-size stack); the result is the one the
    reference-checked whole-clip path (`decode` then `prepare`) gives, bit for bit."""
    data = FIXTURE.read_bytes()
    ours = video.load(data, SPEC, frame_pixels=pixels)
    frames, indices, header = video.decode(data, SPEC)
    ref = video.prepare(frames, indices, header, SPEC, pixels)
    assert ours.grid_thw == ref.grid_thw and ours.source_size == ref.source_size and ours.digest == ref.digest
    assert np.array_equal(ours.pixel_values, ref.pixel_values)


def test_only_model_sized_frames_are_kept(tmp_path):
    """Frames 4x the model's size on a side are area-halved first (`reduction`), then resized; what
    the decode hands over is already the model's size, and the grid is the full-size frame's."""
    data = make_clip(tmp_path, "mp4v", fps=10.0, frames=10, size=(1024, 768))
    pixels = 16 * 32 * 32  # a 128x96 frame: 1024x768 is 8x it, so it is halved by area twice
    frames, indices, header = video.decode(data, SPEC, frame_pixels=pixels, resize=True)
    h, w = video.target_size(len(indices), 768, 1024, SPEC, pixels)
    assert header.source_size == (768, 1024) and video.reduction(768, 1024, (h, w)) == 4
    assert all(f.shape == (h, w, 3) for f in frames)
    ours = video.load(data, SPEC, frame_pixels=pixels)
    full, indices, header = video.decode(data, SPEC)
    ref = video.prepare(full, indices, header, SPEC, pixels)
    assert ours.grid_thw == ref.grid_thw and ours.source_size == (768, 1024)
    assert np.abs(ours.pixel_values - ref.pixel_values).mean() < 0.02  # flat frames: the same picture
    assert video.reduction(300, 400, (96, 128)) == 0  # under 4x: exactly the reference's resize
