"""The peers' spellings of media options (issue 33, item 4): vLLM's `mm_processor_kwargs`,
Qwen's per-item `min_pixels` / `max_pixels` / `fps` / `min_frames` / `max_frames`, llama.cpp's
`input_video` part; their precedence (the item's media object, the part, `detail`, the request,
the server's default) and the server's limits (above them: 400 naming the field)."""

from __future__ import annotations

import base64

import cv2
import numpy as np
import pytest

from vlservice.config import Settings
from vlservice.engine.media import images as imgs
from vlservice.errors import APIError
from vlservice.protocol import parse_chat

S = Settings(max_tokens_cap=512, max_images=4, max_video_frames=16)
PNG = "data:image/png;base64," + base64.b64encode(cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1]).decode()
RAW = base64.b64encode(b"\x1aE\xdf\xa3" + b"\x00" * 64).decode()  # a WebM's magic, then nothing: parsed, not decoded
HIGH, AUTO, LOW = S.detail_high_pixels, S.detail_auto_pixels, S.detail_low_pixels
FRAME_HIGH = S.video_frame_pixels("high")


def body(*parts, **top) -> dict:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}], **top}


def image(**fields) -> dict:
    inner = {k[6:]: v for k, v in fields.items() if k.startswith("inner_")}
    outer = {k: v for k, v in fields.items() if not k.startswith("inner_")}
    return {"type": "image_url", "image_url": {"url": PNG, **inner}, **outer}


def one_image(*parts, **top):
    req, _ = parse_chat(body(*parts, **top), S)
    return req.media[0]


def refusal(b) -> APIError:
    with pytest.raises(APIError) as info:
        parse_chat(b, S)
    return info.value


@pytest.mark.parametrize("part, top, max_pixels, min_pixels", [
    (image(), {}, AUTO, None),
    (image(inner_detail="low"), {}, LOW, None),
    (image(max_pixels=300_000), {}, 300_000, None),
    (image(inner_max_pixels=200_704), {}, 200_704, None),
    (image(inner_max_pixels=200_704, max_pixels=300_000), {}, 200_704, None),  # the object's own wins
    (image(inner_detail="high", max_pixels=300_000), {}, 300_000, None),  # pixels over detail
    (image(), {"mm_processor_kwargs": {"max_pixels": 400_000, "min_pixels": 100_000}}, 400_000, 100_000),
    (image(inner_detail="low"), {"mm_processor_kwargs": {"max_pixels": 400_000}}, LOW, None),  # detail over request
    (image(max_pixels=500_000, min_pixels=200_000), {"mm_processor_kwargs": {"max_pixels": 400_000,
                                                                             "min_pixels": 100_000}},
     500_000, 200_000),
    (image(max_pixels=500_000.0), {}, 500_000, None),  # 500000.0 is an integer in JSON Schema's words
    ({"type": "image_url", "image_url": PNG, "max_pixels": HIGH}, {}, HIGH, None),  # the cap itself is allowed
])
def test_image_budget_precedence(part, top, max_pixels, min_pixels):
    img = one_image(part, **top)
    assert (img.max_pixels, img.min_pixels) == (max_pixels, min_pixels)


@pytest.mark.parametrize("part, top, param", [
    (image(max_pixels=HIGH + 1), {}, "messages[0].content[0].max_pixels"),
    (image(inner_max_pixels=HIGH + 1), {}, "messages[0].content[0].image_url.max_pixels"),
    (image(min_pixels=HIGH + 1), {}, "messages[0].content[0].min_pixels"),
    (image(max_pixels=0), {}, "messages[0].content[0].max_pixels"),
    (image(max_pixels=-5), {}, "messages[0].content[0].max_pixels"),
    (image(max_pixels=1.5), {}, "messages[0].content[0].max_pixels"),
    (image(max_pixels="100"), {}, "messages[0].content[0].max_pixels"),
    (image(inner_min_pixels=300_000, max_pixels=200_000), {}, "messages[0].content[0].image_url.min_pixels"),
    (image(), {"mm_processor_kwargs": {"min_pixels": 900_000}}, "mm_processor_kwargs.min_pixels"),  # > auto
    (image(), {"mm_processor_kwargs": {"max_pixels": HIGH + 1}}, "mm_processor_kwargs.max_pixels"),
    (image(), {"mm_processor_kwargs": {"max_pixels": 10 ** 9}}, "mm_processor_kwargs.max_pixels"),
    (image(), {"mm_processor_kwargs": {"fps": 0}}, "mm_processor_kwargs.fps"),
    (image(), {"mm_processor_kwargs": {"fps": 31}}, "mm_processor_kwargs.fps"),
    (image(), {"mm_processor_kwargs": "x"}, "mm_processor_kwargs"),
])
def test_bad_values_and_values_above_the_servers_limits_are_400_naming_the_field(part, top, param):
    err = refusal(body(part, **top))
    assert err.status == 400 and err.param == param, (err.param, err.message)
    assert param.split(".")[-1] in err.message or param in err.message


