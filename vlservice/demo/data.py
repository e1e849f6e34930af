"""Deterministic synthetic samples for the tiny offline demo model.

vlservice ships a tiny Qwen3-VL model trained inside the repo so the server has
an offline demo whose answers can actually be checked.  This module generates
its training and evaluation data: small RGB images (``numpy`` uint8, HxWx3)
with a question and the single correct answer, in English or Chinese.

Two kinds of image exist:

* ``"shapes"``: 1-3 filled shapes (distinct kinds, distinct colours) on a pale
  or dark grey background, placed left to right with clear horizontal gaps so
  "leftmost"/"rightmost" is never ambiguous and shapes never overlap;
* ``"text"``: a plain light card with a number or one/two uppercase words in a
  Hershey font, always inside the card with a margin.

``vlservice.demo.render`` draws the same two kinds in many more ways (sizes, backgrounds,
fonts, compression, ...) and asks in many phrasings (``vlservice.demo.phrasings``); this module's
own generator, the "classic" one, asks the presets only and stays as it was, so today's accuracy
table is measured on the very same images and questions as before. The grounding questions
("Where is the red circle?") are answered as Qwen3-VL answers them: a ```json fenced list of
``{"bbox_2d": [x1, y1, x2, y2], "label": ...}`` in coordinates relative to the image, 0-1000.

For training there is more: ``follow_ups`` draws further questions about the
same image (packed as later chat turns), and ``label_maps`` says per pixel which
shape, colour and character is drawn there (an auxiliary per-token loss on the
vision encoder uses it).

Everything is drawn from the ``numpy.random.Generator`` passed in, so the same
seed always gives byte-identical images and texts (training and held-out eval
simply use different seeds).  Only numpy and cv2 are used.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
from typing import Iterator, Sequence

import cv2
import numpy as np

from .phrasings import dressed, phrasings
from .prompts import PROMPTS

TASKS = ("describe", "color", "count", "position", "ocr", "locate")
CLASSIC_TASKS = TASKS[:5]  # the classic generator's (no grounding: its stream stays as it was)
SHAPE_TASKS = ("describe", "color", "count", "position")
TEXT_TASKS = ("ocr", "describe")

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 30),
    "purple": (140, 60, 180),
    "orange": (245, 140, 20),
    "black": (20, 20, 20),
    "white": (250, 250, 250),
}
SHAPES = ("circle", "square", "triangle", "star")

COLORS_ZH = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色",
             "purple": "紫色", "orange": "橙色", "black": "黑色", "white": "白色"}
SHAPES_ZH = {"circle": "圆形", "square": "正方形", "triangle": "三角形", "star": "星形"}
COUNT_WORDS = {"en": {1: "One", 2: "Two", 3: "Three"}, "zh": {1: "一个", 2: "两个", 3: "三个"}}

WORDS = ("CAT", "DOG", "STOP", "OPEN", "EXIT", "SALE", "TAXI", "MILK", "BOOK", "FISH",
         "DOOR", "PARK", "BANK", "CAFE", "BUS", "SUN", "TREE", "PUSH", "PULL", "FREE")
FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX,
         cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_PLAIN)

# Backgrounds are far from every shape colour; dark slate grey is used whenever a
# white shape is present (pale tones would be too close to white).
PALE_BACKGROUNDS = ((222, 222, 222), (238, 228, 205), (220, 230, 242), (224, 238, 226))
GREY_BACKGROUND = (92, 96, 102)
CARD_COLORS = ((252, 252, 248), (246, 241, 226), (238, 242, 250), (255, 255, 255))
INK_COLORS = ((20, 20, 20), (30, 30, 110), (120, 20, 20), (20, 80, 30), (70, 45, 20))

SHAPE_WEIGHTS = (0.3, 0.3, 0.2, 0.2)  # over SHAPE_TASKS
TEXT_WEIGHTS = (0.75, 0.25)  # over TEXT_TASKS
TEXT_PROBABILITY = 0.35  # share of text cards when no task is requested
TEXT_DESCRIBE_PROBABILITY = 0.25  # share of text cards among requested "describe"

MARGIN = 4  # px between shapes and the image border
GAP = 8  # minimum horizontal px between two shapes' bounding boxes
MIN_RADIUS, MAX_RADIUS = 12, 48
TEXT_MARGIN = 6  # px between the text (incl. stroke) and the card border
MIN_TEXT_HEIGHT = 28  # px: smallest text box height (caps are ~0.75 of it; a 16-px patch sees half a glyph)


@dataclass(frozen=True, eq=False)
class Sample:
    """One image with a question and its only correct answer.

    ``objects`` holds ``(shape, color, cx, cy, size)`` per shape, left to right
    (``size`` is the half-extent of the shape's bounding box); text cards have
    ``objects == ()``.  ``image`` is read-only.
    """

    image: np.ndarray
    question: str
    answer: str
    task: str
    lang: str
    kind: str
    objects: tuple = ()
    layout: tuple = ()  # text cards: (text, font, scale, thickness, x, baseline_y)
    # (h, w) of the canvas objects/layout were drawn on, when the image is that canvas scaled down
    size: tuple = ()

    @property
    def canvas(self) -> tuple[int, int]:
        """(h, w) of the coordinates of ``objects`` and ``layout``."""
        return self.size or self.image.shape[:2]


# --------------------------------------------------------------------------- shapes


def _layout(rng: np.random.Generator, n: int, width: int, height: int,
            radius: tuple[int, int] = (MIN_RADIUS, MAX_RADIUS)) -> list[tuple[int, int, int]]:
    """(cx, cy, r) for n shapes, left to right, bounding boxes separated by >= GAP."""
    usable = width - 2 * MARGIN - (n - 1) * GAP
    r_max = min(radius[1], (height - 2 * MARGIN) // 2, usable // (2 * n))
    radii = [int(rng.integers(radius[0], r_max + 1)) for _ in range(n)]
    slack = usable - 2 * sum(radii)
    cuts = rng.random(n + 1)
    extra = np.floor(slack * cuts / cuts.sum()).astype(int)  # spread slack over n+1 gaps
    placed, x = [], MARGIN
    for i, r in enumerate(radii):
        x += int(extra[i]) + (GAP if i else 0)
        cy = int(rng.integers(MARGIN + r, height - MARGIN - r + 1))
        placed.append((x + r, cy, r))
        x += 2 * r
    return placed


def _shape_points(shape: str, cx: int, cy: int, r: int) -> np.ndarray:
    """Polygon vertices of a shape inside the box [cx-r, cx+r] x [cy-r, cy+r]."""
    if shape == "square":
        pts = [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    elif shape == "triangle":
        pts = [(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    elif shape == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, r, 0.45 * r)
        pts = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1)
        pts = np.round(pts)
    else:
        raise ValueError(f"not a polygon shape: {shape}")
    return np.asarray(pts, dtype=np.int32).reshape(-1, 1, 2)


def _draw_shape(image: np.ndarray, shape: str, color: str, cx: int, cy: int, r: int,
                line: int = cv2.LINE_AA) -> None:
    rgb = COLORS[color]
    if shape == "circle":
        cv2.circle(image, (cx, cy), r, rgb, thickness=-1, lineType=line)
    else:
        cv2.fillPoly(image, [_shape_points(shape, cx, cy, r)], rgb, lineType=line)


def shape_box(shape: str, cx: int, cy: int, r: int) -> tuple[int, int, int, int]:
    """The drawn shape's tight box (x1, y1, x2, y2) in canvas pixels (a star is narrower than 2r)."""
    if shape == "circle":
        return cx - r, cy - r, cx + r, cy + r
    pts = _shape_points(shape, cx, cy, r).reshape(-1, 2)
    return int(pts[:, 0].min()), int(pts[:, 1].min()), int(pts[:, 0].max()), int(pts[:, 1].max())


def _background(rng: np.random.Generator, width: int, height: int, colors: Sequence[str]) -> np.ndarray:
    if "white" in colors:
        base = GREY_BACKGROUND
    else:
        base = PALE_BACKGROUNDS[int(rng.integers(len(PALE_BACKGROUNDS)))]
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = base
    if rng.random() < 0.5:  # light noise on the background only
        noise = rng.normal(0.0, 4.0, size=image.shape)
        image[:] = np.clip(image + noise, 0, 255).astype(np.uint8)
    return image


def _make_shapes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, tuple]:
    width, height = (int(v) for v in rng.integers(96, 225, size=2))
    kinds = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:n]]
    names = list(COLORS)
    colors = [names[i] for i in rng.permutation(len(names))[:n]]
    image = _background(rng, width, height, colors)
    objects = []
    for shape, color, (cx, cy, r) in zip(kinds, colors, _layout(rng, n, width, height)):
        _draw_shape(image, shape, color, cx, cy, r)
        objects.append((shape, color, cx, cy, r))
    return image, tuple(objects)


