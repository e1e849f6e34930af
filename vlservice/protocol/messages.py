"""The conversation: messages and their parts (text, images, videos), with the peers' spellings
of media options (Qwen's per-item fields, vLLM's `mm_processor_kwargs`, llama.cpp's `input_video`)."""

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, Tag
from pydantic_core import PydanticCustomError

from .base import MAX_STOP, MAX_STOP_CHARS, _In, _integral_float, _pick


class TextPart(_In):
    type: Literal["text"]
    text: str



def _pixels(description: str):
    """An optional pixel count (Qwen's `min_pixels` / `max_pixels`): a positive integer; the upper
    bound is the server's (checked in the request model, which knows the `Settings`)."""
    return Field(None, description=description)


Pixels = Annotated[int, Field(ge=1), BeforeValidator(_integral_float)] | None
IMAGE_MAX_PIXELS = ("Qwen's spelling: the image's pixel budget (width x height after resizing), at most "
                    "VL_DETAIL_HIGH_PIXELS, `detail: high`'s budget (above it: 400; the model's own processor "
                    "range, /api/config `detail_max_pixels`, still applies); takes precedence over `detail` and "
                    "over `mm_processor_kwargs.max_pixels`")
IMAGE_MIN_PIXELS = ("Qwen's spelling: a smaller image is scaled up to at least this many pixels (at most "
                    "`max_pixels`); takes precedence over `mm_processor_kwargs.min_pixels`")
FRAME_MAX_PIXELS = ("Qwen's spelling: each sampled frame's pixel budget, at most VL_VIDEO_DETAIL_HIGH_PIXELS "
                    "(/api/config `video.detail_frame_pixels.high`; above it: 400); takes precedence over "
                    "`detail` and over `mm_processor_kwargs.max_pixels`")
FPS_DESCRIPTION = ("frames sampled per second of video (default 2, as the model's processor); takes precedence "
                   "over `mm_processor_kwargs.fps`")
MIN_FRAMES = "Qwen's spelling: at least this many sampled frames (default 4; at most `max_frames`)"


class ImageURL(_In):
    url: str = Field(description="the image as a data URL, `data:image/<png|jpeg|webp|bmp|gif>;base64,<payload>` "
                                 "(the declared type must match the data), or an https URL when the server "
                                 "allows remote images (VL_REMOTE_IMAGES)")
    detail: Literal["low", "auto", "high"] | None = Field(
        None, description="resolution budget (see /api/config `detail_max_pixels`); null means auto")
    max_pixels: Pixels = _pixels(IMAGE_MAX_PIXELS + " (here it also wins over the part's own `max_pixels`)")
    min_pixels: Pixels = _pixels(IMAGE_MIN_PIXELS + " (here it also wins over the part's own `min_pixels`)")


class ImagePart(_In):
    type: Literal["image_url"]
    image_url: Annotated[Union[Annotated[ImageURL, Tag("ImageURL")], Annotated[str, Tag("URL")]],
                         _pick(lambda v: "ImageURL" if isinstance(v, dict) else "URL" if isinstance(v, str) else None,
                               "image_url_type")] = Field(
        description="an object with `url`, or the URL itself as a string")
    max_pixels: Pixels = _pixels(IMAGE_MAX_PIXELS)
    min_pixels: Pixels = _pixels(IMAGE_MIN_PIXELS)


class VideoURL(_In):
    url: str = Field(description="the clip as a data URL, `data:video/<mp4|webm|quicktime|x-matroska|avi>;base64,"
                                 "<payload>` (the declared type must match the data), or an https URL when the "
                                 "server allows remote files (VL_REMOTE_IMAGES)")
    detail: Literal["low", "auto", "high"] | None = Field(
        None, description="per-frame resolution budget (see /api/config `video.detail_frame_pixels`); null means auto")
    fps: float | None = Field(None, gt=0, le=30, description=FPS_DESCRIPTION)
    # the bound inside Annotated, before the validator: otherwise pydantic writes it to the schema as "ge",
    # which JSON Schema does not know (clients and schemathesis then took -445 for valid)
    max_frames: Annotated[int, Field(ge=4), BeforeValidator(_integral_float)] | None = Field(
        None, description="at most this many sampled frames (default and upper bound: VL_MAX_VIDEO_FRAMES; an "
                                "odd number counts as the even one below: frames go in pairs)")
    min_frames: Annotated[int, Field(ge=1), BeforeValidator(_integral_float)] | None = Field(
        None, description=MIN_FRAMES)
    max_pixels: Pixels = _pixels(FRAME_MAX_PIXELS)


class _VideoOptions(_In):
    """Qwen's per-item video options, written beside the part's media object (the object's own win)."""

    fps: float | None = Field(None, gt=0, le=30, description=FPS_DESCRIPTION)
    max_frames: Annotated[int, Field(ge=4), BeforeValidator(_integral_float)] | None = Field(
        None, description="as `video_url.max_frames`")
    min_frames: Annotated[int, Field(ge=1), BeforeValidator(_integral_float)] | None = Field(
        None, description=MIN_FRAMES)
    max_pixels: Pixels = _pixels(FRAME_MAX_PIXELS)


