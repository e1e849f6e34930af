"""The OpenAI Chat Completions contract, declared once: pydantic models of the request (with the
bounds of the running `Settings`) and of the answers. `parse_chat` validates a request through
them; `vlservice/http/openapi.py` generates the OpenAPI document from the same models, so the
documentation cannot promise what the validator refuses, nor the reverse.

Policy: the parameters we implement are checked strictly (JSON types as JSON Schema reads them:
5.0 is an integer, "5" is not; out of range is refused, never clamped); OpenAI parameters we
cannot honour are refused when they ask for something (`n` > 1, `tools`) and accepted when they
ask for nothing; names OpenAI does not define are ignored, as OpenAI's own API does.

What the models cannot say in JSON Schema is checked in the request model's last step (at most
`max_images` images in all, `min_tokens` <= `max_tokens`); what needs the bytes (a data URL's
payload is an image of the type it declares, remote URLs) is checked while building the engine's
`ChatRequest`. Every failure becomes an `InvalidRequest` naming the field (`param`, e.g.
`messages[0].content[1].image_url`), the bound and the value given.
"""

import base64
import binascii
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, Union

from annotated_types import Ge, Gt, Le
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag,
                      ValidationError, WithJsonSchema, model_validator)
from pydantic_core import PydanticCustomError

from .config import Settings
from .engine.images import probe
from .engine.types import ChatRequest, ImageInput, Message, Sampling, VideoInput
from .engine.video import sniff
from .errors import APIError, ImageTooLarge, InvalidImage, InvalidRequest, InvalidVideo, VideoTooLarge

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
DETAILS = ("low", "auto", "high")
MEDIA_TYPES = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/webp": "webp",
               "image/bmp": "bmp", "image/x-ms-bmp": "bmp", "image/gif": "gif"}
VIDEO_TYPES = {"video/mp4": "mp4", "video/quicktime": "mp4", "video/webm": "webm", "video/x-matroska": "webm",
               "video/avi": "avi", "video/x-msvideo": "avi"}
MAX_STOP = 4
MAX_DEPTH = 32  # JSON nesting of a request body; a chat request needs 6
MAX_STOP_CHARS = 64
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
INTEGERS = ("max_tokens", "max_completion_tokens", "min_tokens", "top_k", "seed", "n", "top_logprobs")
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's decoder joins valid pairs, so any left is lone
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


# --------------------------------------------------------------------------- request

class _In(BaseModel):
    """A request object: JSON types exactly (no "5" for 5, no true for 1), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": True})


def _tagged(choose, error: str, *choices):
    """A union that picks its member by looking at the value (`choose` returns a tag or None), so a
    bad value gets one error, from the member it was meant to be, with its path (`error` otherwise)."""
    return Annotated[Union[tuple(Annotated[t, Tag(tag)] for tag, t in choices)],
                     Discriminator(choose, custom_error_type=error, custom_error_message=error)]


class TextPart(_In):
    type: Literal["text"]
    text: str


def _integral_float(v):
    """JSON Schema counts 61.0 as an integer, so the validator does too (61.5 stays refused)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


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
    image_url: _tagged(lambda v: "ImageURL" if isinstance(v, dict) else "URL" if isinstance(v, str) else None,
                       "image_url_type", ("ImageURL", ImageURL), ("URL", str)) = Field(
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
    input_video: _tagged(lambda v: "InputVideo" if isinstance(v, dict) else "Data" if isinstance(v, str) else None,
                         "input_video_type", ("InputVideo", InputVideo), ("Data", str)) = Field(
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


UserContent = _tagged(_content_tag, "content_type", ("Text", str), ("Parts", list[_tagged(
    _part_tag, "part_type", ("TextPart", TextPart), ("ImagePart", ImagePart), ("VideoPart", VideoPart),
    ("InputVideoPart", InputVideoPart))]))
TextContent = _tagged(_content_tag, "content_type", ("Text", str),
                      ("Parts", list[Annotated[TextPart, BeforeValidator(_text_only)]]))


class SystemMessage(_In):
    role: Literal["system", "developer"]
    content: TextContent


class UserMessage(_In):
    role: Literal["user"]
    content: UserContent = Field(description="text, or text and image parts in order")


class AssistantMessage(_In):
    role: Literal["assistant"]
    content: TextContent | None = Field(None, description="null or missing: an empty message")


def _role_tag(v):
    if isinstance(v, dict) and isinstance(v.get("role"), str):
        return {"system": "SystemMessage", "developer": "SystemMessage", "user": "UserMessage",
                "assistant": "AssistantMessage"}.get(v["role"])


ChatMessage = _tagged(_role_tag, "message_role", ("SystemMessage", SystemMessage), ("UserMessage", UserMessage),
                      ("AssistantMessage", AssistantMessage))

Stop = _tagged(lambda v: "One" if isinstance(v, str) else "Many" if isinstance(v, list) else None, "stop_type",
               ("One", Annotated[str, Field(max_length=MAX_STOP_CHARS)]),
               ("Many", Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOP)]))


