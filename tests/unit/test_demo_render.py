"""The demo model's wider data: phrasings (held-out ones never trained on), pictures drawn in many
styles and an out-of-style renderer, grounding answers in Qwen3-VL's format, and their scoring."""

from __future__ import annotations

import json
import re

import cv2
import numpy as np
import pytest

from test_demo_data import ANSWER_PATTERNS
from vlservice.demo.data import BOX_STEP, COLORS, PROMPTS, label_maps, shape_box
from vlservice.demo.heldout import box_score, check, expected_boxes, iou, parse_boxes
from vlservice.demo.phrasings import AROUND, HELD_OUT, TRAIN, dressed, phrasings
from vlservice.demo.render import IN_STYLE, OUT_OF_STYLE, iter_styled_samples

CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module", params=[IN_STYLE, OUT_OF_STYLE], ids=lambda s: s.name)
def styled(request):
    return list(iter_styled_samples([11, 3], 300, request.param, "train"))


def test_many_phrasings_per_question_and_language_and_held_out_ones_apart():
    for lang in ("en", "zh"):
        assert set(TRAIN[lang]) == set(HELD_OUT[lang])
        for kind, train in TRAIN[lang].items():
            assert len(set(train)) == len(train) >= 10, (lang, kind)
            assert len(HELD_OUT[lang][kind]) >= 6
            assert not set(train) & set(HELD_OUT[lang][kind]), (lang, kind)
            if kind in PROMPTS[lang]:  # the preset first, byte for byte
                assert train[0] == PROMPTS[lang][kind] == phrasings("preset", lang, kind)[0]
            for p in train + HELD_OUT[lang][kind]:  # the language is the question's
                assert bool(CJK.search(p)) == (lang == "zh"), p
        words = " ".join(p.lower() for k in TRAIN[lang].values() for p in k)
        if lang == "en":
            assert all(w in words for w in ("image", "picture", "photo"))
            assert any(p.endswith(".") for p in TRAIN[lang]["count"]) and any(p.endswith("?") for p in TRAIN[lang]["count"])


def test_held_out_phrasings_are_not_in_the_tokenizers_corpus():
    from vlservice.demo.train import training_phrasings

    trained = training_phrasings()
    assert "Where is the red circle?" in trained and "红色的圆形在哪里？" in trained
    for lang in HELD_OUT:
        for held in HELD_OUT[lang].values():
            for p in held:
                assert p.format(shape="circle", object="red circle") not in trained
                assert p.format(shape="圆形", object="红色的圆形") not in trained


def test_training_questions_are_dressed_in_the_words_around_a_question_never_as_held_out_ones():
    rng = np.random.default_rng(0)
    for lang in TRAIN:
        held = {p for kind in HELD_OUT[lang].values() for p in kind}
        for kind, train in TRAIN[lang].items():
            out = [dressed(rng, lang, p) for p in train for _ in range(40)]
            assert not set(out) & held, (lang, kind)
            assert len(set(out)) > 4 * len(train)  # greetings, thanks, case, marks
            assert sum(o in train for o in out) > len(out) // 10  # and often as written
            if "{shape}" in train[1] or "{object}" in train[1]:
                assert all(("{shape}" in o) or ("{object}" in o) for o in out)
        assert any(o.startswith(AROUND[lang]["before"]) for o in out)
        assert any(o.endswith(AROUND[lang]["after"]) for o in out)


def test_styled_samples_are_deterministic_and_vary():
    a = [s.image.tobytes() for s in iter_styled_samples(5, 30)]
    assert a == [s.image.tobytes() for s in iter_styled_samples(5, 30)]
    assert not set(a) & {s.image.tobytes() for s in iter_styled_samples([5, 1], 30)}
    sizes = {s.image.shape[:2] for s in iter_styled_samples(5, 200)}
    assert len(sizes) > 100


def test_answers_are_in_the_questions_language_and_form(styled):
    for s in styled:
        assert re.fullmatch(ANSWER_PATTERNS[(s.kind, s.task, s.lang)], s.answer), (s.task, s.answer)
        if s.task not in ("ocr",):
            assert bool(CJK.search(s.answer)) == (s.lang == "zh"), (s.question, s.answer)
    assert {s.task for s in styled} == {"describe", "color", "count", "position", "ocr", "locate"}


def test_shapes_stay_unambiguous_on_every_background(styled):
    for s in (x for x in styled if x.kind == "shapes"):
        assert len({o[0] for o in s.objects}) == len({o[1] for o in s.objects}) == len(s.objects)
        by_x = sorted(s.objects, key=lambda o: o[2])
        assert s.objects == tuple(by_x)
        for a, b in zip(by_x, by_x[1:]):
            assert b[2] - a[2] > a[4] + b[4]  # bounding boxes apart horizontally
        shapes = cv2.dilate((label_maps(s)[..., 0] > 0).astype(np.uint8), np.ones((7, 7), np.uint8))
        background = s.image[shapes == 0].astype(int)  # away from edges blurred by anti-aliasing, JPEG, scaling
        for _, color, *_ in s.objects:  # no background pixel is near a shape's colour
            near = np.abs(background - COLORS[color]).sum(axis=1) < 60
            assert near.mean() < 0.002, (color, near.mean())


