"""The request model (with the running `Settings`' bounds): sampling, streaming, structured output,
tools."""

from functools import lru_cache
from typing import Annotated, Any, Literal, Union, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, Tag, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from ..config import Settings
from ..engine.interface import SchemaRefused, grammar_for
from .base import MAX_STOP, MAX_STOP_CHARS, MAX_TOP_LOGPROBS, _In, _IntegralIn, _pick
from .media import _check_media
from .messages import ChatMessage, ImagePart, InputVideoPart, MMProcessorKwargs, Stop, VideoPart
from .tools import TOOL_CHOICE, Tool, ToolChoice, check_tools

MAX_TOOLS = 128  # OpenAI's bound


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
    _grammar: str | None = PrivateAttr(None)  # compiled once, by `_compiles`

    @model_validator(mode="after")
    def _compiles(self):
        if self.json_schema.schema_ is not None:
            try:
                self._grammar = grammar_for("json_schema", self.json_schema.schema_)
            except SchemaRefused as exc:
                raise PydanticCustomError("invalid_schema", "`response_format.json_schema.schema` cannot be used: "
                                          "{reason}", {"param": "response_format.json_schema.schema",
                                                       "reason": str(exc)}) from None
        return self


RESPONSE_FORMATS = {"text": "Text", "json_object": "JsonObject", "json_schema": "JsonSchema"}
ResponseFormat = Annotated[Union[Annotated[TextFormat, Tag("Text")], Annotated[JsonObjectFormat, Tag("JsonObject")],
                                 Annotated[JsonSchemaFormat, Tag("JsonSchema")]],
                           _pick(lambda v: RESPONSE_FORMATS.get(v["type"])
                                 if isinstance(v, dict) and isinstance(v.get("type"), str) else None, "response_format_type")]


def grammar_of(fmt) -> str | None:
    """The llguidance grammar a `response_format` asks for (None: free text)."""
    if isinstance(fmt, JsonObjectFormat) or (isinstance(fmt, JsonSchemaFormat) and fmt.json_schema.schema_ is None):
        return grammar_for("json_object")
    if isinstance(fmt, JsonSchemaFormat):
        return fmt._grammar or grammar_for("json_schema", fmt.json_schema.schema_)
    return None


def _refused(name: str) -> AfterValidator:
    """An OpenAI parameter we cannot honour: refused when it asks for something. With `_unsupported_schema`:
    `Annotated[Any, _refused(name), _unsupported_schema(what)]`."""

    def nothing_asked(value):
        if value:
            raise PydanticCustomError("unsupported_parameter", "`{name}` is not supported by this server",
                                      {"param": name, "name": name})
        return value

    return AfterValidator(nothing_asked)


def _unsupported_schema(what: str) -> WithJsonSchema:
    """The schema of a parameter `_refused` refuses: the values that ask for nothing."""
    return WithJsonSchema({
        "description": f"not supported ({what}): a value that asks for it is refused (`unsupported_parameter`); "
                       "null, false, 0, \"\", [] and {} are accepted",
        "anyOf": [{"type": "null"}, {"const": False}, {"const": 0}, {"const": ""},
                  {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}]})


def _num(lo, hi, description: str, *, gt: bool = False):
    """An optional number in [lo, hi] (or (lo, hi] with `gt`)."""
    return Field(None, gt=lo, le=hi, description=description) if gt else Field(None, ge=lo, le=hi,
                                                                               description=description)