class StreamOptions(_In):
    include_usage: bool = Field(False, description="one last chunk with empty `choices`, `usage` and `timings`")
    include_stages: bool = Field(False, description=(
        "extension: stages (queued, vision_encode, prefill) also as `event: vlservice.stage` events"))


class _Format(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class TextFormat(_Format):
    """Free text (the default)."""

    type: Literal["text"]


class JsonObjectFormat(_Format):
    """The answer is one JSON object (any keys), enforced by grammar-constrained decoding."""

    type: Literal["json_object"]


class JsonSchemaSpec(_Format):
    name: str = Field(min_length=1, max_length=64, description="the schema's name (as OpenAI's; not used)")
    description: str | None = Field(None, description="accepted and ignored")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description=(
        "a JSON Schema the answer must validate against (objects, arrays, enums, strings, numbers with bounds, "
        "$defs/$ref, anyOf...); absent: any JSON object. A schema that is invalid or uses a keyword the grammar "
        "compiler does not support is refused (400, `param` response_format.json_schema.schema)"))
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")


class JsonSchemaFormat(_Format):
    """The answer validates against `json_schema.schema`, enforced by grammar-constrained decoding."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec

    @model_validator(mode="after")
    def _compiles(self):
        from .engine.constrain import GrammarError, explain, grammar_for

        if self.json_schema.schema_ is not None:
            try:
                grammar_for("json_schema", self.json_schema.schema_)
            except GrammarError as exc:
                raise PydanticCustomError("invalid_schema", "`response_format.json_schema.schema` cannot be used: "
                                          "{reason}", {"param": "response_format.json_schema.schema",
                                                       "reason": explain(exc)}) from None
        return self


RESPONSE_FORMATS = {"text": "Text", "json_object": "JsonObject", "json_schema": "JsonSchema"}
ResponseFormat = _tagged(lambda v: RESPONSE_FORMATS.get(v["type"]) if isinstance(v, dict) and isinstance(v.get("type"), str)
                         else None,
                         "response_format_type", ("Text", TextFormat), ("JsonObject", JsonObjectFormat),
                         ("JsonSchema", JsonSchemaFormat))


def grammar_of(fmt) -> str | None:
    """The llguidance grammar a `response_format` asks for (None: free text)."""
    from .engine.constrain import grammar_for

    if isinstance(fmt, JsonObjectFormat) or (isinstance(fmt, JsonSchemaFormat) and fmt.json_schema.schema_ is None):
        return grammar_for("json_object")
    if isinstance(fmt, JsonSchemaFormat):
        return grammar_for("json_schema", fmt.json_schema.schema_)
    return None


def _unsupported(name: str, what: str):
    """An OpenAI parameter we cannot honour: refused when it asks for something."""

    def nothing_asked(value):
        if value:
            raise PydanticCustomError("unsupported_parameter", "`{name}` is not supported by this server",
                                      {"param": name, "name": name})
        return value

    return Annotated[Any, AfterValidator(nothing_asked), WithJsonSchema({
        "description": f"not supported ({what}): a value that asks for it is refused (`unsupported_parameter`); "
                       "null, false, 0, \"\", [] and {} are accepted",
        "anyOf": [{"type": "null"}, {"const": False}, {"const": 0}, {"const": ""},
                  {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}]})]


def _num(lo, hi, description: str, *, gt: bool = False):
    """An optional number in [lo, hi] (or (lo, hi] with `gt`)."""
    return Field(None, gt=lo, le=hi, description=description) if gt else Field(None, ge=lo, le=hi,
                                                                               description=description)


@lru_cache(maxsize=16)
def request_model(settings: Settings) -> type[BaseModel]:
    """The request model with this server's bounds (built once per `Settings`)."""
    cap, default_max, max_images = settings.max_tokens_cap, settings.default_max_tokens, settings.max_images
    max_videos, max_frames = settings.max_videos, settings.max_video_frames

    class ChatCompletionRequest(_In):
        """OpenAI Chat Completions request. Fields this server does not know are ignored; the known
        ones are validated strictly (400 naming the field, the bound and the value)."""

        messages: list[ChatMessage] = Field(
            min_length=1, description=f"the conversation: at least one user message; images in user messages only, "
                                      f"at most {max_images} in all, each at most {settings.max_image_bytes} bytes "
                                      f"and {settings.max_image_pixels} pixels; prompt plus max_tokens within "
                                      f"{settings.max_context_tokens} tokens",
            json_schema_extra={"contains": {"type": "object", "required": ["role"],
                                            "properties": {"role": {"const": "user"}}}})
        model: str | None = Field(None, description="accepted and ignored: this server serves one model")
        max_tokens: int | None = _num(1, cap, f"answer length limit in tokens (default {default_max})")
        max_completion_tokens: int | None = _num(1, cap, "same as max_tokens; takes precedence when present")
        min_tokens: int | None = _num(0, cap, "the end-of-sequence token is forbidden before this many tokens; at "
                                              "most max_tokens")
        temperature: float | None = _num(0.0, 2.0, "0 = greedy; default: the model's generation config")
        top_p: float | None = _num(0.0, 1.0, "nucleus sampling", gt=True)
        top_k: int | None = _num(0, 1_000_000, "0 = off")
        repetition_penalty: float | None = _num(0.01, 10.0, "1 = off; over prompt and answer (vLLM, llama.cpp)")
        frequency_penalty: float | None = _num(-2.0, 2.0, "subtracted from a token's logit once per time the "
                                                          "answer so far holds it")
        presence_penalty: float | None = _num(-2.0, 2.0, "subtracted from the logit of every token the answer so "
                                                         "far holds")
        seed: int | None = _num(-(2**63), 2**63 - 1, "sampling seed")
        stop: Stop | None = Field(None, description=f"up to {MAX_STOP} strings of at most {MAX_STOP_CHARS} "
                                                    "characters; the answer ends before the first one")
        stream: bool = Field(False, description="answer as server-sent events, ending with `data: [DONE]`")
        stream_options: StreamOptions | None = None
        result_cache: bool = Field(True, description="extension: false bypasses the cache of identical greedy "
                                                     "requests")
        user: str | None = Field(None, max_length=256, description="an id of the end user (OpenAI); the session "
                                                                  "key when no X-Session-Id header is sent")
        n: int | None = Field(1, ge=1, le=1, description="only 1 is supported")
        logprobs: bool | None = Field(None, description=(
            "true: each answer token's log probability in `choices[].logprobs.content` (streamed: in each chunk, "
            "for the chunk's tokens), from the distribution the token was drawn from (the logits after the "
            "penalties, divided by the temperature; before top-k / top-p)"))
        top_logprobs: int | None = _num(0, MAX_TOP_LOGPROBS, "with `logprobs`: this many most likely tokens at "
                                                             "each position, best first")
        tools: _unsupported("tools", "tool calling") = None
        functions: _unsupported("functions", "function calling") = None
        audio: _unsupported("audio", "audio output") = None
        response_format: ResponseFormat | None = Field(None, description=(
            "structured output: {\"type\": \"json_object\"} (one JSON object) or {\"type\": \"json_schema\", "
            "\"json_schema\": {\"name\", \"schema\", \"strict\"}} (the answer validates against the schema), "
            "enforced by grammar-constrained decoding; the answer parses unless `max_tokens` cut it "
            "(`finish_reason` \"length\") or a `stop` string did. Default {\"type\": \"text\"}"))
        mm_processor_kwargs: MMProcessorKwargs | None = Field(None, description=(
            "vLLM's spelling of request-level media options (`max_pixels`, `min_pixels`, `fps`); precedence: an "
            "item's own field, then its `detail`, then these, then the server's default (`detail` auto)"))

        @model_validator(mode="before")
        @classmethod
        def _integral(cls, body):
            """JSON Schema counts 5.0 as an integer, so the validator does too (5.5 stays refused)."""
            if isinstance(body, dict):
                return {k: int(v) if k in INTEGERS and isinstance(v, float) and v.is_integer() else v
                        for k, v in body.items()}
            return body

        @model_validator(mode="after")
        def _across_fields(self):
            if not any(m.role == "user" for m in self.messages):
                raise PydanticCustomError("invalid_value", "`messages` must contain at least one user message",
                                          {"param": "messages"})
            images = [f"messages[{i}].content[{j}]" for i, m in enumerate(self.messages) if isinstance(m.content, list)
                      for j, p in enumerate(m.content) if isinstance(p, ImagePart)]
            if len(images) > max_images:
                raise PydanticCustomError("too_many_images", f"at most {max_images} images per request, got "
                                          f"{len(images)}", {"param": images[max_images]})
            videos = [(f"messages[{i}].content[{j}]", p) for i, m in enumerate(self.messages)
                      if isinstance(m.content, list) for j, p in enumerate(m.content)
                      if isinstance(p, (VideoPart, InputVideoPart))]
            if len(videos) > max_videos:
                raise PydanticCustomError("too_many_videos", f"at most {max_videos} videos per request, got "
                                          f"{len(videos)}", {"param": videos[max_videos][0]})
            for where, part in videos:
                inner = part.video_url if isinstance(part, VideoPart) else None
                key = "video_url" if inner is not None else "input_video"
                for name, value in ((f"{where}.max_frames", part.max_frames),
                                    (f"{where}.{key}.max_frames", inner and inner.max_frames)):
                    if value is not None and value > max_frames:
                        raise PydanticCustomError("invalid_value", f"`{name}` must be between 4 and {max_frames}, "
                                                  f"got {value}", {"param": name})
            _check_media(self, settings)
            if self.top_logprobs and not self.logprobs:
                raise PydanticCustomError("invalid_value", "`top_logprobs` needs `logprobs` set to true",
                                          {"param": "top_logprobs"})
            param = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
            limit = self.max_completion_tokens or self.max_tokens or default_max
            if self.min_tokens is not None and self.min_tokens > limit:
                raise PydanticCustomError("invalid_value", f"`min_tokens` must be between 0 and {param} ({limit}), "
                                          f"got {self.min_tokens}", {"param": "min_tokens"})
            return self

    return ChatCompletionRequest


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


