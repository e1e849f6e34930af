"""Tests for vlservice.demo.data, the synthetic data generator of the demo model."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from vlservice.demo.data import (CHARS, CLASSIC_TASKS, COLORS, LABEL_CLASSES, PROMPTS, SHAPES, TASKS, TEXT_MARGIN,
                                 Sample, encode_png, follow_ups, iter_samples, label_maps, make_sample,
                                 shape_box)

COLORS_ZH = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色",
             "purple": "紫色", "orange": "橙色", "black": "黑色", "white": "白色"}
SHAPES_ZH = {"circle": "圆形", "square": "正方形", "triangle": "三角形", "star": "星形"}

C_EN = "(?:" + "|".join(COLORS) + ")"
S_EN = "(?:" + "|".join(SHAPES) + ")"
C_ZH = "(?:" + "|".join(COLORS_ZH.values()) + ")"
S_ZH = "(?:" + "|".join(SHAPES_ZH.values()) + ")"
ITEM_EN = f"(?:a (?!orange){C_EN}|an orange) {S_EN}"
ITEM_ZH = f"一个{C_ZH}的{S_ZH}"
TEXT = r"(?:\d{1,6}|[A-Z]{3,5}|[A-Z]{3,5} [A-Z]{3,5})"
BOX_EN = r'\t\{"bbox_2d": \[\d{1,4}, \d{1,4}, \d{1,4}, \d{1,4}\], "label": "' + f'{C_EN} {S_EN}"\\}}'
BOX_ZH = r'\t\{"bbox_2d": \[\d{1,4}, \d{1,4}, \d{1,4}, \d{1,4}\], "label": "' + f'{C_ZH}的{S_ZH}"\\}}'

ANSWER_PATTERNS = {
    ("shapes", "describe", "en"): f"(?:A (?!orange){C_EN}|An orange) {S_EN}(?:(?:, {ITEM_EN})? and {ITEM_EN})?\\.",
    ("shapes", "describe", "zh"): f"{ITEM_ZH}(?:(?:、{ITEM_ZH})?和{ITEM_ZH})?。",
    ("shapes", "color", "en"): "(?:" + "|".join(c.capitalize() for c in COLORS) + r")\.",
    ("shapes", "color", "zh"): f"{C_ZH}。",
    ("shapes", "count", "en"): r"(?:One|Two|Three)\.",
    ("shapes", "count", "zh"): "(?:一个|两个|三个)。",
    ("shapes", "position", "en"): f"The {C_EN} {S_EN}\\.",
    ("shapes", "position", "zh"): f"{C_ZH}的{S_ZH}。",
    ("text", "describe", "en"): f'A card with the text "{TEXT}"\\.',
    ("text", "describe", "zh"): f"一张写着“{TEXT}”的卡片。",
    ("text", "ocr", "en"): TEXT,
    ("text", "ocr", "zh"): TEXT,
    ("shapes", "locate", "en"): f"```json\n\\[\n{BOX_EN}(?:,\n{BOX_EN}){{0,2}}\n\\]\n```",
    ("shapes", "locate", "zh"): f"```json\n\\[\n{BOX_ZH}(?:,\n{BOX_ZH}){{0,2}}\n\\]\n```",
}


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return list(iter_samples(seed=7, n=400))


def _key(s: Sample) -> tuple:
    return (s.image.tobytes(), s.image.shape, s.question, s.answer, s.task, s.lang, s.kind, s.objects)


def test_same_seed_is_identical():
    a, b = list(iter_samples(123, 40)), list(iter_samples(123, 40))
    assert [_key(x) for x in a] == [_key(x) for x in b]
    tasks = ("position", "ocr")
    assert [_key(x) for x in iter_samples(5, 10, tasks=tasks)] == [
        _key(x) for x in iter_samples(5, 10, tasks=tasks)]


def test_different_seeds_differ():
    a, b = list(iter_samples(1, 20)), list(iter_samples(2, 20))
    assert sum(_key(x) != _key(y) for x, y in zip(a, b)) >= 15
    assert {x.image.tobytes() for x in a}.isdisjoint(y.image.tobytes() for y in b)


def test_every_task_in_both_languages(samples):
    assert set(TASKS) == {"describe", "color", "count", "position", "ocr", "locate"}
    seen = {(s.task, s.lang) for s in samples}  # the classic generator asks no grounding question unasked
    assert seen == {(t, lang) for t in CLASSIC_TASKS for lang in ("en", "zh")}
    assert {(s.kind, s.task) for s in samples} >= {("text", "describe"), ("shapes", "describe")}


def test_requested_task_and_lang_are_honoured():
    rng = np.random.default_rng(0)
    for task in TASKS:
        for lang in ("en", "zh"):
            for _ in range(5):
                s = make_sample(rng, task, lang)
                assert (s.task, s.lang) == (task, lang)
                if task == "position":
                    assert len(s.objects) >= 2
                if task == "ocr":
                    assert s.kind == "text"
    with pytest.raises(ValueError):
        make_sample(rng, "nope")


def test_samples_are_well_formed(samples):
    for s in samples:
        assert s.image.dtype == np.uint8 and s.image.ndim == 3 and s.image.shape[2] == 3
        assert not s.image.flags.writeable
        assert (s.kind == "text") == (s.objects == ())
        h, w = s.image.shape[:2]
        if s.kind == "shapes":
            assert 96 <= w <= 224 and 96 <= h <= 224
            assert 1 <= len(s.objects) <= 3
        else:
            assert 128 <= w and 64 <= h and w * h <= 320 * 200


def test_preset_prompts_are_byte_exact():
    assert PROMPTS["en"]["describe"] == "Describe this image."
    assert PROMPTS["zh"]["describe"] == "描述这张图片。"
    assert PROMPTS["en"]["ocr"] == "Read all the text in this image."
    assert PROMPTS["zh"]["ocr"] == "读出图片中的所有文字。"
    assert PROMPTS["en"]["locate"] == "Locate every object in the image and report their bounding boxes in JSON."
    assert PROMPTS["zh"]["locate"] == "找出图中的每个物体，用 JSON 格式给出它们的边界框。"


def test_questions_and_answers_have_expected_form(samples):
    for s in samples:
        pattern = ANSWER_PATTERNS[(s.kind, s.task, s.lang)]
        assert re.fullmatch(pattern, s.answer), (s.task, s.lang, s.answer)
        prompts = PROMPTS[s.lang]
        if s.task in ("describe", "ocr", "count"):
            assert s.question == prompts[s.task]
        elif s.task == "position":
            assert s.question in (prompts["position_left"], prompts["position_right"])
        else:
            names = {o[0]: (o[0] if s.lang == "en" else SHAPES_ZH[o[0]]) for o in s.objects}
            assert s.question in {prompts["color"].format(shape=n) for n in names.values()}


def _phrase(obj: tuple, lang: str) -> str:
    shape, color = obj[:2]
    return f"{color} {shape}" if lang == "en" else f"{COLORS_ZH[color]}的{SHAPES_ZH[shape]}"


def test_answers_match_objects(samples):
    for s in (x for x in samples if x.kind == "shapes"):
        _check_shape_answer(s)


def _check_shape_answer(s: Sample) -> None:
    words = {"en": ["One.", "Two.", "Three."], "zh": ["一个。", "两个。", "三个。"]}
    if s.task == "count":
        assert s.answer == words[s.lang][len(s.objects) - 1]
    elif s.task == "position":
        left = s.question == PROMPTS[s.lang]["position_left"]
        target = (min if left else max)(s.objects, key=lambda o: o[2])
        expected = f"The {_phrase(target, 'en')}." if s.lang == "en" else _phrase(target, "zh") + "。"
        assert s.answer == expected
    elif s.task == "color":
        asked = next(o for o in s.objects
                     if s.question == PROMPTS[s.lang]["color"].format(
                         shape=o[0] if s.lang == "en" else SHAPES_ZH[o[0]]))
        assert s.answer == (asked[1].capitalize() + "." if s.lang == "en" else COLORS_ZH[asked[1]] + "。")
    elif s.task == "describe":
        phrases = [_phrase(o, s.lang) for o in s.objects]  # objects are left to right
        assert [o[2] for o in s.objects] == sorted(o[2] for o in s.objects)
        found = re.findall(f"{C_EN} {S_EN}" if s.lang == "en" else f"{C_ZH}的{S_ZH}", s.answer)
        assert found == phrases


def _asked(question: str) -> tuple[str, str]:
    """(task, lang) of a generated question."""
    for lang, prompts in PROMPTS.items():
        for key, prompt in prompts.items():
            shapes = SHAPES if lang == "en" else SHAPES_ZH.values()
            if question in {prompt.format(shape=x) for x in shapes}:
                return key.split("_")[0], lang
    raise AssertionError(question)


def test_follow_ups_ask_new_questions_about_the_same_image(samples):
    import dataclasses

    rng = np.random.default_rng(0)
    turns = []
    for s in samples[:200]:
        extra = follow_ups(rng, s, max_extra=3)
        turns.append(len(extra))
        questions = [s.question] + [q for q, _ in extra]
        assert len(set(questions)) == len(questions) and len(extra) <= 3
        for question, answer in extra:
            task, lang = _asked(question)
            if s.kind == "shapes":
                assert task != "position" or len(s.objects) >= 2
                _check_shape_answer(dataclasses.replace(s, question=question, answer=answer, task=task, lang=lang))
            else:
                assert task in ("ocr", "describe")
                text = s.layout[0]
                assert answer == text or re.fullmatch(ANSWER_PATTERNS[("text", "describe", lang)], answer)
                assert text in answer
    assert set(turns) == {0, 1, 2, 3}


def test_shapes_are_drawn_distinct_and_separated(samples):
    for s in (x for x in samples if x.kind == "shapes"):
        h, w = s.image.shape[:2]
        assert len({o[0] for o in s.objects}) == len(s.objects)
        assert len({o[1] for o in s.objects}) == len(s.objects)
        for shape, color, cx, cy, size in s.objects:
            assert 0 <= cx - size and cx + size < w and 0 <= cy - size and cy + size < h
            pixel = s.image[cy, cx].astype(int)
            assert np.abs(pixel - COLORS[color]).max() <= 12, (shape, color, pixel)
        by_x = sorted(s.objects, key=lambda o: o[2])
        for a, b in zip(by_x, by_x[1:]):
            assert b[2] - a[2] > a[4] + b[4]  # bounding boxes apart horizontally
        corner = s.image[0, 0].astype(int)
        assert all(np.abs(corner - COLORS[o[1]]).sum() > 120 for o in s.objects)


def test_text_fits_inside_card(samples):
    for s in (x for x in samples if x.kind == "text"):
        img = s.image.astype(int)
        card = img[0, 0]
        m = TEXT_MARGIN
        border = np.concatenate([img[:m].reshape(-1, 3), img[-m:].reshape(-1, 3),
                                 img[:, :m].reshape(-1, 3), img[:, -m:].reshape(-1, 3)])
        assert (border == card).all(), s.answer
        ink = np.abs(img - card).sum(axis=2) > 150
        ys, xs = np.nonzero(ink)
        assert ys.size > 20
        assert ys.max() - ys.min() >= 10  # text is at least ~10 px tall


def test_encode_png_roundtrip(samples):
    s = samples[0]
    data = encode_png(s.image)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert np.array_equal(cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB), s.image)


def test_label_maps_mark_what_is_drawn(samples):
    names = list(COLORS)
    for s in samples[:120]:
        maps = label_maps(s)
        assert maps.shape == s.image.shape and maps.dtype == np.uint8
        for channel, classes in enumerate(LABEL_CLASSES):
            assert maps[..., channel].max() < classes
        background = s.image[0, 0].astype(int)
        if s.kind == "shapes":
            assert not maps[..., 2].any()
            for shape, color, cx, cy, _size in s.objects:  # the shape's centre carries its kind and colour
                assert tuple(maps[cy, cx, :2]) == (1 + SHAPES.index(shape), 1 + names.index(color))
                inside = maps[..., 1] == 1 + names.index(color)
                # labelled pixels are the shape's pixels (anti-aliased edges aside)
                close = np.abs(s.image[inside].astype(int) - COLORS[color]).max(axis=1) <= 40
                assert close.mean() > 0.9, (shape, color, close.mean())
            assert np.abs(s.image[maps[..., 0] == 0].astype(int) - background).max(axis=1).mean() < 20
        else:
            assert not maps[..., :2].any()
            text = s.answer if s.task == "ocr" else s.layout[0]
            assert s.layout[0] == text
            labelled = [CHARS[c - 1] for c in np.unique(maps[..., 2]) if c]
            assert sorted(labelled) == sorted(set(text.replace(" ", "")))
            ink = np.abs(s.image.astype(int) - background).sum(axis=2) > 150
            assert (maps[..., 2][ink] > 0).mean() > 0.9  # the glyph boxes hold the ink
            cols = [np.nonzero((maps[..., 2] == 1 + CHARS.index(ch)).any(axis=0))[0].mean()
                    for ch in text.replace(" ", "")]
            if len(set(text.replace(" ", ""))) == len(text.replace(" ", "")):
                assert cols == sorted(cols)  # characters labelled left to right in reading order


def test_token_targets_follow_the_encoder_token_order():
    from vlservice.engine.media import images as I
    from vlservice.demo.data import boxes_1000
    from vlservice.demo.train import BOX_TARGETS, DIGIT_TARGETS, POSITION_TARGETS, token_targets

    spec = I.ImageSpec()
    rng = np.random.default_rng(3)
    labels = sum(LABEL_CLASSES)
    for _ in range(20):
        s = make_sample(rng, task="color")
        p = I.prepare(s.image, spec)
        t = token_targets(s, p.size, spec.patch_size * spec.merge_size)
        assert t.shape == (p.num_tokens, labels + BOX_TARGETS + POSITION_TARGETS + DIGIT_TARGETS)
        np.testing.assert_allclose(t[:, :labels].sum(axis=1), len(LABEL_CLASSES), rtol=1e-5)
        gw, gh = p.grid_thw[2] // 2, p.grid_thw[1] // 2
        # the last columns: each token's centre, relative to the image, in raster order
        where = t[:, -DIGIT_TARGETS - 2:-DIGIT_TARGETS]
        np.testing.assert_allclose(where[:, 0], np.tile((np.arange(gw) + 0.5) / gw, gh), rtol=1e-6)
        np.testing.assert_allclose(where[:, 1], np.repeat((np.arange(gh) + 0.5) / gh, gw), rtol=1e-6)
        box, shows = t[:, labels:labels + 4], t[:, labels + 4]
        digits = t[:, -DIGIT_TARGETS:]
        assert (digits[shows == 0] == 0).all()
        assert set(np.unique(shows)) <= {0.0, 1.0} and (box[shows == 0] == 0).all()
        assert (shows == (t[:, 1:LABEL_CLASSES[0]].max(axis=1) > 0)).all()  # every token on a shape
        sy, sx = p.size[0] / s.image.shape[0], p.size[1] / s.image.shape[1]
        h, w = s.image.shape[:2]
        for shape, _color, cx, cy, size in s.objects:
            row, col = int(cy * sy) // 32, int(cx * sx) // 32
            kinds = t[row * gw + col, :LABEL_CLASSES[0]]
            assert kinds[1 + SHAPES.index(shape)] == kinds[1:].max() > 0, (shape, kinds)
            # the token at the shape's centre carries the shape's drawn box, relative to the image
            x1, y1, x2, y2 = shape_box(shape, cx, cy, size)
            np.testing.assert_allclose(box[row * gw + col], (x1 / w, y1 / h, (x2 + 1) / w, (y2 + 1) / h), atol=0.03)
            # and the hundreds and tens digits a grounding answer writes for that box (one step of
            # rounding apart at most: the label map's box is the drawn pixels at the encoder's size)
            written = [100 * a + 10 * b for a, b in digits[row * gw + col].reshape(4, 2)]
            answer = boxes_1000(((shape, _color, cx, cy, size),), (h, w))[0]
            assert np.abs(np.array(written) - answer).max() <= 20, (written, answer)


def test_the_pages_preset_asset_is_the_demo_models_own_questions():
    """`/api/config` serves the asset (the server never imports the demo package); it must be what
    `python -m vlservice.demo.prompts` writes from the strings the model was trained on."""
    import json
    from importlib import resources

    from vlservice.demo import prompts

    asset = json.loads(resources.files("vlservice").joinpath(prompts.ASSET).read_text(encoding="utf-8"))
    assert asset == prompts.presets(), "run `python -m vlservice.demo.prompts` to rewrite the asset"