def _check_counts(request, settings: Settings) -> None:
    """At most VL_MAX_IMAGES images and VL_MAX_VIDEOS videos in the request, and no clip asking for
    more than VL_MAX_VIDEO_FRAMES frames (the error names the first part over the bound)."""
    max_images, max_videos, max_frames = settings.max_images, settings.max_videos, settings.max_video_frames
    images = [f"messages[{i}].content[{j}]" for i, m in enumerate(request.messages) if isinstance(m.content, list)
              for j, p in enumerate(m.content) if isinstance(p, ImagePart)]
    if len(images) > max_images:
        raise PydanticCustomError("too_many_images", f"at most {max_images} images per request, got "
                                  f"{len(images)}", {"param": images[max_images]})
    videos = [(f"messages[{i}].content[{j}]", p) for i, m in enumerate(request.messages)
              if isinstance(m.content, list) for j, p in enumerate(m.content)
              if isinstance(p, (VideoPart, InputVideoPart))]
    if len(videos) > max_videos:
        raise PydanticCustomError("too_many_videos", f"at most {max_videos} videos per request, got "
                                  f"{len(videos)}", {"param": videos[max_videos][0]})
    for where, part in videos:
        inner = part.video_url if isinstance(part, VideoPart) else None
        key = "video_url" if inner is not None else "input_video"
        for name, value in ((f"{where}.max_frames", part.max_frames),
                            (f"{where}.{key}.max_frames", cast("int | None", inner and inner.max_frames))):
            if value is not None and value > max_frames:
                raise PydanticCustomError("invalid_value", f"`{name}` must be between 4 and {max_frames}, "
                                          f"got {value}", {"param": name})


@lru_cache(maxsize=16)
def request_model(settings: Settings) -> type[BaseModel]:
    """The request model with this server's bounds (built once per `Settings`)."""
    # Over 60 lines: the class body is the API's field declarations, read best as one list.
    cap, default_max, max_images = settings.max_tokens_cap, settings.default_max_tokens, settings.max_images

    class ChatCompletionRequest(_IntegralIn):
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
        n: int | None = Field(1, ge=1, json_schema_extra={"maximum": settings.max_batch}, description=(
            f"how many choices to answer, at most {settings.max_batch} (VL_MAX_BATCH: each takes a batch slot): one "
            "prefill, then the choices decoded together; with a `seed`, choice i is what the same request alone "
            "with `seed` + i answers (wrapped into the 64-bit range)"))
        logprobs: bool | None = Field(None, description=(
            "true: each answer token's log probability in `choices[].logprobs.content` (streamed: in each chunk, "
            "for the chunk's tokens), from the distribution the token was drawn from (the logits after the "
            "penalties, divided by the temperature; before top-k / top-p)"))
        top_logprobs: int | None = _num(0, MAX_TOP_LOGPROBS, "with `logprobs`: this many most likely tokens at "
                                                             "each position, best first")
        tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS, description=(
            f"functions the model may call (at most {MAX_TOOLS}); its calls come back in `message.tool_calls` "
            "(streamed as `delta.tool_calls`) with `finish_reason` \"tool_calls\""))
        tool_choice: ToolChoice | None = Field(None, description=TOOL_CHOICE)
        parallel_tool_calls: bool | None = Field(None, description=(
            "false: at most one call per answer where calls are forced (default true)"))
        functions: Annotated[Any, _refused("functions"), _unsupported_schema("function calling")] = None
        audio: Annotated[Any, _refused("audio"), _unsupported_schema("audio output")] = None
        response_format: ResponseFormat | None = Field(None, description=(
            "structured output: {\"type\": \"json_object\"} (one JSON object) or {\"type\": \"json_schema\", "
            "\"json_schema\": {\"name\", \"schema\", \"strict\"}} (the answer validates against the schema), "
            "enforced by grammar-constrained decoding; the answer parses unless `max_tokens` cut it "
            "(`finish_reason` \"length\") or a `stop` string did. Default {\"type\": \"text\"}"))
        _tool_grammar: str | None = PrivateAttr(None)  # a forced call's grammar, compiled once (tools.py)
        mm_processor_kwargs: MMProcessorKwargs | None = Field(None, description=(
            "vLLM's spelling of request-level media options (`max_pixels`, `min_pixels`, `fps`); precedence: an "
            "item's own field, then its `detail`, then these, then the server's default (`detail` auto)"))

        @model_validator(mode="after")
        def _across_fields(self):
            if not any(m.role == "user" for m in self.messages):
                raise PydanticCustomError("invalid_value", "`messages` must contain at least one user message",
                                          {"param": "messages"})
            _check_counts(self, settings)
            _check_media(self, settings)
            check_tools(self)
            if self.n is not None and self.n > settings.max_batch:
                raise PydanticCustomError("invalid_value", f"`n` must be between 1 and {settings.max_batch} (each choice "
                                          f"takes one of the {settings.max_batch} batch slots, VL_MAX_BATCH), got "
                                          f"{self.n}", {"param": "n"})
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
