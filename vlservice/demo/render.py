"""The demo's pictures drawn many ways, and a renderer parameterised differently for honest tests.

The classic generator (`vlservice.demo.data`) draws one look: small canvases, four pale
backgrounds, five fonts at one size band, crisp PNG. A model trained only on it read a card in a
larger font as "71115". `Style` names every way a picture may vary and `make_styled_sample` draws
from it, with the rules that keep answers unambiguous (shapes of distinct kinds and colours,
horizontal gaps between them, backgrounds and cards far from every shape or ink colour, text inside
the card):

- `IN_STYLE` is what training draws (and the held-out phrasing set): canvases of 80-320 px at any
  aspect ratio, shapes 10-64 px in radius, flat, white and linear-gradient backgrounds, every Hershey
  font at text heights of 20-64 px, anti-aliased or not, mild Gaussian noise, JPEG at quality
  50-95, and drawings made up to 3x larger and then scaled down (as the page and cameras do).
- `OUT_OF_STYLE` is never trained on: larger canvases (200-480 px), larger shapes (up to 100 px)
  and text (36-90 px), radial gradients between random colours, random card and ink colours,
  uniform instead of Gaussian noise, a slight blur, and harsher JPEG (quality 35-70). Its samples
  come from their own seeds (`eval-demo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import cv2
import numpy as np

from .data import (
    COLORS,
    GAP,
    MARGIN,
    SHAPES,
    TEXT_MARGIN,
    WORDS,
    Sample,
    _draw_shape,
    _layout,
    _shape_qa,
    _text_qa,
)

HERSHEY_FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_PLAIN, cv2.FONT_HERSHEY_DUPLEX,
                 cv2.FONT_HERSHEY_COMPLEX, cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_COMPLEX_SMALL,
                 cv2.FONT_HERSHEY_SCRIPT_SIMPLEX, cv2.FONT_HERSHEY_SCRIPT_COMPLEX)
MORE_WORDS = ("GATE", "SHOP", "ROAD", "WEST", "EAST", "HOME", "CITY", "PIZZA", "HOTEL", "WATER",
              "TRAIN", "MAP", "KEY", "BOX", "CAR", "INFO", "WAY", "HELP", "MENU", "TOWN")
ALL_WORDS = WORDS + MORE_WORDS
FAR = 150  # least sum of |RGB difference| between a background (or card) colour and any shape (ink) colour
SHAPE_TASK_WEIGHTS = {"describe": 0.2, "color": 0.2, "count": 0.15, "position": 0.15, "locate": 0.3}


@dataclass(frozen=True)
class Style:
    """Every way a picture may vary (ranges are inclusive, probabilities per picture)."""

    name: str
    shape_side: tuple[int, int]  # canvas width and height of shape pictures, each drawn from this
    radius: tuple[int, int]  # half-extent of a shape
    card_width: tuple[int, int]
    card_height: tuple[int, int]
    text_height: tuple[int, int]  # px of the text box (capitals are about 3/4 of it)
    backgrounds: tuple[str, ...]  # "flat", "white", "linear", "radial"
    random_card_colors: bool  # else the classic near-white cards
    antialias: float  # share of pictures drawn with anti-aliased edges
    noise: str  # "gaussian" or "uniform"
    noise_level: float  # sigma (gaussian) or half-width (uniform) at most
    blur: tuple[float, float]  # Gaussian blur sigma (0, 0: none)
    jpeg: float  # share saved as JPEG
    jpeg_quality: tuple[int, int]
    downscale: float  # share drawn larger and scaled down with area averaging
    text_probability: float = 0.35


IN_STYLE = Style("in-style", shape_side=(80, 320), radius=(10, 64), card_width=(96, 320), card_height=(48, 200),
                 text_height=(20, 64), backgrounds=("flat", "white", "linear"), random_card_colors=False,
                 antialias=0.7, noise="gaussian", noise_level=5.0, blur=(0.0, 0.0), jpeg=0.4,
                 jpeg_quality=(50, 95), downscale=0.3)
OUT_OF_STYLE = Style("out-of-style", shape_side=(200, 480), radius=(20, 100), card_width=(200, 480),
                     card_height=(120, 300), text_height=(36, 90), backgrounds=("radial",), random_card_colors=True,
                     antialias=0.5, noise="uniform", noise_level=8.0, blur=(0.4, 0.9), jpeg=0.6,
                     jpeg_quality=(35, 70), downscale=0.0)


def _far(color, others) -> bool:
    return all(np.abs(np.subtract(color, o)).sum() >= FAR for o in others)


def _pale(rng: np.random.Generator, low: int = 185) -> tuple[int, ...]:
    return tuple(int(v) for v in rng.integers(low, 256, size=3))


def _background(rng: np.random.Generator, style: Style, width: int, height: int, colors: list[str]) -> np.ndarray:
    """A background far from every shape colour; dark when a white shape is drawn."""
    shape_rgb = [COLORS[c] for c in colors]
    kind = style.backgrounds[int(rng.integers(len(style.backgrounds)))]
    for _ in range(100):
        if "white" in colors:
            a = tuple(int(v) for v in rng.integers(40, 110, size=3))
            b = tuple(int(v) for v in rng.integers(40, 110, size=3))
        elif kind == "white":
            a = b = (255, 255, 255)
        else:
            a, b = _pale(rng), _pale(rng)
        if kind == "flat":
            b = a
        mid = tuple((x + y) // 2 for x, y in zip(a, b))
        if _far(a, shape_rgb) and _far(b, shape_rgb) and _far(mid, shape_rgb):
            break
    else:
        raise RuntimeError("no background far enough from the shapes")  # cannot happen with these palettes
    if kind == "radial":
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        yy, xx = np.mgrid[:height, :width]
        t = np.hypot(yy - cy, xx - cx) / np.hypot(height, width)
    else:  # linear (flat: a == b), in a random direction
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[:height, :width]
        proj = xx * np.cos(angle) + yy * np.sin(angle)
        t = (proj - proj.min()) / max(1e-6, np.ptp(proj))
    t = t[..., None]
    return np.clip(np.asarray(a) * (1 - t) + np.asarray(b) * t, 0, 255).astype(np.uint8)


def _finish(rng: np.random.Generator, style: Style, image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Scale the drawing down to ``size`` (h, w), then blur, noise and JPEG as the style says."""
    if image.shape[:2] != size:
        image = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    if style.blur[1] > 0:
        image = cv2.GaussianBlur(image, (0, 0), float(rng.uniform(*style.blur)))
    if rng.random() < 0.5:
        level = float(rng.uniform(0, style.noise_level))
        shape = image.shape
        noise = rng.normal(0, level, shape) if style.noise == "gaussian" else rng.uniform(-level, level, shape)
        image = np.clip(image + noise, 0, 255).astype(np.uint8)
    if rng.random() < style.jpeg:
        quality = int(rng.integers(style.jpeg_quality[0], style.jpeg_quality[1] + 1))
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
        image = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)  # channel order does not matter to the codec
    return np.ascontiguousarray(image)


