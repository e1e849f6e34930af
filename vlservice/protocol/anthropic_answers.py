"""Anthropic's Messages API answers: the message, its content blocks, usage, `count_tokens`'
answer, the stream's events and the error shape with its types by status, as the route writes them
and `/openapi.json` describes them (the requests and their conversion to chat are in `anthropic`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .answers import Timings, _absent, _Out


# --------------------------------------------------------------------------- answers

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicUsage(_Out):
    input_tokens: int = Field(ge=0, description="the prompt's tokens, images included")
    output_tokens: int = Field(ge=0)


class TextContent(_Out):
    type: Literal["text"]
    text: str


class ToolUseContent(_Out):
    type: Literal["tool_use"]
    id: str = Field(pattern="^toolu_")
    name: str
    input: dict[str, Any]


class AnthropicMessage(_Out):
    """The answer of `POST /v1/messages` (and, with empty `content` and no stop reason yet, the message of a
    stream's `message_start`)."""

    id: str = Field(pattern="^msg_")
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage
    timings: Timings = _absent()


class CountTokensAnswer(_Out):
    input_tokens: int = Field(ge=0)


class AnthropicErrorDetail(_Out):
    type: Literal["invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                  "request_too_large", "rate_limit_error", "api_error", "overloaded_error"]
    message: str


class AnthropicError(_Out):
    """Every error of the Anthropic routes (and the data of a stream's `error` event)."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class MessageStart(_Out):
    type: Literal["message_start"]
    message: AnthropicMessage


class ContentBlockStart(_Out):
    type: Literal["content_block_start"]
    index: int = Field(ge=0)
    content_block: TextContent | ToolUseContent


class TextDelta(_Out):
    type: Literal["text_delta"]
    text: str


class InputJsonDelta(_Out):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDelta(_Out):
    type: Literal["content_block_delta"]
    index: int = Field(ge=0)
    delta: TextDelta | InputJsonDelta


class ContentBlockStop(_Out):
    type: Literal["content_block_stop"]
    index: int = Field(ge=0)


class MessageDeltaBody(_Out):
    stop_reason: StopReason
    stop_sequence: str | None


class DeltaUsage(_Out):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class MessageDelta(_Out):
    type: Literal["message_delta"]
    delta: MessageDeltaBody
    usage: DeltaUsage = Field(description="the totals at the end: input and output tokens")


class MessageStop(_Out):
    type: Literal["message_stop"]


class Ping(_Out):
    type: Literal["ping"]


STREAM_EVENTS = (MessageStart, ContentBlockStart, ContentBlockDelta, ContentBlockStop, MessageDelta, MessageStop,
                 Ping, AnthropicError)
ANSWERS = (AnthropicMessage, CountTokensAnswer, *STREAM_EVENTS)

# An error's Anthropic type, by the HTTP status the server answers with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