def _first(*named):
    """The first (name, value) whose value is set, else (None, None): the precedence of options."""
    return next(((n, v) for n, v in named if v is not None), (None, None))


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
    if item_max[1] is not None:
        max_pixels = item_max[1]
    elif detail is None and kw is not None and kw.max_pixels is not None:
        max_pixels = kw.max_pixels
    else:
        max_pixels = settings.detail_pixels(detail or "auto")
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
    if item_max[1] is not None:
        max_pixels = item_max[1]
    elif detail is None and kw is not None and kw.max_pixels is not None:
        max_pixels = kw.max_pixels
    else:
        max_pixels = settings.video_frame_pixels(detail or "auto")
    fps = _first(("", inner and inner.fps), ("", part.fps), ("", kw and kw.fps))[1]
    max_frames = _first(("", inner and inner.max_frames), ("", part.max_frames))[1]
    min_frames_name, min_frames = _first((f"{where}.video_url.min_frames", inner and inner.min_frames),
                                         (f"{where}.min_frames", part.min_frames))
    given = [(n, v) for n, v in ((f"{where}.video_url.max_pixels", inner and inner.max_pixels),
                                 (f"{where}.max_pixels", part.max_pixels)) if v is not None]
    return {"max_pixels": max_pixels, "fps": fps, "max_frames": max_frames, "min_frames": min_frames,
            "min_frames_name": min_frames_name, "given": given, "detail": detail or "auto",
            "max_from_item": item_max[1] is not None or detail is not None}