def _scale(rng: np.random.Generator, style: Style) -> float:
    return float(rng.uniform(1.5, 3.0)) if rng.random() < style.downscale else 1.0


def _shapes(rng: np.random.Generator, style: Style, n: int) -> tuple[np.ndarray, tuple, tuple]:
    """The picture, its shapes (in canvas coordinates) and the canvas size if drawn larger."""
    r_lo = style.radius[0]
    least = n * 2 * r_lo + (n - 1) * GAP + 2 * MARGIN  # every shape fits at its smallest
    width = int(rng.integers(max(style.shape_side[0], least), max(style.shape_side[1], least) + 1))
    height = int(rng.integers(style.shape_side[0], style.shape_side[1] + 1))
    height = max(height, 2 * (r_lo + MARGIN))
    f = _scale(rng, style)
    cw, ch = round(width * f), round(height * f)
    kinds = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:n]]
    names = list(COLORS)
    colors = [names[i] for i in rng.permutation(len(names))[:n]]
    canvas = _background(rng, style, cw, ch, colors)
    line = cv2.LINE_AA if rng.random() < style.antialias else cv2.LINE_8
    radius = (round(style.radius[0] * f), round(style.radius[1] * f))
    objects = []
    for shape, color, (cx, cy, r) in zip(kinds, colors, _layout(rng, n, cw, ch, radius)):
        _draw_shape(canvas, shape, color, cx, cy, r, line)
        objects.append((shape, color, cx, cy, r))
    image = _finish(rng, style, canvas, (height, width))
    return image, tuple(objects), ((ch, cw) if f != 1.0 else ())


def _text(rng: np.random.Generator) -> str:
    choice = rng.random()
    if choice < 0.45:
        digits = int(rng.integers(1, 7))
        return str(int(rng.integers(10 ** (digits - 1), 10**digits)))
    if choice < 0.8:
        return ALL_WORDS[int(rng.integers(len(ALL_WORDS)))]
    first, second = rng.choice(len(ALL_WORDS), size=2, replace=False)
    return f"{ALL_WORDS[int(first)]} {ALL_WORDS[int(second)]}"


