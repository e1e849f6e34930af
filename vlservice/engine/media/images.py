"""Image bytes in, the model's `pixel_values` and `grid_thw` out: OpenCV and numpy only, no torch.

Why not the Hugging Face processor: its default backend needs torchvision (which does not load
beside the CPU torch we ship) and PIL is slow on large photos. This module reproduces what
`Qwen2VLImageProcessorPil` does, step by step:

1. decode (JPEG, PNG, WebP, BMP, first frame of a GIF), honour EXIF orientation, 16-bit to 8-bit,
   grayscale to RGB, alpha flattened onto white (as `transformers`' `convert_to_rgb`);
2. `smart_resize`: each side a multiple of patch_size*merge_size, pixels within [min, max];
3. resize with PIL's antialiased bicubic, re-implemented in numpy with PIL's own fixed-point
   arithmetic, so the resized uint8 image equals PIL's bit for bit (see tests/unit/test_images.py).
   OpenCV's bicubic is not PIL's (no antialiasing when shrinking), and this resize is the one
   thing the server would need Pillow for: keeping it here is why the server needs no Pillow
   (only the benchmark's baseline, the Hugging Face PIL processor, does: a tool dependency);
4. rescale, normalise, patchify into the processor's flat `(patches, C*T*P*P)` layout.

Limits are checked from the header, before any pixel is decoded (decompression bombs), and so is
a JPEG's number of scans: libjpeg decodes every scan of a progressive JPEG over the whole image,
so a small file of thousands of scans took OpenCV 19 s (libjpeg-turbo's djpeg has `-maxscans`).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import time
from dataclasses import dataclass, field

os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(64 * 1024 * 1024))  # before cv2 is imported

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from ...errors import ImageTooLarge, InvalidImage  # noqa: E402

cv2.setNumThreads(1)  # decode and resize are small next to the model; keep the cores for it


@dataclass(frozen=True)
class ImageSpec:
    """The model's image settings, from its `preprocessor_config.json`."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    min_pixels: int = 65536
    max_pixels: int = 16777216

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_preprocessor_config(cls, cfg: dict) -> "ImageSpec":
        size = cfg.get("size") or {}
        return cls(
            patch_size=int(cfg.get("patch_size", 16)),
            merge_size=int(cfg.get("merge_size", 2)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", 2)),
            image_mean=tuple(float(x) for x in cfg.get("image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(float(x) for x in cfg.get("image_std", (0.5, 0.5, 0.5))),
            min_pixels=int(cfg.get("min_pixels") or size.get("shortest_edge") or 65536),
            max_pixels=int(cfg.get("max_pixels") or size.get("longest_edge") or 16777216),
        )


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_aspect_ratio: float = 200.0
    max_jpeg_scans: int = 100  # a progressive JPEG from a camera or an encoder has ~10


@dataclass
class Prepared:
    """One image, ready for the vision encoder."""

    resized: np.ndarray  # (height, width, 3) uint8 at the model's size: 8x smaller than its pixel values
    grid_thw: tuple  # (1, grid_h, grid_w)
    size: tuple  # (height, width) after resize
    source_size: tuple  # (height, width) as decoded
    digest: str = ""  # content hash of the resized pixels and grid: the feature cache's key
    timings: dict = field(default_factory=dict)  # image_decode_ms, preprocess_ms (set by `load`)
    spec: ImageSpec = field(default_factory=ImageSpec)

    @property
    def pixel_values(self) -> np.ndarray:
        """(grid_h*grid_w, C*T*P*P) float32, computed when asked (the encoder's input): a request
        waiting for its turn holds only the uint8 image."""
        return pixel_values(self.resized, self.spec)

    @property
    def num_tokens(self) -> int:
        return self.grid_thw[1] * self.grid_thw[2] // 4  # merge_size**2 for every Qwen3-VL


# --------------------------------------------------------------------------- header probe

def probe(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) read from the header alone; raises InvalidImage if unknown."""
    if len(data) == 0:
        raise InvalidImage("the image is empty (0 bytes)")
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise InvalidImage("truncated PNG header")
        w, h = struct.unpack(">II", data[16:24])
        return "png", w, h
    if data[:3] == b"\xff\xd8\xff":
        return ("jpeg", *_jpeg_size(data))
    if data[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 10:
            raise InvalidImage("truncated GIF header")
        w, h = struct.unpack("<HH", data[6:10])
        return "gif", w, h
    if data[:2] == b"BM":
        if len(data) < 26:
            raise InvalidImage("truncated BMP header")
        w, h = struct.unpack("<ii", data[18:26])
        return "bmp", abs(w), abs(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ("webp", *_webp_size(data))
    raise InvalidImage("the data is not a supported image (JPEG, PNG, WebP, BMP or GIF)")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise InvalidImage("corrupt JPEG: bad marker")
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            if i + 9 > n:
                break
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + length
    raise InvalidImage("truncated JPEG: no frame header")


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        b = data[21:25]
        w = 1 + (((b[1] & 0x3F) << 8) | b[0])
        h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
        return w, h
    if chunk == b"VP8X" and len(data) >= 30:
        w = 1 + int.from_bytes(data[24:27], "little")
        h = 1 + int.from_bytes(data[27:30], "little")
        return w, h
    raise InvalidImage("truncated or unsupported WebP header")


# --------------------------------------------------------------------------- decode

def check(data: bytes, limits: Limits = Limits()) -> tuple[str, int, int]:
    """(format, width, height) from the header, checked against the limits before any pixel is decoded."""
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(f"the image is {len(data)} bytes; the limit is {limits.max_bytes} bytes")
    fmt, w, h = probe(data)
    if w <= 0 or h <= 0:
        raise InvalidImage(f"the image header declares an empty size ({w}x{h})")
    if w * h > limits.max_pixels:
        raise ImageTooLarge(
            f"the image is {w}x{h} = {w * h} pixels; the limit is {limits.max_pixels} pixels"
        )
    if max(w, h) / min(w, h) > limits.max_aspect_ratio:
        raise InvalidImage(
            f"the image is {w}x{h}: aspect ratio {max(w, h) / min(w, h):.0f}:1 exceeds "
            f"{limits.max_aspect_ratio:.0f}:1"
        )
    if fmt == "jpeg" and (scans := jpeg_scans(data, limits.max_jpeg_scans)) > limits.max_jpeg_scans:
        raise InvalidImage(f"the JPEG has more than {limits.max_jpeg_scans} scans ({scans} or more); "
                           f"at most {limits.max_jpeg_scans} are decoded")
    return fmt, w, h


def jpeg_scans(data: bytes, most: int) -> int:
    """An upper bound on a JPEG's scans, counting up to `most` + 1: each scan starts with an SOS
    marker (FF DA), and entropy-coded data never holds FF DA (a data byte FF is written FF 00), so
    counting the byte pair bounds the scans (an embedded thumbnail's are counted too)."""
    n, i = 0, data.find(b"\xff\xda")
    while i >= 0 and n <= most:
        n += 1
        i = data.find(b"\xff\xda", i + 2)
    return n


def decode(data: bytes, limits: Limits = Limits(), reduce: int = 1) -> np.ndarray:
    """Bytes to an RGB uint8 array (H, W, 3), or InvalidImage / ImageTooLarge. `reduce` (2, 4 or 8,
    JPEG only) has libjpeg decode at 1/reduce of the size, in the DCT: the full size never exists."""
    fmt, w, h = check(data, limits)
    buf = np.frombuffer(data, dtype=np.uint8)
    if fmt == "jpeg":
        # IMREAD_COLOR applies the EXIF orientation and converts CMYK and grayscale for us.
        img = cv2.imdecode(buf, _REDUCED_COLOR.get(reduce, cv2.IMREAD_COLOR))
    else:
        reduce = 1
        img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if img is None or img.size == 0:
        raise InvalidImage(f"the {fmt.upper()} data could not be decoded (truncated or corrupt)")
    rh, rw = -(-h // reduce), -(-w // reduce)
    if fmt == "jpeg" and (img.shape[0], img.shape[1]) not in ((rh, rw), (rw, rh)):
        raise InvalidImage("the JPEG data is corrupt (decoded size differs from its header)")
    return _to_rgb8(img)


_REDUCED_COLOR = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def reduction(fmt: str, height: int, width: int, spec: ImageSpec, max_pixels: int | None = None,
              min_pixels: int | None = None) -> int:
    """How much smaller (1, 2, 4 or 8) a JPEG can be decoded, by libjpeg's scaled DCT, and still be
    at least twice the model's size on each side (then the antialiased resize does the rest). Other
    formats, and JPEGs whose reduced sides would be equal though the full ones are not (the EXIF
    rotation could then not be told from the decoded shape), decode at full size: 1."""
    if fmt != "jpeg":
        return 1
    budget = _budget(spec, max_pixels)
    th, tw = smart_resize(height, width, spec.factor, _floor(spec, budget, min_pixels), budget)
    for r in (8, 4, 2):
        rh, rw = -(-height // r), -(-width // r)
        if rh >= 2 * th and rw >= 2 * tw and (rh != rw or height == width):
            return r
    return 1


def load(data: bytes, spec: ImageSpec, limits: Limits = Limits(), max_pixels: int | None = None,
         min_pixels: int | None = None) -> Prepared:
    """Bytes to a `Prepared` image, decoded at the size the model uses: the header is checked first,
    a large JPEG is decoded reduced (`reduction`), 16-bit and alpha are reduced to RGB8 in strips,
    and the resize works in strips, so no full-size temporary beyond the decoded image exists. The
    grid and `source_size` are those of the full-size image (grounding boxes are in its pixels)."""
    t0 = time.perf_counter()
    fmt, w, h = check(data, limits)
    r = reduction(fmt, h, w, spec, max_pixels, min_pixels)
    rgb = decode(data, limits, r)
    source = None
    if r > 1:  # EXIF may have rotated it: the decoded shape says which way up (reduction() made it unambiguous)
        source = (h, w) if rgb.shape[:2] == (-(-h // r), -(-w // r)) else (w, h)
    t1 = time.perf_counter()
    prepared = prepare(rgb, spec, max_pixels, min_pixels, source_size=source)
    prepared.timings = {"image_decode_ms": (t1 - t0) * 1e3, "preprocess_ms": (time.perf_counter() - t1) * 1e3}
    return prepared


STRIP_BYTES = 8 << 20  # the most a temporary of one strip holds (conversions and resize passes)


def _to_rgb8(img: np.ndarray) -> np.ndarray:
    """Any decoded image to RGB uint8. 16-bit, float and alpha are converted in strips of rows, so
    their wide temporaries (uint32, float) are a strip's, never the whole image's."""
    if img.dtype not in (np.uint8, np.uint16, np.float32, np.float64):
        raise InvalidImage(f"unsupported pixel type {img.dtype}")
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels not in (1, 3, 4):
        raise InvalidImage(f"unsupported number of channels: {channels}")
    if img.dtype == np.uint8 and channels == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB, dst=img)  # in place: no second copy
    out = np.empty(img.shape[:2] + (3,), np.uint8)
    step = max(1, STRIP_BYTES // max(1, img.shape[1] * channels * 8))
    for a in range(0, img.shape[0], step):
        out[a:a + step] = _strip_to_rgb8(img[a:a + step])
    return out


def _strip_to_rgb8(img: np.ndarray) -> np.ndarray:
    if img.dtype == np.uint16:
        img = ((img.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    elif img.dtype in (np.float32, np.float64):
        img = np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)
    if img.ndim == 2 or img.shape[2] == 1:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    if img.shape[2] == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    # Flatten onto white, with PIL's alpha_composite rounding: (a*c + (255-a)*255) / 255.
    rgb = img[:, :, 2::-1].astype(np.uint32)
    alpha = img[:, :, 3:4].astype(np.uint32)
    out = (rgb * alpha + 255 * (255 - alpha) + 127) // 255
    return out.astype(np.uint8)


# --------------------------------------------------------------------------- resize

def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The Qwen2-VL/Qwen3-VL processor's rule, to the letter (so `grid_thw` is identical)."""
    if max(height, width) / min(height, width) > 200:
        raise InvalidImage(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


_PRECISION_BITS = 32 - 8 - 2  # PIL's fixed point for 8-bit images


def _bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    return np.where(
        x < 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
        np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and fixed-point weights per output pixel, as PIL's precompute_coeffs."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    centers = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum((centers + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    valid = taps[None, :] < xmax[:, None]
    weights = _bicubic((taps[None, :] + xmin[:, None] - centers[:, None] + 0.5) / filterscale)
    weights = np.where(valid, weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(total != 0.0, weights / np.where(total == 0.0, 1.0, total), 0.0)
    one = float(1 << _PRECISION_BITS)
    fixed = np.where(weights < 0, np.trunc(-0.5 + weights * one), np.trunc(0.5 + weights * one))
    index = np.minimum(xmin[:, None] + taps[None, :], in_size - 1)
    return index, fixed.astype(np.int32)


def _resample_axis(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One pass of the resize along `axis`, in strips along another axis (the int32 accumulators
    and per-tap temporaries are a strip's: at most about `STRIP_BYTES` each); the arithmetic per
    output pixel is the same whatever the strips are."""
    index, weights = _coefficients(img.shape[axis], out_size)
    shape = img.shape[:axis] + (out_size,) + img.shape[axis + 1:]
    other = 1 if axis == 0 else 0
    out = np.empty(shape, np.uint8)
    per_slice = max(1, math.prod(shape) // shape[other] * 4)
    step = max(1, STRIP_BYTES // per_slice)
    cut = [slice(None)] * img.ndim
    for a in range(0, shape[other], step):
        cut[other] = slice(a, a + step)
        out[tuple(cut)] = _resample_block(img[tuple(cut)], index, weights, axis)
    return out


def _resample_block(img: np.ndarray, index: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    out_size = index.shape[0]
    acc = np.full(
        img.shape[:axis] + (out_size,) + img.shape[axis + 1:], 1 << (_PRECISION_BITS - 1), dtype=np.int32
    )
    shape = [1] * img.ndim
    shape[axis] = out_size
    for k in range(index.shape[1]):
        w = weights[:, k]
        if not w.any():
            continue
        # int32 is enough: 255 * sum(|w|) * 2**22 stays below 2**31 for the bicubic kernel.
        acc += np.take(img, index[:, k], axis=axis).astype(np.int32) * w.reshape(shape)
    np.clip(acc >> _PRECISION_BITS, 0, 255, out=acc)
    return acc.astype(np.uint8)


def resize_bicubic(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """PIL's `Image.resize((width, height), BICUBIC)` on an RGB uint8 array, bit for bit."""
    if img.shape[1] != width:
        img = _resample_axis(img, width, axis=1)
    if img.shape[0] != height:
        img = _resample_axis(img, height, axis=0)
    return img


# --------------------------------------------------------------------------- patchify

def patchify(image: np.ndarray, spec: ImageSpec) -> tuple[np.ndarray, int, int]:
    """(H, W, 3) normalised float32 to the processor's flat layout and its grid."""
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    chw = np.transpose(image, (2, 0, 1))
    c, h, w = chw.shape
    gh, gw = h // p, w // p
    patches = chw.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
    return np.ascontiguousarray(patches.reshape(gh * gw, c * t * p * p), dtype=np.float32), gh, gw


def _budget(spec: ImageSpec, max_pixels: int | None) -> int:
    budget = spec.max_pixels if max_pixels is None else min(max_pixels, spec.max_pixels)
    return max(budget, spec.min_pixels)


def _floor(spec: ImageSpec, budget: int, min_pixels: int | None) -> int:
    """The model's lower bound, raised by a request's `min_pixels`, never above the budget."""
    return spec.min_pixels if min_pixels is None else min(max(min_pixels, spec.min_pixels), budget)


def prepare(rgb: np.ndarray, spec: ImageSpec, max_pixels: int | None = None, min_pixels: int | None = None,
            source_size: tuple | None = None) -> Prepared:
    """A decoded RGB image to `pixel_values` and `grid_thw` under a pixel budget; `min_pixels` (a
    request's) raises the model's lower bound, never above the budget. `source_size`: the (height,
    width) the grid is computed from when `rgb` was decoded reduced (default: its own)."""
    h0, w0 = source_size or rgb.shape[:2]
    budget = _budget(spec, max_pixels)
    h, w = smart_resize(h0, w0, spec.factor, _floor(spec, budget, min_pixels), budget)
    resized = resize_bicubic(rgb, h, w)
    gh, gw = h // spec.patch_size, w // spec.patch_size
    # The resized uint8 image fixes pixel_values entirely (for one spec) and is 4x smaller to hash.
    digest = hashlib.blake2b(resized.tobytes(), digest_size=16, person=f"{h}x{w}".encode()[:16]).hexdigest()
    return Prepared(resized=resized, grid_thw=(1, gh, gw), size=(h, w), source_size=(h0, w0), digest=digest,
                    spec=spec)


def pixel_values(resized: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """A resized RGB uint8 image to the processor's `pixel_values`: rescale, normalise, patchify."""
    normalised = resized.astype(np.float32)
    normalised *= np.float32(1 / 255)  # in place, the same float32 operations in the same order
    normalised -= np.asarray(spec.image_mean, dtype=np.float32)
    normalised /= np.asarray(spec.image_std, dtype=np.float32)
    return patchify(normalised, spec)[0]


def estimate_tokens(height: int, width: int, spec: ImageSpec, max_pixels: int) -> int:
    h, w = smart_resize(height, width, spec.factor, spec.min_pixels, max(min(max_pixels, spec.max_pixels), spec.min_pixels))
    return (h // spec.factor) * (w // spec.factor)
