"""Preprocessing: OpenCV/numpy against the Hugging Face processor (its PIL backend)."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from vlservice.engine.media import images as I
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


# --------------------------------------------------------------------------- decoded at the model's size (issue 31)

def _photo(h, w, seed=0):
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)  # smooth, like a photo


@pytest.mark.parametrize("name,data,budget", [
    ("png", png_bytes(scene(300, 500)), None),
    ("jpeg, under 4x the model's size", cv2.imencode(".jpg", _photo(900, 1200))[1].tobytes(), 256 * 32 * 32),
    ("png 16-bit rgba", cv2.imencode(".png", np.dstack([_photo(200, 300).astype(np.uint16) * 257,
                                                        np.linspace(0, 65535, 300, dtype=np.uint16)[None, :]
                                                        .repeat(200, 0)]))[1].tobytes(), None),
])
def test_load_is_prepare_of_decode_for_normal_images(name, data, budget):
    """What the service runs (`load`) gives the same bits as decode-then-prepare, which the tests
    above hold to the Hugging Face processor."""
    ours = I.load(data, SPEC, I.Limits(), budget)
    ref = I.prepare(I.decode(data), SPEC, budget)
    assert ours.grid_thw == ref.grid_thw and ours.source_size == ref.source_size and ours.digest == ref.digest
    assert np.array_equal(ours.pixel_values, ref.pixel_values)
    assert set(ours.timings) == {"image_decode_ms", "preprocess_ms"}


def test_strips_change_no_bit(monkeypatch):
    deep = np.dstack([_photo(300, 410, 1).astype(np.uint16) * 251,
                      np.linspace(0, 65535, 410, dtype=np.uint16)[None, :].repeat(300, 0)])
    rgb = _photo(301, 409, 2)
    whole = (I._to_rgb8(deep.copy()), I.resize_bicubic(rgb, 97, 130), I.resize_bicubic(rgb, 700, 900))
    monkeypatch.setattr(I, "STRIP_BYTES", 4096)  # many strips of a few rows or columns
    strips = (I._to_rgb8(deep.copy()), I.resize_bicubic(rgb, 97, 130), I.resize_bicubic(rgb, 700, 900))
    for a, b in zip(whole, strips):
        assert np.array_equal(a, b)


def test_16_bit_and_alpha_are_reduced_in_strips():
    """The wide temporaries (uint32 per channel) are a strip's, never the image's: numpy's peak
    allocation while converting is the 8-bit result plus a few strips."""
    import tracemalloc

    deep = np.full((2000, 2000, 4), 40000, np.uint16)  # 32 MB; the whole-image uint32 copy: 64 MB
    tracemalloc.start()
    try:
        out = I._to_rgb8(deep)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.shape == (2000, 2000, 3) and out.dtype == np.uint8
    assert peak < out.nbytes + 6 * I.STRIP_BYTES  # 12 MB + 48 MB; the old whole-image conversion: > 150 MB


@pytest.mark.parametrize("orientation", [1, 6])
def test_large_jpeg_is_decoded_reduced_with_the_full_size_grid(orientation):
    h, w = 3000, 4200
    rgb = _photo(h, w, 3)
    exif = Image.Exif()
    exif[0x0112] = orientation  # 6: rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=92, exif=exif)
    data = buf.getvalue()
    budget = 256 * 32 * 32
    assert I.reduction("jpeg", h, w, SPEC, budget) == 2  # 1500x2100 is still twice the model's 448x608
    assert I.reduction("png", h, w, SPEC, budget) == 1
    assert I.reduction("jpeg", h, w, SPEC, None) == 1  # at the model's largest size, no reduction
    ours = I.load(data, SPEC, I.Limits(), budget)
    full = I.prepare(I.decode(data), SPEC, budget)
    assert ours.source_size == full.source_size == ((h, w) if orientation == 1 else (w, h))
    assert ours.grid_thw == full.grid_thw and ours.size == full.size
    # the DCT-domain halving, then the same antialiased bicubic: the same picture, within JPEG noise
    diff = np.abs(ours.pixel_values - full.pixel_values)
    assert diff.mean() < 0.01 and np.percentile(diff, 99) < 0.05
