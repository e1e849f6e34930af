"""The demo model beyond its presets: held-out phrasings, pictures drawn out of style, and boxes.

`eval-demo`'s first table asks the classic generator's preset questions. This module measures what
a new user meets, through the same service submit path (greedy, caches off):

- "held-out phrasings": pictures in `render.IN_STYLE`, questions phrased from
  `phrasings.HELD_OUT` (wordings no training run and no tokenizer corpus saw);
- "out-of-style": pictures from `render.OUT_OF_STYLE` (a renderer parameterised differently from
  anything trained on), asked with the presets, so the column shows what the drawing alone costs;
- "video", in both sets: generated clips (`clips`, MP4 bytes sent as a video part, sampled by the
  server at 2 fps), asked "Describe this video." / "描述这段视频。" in the out-of-style set and in
  held-out phrasings in the other; a quarter as many clips as pictures, at least 20.

Each set draws from its own seed sequence, `[seed, k]`, never a training seed. Grounding answers
("locate") are scored by their boxes: a box counts when a predicted box with the same label has
IoU >= 0.5 with the drawn shape's box; the share is hits / (drawn boxes + predicted boxes that
matched nothing), so a missing, a wrong and an invented box all count against it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

from .clips import iter_clips
from .data import TASKS, _phrase, boxes_1000, encode_png
from .render import IN_STYLE, OUT_OF_STYLE, iter_styled_samples

SETS = (("held-out phrasings", IN_STYLE, "held_out", 1), ("out-of-style", OUT_OF_STYLE, "preset", 2))
IOU_HIT = 0.5
MAX_TOKENS = 200  # three boxes take about 110 tokens

_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse_boxes(text: str) -> list[tuple[str, list[float]]] | None:
    """(label, [x1, y1, x2, y2]) of each item of a grounding answer (a JSON list, fenced or not);
    None when the text holds no such list."""
    match = _FENCED.search(text)
    body = match.group(1) if match else text[text.find("["):text.rfind("]") + 1]
    try:
        items = json.loads(body)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        box = item.get("bbox_2d") if isinstance(item, dict) else None
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
            return None
        out.append((str(item.get("label", "")).strip().lower(), [float(v) for v in box]))
    return out


def iou(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def box_score(expected: list[tuple[str, list[float]]], answer: str) -> tuple[int, int]:
    """(hits, drawn boxes + unmatched predicted boxes) of one grounding answer."""
    predicted = parse_boxes(answer) or []
    free = list(predicted)
    hits = 0
    for label, box in expected:
        best = max((p for p in free if p[0] == label), key=lambda p: iou(p[1], box), default=None)
        if best is not None and iou(best[1], box) >= IOU_HIT:
            hits += 1
            free.remove(best)
    return hits, len(expected) + len(free)


def expected_boxes(sample) -> list[tuple[str, list[float]]]:
    """The drawn boxes a grounding question asks for (labels as its answer writes them), exact:
    the answer rounds its coordinates to `data.BOX_STEP`, the score does not."""
    exact = {_phrase(o[0], o[1], sample.lang).lower(): box
             for o, box in zip(sample.objects, boxes_1000(sample.objects, sample.canvas, step=1))}
    return [(label, [float(v) for v in exact[label]]) for label in
            (item["label"].lower() for item in json.loads(_FENCED.search(sample.answer).group(1)))]


def check(sample, answer: str) -> tuple[bool, tuple[int, int] | None]:
    """(right?, box hits and total for grounding questions)."""
    if sample.task == "locate":
        hits, total = box_score(expected_boxes(sample), answer)
        return hits == total, (hits, total)
    return " ".join(answer.split()) == " ".join(sample.answer.split()), None


COLUMNS = (*TASKS, "video")


def run_sets(service, seed: int, n: int) -> dict:
    """Every set's accuracy per task (locate: the box share) through ``service``'s submit path."""
    from ..engine.types import ChatRequest, ImageInput, Message, Sampling, VideoInput

    def ask(s) -> str:
        media = VideoInput(s.data) if s.task == "video" else ImageInput(encode_png(s.image))
        return service.submit(ChatRequest([Message("user", [media, s.question])], Sampling(max_tokens=MAX_TOKENS),
                                          result_cache=False)).result()["text"]

    out = {}
    for name, style, pool, k in SETS:
        samples = [*iter_styled_samples([seed, k], n, style, pool), *iter_clips([seed, k, 1], max(20, n // 4), pool)]
        n_all = len(samples)
        answers = [ask(s) for s in samples]
        per: dict = defaultdict(lambda: [0, 0])
        boxes = [0, 0]
        right = 0
        examples = []
        for s, answer in zip(samples, answers):
            ok, scored = check(s, answer)
            right += ok
            per[s.task][0] += ok
            per[s.task][1] += 1
            if scored:
                boxes[0] += scored[0]
                boxes[1] += scored[1]
            if not ok and len(examples) < 12:
                examples.append({"task": s.task, "question": s.question, "expected": s.answer, "answer": answer})
        accuracy = {t: per[t][0] / per[t][1] for t in COLUMNS if per[t][1]}
        if boxes[1]:
            accuracy["locate"] = boxes[0] / boxes[1]
        accuracy["all"] = right / n_all
        out[name] = {"accuracy": accuracy, "counts": {t: per[t][1] for t in COLUMNS if per[t][1]},
                     "boxes": {"hits": boxes[0], "total": boxes[1]}, "seed": [seed, k], "misses": examples}
    return out


def markdown(sets: dict) -> str:
    lines = ["| set | " + " | ".join(COLUMNS) + " | all (exact) |", "|" + "---|" * (len(COLUMNS) + 2)]
    for name, r in sets.items():
        cells = [f"{r['accuracy'][t] * 100:.1f}% (n={r['counts'][t]})" if t in r["counts"] else "-" for t in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['accuracy']['all'] * 100:.1f}% |")
    for name, r in sets.items():
        b = r["boxes"]
        lines.append(f"\n{name}: grounding boxes with IoU >= {IOU_HIT} and the right label: {b['hits']} of {b['total']}"
                     " (drawn boxes plus invented ones)")
    return "\n".join(lines)

