"""Media options resolved (precedence and the server's limits) and media read from data or remote URLs."""

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass

from pydantic_core import PydanticCustomError

from ..config import Settings
from ..engine.interface import ImageInput, VideoInput, probe, sniff
from ..errors import APIError, ImageTooLarge, InvalidImage, InvalidRequest, InvalidVideo, VideoTooLarge, brief
from .base import _DATA_URL, MEDIA_TYPES, VIDEO_TYPES, _first
from .messages import ImagePart, ImageURL, InputVideoPart, MMProcessorKwargs, TextPart, VideoPart, VideoURL


def _check_media(r, settings: Settings) -> None:
    """The pixel and frame options against the server's limits (refused above them, never clamped),
    and each item's resolved `min_pixels` / `min_frames` against its `max_pixels` / `max_frames`."""
    image_cap, frame_cap = settings.detail_high_pixels, settings.video_frame_pixels("high")

    def bound(name: str, value, cap: int, what: str) -> None:
        if value is not None and value > cap:
            raise PydanticCustomError("invalid_value", f"`{name}` must be between 1 and {cap} (the server's {what}), "
                                      f"got {value}", {"param": name})

    kw = r.mm_processor_kwargs
    if kw is not None:
        bound("mm_processor_kwargs.max_pixels", kw.max_pixels, max(image_cap, frame_cap), "largest pixel budget")
        bound("mm_processor_kwargs.min_pixels", kw.min_pixels, image_cap, "image pixel budget")
    for i, m in enumerate(r.messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(part, ImagePart):
                o = image_options(part, kw, settings, where)
                for name, value in o["given"]:
                    bound(name, value, image_cap, "image pixel budget")
                if kw is not None and kw.max_pixels is not None and not o["max_from_item"]:
                    bound("mm_processor_kwargs.max_pixels", kw.max_pixels, image_cap, "image pixel budget")
                if o["min_pixels"] is not None and o["min_pixels"] > o["max_pixels"]:
                    raise PydanticCustomError(
                        "invalid_value", f"`{o['min_name']}` must be at most the image's max_pixels "
                        f"({o['max_pixels']}), got {o['min_pixels']}", {"param": o["min_name"]})
            elif isinstance(part, (VideoPart, InputVideoPart)):
                o = video_options(part, kw, settings, where)
                for name, value in o["given"]:
                    bound(name, value, frame_cap, "per-frame pixel budget")
                if kw is not None and kw.max_pixels is not None and not o["max_from_item"]:
                    bound("mm_processor_kwargs.max_pixels", kw.max_pixels, frame_cap, "per-frame pixel budget")
                most = o["max_frames"] or settings.max_video_frames
                if o["min_frames"] is not None and o["min_frames"] > most:
                    raise PydanticCustomError("invalid_value", f"`{o['min_frames_name']}` must be between 1 and the "
                                              f"video's max_frames ({most}), got {o['min_frames']}",
                                              {"param": o["min_frames_name"]})



def _max_pixels(item: int | None, detail: str | None, kw: "MMProcessorKwargs | None", by_detail) -> int:
    """The pixel budget, first set wins: the item's own `max_pixels`, its `detail`, the request's
    `mm_processor_kwargs.max_pixels`, the server's default for `detail` auto (``by_detail``)."""
    if item is not None:
        return item
    if detail is None and kw is not None and kw.max_pixels is not None:
        return kw.max_pixels
    return by_detail(detail or "auto")


def image_options(part: "ImagePart", kw: "MMProcessorKwargs | None", settings: Settings, where: str) -> dict:
    """An image part's resolved resolution: `max_pixels` from the `image_url` object's, the part's,
    `detail`, `mm_processor_kwargs`, the server's default (`detail` auto), first set wins;
    `min_pixels` likewise (None: the model's own minimum)."""
    inner = part.image_url if isinstance(part.image_url, ImageURL) else None
    detail = inner.detail if inner is not None else None
    item_max = _first((f"{where}.image_url.max_pixels", inner and inner.max_pixels),
                      (f"{where}.max_pixels", part.max_pixels))
    item_min = _first((f"{where}.image_url.min_pixels", inner and inner.min_pixels),
                      (f"{where}.min_pixels", part.min_pixels))
    max_pixels = _max_pixels(item_max[1], detail, kw, settings.detail_pixels)
    min_name, min_pixels = item_min if item_min[1] is not None else (
        ("mm_processor_kwargs.min_pixels", kw.min_pixels) if kw is not None and kw.min_pixels is not None
        else (None, None))
    given = [(n, v) for n, v in ((f"{where}.image_url.max_pixels", inner and inner.max_pixels),
                                 (f"{where}.max_pixels", part.max_pixels),
                                 (f"{where}.image_url.min_pixels", inner and inner.min_pixels),
                                 (f"{where}.min_pixels", part.min_pixels)) if v is not None]
    return {"max_pixels": max_pixels, "min_pixels": min_pixels, "min_name": min_name, "given": given,
            "max_from_item": item_max[1] is not None or detail is not None, "detail": detail or "auto"}


def video_options(part, kw: "MMProcessorKwargs | None", settings: Settings, where: str) -> dict:
    """A video part's resolved options, with the same precedence: the `video_url` object's field,
    the part's, `detail` (per-frame pixels only), `mm_processor_kwargs`, the server's default."""
    inner = part.video_url if isinstance(part, VideoPart) else None
    detail = inner.detail if inner is not None else None
    item_max = _first((f"{where}.video_url.max_pixels", inner and inner.max_pixels),
                      (f"{where}.max_pixels", part.max_pixels))
    max_pixels = _max_pixels(item_max[1], detail, kw, settings.video_frame_pixels)
    fps = _first(("", inner and inner.fps), ("", part.fps), ("", kw and kw.fps))[1]
    max_frames = _first(("", inner and inner.max_frames), ("", part.max_frames))[1]
    min_frames_name, min_frames = _first((f"{where}.video_url.min_frames", inner and inner.min_frames),
                                         (f"{where}.min_frames", part.min_frames))
    given = [(n, v) for n, v in ((f"{where}.video_url.max_pixels", inner and inner.max_pixels),
                                 (f"{where}.max_pixels", part.max_pixels)) if v is not None]
    return {"max_pixels": max_pixels, "fps": fps, "max_frames": max_frames, "min_frames": min_frames,
            "min_frames_name": min_frames_name, "given": given, "detail": detail or "auto",
            "max_from_item": item_max[1] is not None or detail is not None}


def _parts(content, where: str, settings: Settings, fetch_remote, kw: MMProcessorKwargs | None = None) -> list:
    if content is None:
        return [""]
    if isinstance(content, str):
        return [content]
    out: list = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if isinstance(part, TextPart):
            out.append(part.text)
        elif isinstance(part, VideoPart):
            out.append(_video(part.video_url, f"{at}.video_url", settings, fetch_remote,
                              video_options(part, kw, settings, at)))
        elif isinstance(part, InputVideoPart):
            out.append(_video(part.as_video_url(), f"{at}.input_video", settings, fetch_remote,
                              video_options(part, kw, settings, at)))
        else:
            out.append(_image(part.image_url, f"{at}.image_url", settings, fetch_remote,
                              image_options(part, kw, settings, at)))
    return out


def _image(spec, param: str, settings: Settings, fetch_remote, options: dict | None = None) -> ImageInput:
    url = spec if isinstance(spec, str) else spec.url
    o = options or {}
    detail = o.get("detail") or (None if isinstance(spec, str) else spec.detail) or "auto"

    def image(data: bytes) -> ImageInput:
        return ImageInput(data=data, detail=detail, param=param, max_pixels=o.get("max_pixels"),
                          min_pixels=o.get("min_pixels"))

    if url.startswith("data:"):
        return image(decode_data_url(url, param, settings.max_image_bytes))
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        if fetch_remote is None:
            raise InvalidRequest("remote image URLs are disabled on this server; send the image as a data URL "
                                 "(data:image/jpeg;base64,...)", param=param, code="remote_images_disabled")
        return image(fetch_remote(url, param))
    raise InvalidRequest(f"unsupported image URL scheme {brief(scheme or url[:16])}: use a data URL", param=param,
                         code="invalid_image_url")


def _video(spec: VideoURL, param: str, settings: Settings, fetch_remote, options: dict | None = None) -> VideoInput:
    o = options or {"detail": spec.detail or "auto", "fps": spec.fps, "max_frames": spec.max_frames}

    def clip(data: bytes) -> VideoInput:
        return VideoInput(data=data, detail=o["detail"], fps=o["fps"], max_frames=o["max_frames"], param=param,
                          min_frames=o.get("min_frames"), max_pixels=o.get("max_pixels"))

    url = spec.url
    if url.startswith("data:"):
        return clip(decode_data_url(url, param, settings.max_video_bytes, VIDEO))
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        if fetch_remote is None:
            raise InvalidRequest("remote URLs are disabled on this server; send the video as a data URL "
                                 "(data:video/mp4;base64,...)", param=param, code="remote_images_disabled")
        try:
            return clip(fetch_remote(url, param, max_bytes=settings.max_video_bytes))
        except ImageTooLarge as exc:  # the fetcher's size error, said of a video
            raise VideoTooLarge(exc.message, param=param) from None
    raise InvalidRequest(f"unsupported video URL scheme {brief(scheme or url[:16])}: use a data URL", param=param,
                         code="invalid_video_url")


@dataclass(frozen=True)
class _Media:
    """What a data URL may hold: its media types, and the errors that name it."""

    what: str
    types: dict
    names: str
    invalid: type[APIError]
    too_large: type[APIError]
    kind_of: Callable[[bytes], str]  # the format the bytes are, from their first bytes


IMAGE = _Media("image", MEDIA_TYPES, "PNG, JPEG, WebP, BMP or GIF", InvalidImage, ImageTooLarge, lambda d: probe(d)[0])
VIDEO = _Media("video", VIDEO_TYPES, "MP4, WebM, QuickTime, Matroska or AVI", InvalidVideo, VideoTooLarge, sniff)


def decode_data_url(url: str, param: str, max_bytes: int, media: _Media = IMAGE) -> bytes:
    """A `data:<type>;base64,` URL's bytes, checked: the size before decoding, the declared type
    against the data after."""
    m = _DATA_URL.match(url[:256])
    if not m:
        raise media.invalid(f"malformed data URL: expected data:{media.what}/...;base64,...", param=param)
    if not m.group("b64"):
        raise media.invalid("the data URL must be base64-encoded (;base64,)", param=param)
    declared = (m.group("type") or "").lower()
    if declared and declared not in media.types:
        raise media.invalid(f"unsupported media type {brief(declared)}; send {media.names}", param=param)
    payload = url[m.end():]
    if len(payload) > (max_bytes * 4) // 3 + 8:
        raise media.too_large(f"the {media.what} is larger than the limit of {max_bytes} bytes", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise media.invalid("the data URL's base64 payload is invalid", param=param) from None
    if declared:
        try:
            actual = media.kind_of(data)
        except APIError as exc:
            exc.param = param
            raise
        if media.types[declared] != actual:
            raise media.invalid(f"the data URL says {declared} but the data is {actual.upper()}", param=param)
    return data
