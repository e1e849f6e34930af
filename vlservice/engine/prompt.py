"""The chat template to tokens: one placeholder per image expanded to its number of tokens, one
per video to its timestamped frame patches (as `Qwen3VLProcessor` expands them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"


@dataclass
class Prompt:
    input_ids: list
    image_grids: list = field(default_factory=list)  # (1, h, w) per image, in order
    video_grids: list = field(default_factory=list)  # (t, h, w) per video, in order
    media: list = field(default_factory=list)  # "image" or "video" per item, in prompt order

    def __len__(self) -> int:
        return len(self.input_ids)

    def image_spans(self, image_token_id: int) -> list[tuple[int, int]]:
        """(start, end) of each run of `image_token_id` placeholder tokens, in order."""
        spans, start = [], None
        for i, t in enumerate(self.input_ids):
            if t == image_token_id and start is None:
                start = i
            elif t != image_token_id and start is not None:
                spans.append((start, i))
                start = None
        if start is not None:
            spans.append((start, len(self.input_ids)))
        return spans

    def media_spans(self, image_token_id: int, video_token_id: int) -> list[tuple[int, int]]:
        """(start, end) of each image's and video's tokens, in prompt order. A video's span runs from
        its first temporal patch's tokens to its last one's (the timestamps between included)."""
        images = iter(self.image_spans(image_token_id))
        videos = iter(self.image_spans(video_token_id))  # one run per temporal patch
        grids = iter(self.video_grids)
        spans = []
        for kind in self.media or ["image"] * len(self.image_grids):
            if kind == "image":
                spans.append(next(images))
            else:
                runs = [next(videos) for _ in range(next(grids)[0])]
                spans.append((runs[0][0], runs[-1][1]))
        return spans


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The chat template's text, with one `<|image_pad|>` per image and one `<|video_pad|>` per video
    (as the processor expects)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_prompt(tokenizer, messages: list[dict], image_tokens: list[int], image_grids: list,
                 videos: tuple | list = ()) -> Prompt:
    """Expand each image placeholder to its number of tokens and each video placeholder to its
    text (`videos`: (placeholder text, grid) per video, see `video.placeholder`), then tokenize."""
    text = render_chat(tokenizer, messages)
    pieces = re.split(f"({re.escape(IMAGE_PAD)}|{re.escape(VIDEO_PAD)})", text)
    kinds = ["image" if p == IMAGE_PAD else "video" for p in pieces[1::2]]
    if kinds.count("image") != len(image_tokens) or kinds.count("video") != len(videos):
        raise ValueError(f"the chat template produced {kinds.count('image')} image and {kinds.count('video')} "
                         f"video slots for {len(image_tokens)} images and {len(videos)} videos")
    images, clips = iter(image_tokens), iter(videos)
    out = [pieces[0]]
    for kind, rest in zip(kinds, pieces[2::2]):
        out.append(IMAGE_PAD * next(images) if kind == "image" else next(clips)[0])
        out.append(rest)
    ids = tokenizer("".join(out), add_special_tokens=False)["input_ids"]
    return Prompt(input_ids=ids, image_grids=list(image_grids), video_grids=[tuple(g) for _, g in videos],
                  media=kinds)
