"""Video bytes in, the model's `pixel_values_videos`, `video_grid_thw` and frame timestamps out:
OpenCV (the FFmpeg inside opencv-python-headless) and numpy only, no torch.

Why not the Hugging Face path: `Qwen3VLVideoProcessor` decodes with torchvision/PyAV/decord and
resizes with torchvision, none of which loads beside our CPU torch. This module does what it does,
step by step, with the same numbers (tests/unit/test_video.py compares each rule with the
reference's own code where that code runs without torchvision):

1. check the container from its first bytes (MP4/MOV, WebM/Matroska, AVI) and its header
   (frame size, frame rate, frame count, duration) against the limits, before any frame is decoded;
2. sample as `Qwen3VLVideoProcessor.sample_frames` does: `int(frames / video_fps * fps)` frames,
   at least `min_frames` (4), at most `max_frames` and the frame count, at
   `linspace(0, frames - 1, n).round()`; an odd count repeats its last frame (the model merges two
   frames per temporal patch), as the reference's `patchify` does;
3. decode in one sequential pass (grab every frame, retrieve only the sampled ones: seeking is
   not frame-exact for every codec), from a temporary file that is removed before returning;
4. one size for all frames from the per-video pixel budget of the reference `resize` with
   `cap_pixels_per_frame` (qwen-vl-utils' rule: per frame at most `max_video_tokens` patches or
   the budget's share, floored at 1.05 x the minimum), where the request's `detail` lowers the
   per-frame cap; resized with the same PIL-exact antialiased bicubic as images;
5. normalise and patchify into the processor's `(t*h*w, C*T*P*P)` layout;
6. the timestamp of each temporal patch, as `Qwen3VLProcessor._calculate_timestamps`: the mean
   of its first and last frame's time, written `<x.x seconds>` before the patch's tokens.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from ...errors import InvalidVideo, VideoTooLarge
from .images import _resample_axis, _to_rgb8

DEFAULT_FPS = 2.0  # Qwen3VLVideoProcessor.fps


@dataclass(frozen=True)
class VideoSpec:
    """The model's video settings: `video_preprocessor_config.json` if the checkpoint has one, else
    the values Qwen3-VL-2B-Instruct ships (size 4096..25165824 pixels, fps 2, 4..768 frames)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    min_pixels: int = 4096  # size.shortest_edge
    max_pixels: int = 25165824  # size.longest_edge: the whole clip's budget
    max_video_tokens: int = 768  # per-frame cap in patches of factor x factor (qwen-vl-utils)
    fps: float = DEFAULT_FPS
    min_frames: int = 4
    max_frames: int = 768

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_checkpoint(cls, model_dir: Path, image_cfg: dict) -> "VideoSpec":
        import json

        path = Path(model_dir) / "video_preprocessor_config.json"
        cfg = json.loads(path.read_text()) if path.is_file() else {}
        base = {**{k: image_cfg[k] for k in ("patch_size", "merge_size", "temporal_patch_size", "image_mean",
                                             "image_std") if k in image_cfg}, **cfg}
        size = base.get("size") or {}
        d = cls()
        return cls(
            patch_size=int(base.get("patch_size", d.patch_size)),
            merge_size=int(base.get("merge_size", d.merge_size)),
            temporal_patch_size=int(base.get("temporal_patch_size", d.temporal_patch_size)),
            image_mean=tuple(float(x) for x in base.get("image_mean", d.image_mean)),
            image_std=tuple(float(x) for x in base.get("image_std", d.image_std)),
            min_pixels=int(size.get("shortest_edge") or d.min_pixels),
            max_pixels=int(size.get("longest_edge") or d.max_pixels),
            max_video_tokens=int(base.get("max_video_tokens", d.max_video_tokens)),
            fps=float(base.get("fps") or d.fps),
            min_frames=int(base.get("min_frames", d.min_frames)),
            max_frames=int(base.get("max_frames", d.max_frames)),
        )


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 64 * 1024 * 1024
    max_seconds: float = 120.0
    max_frames: int = 64  # sampled frames (after the odd count is made even)
    max_pixels: int = 40_000_000  # one frame's width x height: the header's, then each decoded frame's