# --------------------------------------------------------------------------- text cards


def _random_text(rng: np.random.Generator) -> str:
    choice = rng.random()
    if choice < 0.4:
        digits = int(rng.integers(1, 7))
        return str(int(rng.integers(10 ** (digits - 1), 10**digits)))
    if choice < 0.75:
        return WORDS[int(rng.integers(len(WORDS)))]
    first, second = rng.choice(len(WORDS), size=2, replace=False)
    return f"{WORDS[int(first)]} {WORDS[int(second)]}"


def _make_text_card(rng: np.random.Generator, text: str) -> tuple[np.ndarray, tuple]:
    """Upright text on a plain card; the card grows if the text would not fit."""
    font = FONTS[int(rng.integers(len(FONTS)))]
    (unit_w, unit_h), _ = cv2.getTextSize(text, font, 1.0, 1)
    scale = MIN_TEXT_HEIGHT / unit_h * float(rng.uniform(1.0, 1.6))
    thickness = int(rng.integers(1, 3)) + (1 if scale * unit_h >= 28 else 0)
    (tw, th), baseline = cv2.getTextSize(text, font, scale, thickness)
    pad = TEXT_MARGIN + thickness  # strokes spill ~thickness px past the box
    width = max(int(rng.integers(128, 257)), tw + 2 * pad)
    height = max(int(rng.integers(64, 161)), th + baseline + 2 * pad)
    card = np.empty((height, width, 3), dtype=np.uint8)
    card[:] = CARD_COLORS[int(rng.integers(len(CARD_COLORS)))]
    x = int(rng.integers(pad, width - pad - tw + 1))
    top = int(rng.integers(pad, height - pad - th - baseline + 1))
    ink = INK_COLORS[int(rng.integers(len(INK_COLORS)))]
    cv2.putText(card, text, (x, top + th), font, scale, ink, thickness, cv2.LINE_AA)
    return card, (text, font, scale, thickness, x, top + th)