class VideoPart(_VideoOptions):
    type: Literal["video_url"]
    video_url: VideoURL = Field(description="vLLM's video part: an object with `url` and optional `fps`, "
                                            "`max_frames`, `min_frames`, `max_pixels`, `detail`")


class InputVideo(_In):
    url: str | None = Field(None, description="as `video_url.url`")
    data: str | None = Field(None, description="llama.cpp's spelling: the clip's bytes in base64 (no `data:` "
                                               "prefix), or a data URL")


class InputVideoPart(_VideoOptions):
    """llama.cpp's video part, read as a `video_url` part."""

    type: Literal["input_video"]
    input_video: Annotated[Union[Annotated[InputVideo, Tag("InputVideo")], Annotated[str, Tag("Data")]],
                           _pick(lambda v: "InputVideo" if isinstance(v, dict) else "Data" if isinstance(v, str) else None,
                                 "input_video_type")] = Field(
        description="llama.cpp's spelling: an object with `data` (base64) or `url`, or the base64 (or a data URL) "
                    "as a string")

    def as_video_url(self) -> VideoURL:
        v = self.input_video
        raw = v if isinstance(v, str) else (v.url or v.data or "")
        if not raw.startswith(("data:", "http:", "https:")) and ":" not in raw[:16]:
            raw = "data:;base64," + raw  # llama.cpp's raw base64: the type is read from the bytes
        return VideoURL(url=raw)


class MMProcessorKwargs(_In):
    """vLLM's request-level media options; each item's own fields (and `detail`) take precedence."""

    max_pixels: Pixels = _pixels("every image's pixel budget (at most VL_DETAIL_HIGH_PIXELS) and every video "
                                 "frame's (at most VL_VIDEO_DETAIL_HIGH_PIXELS); above: 400")
    min_pixels: Pixels = _pixels("every image's lower bound in pixels (images only)")
    fps: float | None = Field(None, gt=0, le=30, description="every video's frames sampled per second")


def _part_tag(v):
    if isinstance(v, dict) and isinstance(v.get("type"), str):
        return {"text": "TextPart", "image_url": "ImagePart", "video_url": "VideoPart",
                "input_video": "InputVideoPart"}.get(v["type"])


def _text_only(v):
    """A part of a system or assistant message: text only (images go in user messages)."""
    if not (isinstance(v, dict) and v.get("type") == "text"):
        raise PydanticCustomError("text_part_type", "text_part_type")
    return v


def _content_tag(v):
    return "Text" if isinstance(v, str) else "Parts" if isinstance(v, list) else None


_UserPart = Annotated[Union[Annotated[TextPart, Tag("TextPart")], Annotated[ImagePart, Tag("ImagePart")],
                           Annotated[VideoPart, Tag("VideoPart")], Annotated[InputVideoPart, Tag("InputVideoPart")]],
                     _pick(_part_tag, "part_type")]
UserContent = Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[_UserPart], Tag("Parts")]],
                        _pick(_content_tag, "content_type")]
TextContent = Annotated[Union[Annotated[str, Tag("Text")],
                              Annotated[list[Annotated[TextPart, BeforeValidator(_text_only)]], Tag("Parts")]],
                        _pick(_content_tag, "content_type")]


class SystemMessage(_In):
    role: Literal["system", "developer"]
    content: TextContent


class UserMessage(_In):
    role: Literal["user"]
    content: UserContent = Field(description="text, or text and image parts in order")


class FunctionCall(_In):
    name: str = Field(min_length=1, max_length=64, description="the function called")
    arguments: str = Field(description="its arguments as the JSON text of an object, as the answer gave them")


class AssistantToolCall(_In):
    id: str = Field(max_length=256, description="the call's id, which the `tool` message answering it names")
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_In):
    role: Literal["assistant"]
    content: TextContent | None = Field(None, description="null or missing: an empty message")
    tool_calls: list[AssistantToolCall] | None = Field(None, description=(
        "the calls this turn made (an earlier answer's `tool_calls`), rendered in the model's own format"))


class ToolMessage(_In):
    role: Literal["tool"]
    tool_call_id: str = Field(max_length=256, description="the call this answers")
    content: TextContent = Field(description="what the function returned, as text")


def _role_tag(v):
    if isinstance(v, dict) and isinstance(v.get("role"), str):
        return {"system": "SystemMessage", "developer": "SystemMessage", "user": "UserMessage",
                "assistant": "AssistantMessage", "tool": "ToolMessage"}.get(v["role"])


ChatMessage = Annotated[Union[Annotated[SystemMessage, Tag("SystemMessage")], Annotated[UserMessage, Tag("UserMessage")],
                              Annotated[AssistantMessage, Tag("AssistantMessage")], Annotated[ToolMessage, Tag("ToolMessage")]],
                        _pick(_role_tag, "message_role")]

Stop = Annotated[Union[Annotated[Annotated[str, Field(max_length=MAX_STOP_CHARS)], Tag("One")],
                       Annotated[Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOP)],
                                 Tag("Many")]],
                 _pick(lambda v: "One" if isinstance(v, str) else "Many" if isinstance(v, list) else None, "stop_type")]