def test_grounding_answers_box_the_drawn_shapes(styled):
    seen = 0
    for s in (x for x in styled if x.task == "locate"):
        items = json.loads(s.answer.removeprefix("```json\n").removesuffix("\n```"))
        h, w = s.canvas
        objects = {f"{o[1]} {o[0]}": o for o in s.objects}
        for item in items:
            x1, y1, x2, y2 = item["bbox_2d"]
            assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000
            assert all(v % BOX_STEP == 0 for v in item["bbox_2d"])  # coarse coordinates
            if s.lang == "en":
                o = objects[item["label"]]
                bx = shape_box(o[0], *o[2:])
                assert abs(x1 - bx[0] / w * 1000) <= BOX_STEP / 2 and abs(y2 - bx[3] / h * 1000) <= BOX_STEP / 2
            # the image's own pixels: the box holds the shape (its middle is not background)
            ih, iw = s.image.shape[:2]
            cy, cx = int((y1 + y2) / 2000 * ih), int((x1 + x2) / 2000 * iw)
            assert label_maps(s)[cy, cx, 0] > 0
            seen += 1
        assert check(s, s.answer) == (True, (len(items), len(items)))
    assert seen > 20


def test_out_of_style_differs_from_what_training_draws():
    differ = [f for f in IN_STYLE.__dataclass_fields__ if f != "name" and getattr(IN_STYLE, f) != getattr(OUT_OF_STYLE, f)]
    assert len(differ) >= 10, differ
    assert OUT_OF_STYLE.shape_side[1] > IN_STYLE.shape_side[1] and OUT_OF_STYLE.text_height[1] > IN_STYLE.text_height[1]
    assert not set(OUT_OF_STYLE.backgrounds) & set(IN_STYLE.backgrounds)


@pytest.mark.parametrize("text,expected", [
    ('```json\n[\n\t{"bbox_2d": [10, 20, 300, 400], "label": "red circle"}\n]\n```', [("red circle", [10, 20, 300, 400])]),
    ('[{"bbox_2d": [1, 2, 3, 4], "label": "A"}, {"bbox_2d": [5, 6, 7, 8], "label": "b"}]',
     [("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])]),
    ("Red.", None),
    ('```json\n[\n\t{"bbox_2d": [10, 20, 300', None),  # cut off
    ('```json\n[{"bbox_2d": [1, 2, 3], "label": "x"}]\n```', None),
])
def test_parse_boxes(text, expected):
    assert parse_boxes(text) == expected


def test_box_score_counts_misses_wrong_labels_and_invented_boxes():
    truth = [("red circle", [100.0, 100.0, 300.0, 300.0]), ("blue square", [500.0, 500.0, 700.0, 700.0])]

    def answer(*items):
        return "```json\n" + json.dumps([{"bbox_2d": b, "label": lab} for lab, b in items]) + "\n```"

    assert box_score(truth, answer(*truth)) == (2, 2)
    assert box_score(truth, answer(("red circle", [110, 110, 310, 310]))) == (1, 2)  # IoU 0.82; one missing
    assert box_score(truth, answer(("red circle", [200, 200, 400, 400]), truth[1])) == (1, 3)  # IoU 0.14
    assert box_score(truth, answer(("green circle", truth[0][1]), truth[1])) == (1, 3)  # wrong label
    assert box_score(truth, answer(*truth, ("red star", [0, 0, 50, 50]))) == (2, 3)  # invented
    assert box_score(truth, "I don't know.") == (0, 2)
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(1 / 3)


def test_expected_boxes_are_the_drawn_shapes_exactly():
    """The answer rounds its coordinates to BOX_STEP; the score compares with the drawn boxes
    themselves, for every label the answer names (one shape or all, both languages)."""
    seen = 0
    for s in iter_styled_samples(2, 200, tasks=("locate",)):
        boxes = expected_boxes(s)
        items = json.loads(s.answer.removeprefix("```json\n").removesuffix("\n```"))
        assert [label for label, _ in boxes] == [item["label"].lower() for item in items]
        h, w = s.canvas
        drawn = [[v / side * 1000 for v, side in zip(shape_box(o[0], *o[2:]), (w, h, w, h))] for o in s.objects]
        for (_, box), item in zip(boxes, items):
            exact = [d for d in drawn if all(abs(a - b) <= BOX_STEP / 2 for a, b in zip(d, item["bbox_2d"]))]
            assert len(exact) == 1 and box == pytest.approx(exact[0], abs=0.5)
            seen += 1
        assert check(s, s.answer)[0]  # the rounded answer still scores every box
    assert seen > 100