# --------------------------------------------------------------------------- errors

_KINDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
          "list_type": "a list", "model_type": "an object", "dict_type": "an object", "missing": "present"}


def _param(loc, tags: bool = True) -> str:
    """('messages', 0, 'UserMessage', 'content', ...) -> 'messages[0].content...' (union tags dropped:
    ours are CamelCase, field names never are; `tags=False` for a path of JSON keys, which may be)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (tags and part[:1].isupper()):
            out += ("." if out else "") + part
    return out


def _bounds(model, name: str) -> tuple:
    lo = hi = None
    strict_lo = False
    for m in model.model_fields[name].metadata:
        if isinstance(m, Ge):
            lo = m.ge
        elif isinstance(m, Gt):
            lo, strict_lo = m.gt, True
        elif isinstance(m, Le):
            hi = m.le
    return lo, hi, strict_lo


def _explain(err: dict, model) -> tuple[str, str, str]:
    """One pydantic error -> (message, param, code), in the words of the old hand-written validator."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    p = _param(err["loc"])
    if "param" in ctx:  # our own checks know their field and their words
        return err["msg"], ctx["param"], kind
    if kind == "message_role":
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return (f"`{p}.role` must be one of system, developer, user, assistant, got {value.get('role')!r}",
                f"{p}.role", "invalid_value")
    if kind in ("part_type", "text_part_type"):
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        if value.get("type") in ("image_url", "video_url", "input_video"):
            return f"images and videos are accepted in user messages only (`{p}`)", p, "invalid_value"
        allowed = '"text", "image_url", "video_url" or "input_video"' if kind == "part_type" else '"text"'
        return f"`{p}.type` must be {allowed}, got {value.get('type')!r}", f"{p}.type", "invalid_value"
    if kind == "response_format_type":
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return (f"`{p}.type` must be \"text\", \"json_object\" or \"json_schema\", got {value.get('type')!r}",
                f"{p}.type", "invalid_value")
    if kind == "content_type":
        return f"`{p}` must be a string or a list of parts", p, "invalid_type"
    if kind == "input_video_type":
        return f"`{p}` must be an object with `data` or `url`, or the base64 as a string", p, "invalid_type"
    if kind == "image_url_type":
        return f"`{p}` must be an object with a string `url`, or the URL as a string", p, "invalid_type"
    if kind == "stop_type":
        return f"`{p}` must be a string or a list of strings, got {value!r}", p, "invalid_type"
    if kind == "missing":
        return f"`{p}` is required", p, "invalid_type"
    if kind in _KINDS:
        return f"`{p}` must be {_KINDS[kind]}, got {value!r}", p, "invalid_type"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"`{p}` must be a non-empty list", p, "empty"
    if kind == "too_long":
        return f"`{p}` takes at most {ctx['max_length']} items, got {ctx.get('actual_length')}", p, "invalid_value"
    if kind == "string_too_long":
        return (f"`{p}` must be at most {ctx['max_length']} characters long, got {len(value)}", p,
                "invalid_value")
    if kind == "literal_error":
        return f"`{p}` must be {ctx['expected']}, got {value!r}", p, "invalid_value"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than") and p in model.model_fields:
        lo, hi, strict_lo = _bounds(model, p)
        if lo == hi:
            return f"`{p}` must be {lo}, got {value}", p, "invalid_value"
        if strict_lo:
            return f"`{p}` must be greater than {lo} and at most {hi}, got {value}", p, "invalid_value"
        return f"`{p}` must be between {lo} and {hi}, got {value}", p, "invalid_value"
    if kind == "finite_number":
        return f"`{p}` must be a finite number, got {value}", p, "invalid_value"
    return f"`{p}`: {err['msg']}", p, "invalid_value"


