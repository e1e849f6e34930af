"""A request made ready for the scheduler, in the caller's thread: its images and clips decoded and
preprocessed (at most `VL_MEDIA_DECODES` at once in the process, the bound on decode memory), their
feature-cache keys, and the chat rendered to a prompt with each item's tokens in place."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Callable

from ...config import Settings
from ...errors import APIError, Cancelled, ContextLengthExceeded, QueueTimeout
from . import images as imgs
from . import video as vid
from ..caches import feature_key
from ..prompt import Prompt, build_prompt, text_tokens_at_least
from ..types import ImageInput, VideoInput


GONE_CHECK_S = 0.2  # how often a request waiting for a decode turn looks whether its client left


class MediaPreparer:
    """Decodes, checks and preprocesses a request's media with the model's specs and the limits."""

    def __init__(self, settings: Settings, spec: imgs.ImageSpec, video_spec: vid.VideoSpec, limits: imgs.Limits,
                 video_limits: vid.Limits, retry_after: Callable[[], int]):
        self.settings = settings
        self.spec, self.video_spec = spec, video_spec
        self.limits, self.video_limits = limits, video_limits
        self.retry_after = retry_after  # seconds a refused client should wait (the service's estimate)
        self._decoding = threading.BoundedSemaphore(settings.media_decodes)

    @contextlib.contextmanager
    def decode_turn(self, gone: Callable[[], bool] = lambda: False):
        """One of the VL_MEDIA_DECODES turns to decode an image or a clip; waiting longer than
        VL_QUEUE_TIMEOUT_S for one is a 503 `queue_timeout`, like waiting for a slot, and a client
        that leaves meanwhile (`gone`) stops waiting within `GONE_CHECK_S`."""
        deadline = time.monotonic() + self.settings.queue_timeout_s
        while not self._decoding.acquire(timeout=min(GONE_CHECK_S, max(0.0, deadline - time.monotonic()))):
            if gone():
                raise Cancelled("the client left while the request waited to decode its media")
            if time.monotonic() >= deadline:
                raise QueueTimeout(f"no turn to decode the media within {self.settings.queue_timeout_s:g} s; "
                                   "retry later", retry_after=self.retry_after())
        try:
            yield
        finally:
            self._decoding.release()

    def video(self, clip: VideoInput, gone: Callable[[], bool] = lambda: False) -> vid.PreparedVideo:
        """Decode, sample and preprocess one clip (bad input: an APIError naming its part)."""
        try:
            with self.decode_turn(gone):
                return vid.load(clip.data, self.video_spec, self.video_limits, clip.fps, clip.max_frames,
                                clip.max_pixels or self.settings.video_frame_pixels(clip.detail), clip.min_frames)
        except APIError as exc:
            exc.param = exc.param or clip.param
            raise

    def image(self, img: ImageInput, budget: int, gone: Callable[[], bool] = lambda: False) -> imgs.Prepared:
        """Decode, check and preprocess one image to `budget` pixels (bad input: an APIError naming its part)."""
        try:
            with self.decode_turn(gone):
                return imgs.load(img.data, self.spec, self.limits, budget, img.min_pixels)
        except APIError as exc:
            exc.param = exc.param or img.param
            raise

    def prepare(self, media: list, model_fp: str, encoder: str,
                gone: Callable[[], bool] = lambda: False) -> tuple[list, list, dict]:
        """Every item of `media` (in prompt order): (prepared items, their feature-cache keys for
        the encoder named `encoder`, the decode and preprocess timings in milliseconds). A client
        that leaves (`gone`) stops the work before its next item and while it waits for a turn."""
        decode_s = prep_s = 0.0
        prepared: list[imgs.Prepared | vid.PreparedVideo] = []
        keys = []
        video_timings: dict = {}
        for item in media:
            if gone():
                raise Cancelled("the client left while its media were being decoded")
            if isinstance(item, VideoInput):
                v = self.video(item, gone)
                for k, ms in v.timings.items():
                    video_timings[k] = video_timings.get(k, 0.0) + ms
                budget = item.max_pixels or self.settings.video_frame_pixels(item.detail)
                prepared.append(v)
                keys.append(feature_key(v.digest, v.grid_thw, budget, model_fp, encoder))
                continue
            budget = item.max_pixels or self.settings.detail_pixels(item.detail)
            p = self.image(item, budget, gone)
            decode_s += p.timings["image_decode_ms"] / 1e3
            prep_s += p.timings["preprocess_ms"] / 1e3
            prepared.append(p)
            keys.append(feature_key(p.digest, p.grid_thw, budget, model_fp, encoder))
        return prepared, keys, {"image_decode_ms": decode_s * 1e3, "preprocess_ms": prep_s * 1e3, **video_timings}


def check_text_fits(tokenizer, messages: list, tools: list, max_tokens: int, context: int) -> None:
    """Refuses a request whose text alone cannot fit the context, before the chat template renders
    it or the tokenizer reads it whole: their memory grows about 200x a text's size, this check's
    stays bounded (`text_tokens_at_least`)."""
    texts = [p for m in messages for p in m.parts if isinstance(p, str)]
    texts += [c["name"] + c["arguments"] for m in messages for c in m.tool_calls]
    if tools:
        texts.append(json.dumps(tools, ensure_ascii=False))
    budget = context - max_tokens
    need = text_tokens_at_least(tokenizer, texts, budget)
    if need > budget:
        raise ContextLengthExceeded(
            f"the request's text alone needs at least {need} tokens plus max_tokens={max_tokens}, more than "
            f"the context limit of {context} tokens", param="messages")


def chat_prompt(tokenizer, messages: list, prepared: list, tools: list | None = None) -> Prompt:
    """The engine's messages rendered by the model's chat template, each image or clip in `prepared`
    (in prompt order) expanded to its tokens; `tools` as the template renders them."""
    chat, it = [], iter(prepared)
    for m in messages:
        calls = {"tool_calls": [{"type": "function", "function": c} for c in m.tool_calls]} if m.tool_calls else {}
        if all(isinstance(p, str) for p in m.parts):
            chat.append({"role": m.role, "content": "".join(m.parts), **calls})
            continue
        content = []
        for p in m.parts:
            if isinstance(p, (ImageInput, VideoInput)):
                next(it)
                content.append({"type": "image" if isinstance(p, ImageInput) else "video"})
            else:
                content.append({"type": "text", "text": p})
        chat.append({"role": m.role, "content": content, **calls})
    images = [p for p in prepared if not isinstance(p, vid.PreparedVideo)]
    videos = [(vid.placeholder(p), p.grid_thw) for p in prepared if isinstance(p, vid.PreparedVideo)]
    return build_prompt(tokenizer, chat, [p.num_tokens for p in images], [p.grid_thw for p in images],
                        videos, tools=tools or None)


def media_tokens(prepared: list) -> dict:
    """`image_tokens` always, and `video_tokens` / `video_frames` when the request has a video."""
    videos = [p for p in prepared if isinstance(p, vid.PreparedVideo)]
    out = {"image_tokens": sum(p.num_tokens for p in prepared if not isinstance(p, vid.PreparedVideo))}
    if videos:
        out["video_tokens"] = sum(p.num_tokens for p in videos)
        out["video_frames"] = sum(len(p.frame_indices) for p in videos)
    return out
