"""The grounding parser (vlservice/engine/output/grounding.py) on answers written the way Qwen3-VL writes
them: boxes, points, fenced or bare, with prose around, cut by max_tokens, streamed in pieces cut
at every offset; malformed objects stay text. And the conversion of its 0-1000 coordinates to
pixels of the image the request sent (non-square, downscaled by the page, the last of several)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from vlservice.config import Settings
from vlservice.engine.output.grounding import GroundingParser, Item, grounding, parse
from vlservice.http.openapi import spec
from vlservice.protocol import ChatCompletion

# Qwen3-VL's own format: a fenced JSON list, one object per line, indented with a tab.
FENCED = ('```json\n[\n\t{"bbox_2d": [102, 215, 387, 644], "label": "red circle"},\n'
          '\t{"bbox_2d": [512, 98, 930, 471], "label": "blue square"}\n]\n```')
SINGLE = '[{"bbox_2d": [250, 250, 750, 750], "label": "cat"}]'
POINTS = 'The tips:\n```json\n[{"point_2d": [120, 880], "label": "left"}, {"point_2d": [877, 60], "label": "right"}]\n```'
MIXED = ('Here is what I found.\n```json\n[\n  {"bbox_2d": [0, 0, 1000, 1000], "label": "page"},\n'
         '  {"point_2d": [500, 500], "label": "center"},\n  {"bbox_2d": [10, 20, 30, 40], "label": "\u7ea2\u5706"}\n]\n```\n'
         'Three objects in all.')


def box(x1, y1, x2, y2, label=""):
    return Item("box", (x1, y1, x2, y2), label)


def point(x, y, label=""):
    return Item("point", (x, y), label)


@pytest.mark.parametrize("text, items", [
    (SINGLE, [box(250, 250, 750, 750, "cat")]),
    (FENCED, [box(102, 215, 387, 644, "red circle"), box(512, 98, 930, 471, "blue square")]),
    (POINTS, [point(120, 880, "left"), point(877, 60, "right")]),
    (MIXED, [box(0, 0, 1000, 1000, "page"), point(500, 500, "center"), box(10, 20, 30, 40, "红圆")]),
    # one bare object, no list; floats; key order of the model's choosing
    ('{"label": "dog", "bbox_2d": [1.5, 2, 3, 4.25]}', [box(1.5, 2, 3, 4.25, "dog")]),
    # no label, a label that is not a string, spaces around a label
    ('[{"bbox_2d": [1, 2, 3, 4]}, {"point_2d": [5, 6], "label": 7}, {"point_2d": [8, 9], "label": " a "}]',
     [box(1, 2, 3, 4), point(5, 6), point(8, 9, "a")]),
    # braces, quotes and escapes inside labels do not end the object
    ('[{"bbox_2d": [1, 2, 3, 4], "label": "a } { b"}, {"point_2d": [5, 6], "label": "say \\"hi\\" \\\\"}]',
     [box(1, 2, 3, 4, "a } { b"), point(5, 6, 'say "hi" \\')]),
    # an item nested in another object is found; the outer object is no item itself
    ('{"objects": [{"bbox_2d": [1, 2, 3, 4], "label": "x", "attrs": {"color": "red"}}]}', [box(1, 2, 3, 4, "x")]),
])
def test_parses_model_outputs(text, items):
    assert parse(text) == items


@pytest.mark.parametrize("text", [
    "There is a cat in the middle of the picture.",
    "",
    "{not json}",
    "{'bbox_2d': [1, 2, 3, 4], 'label': 'single quotes'}",
    '{bbox_2d: [1, 2, 3, 4]}',
    '{"bbox_2d": [1, 2, 3, 4], "label": "trailing comma",}',
    '{"bbox_2d": [1, 2, 3], "label": "three numbers"}',
    '{"bbox_2d": [1, 2, 3, 4, 5]}',
    '{"point_2d": [1]}',
    '{"bbox_2d": [1, 2, 3, 1001], "label": "beyond the scale"}',
    '{"bbox_2d": [-1, 2, 3, 4]}',
    '{"bbox_2d": ["1", "2", "3", "4"]}',
    '{"bbox_2d": [true, 2, 3, 4]}',
    '{"bbox_2d": [NaN, 2, 3, 4]}',
    '{"bbox_2d": [[1, 2, 3, 4]]}',
    '{"bbox_2d": {"x1": 1}}',
    '[[1, 2, 3, 4]]',
    '```json\n[{"bbox_2d": [1, 2, 3',  # cut by max_tokens
    '}}}{{{',
])
def test_malformed_stays_text(text):
    assert parse(text) == []


def test_cut_answer_keeps_its_complete_objects():
    cut = FENCED[:FENCED.index("blue") + 3]
    assert parse(cut) == [box(102, 215, 387, 644, "red circle")]


def test_unterminated_string_does_not_hide_later_objects():
    """A raw line break cannot be inside a JSON string: the broken object is dropped there."""
    text = '{"bbox_2d": [1, 2, 3, 4], "label": "never closed\n[{"point_2d": [5, 6], "label": "ok"}]'
    assert parse(text) == [point(5, 6, "ok")]


@pytest.mark.parametrize("text", [SINGLE, FENCED, POINTS, MIXED], ids=["single", "fenced", "points", "mixed"])
def test_split_at_every_offset(text):
    """Streamed in two pieces cut anywhere (inside a key, a number, a multi-byte label, between
    braces), or one character at a time: the same items as the whole text, each reported by the
    piece that completed it."""
    whole = parse(text)
    for cut in range(len(text) + 1):
        p = GroundingParser()
        first = p.feed(text[:cut])
        second = p.feed(text[cut:])
        assert first + second == whole == p.items, cut
        assert first == parse(text[:cut]), cut  # what was complete at the cut, and nothing more
    p = GroundingParser()
    assert [item for c in text for item in p.feed(c)] == whole


def test_an_object_counts_when_its_brace_closes():
    p = GroundingParser()
    assert p.feed('```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "a"') == []
    assert p.feed("}") == [box(1, 2, 3, 4, "a")]
    assert p.feed(', {"point_2d": [5, 6]') == []
    assert p.feed("}]\n```") == [point(5, 6)]


# ----------------------------------------------------------------------------- pixels

def test_pixels_of_a_non_square_image():
    items = parse('[{"bbox_2d": [250, 500, 750, 1000], "label": "a"}, {"point_2d": [100, 900], "label": "b"}]')
    assert grounding(items, [(640, 480)]) == {
        "image": 0, "width": 640, "height": 480,
        "objects": [{"label": "a", "box": [160, 240, 480, 480]}, {"label": "b", "point": [64, 432]}]}
    # portrait: x scales with the width, y with the height
    assert grounding(items, [(300, 1200)])["objects"] == [
        {"label": "a", "box": [75, 600, 225, 1200]}, {"label": "b", "point": [30, 1080]}]


def test_corners_written_the_other_way_round_are_ordered():
    assert box(800, 900, 200, 100).pixels(1000, 500) == {"label": "", "box": [200, 50, 800, 450]}


def test_pixels_of_the_image_the_page_downscaled():
    """The page sends a photo downscaled to the server's budget (a 4032x3024 photo goes as
    1024x768): the answer's boxes are in pixels of the image sent, which is the image the page
    shows, so the same relative box lands on the same part of the picture at either size."""
    items = parse(SINGLE)
    sent = grounding(items, [(1024, 768)])
    assert sent["objects"] == [{"label": "cat", "box": [256, 192, 768, 576]}]
    original = grounding(items, [(4032, 3024)])["objects"][0]["box"]
    assert [round(v * 1024 / 4032) for v in original] == sent["objects"][0]["box"]


def test_the_last_image_of_several():
    g = grounding(parse(SINGLE), [(100, 100), (200, 50), (640, 480)])
    assert (g["image"], g["width"], g["height"]) == (2, 640, 480)


def test_nothing_to_report():
    assert grounding([], [(640, 480)]) is None
    assert grounding(parse(SINGLE), []) is None  # no image: relative coordinates of nothing


def test_matches_the_documented_answer_shape():
    """What the API adds to an answer validates against its pydantic model (the OpenAPI document)."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": MIXED}, "finish_reason": "stop",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "timings": {"queue_ms": 0, "prompt_ms": 0, "prompt_n": 0, "cache_n": 0, "predicted_ms": 0,
                        "predicted_n": 0, "ttft_ms": 0, "total_ms": 0},
            "grounding": grounding(parse(MIXED), [(320, 200)])}
    parsed = ChatCompletion.model_validate(json.loads(json.dumps(body)))
    assert [type(o).__name__ for o in parsed.grounding.objects] == ["BoxObject", "PointObject", "BoxObject"]


def test_openapi_documents_the_field():
    schemas = spec(SimpleNamespace(extensions={"vlservice": SimpleNamespace(settings=Settings())}))["components"][
        "schemas"]
    for answer in ("ChatCompletion", "ChatCompletionChunk"):
        assert schemas[answer]["properties"]["grounding"] == {"$ref": "#/components/schemas/Grounding"}
        assert "grounding" not in schemas[answer].get("required", [])
    g = schemas["Grounding"]
    assert set(g["required"]) == {"image", "width", "height", "objects"}
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in g["properties"]["objects"]["items"]["anyOf"]} == {
        "BoxObject", "PointObject"}
    assert schemas["BoxObject"]["required"] == ["label", "box"] and schemas["PointObject"]["required"] == [
        "label", "point"]
