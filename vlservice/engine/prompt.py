"""The chat template to tokens: one placeholder per image expanded to its number of tokens, one
per video to its timestamped frame patches (as `Qwen3VLProcessor` expands them). What a client
wrote is tokenized as text: only the template's own markers are control tokens."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from tokenizers import Tokenizer

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


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The chat template's text, with one `<|image_pad|>` per image and one `<|video_pad|>` per video
    (as the processor expects), and the tools where the template lists them."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)


def build_prompt(tokenizer, messages: list[dict], image_tokens: list[int], image_grids: list,
                 videos: tuple | list = (), tools: list[dict] | None = None) -> Prompt:
    """Expand each image placeholder to its number of tokens and each video placeholder to its
    text (`videos`: (placeholder text, grid) per video, see `video.placeholder`), then tokenize.

    The template is rendered with every client text replaced by a slot (`_hide`), so only the
    template's own markers become control tokens and only its media slots are counted; the texts
    are spliced back in as text (`encode`): a typed `<|im_start|>` or `<|image_pad|>` is text to the
    model, as in OpenAI's API, and can neither forge a turn nor claim an image's place. Tools and
    tool calls are client text too: a tool's JSON (which the template writes with `tojson`) and a
    call's name and arguments go in as slots the same way."""
    texts: list[str] = []
    hidden = _hide(messages, texts)
    # a tool stands in the template as a dict naming its slot, which `tojson` writes as JSON
    slots = [_slot(texts, json.dumps(t, ensure_ascii=False)) for t in tools or []]
    stand_ins = [{"type": "function", "function": {"name": slot}} for slot in slots]
    rendered = render_chat(tokenizer, hidden, stand_ins or None)
    for slot, t in zip(slots, stand_ins):
        rendered = rendered.replace(json.dumps(t, ensure_ascii=False), slot)
    runs = _SLOT.split(rendered)  # template, slot index, template, ...
    kinds = ["image" if p == IMAGE_PAD else "video" for run in runs[0::2] for p in _MEDIA.findall(run)]
    if kinds.count("image") != len(image_tokens) or kinds.count("video") != len(videos):
        raise ValueError(f"the chat template produced {kinds.count('image')} image and {kinds.count('video')} "
                         f"video slots for {len(image_tokens)} images and {len(videos)} videos")
    images, clips = iter(image_tokens), iter(videos)

    def expand(slot: re.Match) -> str:
        return IMAGE_PAD * next(images) if slot.group() == IMAGE_PAD else next(clips)[0]

    segments = [(texts[int(run)], False) if i % 2 else (_MEDIA.sub(expand, run), True) for i, run in enumerate(runs)]
    return Prompt(input_ids=encode(tokenizer, segments), image_grids=list(image_grids),
                  video_grids=[tuple(g) for _, g in videos], media=kinds)


# A client text's slot in the rendered template: NUL never comes from the template, and the texts
# are not in the rendered string at all, so a client cannot write one.
_SLOT = re.compile("\x00([0-9]+)\x00")
_MEDIA = re.compile(f"{re.escape(IMAGE_PAD)}|{re.escape(VIDEO_PAD)}")


def _slot(texts: list[str], text: str) -> str:
    texts.append(text)
    return f"\x00{len(texts) - 1}\x00"