def _card(rng: np.random.Generator, style: Style, text: str) -> tuple[np.ndarray, tuple, tuple]:
    """Upright text on a card that grows to fit it, drawn larger and scaled down if the style says."""
    f = _scale(rng, style)
    font = HERSHEY_FONTS[int(rng.integers(len(HERSHEY_FONTS)))]
    (_, unit_h), _ = cv2.getTextSize(text, font, 1.0, 1)
    scale = float(rng.uniform(*style.text_height)) * f / unit_h
    thickness = max(1, round(scale * unit_h / int(rng.integers(14, 25))))
    (tw, th), baseline = cv2.getTextSize(text, font, scale, thickness)
    pad = round(TEXT_MARGIN * f) + thickness
    width = max(round(int(rng.integers(*style.card_width)) * f), tw + 2 * pad)
    height = max(round(int(rng.integers(*style.card_height)) * f), th + baseline + 2 * pad)
    if style.random_card_colors:
        card_rgb = _pale(rng, 200)
        ink = tuple(int(v) for v in rng.integers(0, 90, size=3))
    else:
        card_rgb = ((252, 252, 248), (246, 241, 226), (238, 242, 250), (255, 255, 255))[int(rng.integers(4))]
        ink = ((20, 20, 20), (30, 30, 110), (120, 20, 20), (20, 80, 30), (70, 45, 20))[int(rng.integers(5))]
    card = np.empty((height, width, 3), dtype=np.uint8)
    card[:] = card_rgb
    if style.random_card_colors:  # a soft radial shading of the card colour
        card = _background_like(rng, card_rgb, width, height)
    x = int(rng.integers(pad, width - pad - tw + 1))
    top = int(rng.integers(pad, height - pad - th - baseline + 1))
    line = cv2.LINE_AA if rng.random() < style.antialias else cv2.LINE_8
    cv2.putText(card, text, (x, top + th), font, scale, ink, thickness, line)
    size = (round(height / f), round(width / f))
    image = _finish(rng, style, card, size)
    return image, (text, font, scale, thickness, x, top + th), ((height, width) if f != 1.0 else ())


def _background_like(rng: np.random.Generator, rgb: tuple, width: int, height: int) -> np.ndarray:
    """A card shaded from ``rgb`` to a slightly darker tone of it, radially."""
    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    yy, xx = np.mgrid[:height, :width]
    t = (np.hypot(yy - cy, xx - cx) / np.hypot(height, width))[..., None]
    return np.clip(np.asarray(rgb) * (1 - 0.12 * t), 0, 255).astype(np.uint8)


def make_styled_sample(rng: np.random.Generator, style: Style = IN_STYLE, task: str | None = None,
                       lang: str | None = None, pool: str = "train") -> Sample:
    """One picture drawn in ``style`` with a question phrased from ``pool`` ("preset", "train" or
    "held_out", `vlservice.demo.phrasings`) in ``lang`` and its only correct answer."""
    lang = lang or ("en" if rng.random() < 0.5 else "zh")
    if task is None:
        if rng.random() < style.text_probability:
            task = "ocr" if rng.random() < 0.75 else "describe"
        else:
            names = list(SHAPE_TASK_WEIGHTS)
            task = names[int(rng.choice(len(names), p=list(SHAPE_TASK_WEIGHTS.values())))]
    text_card = task == "ocr" or (task == "describe" and rng.random() < 0.25)
    if text_card:
        text = _text(rng)
        image, layout, size = _card(rng, style, text)
        question, answer = _text_qa(rng, task, lang, text, pool)
        objects: tuple = ()
    else:
        n = int(rng.integers(2 if task == "position" else 1, 4))
        image, objects, size = _shapes(rng, style, n)
        question, answer = _shape_qa(rng, task, lang, objects, pool, size or image.shape[:2])
        layout = ()
    image.setflags(write=False)
    return Sample(image, question, answer, task, lang, "text" if text_card else "shapes", objects, layout, size)


def iter_styled_samples(seed, n: int, style: Style = IN_STYLE, pool: str = "train",
                        tasks: tuple[str, ...] | None = None) -> Iterator[Sample]:
    """``n`` samples fully determined by ``seed`` (an int or a list of ints, as NumPy seeds)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        task = tasks[int(rng.integers(len(tasks)))] if tasks else None
        yield make_styled_sample(rng, style, task, None, pool)
