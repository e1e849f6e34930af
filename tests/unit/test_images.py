"""Preprocessing: OpenCV/numpy against the Hugging Face processor (its PIL backend)."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from vlservice.engine import images as I
from vlservice.errors import ImageTooLarge, InvalidImage

from conftest import png_bytes, scene

SPEC = I.ImageSpec()  # Qwen3-VL-2B-Instruct's preprocessor settings
TOLERANCE = 1e-6  # pixel_values are float32 of the same uint8 pixels: only rounding may differ


def hf_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2,
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3,
                                    size={"shortest_edge": SPEC.min_pixels, "longest_edge": SPEC.max_pixels})


def test_grid_matches_hf_smart_resize_for_many_sizes():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    rng = np.random.default_rng(1)
    sizes = [(1, 1), (1, 199), (199, 1), (31, 33), (448, 448), (768, 1024), (4032, 3024), (20, 3999)]
    sizes += [tuple(int(x) for x in rng.integers(1, 5000, 2)) for _ in range(400)]
    budgets = [SPEC.min_pixels, 256 * 1024, 768 * 1024, 2048 * 1024, SPEC.max_pixels]
    checked = 0
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        for budget in budgets:
            assert I.smart_resize(h, w, 32, SPEC.min_pixels, budget) == hf_smart_resize(
                h, w, factor=32, min_pixels=SPEC.min_pixels, max_pixels=budget)
            checked += 1
    assert checked > 1500


@pytest.mark.parametrize("h,w,budget", [(448, 448, None), (768, 1024, None), (120, 200, None),
                                        (1000, 13, None), (3024, 4032, 768 * 1024), (31, 33, None)])
def test_pixel_values_match_hf_processor(h, w, budget):
    rgb = scene(h, w, seed=h + w)
    ours = I.prepare(rgb, SPEC, budget)
    size = {"shortest_edge": SPEC.min_pixels, "longest_edge": budget or SPEC.max_pixels}
    ref = hf_processor()(images=[Image.fromarray(rgb)], size=size, return_tensors="np")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    diff = np.abs(ours.pixel_values - ref["pixel_values"])
    print(f"{h}x{w}: mean abs diff {diff.mean():.2e}, max abs diff {diff.max():.2e}")
    assert diff.max() <= TOLERANCE


def _encode(rgb, ext, **params):
    flags = []
    for k, v in params.items():
        flags += [k, v]
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(rgb[:, :, ::-1]), flags)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("ext", [".png", ".jpg", ".webp", ".bmp"])
def test_decodes_common_formats(ext):
    rgb = scene(60, 90, seed=3)
    out = I.decode(_encode(rgb, ext))
    assert out.shape == (60, 90, 3) and out.dtype == np.uint8
    tol = 0 if ext in (".png", ".bmp") else 40
    assert np.abs(out.astype(int) - rgb.astype(int)).mean() <= max(tol / 4, 0)


def test_gif_first_frame():
    frames = [Image.new("RGB", (40, 30), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out = I.decode(buf.getvalue())
    assert out.shape == (30, 40, 3)
    assert out[15, 20, 0] > 200 and out[15, 20, 2] < 50  # red: the first frame


def test_exif_orientation_is_honoured():
    rgb = np.zeros((40, 80, 3), np.uint8)
    rgb[:, :40] = (255, 0, 0)  # left half red, right half blue
    rgb[:, 40:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=95, exif=exif)
    out = I.decode(buf.getvalue())
    assert out.shape == (80, 40, 3)  # upright: taller than wide
    assert out[5, 20, 0] > 200 and out[75, 20, 2] > 200  # red on top after the rotation


def test_alpha_is_flattened_onto_white_like_transformers():
    from transformers.image_transforms import convert_to_rgb

    rgba = np.zeros((20, 30, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.linspace(0, 255, 30).astype(np.uint8)[None, :]
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    ours = I.decode(buf.getvalue())
    ref = np.asarray(convert_to_rgb(Image.open(io.BytesIO(buf.getvalue()))))
    assert np.abs(ours.astype(int) - ref.astype(int)).max() <= 1
    assert (ours[:, 0] == 255).all()  # fully transparent is white


def test_grayscale_and_16_bit():
    gray = (np.arange(600).reshape(20, 30) % 256).astype(np.uint8)
    out = I.decode(cv2.imencode(".png", gray)[1].tobytes())
    assert out.shape == (20, 30, 3) and (out[..., 0] == gray).all()
    deep = (gray.astype(np.uint16) * 257)
    out16 = I.decode(cv2.imencode(".png", np.dstack([deep] * 3))[1].tobytes())
    assert out16.shape == (20, 30, 3) and (out16[..., 0] == gray).all()


def _png_header(w, h):
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))


@pytest.mark.parametrize("data,error,code", [
    (b"", InvalidImage, "invalid_image"),
    (b"hello, not an image", InvalidImage, "invalid_image"),
    (_png_header(100_000, 100_000) + b"\0" * 100, ImageTooLarge, "image_too_large"),
    (_png_header(10_000, 20), InvalidImage, "invalid_image"),
])
def test_bad_images_are_refused_from_the_header(data, error, code):
    with pytest.raises(error) as exc:
        I.decode(data)
    assert exc.value.code == code


def test_truncated_images():
    data = png_bytes(scene(64, 64))
    with pytest.raises(InvalidImage):
        I.decode(data[: len(data) // 2])
    jpg = _encode(scene(64, 64), ".jpg")
    with pytest.raises(InvalidImage):
        I.decode(jpg[:200])


def test_byte_limit():
    with pytest.raises(ImageTooLarge):
        I.decode(png_bytes(scene(64, 64)), I.Limits(max_bytes=100))


def test_budget_changes_the_grid_and_token_estimate():
    rgb = scene(1200, 1600)
    low = I.prepare(rgb, SPEC, 256 * 1024)
    high = I.prepare(rgb, SPEC, 2048 * 1024)
    assert low.num_tokens < high.num_tokens <= 2048
    assert I.estimate_tokens(1200, 1600, SPEC, 256 * 1024) == low.num_tokens
    assert low.digest != high.digest