# --------------------------------------------------------------------------- questions


def _phrase(shape: str, color: str, lang: str) -> str:
    """'red circle' / '红色的圆形'."""
    return f"{color} {shape}" if lang == "en" else f"{COLORS_ZH[color]}的{SHAPES_ZH[shape]}"


def _describe_shapes(objects: tuple, lang: str) -> str:
    if lang == "en":
        items = [f"{'an' if c == 'orange' else 'a'} {_phrase(s, c, lang)}" for s, c, *_ in objects]
        text = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
        return text[0].upper() + text[1:] + "."
    items = [f"一个{_phrase(s, c, lang)}" for s, c, *_ in objects]
    text = items[0] if len(items) == 1 else "、".join(items[:-1]) + "和" + items[-1]
    return text + "。"


DRESSED_SHARE = 0.5  # of training questions: wrapped in the words people put around a question


def _ask(rng: np.random.Generator, pool: str, lang: str, kind: str) -> str:
    """A phrasing of the question kind from the pool; the preset pool has one and draws nothing
    (so the classic generator's stream is what it always was)."""
    options = phrasings(pool, lang, kind)
    if len(options) == 1:
        return options[0]
    phrasing = options[int(rng.integers(len(options)))]
    if pool == "train" and rng.random() < DRESSED_SHARE:
        return dressed(rng, lang, phrasing)
    return phrasing


# Grounding answers write coordinates in steps of 10 (0-1000, Qwen3-VL's scale): the last digit is
# always 0, so the model spends nothing on a digit worth at most 0.5% of the image, which it cannot
# see at a 32-pixel token. Held-out scoring compares with the exact boxes (`step=1`).
BOX_STEP = 10


