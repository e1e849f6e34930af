"""Qwen3-VL's grounding answers read as data: boxes and points, in pixels of the image they are about.

Asked where something is, Qwen3-VL writes JSON such as

    ```json
    [{"bbox_2d": [120, 340, 460, 780], "label": "red circle"}, {"point_2d": [500, 500], "label": "tip"}]
    ```

with coordinates relative to the image on a 0-1000 scale, whatever the image's size (Qwen2.5-VL
wrote pixels of its resized input instead; Qwen3-VL does not). This module finds such objects in
an answer, also while it streams, and converts them to pixels of the image the user sent.

Why matching braces instead of parsing the answer as JSON: the model's list is only valid JSON
once it is finished, and never when `max_tokens` cuts it or the model writes prose or a fence
around it; each object inside is complete long before, so an object counts from the moment its
closing brace arrives and a page can draw it at once. Nothing here raises on what the model
wrote: what is not a well-formed object with `bbox_2d` (4 numbers) or `point_2d` (2 numbers) in
[0, 1000] simply stays text. The text itself is never changed.

Which image: an answer's coordinates refer to one image; with several in the request, the last
one (Qwen3-VL's convention: the image the question follows). `static/js/grounding.js` is the
page's copy of the same parser.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

SCALE = 1000  # Qwen3-VL's coordinates: 0 is the left/top edge, 1000 the right/bottom edge
KINDS = {"bbox_2d": ("box", 4), "point_2d": ("point", 2)}  # the model's key -> (our name, numbers)


@dataclass(frozen=True)
class Item:
    """One box or point as the model wrote it (0-1000 relative coordinates)."""

    kind: str  # "box" ([x1, y1, x2, y2]) or "point" ([x, y])
    coords: tuple[float, ...]
    label: str = ""

    def pixels(self, width: int, height: int) -> dict:
        """{"label", "box" or "point"} in integer pixels of a `width` x `height` image; a box's
        corners ordered (x1 <= x2, y1 <= y2) whichever way round the model wrote them."""
        # halves round up, as the page's Math.round does: both draw on the same pixels
        xs = [int(x * width / SCALE + 0.5) for x in self.coords[0::2]]
        ys = [int(y * height / SCALE + 0.5) for y in self.coords[1::2]]
        if self.kind == "box":
            return {"label": self.label, "box": [min(xs), min(ys), max(xs), max(ys)]}
        return {"label": self.label, "point": [xs[0], ys[0]]}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= SCALE


def _item(source: str) -> Item | None:
    """The item a complete `{...}` holds, or None (not JSON, not an object, no usable coordinates)."""
    try:
        obj = json.loads(source)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    for key, (kind, n) in KINDS.items():
        coords = obj.get(key)
        if isinstance(coords, list) and len(coords) == n and all(map(_number, coords)):
            label = obj.get("label")
            return Item(kind, tuple(float(c) for c in coords), label.strip() if isinstance(label, str) else "")
    return None


class GroundingParser:
    """Feed an answer's text as it arrives; `feed` returns the items its piece completed and
    `items` holds all so far. Only the text of still-open objects is kept."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self._pending: list[str] = []  # the text from the outermost open brace on
        self._open: list[int] = []  # where each open brace is in _pending
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> list[Item]:
        found = []
        for c in text:
            if not self._open:
                if c == "{":
                    self._pending, self._open = ["{"], [0]
                continue
            self._pending.append(c)
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
                elif c == "\n":  # JSON strings hold no raw line break: what is open is not JSON
                    self._drop()
            elif c == '"':
                self._in_string = True
            elif c == "{":
                self._open.append(len(self._pending) - 1)
            elif c == "}":
                item = _item("".join(self._pending[self._open.pop():]))
                if item is not None:
                    found.append(item)
                if not self._open:
                    self._pending = []
        self.items.extend(found)
        return found

    def _drop(self) -> None:
        self._pending, self._open, self._in_string, self._escape = [], [], False, False


def parse(text: str) -> list[Item]:
    """Every box and point in a whole answer, in the order written."""
    return GroundingParser().feed(text)


def grounding(items: list[Item], image_sizes: list[tuple[int, int]]) -> dict | None:
    """The answer's `grounding` object: the items in pixels of the request's last image
    (`image_sizes`: (width, height) of each image, in request order), or None when the answer has
    no items or the request no image (relative coordinates of nothing)."""
    if not items or not image_sizes:
        return None
    index = len(image_sizes) - 1
    width, height = image_sizes[index]
    return {"image": index, "width": width, "height": height,
            "objects": [item.pixels(width, height) for item in items]}