def test_a_request_level_budget_is_checked_against_the_cap_of_each_item_that_uses_it():
    assert HIGH > FRAME_HIGH  # an image may take more pixels than a video frame
    kw = {"mm_processor_kwargs": {"max_pixels": HIGH}}
    assert one_image(image(), **kw).max_pixels == HIGH
    err = refusal(body(video(), **kw))  # a frame would exceed its cap
    assert err.param == "mm_processor_kwargs.max_pixels" and str(FRAME_HIGH) in err.message
    # an item with its own budget does not use the request's
    assert one_video(video(max_pixels=1000), **kw).max_pixels == 1000
    assert one_video(video(inner_detail="high"), **kw).max_pixels == FRAME_HIGH


def video(kind="video_url", **fields) -> dict:
    inner = {k[6:]: v for k, v in fields.items() if k.startswith("inner_")}
    outer = {k: v for k, v in fields.items() if not k.startswith("inner_")}
    if kind == "video_url":
        return {"type": "video_url", "video_url": {"url": "data:video/webm;base64," + RAW, **inner}, **outer}
    return {"type": "input_video", "input_video": {"data": RAW, **inner}, **outer}


def one_video(*parts, **top):
    req, _ = parse_chat(body(*parts, **top), S)
    (clip,) = req.media
    return clip


def test_video_options_precedence():
    v = one_video(video())
    assert (v.fps, v.max_frames, v.min_frames, v.max_pixels) == (None, None, None, S.video_frame_pixels("auto"))
    v = one_video(video(fps=1, max_frames=8, min_frames=6, max_pixels=50_000), mm_processor_kwargs={"fps": 3})
    assert (v.fps, v.max_frames, v.min_frames, v.max_pixels) == (1, 8, 6, 50_000)
    v = one_video(video(inner_fps=0.5, fps=1, inner_max_pixels=40_000, max_pixels=50_000, inner_max_frames=10,
                        max_frames=8))
    assert (v.fps, v.max_pixels, v.max_frames) == (0.5, 40_000, 10)
    v = one_video(video(), mm_processor_kwargs={"fps": 3, "max_pixels": 60_000})
    assert (v.fps, v.max_pixels) == (3, 60_000)
    v = one_video(video(inner_detail="low"), mm_processor_kwargs={"max_pixels": 60_000})
    assert v.max_pixels == S.video_frame_pixels("low")


@pytest.mark.parametrize("part, param", [
    (video(max_pixels=FRAME_HIGH + 1), "messages[0].content[0].max_pixels"),
    (video(inner_max_pixels=FRAME_HIGH + 1), "messages[0].content[0].video_url.max_pixels"),
    (video(max_frames=17), "messages[0].content[0].max_frames"),
    (video(inner_min_frames=12, inner_max_frames=8), "messages[0].content[0].video_url.min_frames"),
    (video(min_frames=17), "messages[0].content[0].min_frames"),
    (video(min_frames=0), "messages[0].content[0].min_frames"),
    (video(fps=0), "messages[0].content[0].fps"),
    (video("input_video", max_pixels=FRAME_HIGH + 1), "messages[0].content[0].max_pixels"),
    ({"type": "input_video", "input_video": 5}, "messages[0].content[0].input_video"),
])
def test_bad_video_options_are_400_naming_the_field(part, param):
    err = refusal(body(part))
    assert err.status == 400 and err.param == param, (err.param, err.message)


@pytest.mark.parametrize("input_video", [
    {"data": RAW}, {"data": "data:video/webm;base64," + RAW}, {"url": "data:video/webm;base64," + RAW}, RAW,
])
def test_llama_cpps_input_video_is_read_as_a_video_url(input_video):
    clip = one_video({"type": "input_video", "input_video": input_video, "fps": 1})
    assert clip.data[:4] == b"\x1aE\xdf\xa3" and clip.fps == 1
    assert clip.param == "messages[0].content[0].input_video"


def test_input_video_counts_as_a_video_and_not_in_a_system_message():
    s = Settings(max_videos=1)
    with pytest.raises(APIError) as info:
        parse_chat(body(video("input_video"), video("input_video")), s)
    assert info.value.code == "too_many_videos"
    err = refusal({"messages": [{"role": "system", "content": [video("input_video")]},
                                {"role": "user", "content": "hi"}]})
    assert err.status == 400 and "user messages only" in err.message


def test_min_pixels_raises_a_small_images_resolution_and_max_pixels_lowers_a_large_ones():
    spec = imgs.ImageSpec()
    small = np.zeros((64, 64, 3), np.uint8)
    base = imgs.prepare(small, spec, AUTO)
    up = imgs.prepare(small, spec, AUTO, 400_000)
    assert up.size[0] * up.size[1] >= 400_000 > base.size[0] * base.size[1]
    capped = imgs.prepare(small, spec, 200_704, 10 ** 7)  # the floor never passes the budget (448 x 448)
    assert capped.size[0] * capped.size[1] <= 200_704
    large = np.zeros((1000, 1000, 3), np.uint8)
    assert imgs.prepare(large, spec, 100_000).grid_thw[1] < imgs.prepare(large, spec, 400_000).grid_thw[1]


def test_the_openapi_document_names_the_new_spellings():
    from types import SimpleNamespace

    from vlservice.http.openapi import spec as openapi

    text = str(openapi(SimpleNamespace(extensions={"vlservice": SimpleNamespace(settings=S)})))
    for word in ("mm_processor_kwargs", "input_video", "min_pixels", "max_pixels", "min_frames"):
        assert word in text