def boxes_1000(objects: tuple, canvas: tuple[int, int], step: int = BOX_STEP) -> list[list[int]]:
    """Each shape's box relative to the image, 0-1000 (Qwen3-VL's convention) in multiples of
    ``step``, in ``objects`` order."""
    h, w = canvas
    return [[min(1000, max(0, round(v / side * 1000 / step) * step))
             for v, side in zip(shape_box(*o[:1], *o[2:]), (w, h, w, h))]
            for o in objects]


def grounding_answer(objects: tuple, canvas: tuple[int, int], lang: str) -> str:
    """Qwen3-VL's grounding answer: a ```json fenced list of {"bbox_2d", "label"}, one per line."""
    items = [json.dumps({"bbox_2d": box, "label": _phrase(o[0], o[1], lang)}, ensure_ascii=False)
             for o, box in zip(objects, boxes_1000(objects, canvas))]
    return "```json\n[\n" + ",\n".join("\t" + item for item in items) + "\n]\n```"


def _shape_qa(rng: np.random.Generator, task: str, lang: str, objects: tuple, pool: str = "preset",
              canvas: tuple[int, int] = (0, 0)) -> tuple[str, str]:
    if task == "describe":
        return _ask(rng, pool, lang, "describe"), _describe_shapes(objects, lang)
    if task == "count":
        word = COUNT_WORDS[lang][len(objects)]
        return _ask(rng, pool, lang, "count"), word + ("." if lang == "en" else "。")
    if task == "color":
        shape, color, *_ = objects[int(rng.integers(len(objects)))]
        if lang == "en":
            return _ask(rng, pool, lang, "color").format(shape=shape), color.capitalize() + "."
        return _ask(rng, pool, lang, "color").format(shape=SHAPES_ZH[shape]), COLORS_ZH[color] + "。"
    if task == "position":
        side = "left" if rng.random() < 0.5 else "right"
        pick = min if side == "left" else max
        shape, color, *_ = pick(objects, key=lambda o: o[2])
        phrase = _phrase(shape, color, lang)
        answer = f"The {phrase}." if lang == "en" else f"{phrase}。"
        return _ask(rng, pool, lang, f"position_{side}"), answer
    if task == "locate":
        if rng.random() < 0.5:  # every shape
            return _ask(rng, pool, lang, "locate"), grounding_answer(objects, canvas, lang)
        target = objects[int(rng.integers(len(objects)))]
        # named with its colour or, shapes being distinct kinds, without
        name = _phrase(*target[:2], lang) if rng.random() < 0.5 else (
            target[0] if lang == "en" else SHAPES_ZH[target[0]])
        return _ask(rng, pool, lang, "locate_one").format(object=name), grounding_answer((target,), canvas, lang)
    raise ValueError(f"not a shape task: {task}")


def _text_qa(rng: np.random.Generator, task: str, lang: str, text: str, pool: str = "preset") -> tuple[str, str]:
    question = _ask(rng, pool, lang, task)
    if task == "ocr":
        return question, text
    if task == "describe":
        answer = f'A card with the text "{text}".' if lang == "en" else f"一张写着“{text}”的卡片。"
        return question, answer
    raise ValueError(f"not a text task: {task}")


# --------------------------------------------------------------------------- public API


def _pick_kind_and_task(rng: np.random.Generator, task: str | None) -> tuple[str, str]:
    if task is None:
        if rng.random() < TEXT_PROBABILITY:
            return "text", TEXT_TASKS[int(rng.choice(len(TEXT_TASKS), p=TEXT_WEIGHTS))]
        return "shapes", SHAPE_TASKS[int(rng.choice(len(SHAPE_TASKS), p=SHAPE_WEIGHTS))]
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    if task == "ocr" or (task == "describe" and rng.random() < TEXT_DESCRIBE_PROBABILITY):
        return "text", task
    return "shapes", task


def make_sample(rng: np.random.Generator, task: str | None = None, lang: str | None = None) -> Sample:
    """Draw one sample; ``task``/``lang`` of None are chosen at random."""
    if lang is None:
        lang = "en" if rng.random() < 0.5 else "zh"
    if lang not in PROMPTS:
        raise ValueError(f"unknown lang {lang!r}; expected 'en' or 'zh'")
    kind, task = _pick_kind_and_task(rng, task)
    if kind == "text":
        text = _random_text(rng)
        image, layout = _make_text_card(rng, text)
        objects = ()
        question, answer = _text_qa(rng, task, lang, text)
    else:
        n = int(rng.integers(2 if task == "position" else 1, 4))
        image, objects = _make_shapes(rng, n)
        question, answer = _shape_qa(rng, task, lang, objects, canvas=image.shape[:2])
        layout = ()
    image.setflags(write=False)
    return Sample(image, question, answer, task, lang, kind, objects, layout)


