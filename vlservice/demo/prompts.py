"""The demo model's questions, in English and Chinese: the one list that both its training data
(`vlservice.demo.data`) and the web page's preset buttons are built from. The buttons are written
to an asset, `vlservice/assets/presets.json` (`python -m vlservice.demo.prompts` rewrites it;
tests/unit/test_demo_data.py fails when it differs), which `/api/config` serves: the server never
imports the demo package.

A module of its own so the server can read it without importing the training data's OpenCV code.
The demo model was trained on these exact strings: a preset that differs by one character is a
question it has never seen, so they stay byte-exact.
"""

from __future__ import annotations

PROMPTS: dict[str, dict[str, str]] = {
    "en": {
        "describe": "Describe this image.",
        "ocr": "Read all the text in this image.",
        "count": "How many shapes are there?",
        "color": "What color is the {shape}?",
        "position_left": "Which shape is on the left?",
        "position_right": "Which shape is on the right?",
        "locate": "Locate every object in the image and report their bounding boxes in JSON.",
    },
    "zh": {
        "describe": "描述这张图片。",
        "ocr": "读出图片中的所有文字。",
        "count": "图中有几个图形？",
        "color": "{shape}是什么颜色？",
        "position_left": "最左边的是什么图形？",
        "position_right": "最右边的是什么图形？",
        "locate": "找出图中的每个物体，用 JSON 格式给出它们的边界框。",
    },
}

# The page's preset buttons, in order. Colour and position are left out: they only make sense about
# the demo's own pictures of shapes, and a preset is offered for any image (with the real model too).
PRESETS = ("describe", "ocr", "count", "locate")


# Presets about a video clip: the page offers them only while a clip is attached (and the image
# presets only without one).
VIDEO_PRESETS = {"describe_video": {"en": "Describe this video.", "zh": "描述这段视频。"}}


def presets() -> list[dict[str, str]]:
    """The preset prompts per language, in button order: [{"name", "en", "zh", "media"}, ...]."""
    return ([{"name": name, **{lang: PROMPTS[lang][name] for lang in PROMPTS}, "media": "image"} for name in PRESETS]
            + [{"name": name, **texts, "media": "video"} for name, texts in VIDEO_PRESETS.items()])


ASSET = "assets/presets.json"


def main() -> int:
    """Write the page's preset buttons to the package's asset."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / ASSET
    path.write_text(json.dumps(presets(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(presets())} presets to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
