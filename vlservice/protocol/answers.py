"""The answers' models: what the server writes (the OpenAPI document is generated from these)."""

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import MAX_TOP_LOGPROBS


class _Out(BaseModel):
    """An answer object: what the server writes (unknown fields may be added later). The handlers
    build every answer from these models (`answer`), so the OpenAPI document is the code's own."""

    model_config = ConfigDict(extra="allow")


def answer(model: BaseModel) -> str:
    """The JSON text of an answer: the fields given, the absent ones left out (a field given as
    None, like `logprobs`, is written as null); laid out as `json.dumps` writes it, as before the
    models wrote the answers (clients that match text, like `"finish_reason": "length"`, still do)."""
    return json.dumps(model.model_dump(mode="json", exclude_unset=True), ensure_ascii=False)


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


FinishReason = Literal["stop", "length", "tool_calls"]


class CalledFunction(_Out):
    name: str
    arguments: str = Field(description="the JSON text of an object")


class ToolCall(_Out):
    id: str = Field(pattern="^call_")
    type: Literal["function"]
    function: CalledFunction


class AssistantReply(_Out):
    role: Literal["assistant"]
    content: str | None = Field(description="the answer's text; null when it is only tool calls")
    tool_calls: list[ToolCall] = _absent(min_length=1, description=(
        "the calls the answer made (requests with `tools`); `finish_reason` is then \"tool_calls\""))


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
    index: int = Field(ge=0, description="which choice: 0 to `n` - 1")
    message: AssistantReply
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = Field(description="null unless the request set `logprobs`")
    grounding: "Grounding" = _absent(description=(
        "extension, with `n` > 1: this choice's boxes and points (the top-level `grounding` is choice 0's)"))


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
    choices: list[Choice] = Field(min_length=1, description="`n` choices, in order of `index`")
    usage: Usage = Field(description="the prompt counted once, the completion tokens of every choice")
    timings: Timings
    system_fingerprint: str = _absent()
    grounding: Grounding = _absent()


class ToolCallDelta(ToolCall):
    """A whole call in one delta (OpenAI's clients join fragments by `index`; ours come complete)."""

    index: int = Field(ge=0, description="the call's place among the answer's calls")


class Delta(_Out):
    role: Literal["assistant"] = _absent()
    content: str = _absent()
    tool_calls: list[ToolCallDelta] = _absent(min_length=1)


class ChunkChoice(_Out):
    index: int = Field(ge=0, description="the choice this chunk continues (0 to `n` - 1)")
    delta: Delta
    finish_reason: FinishReason | None
    logprobs: ChoiceLogprobs | None = Field(description="with `logprobs`: the entries of this chunk's tokens")


class ChatCompletionChunk(_Out):
    """One `data:` event of a streamed answer, for one choice (its `index`; with `n` > 1 the choices'
    chunks interleave); the one with `finish_reason` carries that choice's `grounding` (when its
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


Choice.model_rebuild()  # `grounding` names a model defined after it

ANSWERS = (ChatCompletion, ChatCompletionChunk, Error, ChatCompletionCancel, ModelList)