# --------------------------------------------------------------------------- parse

def load_body(raw: bytes):
    """The request body's JSON. A parser error is the client's (400), never the server's: the
    decoder recurses once per level, so a body nested some thousand levels deep raises
    `RecursionError`, which is no `ValueError` and escaped as a 500 before."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep",
                             code="invalid_json") from None
    except ValueError:  # UnicodeDecodeError included
        raise InvalidRequest("the request body must be valid JSON (Content-Type: application/json)",
                             code="invalid_json") from None


def check_tree(body) -> None:
    """Refuses, once for the whole body and before any field is read, what no later step can
    handle: nesting deeper than `MAX_DEPTH` (validators and walkers recurse) and strings with a
    lone UTF-16 surrogate (JSON's `"\\ud800"` decodes to one; it cannot be encoded as UTF-8, so the
    tokenizer, the session hash and the answer's JSON would fail on it). Unknown fields too: the
    body as a whole must be text this server can encode."""
    stack = [(body, (), 0)]
    while stack:
        value, loc, depth = stack.pop()
        if isinstance(value, str) and _SURROGATE.search(value):
            raise _surrogate(loc, "")
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise InvalidRequest(f"the request body is nested more than {MAX_DEPTH} levels deep (at "
                                     f"`{_param(loc, tags=False)}`)", code="invalid_json")
            if isinstance(value, dict) and any(_SURROGATE.search(k) for k in value):
                raise _surrogate(loc, "a key of ")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(v, (*loc, k), depth + 1) for k, v in items]))  # the first fault is named


def _surrogate(loc, where: str) -> InvalidRequest:
    """The refusal of a lone surrogate at `loc`, naming the field (for a key, the object holding it)
    and never echoing the string (it could not be written in the answer either)."""
    p = _param(loc, tags=False)
    return InvalidRequest(f"{where}`{p or 'the request body'}` holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
                          "escape without its pair): text must be valid Unicode", param=p or None,
                          code="invalid_value")


def parse_chat(body, settings: Settings, defaults: dict | None = None, fetch_remote=None) -> tuple[ChatRequest, dict]:
    """(request, options) where options has `stream`, `include_usage`, `include_stages`, `model`.

    `defaults`: the model's generation config (temperature, top_p, top_k, repetition_penalty) for
    what the request leaves unset; `fetch_remote(url, param) -> bytes`, or None to refuse http(s)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", param=None, code="invalid_json")
    check_tree(body)
    model = request_model(settings)
    try:
        r = model.model_validate(body)
    except ValidationError as exc:
        message, param, code = _explain(exc.errors(include_url=False)[0], model)
        raise InvalidRequest(message, param=param or None, code=code) from None
    defaults = defaults or {}

    def pick(value, name, fallback):
        return value if value is not None else defaults.get(name, fallback)

    max_tokens = r.max_completion_tokens or r.max_tokens or settings.default_max_tokens
    stop = [r.stop] if isinstance(r.stop, str) else (r.stop or [])
    sampling = Sampling(
        max_tokens=max_tokens, min_tokens=r.min_tokens or 0, temperature=float(pick(r.temperature, "temperature", 0.0)),
        top_p=float(pick(r.top_p, "top_p", 1.0)), top_k=int(pick(r.top_k, "top_k", 0)),
        repetition_penalty=float(pick(r.repetition_penalty, "repetition_penalty", 1.0)),
        frequency_penalty=r.frequency_penalty or 0.0, presence_penalty=r.presence_penalty or 0.0, seed=r.seed,
        stop=tuple(s for s in stop if s), logprobs=(r.top_logprobs or 0) if r.logprobs else None,
        grammar=grammar_of(r.response_format))
    messages = [Message(ROLES[m.role], _parts(m.content, f"messages[{i}]", settings, fetch_remote,
                                              r.mm_processor_kwargs))
                for i, m in enumerate(r.messages)]
    so = r.stream_options or StreamOptions()
    request = ChatRequest(messages=messages, sampling=sampling, result_cache=r.result_cache)
    return request, {"stream": r.stream, "include_usage": so.include_usage, "include_stages": so.include_stages,
                     "model": r.model}


def _parts(content, where: str, settings: Settings, fetch_remote, kw: MMProcessorKwargs | None = None) -> list:
    if content is None:
        return [""]
    if isinstance(content, str):
        return [content]
    out = []
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
    raise InvalidRequest(f"unsupported image URL scheme {scheme or url[:16]!r}: use a data URL", param=param,
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
    raise InvalidRequest(f"unsupported video URL scheme {scheme or url[:16]!r}: use a data URL", param=param,
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
        raise media.invalid(f"unsupported media type {declared!r}; send {media.names}", param=param)
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


# --------------------------------------------------------------------------- answers

class _Out(BaseModel):
    """An answer object: what the server writes (unknown fields may be added later)."""


def _absent(**kw):
    """An answer field that may be left out (no `default` in the schema: it is simply not required)."""
    return Field(default=None, json_schema_extra=lambda s: s.pop("default", None), **kw)


class Usage(_Out):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class Timings(_Out):
    """Where the time went, in milliseconds, with llama.cpp's names (`prompt_n`, `predicted_per_second`, ...)
    and ours (`queue_ms`, `image_decode_ms`, `vision_encode_ms`, `ttft_ms`, ...); counts are integers,
    `vision_cache_hit` and `result_cache_hit` booleans."""

    model_config = ConfigDict(json_schema_extra={"additionalProperties": {"type": ["number", "boolean"]}})
    queue_ms: float = Field(ge=0)
    prompt_ms: float = Field(ge=0)
    prompt_n: int = Field(ge=0)
    cache_n: int = Field(ge=0)
    predicted_ms: float = Field(ge=0)
    predicted_n: int = Field(ge=0)
    ttft_ms: float = Field(ge=0)
    total_ms: float = Field(ge=0)


FinishReason = Literal["stop", "length"]


class AssistantReply(_Out):
    role: Literal["assistant"]
    content: str


class TopLogprob(_Out):
    token: str = Field(description="the token's text (U+FFFD for a part of a character its bytes do not complete)")
    logprob: float = Field(le=0, description="natural log of its probability; -9999.0 for a forbidden token")
    bytes: list[int] = Field(description="the token's UTF-8 bytes")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(max_length=MAX_TOP_LOGPROBS, description=(
        "the `top_logprobs` most likely tokens at this position, most likely first"))


class ChoiceLogprobs(_Out):
    """OpenAI's `logprobs` of a choice: one entry per answer token (the end-of-sequence token is not one)."""

    content: list[TokenLogprob] | None
    refusal: None = None


class Choice(_Out):
    index: Literal[0]
    message: AssistantReply
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = Field(description="null unless the request set `logprobs`")


class BoxObject(_Out):
    label: str = Field(description="the model's label; \"\" when it gave none")
    box: list[int] = Field(min_length=4, max_length=4, description="[x1, y1, x2, y2] in pixels, x1 <= x2, y1 <= y2")


class PointObject(_Out):
    label: str = Field(description="the model's label; \"\" when it gave none")
    point: list[int] = Field(min_length=2, max_length=2, description="[x, y] in pixels")


class Grounding(_Out):
    """Extension: the boxes (`bbox_2d`) and points (`point_2d`) the answer's text holds, converted
    from the model's 0-1000 relative coordinates to pixels of one image of the request (the last
    one, Qwen3-VL's convention), in the order written. Absent when there are none."""

    image: int = Field(ge=0, description="which image of the request, counting image parts from 0 in message order")
    width: int = Field(ge=1, description="that image's width in pixels, as the server decoded it")
    height: int = Field(ge=1, description="that image's height in pixels")
    objects: list[BoxObject | PointObject] = Field(min_length=1)


class ChatCompletion(_Out):
    id: str = Field(pattern="^chatcmpl-")
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice] = Field(min_length=1, max_length=1)
    usage: Usage
    timings: Timings
    system_fingerprint: str = _absent()
    grounding: Grounding = _absent()


class Delta(_Out):
    role: Literal["assistant"] = _absent()
    content: str = _absent()


class ChunkChoice(_Out):
    index: Literal[0]
    delta: Delta
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None = Field(description="with `logprobs`: the entries of this chunk's tokens")


class ChatCompletionChunk(_Out):
    """One `data:` event of a streamed answer; the one with `finish_reason` carries `grounding` (when the
    answer holds boxes or points); the last one (with `stream_options.include_usage`) has empty
    `choices`, `usage` and `timings`."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice] = Field(max_length=1)
    usage: Usage | None
    timings: Timings = _absent()
    grounding: Grounding = _absent()


class ErrorDetail(_Out):
    message: str = Field(description="what was wrong: the field, the bound, the value")
    type: str = Field(examples=["invalid_request_error", "authentication_error", "unavailable_error", "server_error"])
    param: str | None = Field(description="the request field at fault, e.g. `messages[0].content[1].image_url`")
    code: str | None = Field(examples=[
        "invalid_value", "invalid_type", "invalid_json", "empty", "unsupported_parameter", "invalid_image",
        "image_too_large", "too_many_images", "invalid_video", "video_too_large", "too_many_videos",
        "context_length_exceeded", "request_too_large", "invalid_api_key",
        "server_busy", "queue_timeout", "not_ready", "not_found", "cancelled"])


class Error(_Out):
    """Every error, with the status of the response."""

    error: ErrorDetail


class ChatCompletionCancel(_Out):
    id: str
    object: Literal["chat.completion.cancel"]
    cancelled: Literal[True]


class Model(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    input_modalities: list[str] = _absent()
    output_modalities: list[str] = _absent()
    max_context_length: int = _absent()
    demo: bool = _absent()
    notice: str = _absent()


class ModelList(_Out):
    object: Literal["list"]
    data: list[Model]


ANSWERS = (ChatCompletion, ChatCompletionChunk, Error, ChatCompletionCancel, ModelList)