def _hide(messages: list[dict], texts: list[str]) -> list[dict]:
    """`messages` with each text (a string content, a text part's `text`, a tool call's name and
    arguments) moved to `texts` and replaced by its slot: the template then cannot see, split or
    match on what a client wrote. An empty text stays empty (the template tests it as false)."""

    def slot(text: str) -> str:
        return _slot(texts, text) if text else text

    def parts(content):
        if isinstance(content, str):
            return slot(content)
        if isinstance(content, list):
            return [{**p, "text": slot(p["text"])} if isinstance(p.get("text"), str) else p for p in content]
        return content

    def calls(m: dict) -> dict:
        if not m.get("tool_calls"):
            return {}
        return {"tool_calls": [{**c, "function": {"name": slot(c["function"]["name"]),
                                                  "arguments": slot(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]}

    return [{**m, "content": parts(m.get("content")), **calls(m)} for m in messages]


@dataclass(frozen=True)
class _Vocab:
    plain: Tokenizer  # the same tokenizer without its added tokens: everything it reads is text
    controls: re.Pattern  # the added tokens' strings, longest first (one capture group)
    ids: dict  # added token string -> id


@lru_cache(maxsize=8)
def _vocab(tokenizer) -> _Vocab:
    """Built once per tokenizer. The plain tokenizer is the checkpoint's own (normalizer, pre-
    tokenizer, BPE) minus the added vocabulary, so text between markers gets exactly the ids the
    full tokenizer gives it; `split_special_tokens` would still match the non-special added tokens
    (`<think>`, `<tool_call>`)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.update(added_tokens=[], truncation=None, padding=None)
    ids = dict(tokenizer.added_tokens_encoder)
    names = sorted(ids, key=len, reverse=True)
    return _Vocab(Tokenizer.from_str(json.dumps(spec)), re.compile(f"({'|'.join(map(re.escape, names))})"), ids)


# Qwen2's pre-tokenizer (Split on this pattern, then ByteLevel): no piece it cuts text into runs
# from a non-space character into a following space, and it looks back at nothing, so text cut
# just before such a space tokenizes as its two halves do, id for id.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
_CUT = re.compile(r"(?<=\S) ")
SLICE_CHARS = 16_384  # text tokenized at a time while counting: the tokenizer's memory is per slice


@dataclass(frozen=True)
class _Bound:
    longest: int  # bytes of the longest token of the plain vocabulary: tokens >= bytes / longest
    cuts: bool  # the pre-tokenizer is Qwen2's, so text may be counted slice by slice


@lru_cache(maxsize=8)
def _bound(tokenizer) -> _Bound:
    vocab = _vocab(tokenizer)
    spec = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    splits = [p for p in spec.get("pretokenizers", []) if p.get("type") == "Split"]
    cuts = len(splits) == 1 and splits[0].get("pattern", {}).get("Regex") == _QWEN2_SPLIT
    longest = max(len(t.encode("utf-8")) for t in vocab.plain.get_vocab())
    return _Bound(longest=max(1, longest), cuts=cuts)


def text_tokens_at_least(tokenizer, texts: list[str], stop_at: int) -> int:
    """A lower bound of the tokens `texts` take as text, computed in memory bounded by
    `SLICE_CHARS` and stopping once it passes `stop_at`: work before a request is refused for its
    length is bounded by the context, not by the text's size. Exact where the text can be cut at
    a space that follows a non-space within every `SLICE_CHARS`; elsewhere characters / the
    longest token's bytes, which no tokenization can go below."""
    b = _bound(tokenizer)
    total = 0
    for text in texts:
        size = len(text)  # characters: no more than its UTF-8 bytes, and costs no copy
        if (total + size // b.longest > stop_at) or not b.cuts:
            total += size // b.longest
        else:
            total += _count_slices(_vocab(tokenizer).plain, text, stop_at - total, b.longest)
        if total > stop_at:
            break
    return total


def _count_slices(plain: Tokenizer, text: str, stop_at: int, longest: int) -> int:
    total, start = 0, 0
    while start < len(text) and total <= stop_at:
        end = len(text)
        if end - start > SLICE_CHARS:
            cut = _CUT.search(text, start + SLICE_CHARS // 2, start + SLICE_CHARS)
            if cut is None:  # no safe cut near: the rest counts by its bytes
                return total + (len(text) - start) // longest
            end = cut.start()
        total += len(plain.encode(text[start:end], add_special_tokens=False).ids)
        start = end
    return total


def encode(tokenizer, segments: list[tuple[str, bool]]) -> list[int]:
    """Token ids of (text, trusted) segments in order: the added tokens' strings in a trusted
    segment (the template's, the server's) are control tokens; everything else is text, and
    neighbouring text is tokenized as one string, so a prompt without typed markers gets the ids
    the full tokenizer gives the rendered template."""
    vocab = _vocab(tokenizer)
    ids: list[int] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            ids.extend(vocab.plain.encode("".join(text), add_special_tokens=False).ids)
            text.clear()

    for segment, trusted in segments:
        pieces = vocab.controls.split(segment) if trusted else [segment]
        for i, piece in enumerate(pieces):
            if i % 2:
                flush()
                ids.append(vocab.ids[piece])
            else:
                text.append(piece)
    flush()
    return ids