@dataclass
class PreparedVideo:
    """One clip, ready for the vision encoder and the prompt."""

    clip: np.ndarray  # (T, height, width, 3) uint8 at the model's size, T padded to pairs: 4x smaller than its pixel values
    grid_thw: tuple  # (grid_t, grid_h, grid_w)
    size: tuple  # (height, width) after resize
    source_size: tuple  # (height, width) as decoded
    timestamps: list  # seconds, one per temporal patch
    frame_indices: list  # sampled frame indices (before the odd count is padded)
    video_fps: float
    duration_s: float
    digest: str = ""
    timings: dict = field(default_factory=dict)  # video_decode_ms, video_preprocess_ms
    spec: VideoSpec = field(default_factory=VideoSpec)

    @property
    def pixel_values(self) -> np.ndarray:
        """(t*h*w, C*T*P*P) float32, computed when asked (the encoder's input): a request waiting
        for its turn holds only the uint8 frames."""
        normalised = self.clip.astype(np.float32)
        normalised *= np.float32(1 / 255)  # in place: the same float32 operations, one float copy
        normalised -= np.asarray(self.spec.image_mean, dtype=np.float32)
        normalised /= np.asarray(self.spec.image_std, dtype=np.float32)
        return patchify(normalised, self.spec)[0]

    @property
    def num_tokens(self) -> int:
        return self.grid_thw[0] * self.grid_thw[1] * self.grid_thw[2] // 4

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one temporal patch (two sampled frames)."""
        return self.grid_thw[1] * self.grid_thw[2] // 4


# --------------------------------------------------------------------------- the reference's rules

def sample_indices(total: int, video_fps: float, fps: float, min_frames: int, max_frames: int) -> np.ndarray:
    """`Qwen3VLVideoProcessor.sample_frames` with metadata: which frames to keep."""
    n = int(total / video_fps * fps)
    n = min(max(n, min_frames), max_frames, total)
    return np.linspace(0, total - 1, n).round().astype(int)


def timestamps(indices, video_fps: float, temporal_patch_size: int) -> list[float]:
    """`Qwen3VLProcessor._calculate_timestamps`: one time per temporal patch."""
    idx = [int(i) for i in indices]
    if len(idx) % temporal_patch_size:
        idx.extend(idx[-1] for _ in range(temporal_patch_size - len(idx) % temporal_patch_size))
    t = [i / video_fps for i in idx]
    return [(t[i] + t[i + temporal_patch_size - 1]) / 2 for i in range(0, len(t), temporal_patch_size)]


def smart_resize(num_frames: int, height: int, width: int, temporal_factor: int, factor: int,
                 min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The video processor's `smart_resize`, to the letter."""
    if num_frames < temporal_factor:
        raise InvalidVideo(f"t:{num_frames} must be larger than temporal_factor:{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise InvalidVideo(f"absolute aspect ratio must be smaller than 200, got "
                           f"{max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def clip_budget(num_frames: int, spec: VideoSpec, frame_pixels: int | None = None) -> int:
    """The reference `resize`'s budget with `cap_pixels_per_frame`; `frame_pixels` (the request's
    detail) can only lower the per-frame cap."""
    frame_cap = spec.max_video_tokens * spec.factor * spec.factor
    if frame_pixels is not None:
        frame_cap = min(frame_cap, frame_pixels)
    per_frame = max(min(frame_cap, spec.max_pixels // num_frames), int(spec.min_pixels * 1.05))
    return per_frame * num_frames


def target_size(num_frames: int, height: int, width: int, spec: VideoSpec,
                frame_pixels: int | None = None) -> tuple[int, int]:
    # A single sampled frame is padded to a pair before the reference would refuse it.
    n = max(num_frames, spec.temporal_patch_size)
    return smart_resize(n, height, width, spec.temporal_patch_size, spec.factor, spec.min_pixels,
                        clip_budget(n, spec, frame_pixels))


def patchify(frames: np.ndarray, spec: VideoSpec) -> tuple[np.ndarray, tuple]:
    """(T, H, W, C) normalised float32 (T a multiple of the temporal patch) to the processor's
    flat layout: its `view(...).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)` without the batch axis."""
    p, m, tp = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    t, h, w, c = frames.shape
    gt, gh, gw = t // tp, h // p, w // p
    # A view of the (T, H, W, C) frames, then one transpose and one copy (the same order as the
    # reference's channels-first view; never a second full-size float temporary).
    x = np.asarray(frames, dtype=np.float32).reshape(gt, tp, gh // m, m, p, gw // m, m, p, c)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x).reshape(gt * gh * gw, c * tp * p * p), (gt, gh, gw)


# --------------------------------------------------------------------------- container check

def sniff(data: bytes) -> str:
    """The container, from its first bytes; InvalidVideo if it is none we read."""
    if len(data) == 0:
        raise InvalidVideo("the video is empty (0 bytes)")
    if data[4:8] == b"ftyp":
        return "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    raise InvalidVideo("the data is not a supported video (MP4/MOV, WebM/Matroska or AVI)")


@dataclass
class Header:
    width: int
    height: int
    fps: float
    frames: int
    source_size: tuple | None = None  # (height, width) of the frames as decoded, once one is read

    @property
    def duration_s(self) -> float:
        return self.frames / self.fps


def _header(cap, limits: Limits) -> Header:
    w, h = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    fps, frames = float(cap.get(cv2.CAP_PROP_FPS)), cap.get(cv2.CAP_PROP_FRAME_COUNT)
    if w <= 0 or h <= 0:
        raise InvalidVideo(f"the video declares an empty frame size ({w}x{h})")
    if w * h > limits.max_pixels:
        raise VideoTooLarge(f"the video's frames are {w}x{h} = {w * h} pixels; the limit is {limits.max_pixels}")
    if not math.isfinite(fps) or not 0 < fps <= 1000:
        raise InvalidVideo(f"the video declares an unusable frame rate ({fps:g} frames per second)")
    if not math.isfinite(frames) or frames < 1:
        return Header(w, h, fps, 0)  # no count (a streamed WebM, as browsers record them): `_count` it
    header = Header(w, h, fps, int(frames))
    if header.duration_s > limits.max_seconds:
        raise VideoTooLarge(f"the video is {header.duration_s:.1f} s long ({header.frames} frames at {fps:g} fps); "
                            f"the limit is {limits.max_seconds:g} s")
    return header


def _count(cap, header: Header, limits: Limits) -> int:
    """Frames of a clip whose container does not say, by decoding at most the duration limit's."""
    most = int(limits.max_seconds * header.fps)
    n = 0
    while cap.grab():
        n += 1
        if n > most:
            raise VideoTooLarge(f"the video is longer than the limit of {limits.max_seconds:g} s "
                                f"(more than {most} frames at {header.fps:g} fps)")
    if n == 0:
        raise InvalidVideo("the video has no frame that could be decoded")
    return n


def _open(name: str, kind: str):
    # one decoding thread: FFmpeg's frame threads each hold frames (memory), and the cores are the model's
    cap = cv2.VideoCapture(name, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    if not cap.isOpened():
        cap.release()
        raise InvalidVideo(f"the {kind.upper()} data could not be opened (truncated or corrupt)")
    return cap


# --------------------------------------------------------------------------- decode + prepare

def decode(data: bytes, spec: VideoSpec, limits: Limits = Limits(), fps: float | None = None,
           max_frames: int | None = None, frame_pixels: int | None = None,
           resize: bool = False, min_frames: int | None = None) -> tuple[list, np.ndarray, Header]:
    """Bytes to (sampled RGB frames, their indices, the header), or InvalidVideo / VideoTooLarge
    (before decoding when the header tells). The temporary file FFmpeg reads from is gone when this
    returns, whatever happened. `resize`: each sampled frame is resized to the clip's model size
    (`target_size` with `frame_pixels`) as soon as it is read, so at most one full-size frame exists
    at a time (`header.source_size` keeps the size as decoded)."""
    if len(data) > limits.max_bytes:
        raise VideoTooLarge(f"the video is {len(data)} bytes; the limit is {limits.max_bytes} bytes")
    kind = sniff(data)
    cap_frames = min(max_frames or limits.max_frames, limits.max_frames, spec.max_frames)
    cap_frames -= cap_frames % spec.temporal_patch_size  # an odd count would be padded past the cap
    if cap_frames < spec.temporal_patch_size:
        raise InvalidVideo(f"max_frames must allow at least {spec.temporal_patch_size} frames")
    fd, name = tempfile.mkstemp(prefix="vlservice-video-", suffix="." + kind)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        cap = _open(name, kind)
        try:
            header = _header(cap, limits)
            if header.frames == 0:
                header.frames = _count(cap, header, limits)
                cap.release()
                cap = _open(name, kind)
            least = spec.min_frames if min_frames is None else min(min_frames, cap_frames)
            indices = sample_indices(header.frames, header.fps, fps or spec.fps, least, cap_frames)
            size_of = (lambda h0, w0: target_size(len(indices), h0, w0, spec, frame_pixels)) if resize else None
            return _read(cap, header, indices, size_of, limits.max_pixels), indices, header
        finally:
            cap.release()
    finally:
        os.unlink(name)


def load(data: bytes, spec: VideoSpec, limits: Limits = Limits(), fps: float | None = None,
         max_frames: int | None = None, frame_pixels: int | None = None,
         min_frames: int | None = None) -> PreparedVideo:
    """Bytes to a `PreparedVideo` (decode, then prepare), with the time each step took."""
    t0 = time.perf_counter()
    frames, indices, header = decode(data, spec, limits, fps, max_frames, frame_pixels, resize=True,
                                     min_frames=min_frames)
    t1 = time.perf_counter()
    prepared = prepare(frames, indices, header, spec, frame_pixels, source_size=header.source_size)
    prepared.timings = {"video_decode_ms": (t1 - t0) * 1e3, "video_preprocess_ms": (time.perf_counter() - t1) * 1e3}
    return prepared


def _read(cap, header: Header, indices: np.ndarray, size_of=None,
          max_pixels: int = Limits.max_pixels) -> list[np.ndarray]:
    """The sampled frames (RGB uint8), in one pass. Containers may overstate their frame count by
    a frame or two (the count is estimated from the duration): the missing tail repeats the last
    frame read; a stream that ends sooner than that is truncated. `size_of(h0, w0) -> (h, w)`: each
    frame is resized to it as it is read (the full-size frame is dropped before the next is read)."""
    wanted, i = [int(x) for x in indices], 0
    out: list[np.ndarray] = []
    source: tuple | None = None
    target: tuple = ()
    while len(out) < len(wanted) and cap.grab():
        if wanted[len(out)] == i:  # indices are distinct and increasing (n <= frames)
            ok, frame = cap.retrieve()
            if not ok or frame is None:
                raise InvalidVideo(f"frame {i} of the video could not be decoded (corrupt)")
            _check_frame(frame, max_pixels, i)
            if source is None:
                source = frame.shape[:2]
                target = size_of(*source) if size_of else source
            elif frame.shape[:2] != source:
                raise InvalidVideo("the video's frame size changes within the stream")
            rgb = _to_rgb8(frame)
            del frame
            if r := reduction(rgb.shape[0], rgb.shape[1], target):
                rgb = cv2.resize(rgb, (rgb.shape[1] // r, rgb.shape[0] // r), interpolation=cv2.INTER_AREA)
            if rgb.shape[1] != target[1]:
                rgb = _resample_axis(rgb, target[1], axis=1)
            if rgb.shape[0] != target[0]:
                rgb = _resample_axis(rgb, target[0], axis=0)
            out.append(rgb)
        i += 1
    if not out:
        raise InvalidVideo("no frame of the video could be decoded (truncated or corrupt)")
    missing = len(wanted) - len(out)
    if missing and header.frames - i > max(2, header.frames // 100):
        raise InvalidVideo(f"the video is truncated: it declares {header.frames} frames but only {i} could be decoded")
    out.extend([out[-1]] * missing)
    if any(f.shape != out[0].shape for f in out):
        raise InvalidVideo("the video's frame size changes within the stream")
    header.source_size = source
    return out


def _check_frame(frame: np.ndarray, max_pixels: int, i: int) -> None:
    """A decoded frame's real size against the limit, before any work on it: the container's header
    (checked in `_header`) may claim 64x64 for a stream of 8000x8000 frames."""
    h, w = frame.shape[:2]
    if h * w > max_pixels:
        raise VideoTooLarge(f"frame {i} of the video is {w}x{h} = {w * h} pixels (its header said less); "
                            f"the limit is {max_pixels}")


def reduction(height: int, width: int, target: tuple) -> int:
    """FFmpeg (through OpenCV) cannot decode a frame reduced, as libjpeg can: a frame at least 4x
    the model's size on each side is first shrunk by an area average of 2, 4 or 8 (cheap, exact
    for whole factors) to no less than twice that size, then resized by the PIL-exact bicubic as
    any frame. 0: no pre-reduction (every clip up to 4x the model's size is resized exactly as
    the reference does)."""
    for r in (8, 4, 2):
        if height // r >= 2 * target[0] and width // r >= 2 * target[1]:
            return r
    return 0


def prepare(frames: list, indices, header: Header, spec: VideoSpec,
            frame_pixels: int | None = None, source_size: tuple | None = None) -> PreparedVideo:
    """Sampled RGB frames to pixel values: one size for all, normalise, pad to pairs, patchify.
    `source_size`: the (height, width) as decoded when the frames were already resized as read."""
    h0, w0 = source_size or frames[0].shape[:2]
    h, w = target_size(len(frames), h0, w0, spec, frame_pixels)
    clip = np.stack(frames)
    del frames
    if clip.shape[2] != w:
        clip = _resample_axis(clip, w, axis=2)
    if clip.shape[1] != h:
        clip = _resample_axis(clip, h, axis=1)
    if pad := -len(clip) % spec.temporal_patch_size:
        clip = np.concatenate([clip, np.repeat(clip[-1:], pad, axis=0)])
    tp, p = spec.temporal_patch_size, spec.patch_size
    grid = (len(clip) // tp, h // p, w // p)
    digest = hashlib.blake2b(clip.tobytes(), digest_size=16, person=f"v{len(clip)}x{h}x{w}".encode()[:16]).hexdigest()
    return PreparedVideo(clip=clip, spec=spec, grid_thw=grid, size=(h, w), source_size=(h0, w0),
                         timestamps=timestamps(indices, header.fps, spec.temporal_patch_size),
                         frame_indices=[int(i) for i in indices], video_fps=header.fps,
                         duration_s=header.duration_s, digest=digest)


def placeholder(prepared: PreparedVideo, video_token: str = "<|video_pad|>", start: str = "<|vision_start|>",
                end: str = "<|vision_end|>") -> str:
    """What `Qwen3VLProcessor.replace_video_token` puts in place of one `<|video_pad|>`."""
    n = prepared.tokens_per_frame
    return "".join(f"<{t:.1f} seconds>{start}{video_token * n}{end}" for t in prepared.timestamps)