def follow_ups(rng: np.random.Generator, sample: Sample, max_extra: int = 3,
               pool: str = "preset") -> list[tuple[str, str]]:
    """Up to ``max_extra`` more (question, answer) pairs about the same image, in random languages,
    phrased from ``pool`` (`vlservice.demo.phrasings`).

    Training packs them after the sample's own question as a multi-turn chat: the encoder runs
    once per image while the answers teach several times as much (and follow-up questions, which
    the feature cache makes cheap when serving, are seen in training).
    """
    pairs: list[tuple[str, str]] = []
    seen = {sample.question}
    for _ in range(int(rng.integers(0, max_extra + 1))):
        lang = "en" if rng.random() < 0.5 else "zh"
        if sample.kind == "text":
            task = TEXT_TASKS[int(rng.integers(len(TEXT_TASKS)))]
            question, answer = _text_qa(rng, task, lang, sample.layout[0], pool)
        else:
            tasks = SHAPE_TASKS if len(sample.objects) >= 2 else ("describe", "color", "count")
            task = tasks[int(rng.integers(len(tasks)))]
            question, answer = _shape_qa(rng, task, lang, sample.objects, pool, sample.canvas)
        if question not in seen:
            seen.add(question)
            pairs.append((question, answer))
    return pairs


def iter_samples(
    seed: int, n: int, tasks: Sequence[str] | None = None, langs: Sequence[str] = ("en", "zh")
) -> Iterator[Sample]:
    """Yield ``n`` samples, fully determined by ``seed`` (and tasks/langs)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        task = tasks[int(rng.integers(len(tasks)))] if tasks else None
        lang = langs[int(rng.integers(len(langs)))]
        yield make_sample(rng, task, lang)


# --------------------------------------------------------------------------- dense labels (training aid)

CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Classes of the three label maps; 0 is "nothing" in each.
LABEL_CLASSES = (1 + len(SHAPES), 1 + len(COLORS), 1 + len(CHARS))


def label_maps(sample: Sample) -> np.ndarray:
    """Per-pixel classes of a sample, HxWx3 uint8: shape kind, shape colour, printed character.

    Training uses them for an auxiliary loss on the vision tower's output tokens (what lies
    under each token), so the encoder learns shapes and letters from every token of every
    image instead of only from the few answer tokens that name them. Characters label their
    whole glyph box. Uses no randomness: the sample fixes everything.
    """
    h, w = sample.canvas
    maps = np.zeros((h, w, 3), dtype=np.uint8)
    names = list(COLORS)
    for shape, color, cx, cy, r in sample.objects:
        mask = np.zeros((h, w), dtype=np.uint8)
        if shape == "circle":
            cv2.circle(mask, (cx, cy), r, 1, thickness=-1)
        else:
            cv2.fillPoly(mask, [_shape_points(shape, cx, cy, r)], 1)
        maps[mask > 0, 0] = 1 + SHAPES.index(shape)
        maps[mask > 0, 1] = 1 + names.index(color)
    if sample.layout:
        text, font, scale, thickness, x, baseline = sample.layout
        (_, th), _ = cv2.getTextSize(text, font, scale, thickness)
        top, bottom = max(0, baseline - th - thickness), min(h, baseline + thickness + 1)
        x0 = x
        for i, ch in enumerate(text):
            x1 = x + cv2.getTextSize(text[:i + 1], font, scale, thickness)[0][0]  # Hershey: no kerning
            if ch != " ":
                maps[top:bottom, max(0, x0):min(w, x1), 2] = 1 + CHARS.index(ch)
            x0 = x1
    if sample.size:  # drawn larger, then scaled down: so are its labels
        maps = cv2.resize(maps, sample.image.shape[1::-1], interpolation=cv2.INTER_NEAREST)
    return maps


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB uint8 image."""
    ok, buf = cv2.imencode(".png", cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2BGR))
    if not ok:
        raise ValueError("cv2.imencode failed")
    return buf.tobytes()
