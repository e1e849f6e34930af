"""The OpenAI Responses API's answers: the response object, its output items, usage and the typed
stream events, as the route writes them and `/openapi.json` describes them (the requests and their
conversion to chat are in `responses`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .answers import Timings, _absent, _Out


# --------------------------------------------------------------------------- answers

class ResponseOutputTextPart(_Out):
    type: Literal["output_text"]
    text: str
    annotations: list[dict] = Field(max_length=0)
    logprobs: list[dict] = Field(max_length=0)


class ResponseOutputMessage(_Out):
    id: str = Field(pattern="^msg_")
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[ResponseOutputTextPart]


class ResponseOutputFunctionCall(_Out):
    id: str = Field(pattern="^fc_")
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str = Field(pattern="^call_", description="the id a `function_call_output` item names")
    name: str
    arguments: str = Field(description="the JSON text of an object")


class ResponseInputTokensDetails(_Out):
    cached_tokens: int = Field(ge=0, description="prompt tokens reused from the conversation's KV cache")


class ResponseOutputTokensDetails(_Out):
    reasoning_tokens: Literal[0]


class ResponseUsage(_Out):
    input_tokens: int = Field(ge=0)
    input_tokens_details: ResponseInputTokensDetails
    output_tokens: int = Field(ge=0)
    output_tokens_details: ResponseOutputTokensDetails
    total_tokens: int = Field(ge=0)


class ResponseError(_Out):
    code: str
    message: str


class ResponseIncompleteDetails(_Out):
    reason: Literal["max_output_tokens"]


class ResponseObject(_Out):
    """A response (`object: "response"`): the answer of POST /v1/responses, of GET
    /v1/responses/{id}, and the `response` of the stream's lifecycle events."""

    id: str = Field(pattern="^resp_")
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None
    incomplete_details: ResponseIncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[ResponseOutputMessage | ResponseOutputFunctionCall]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any] = Field(description="{\"format\": ...} as the request gave it")
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"]
    background: Literal[False]
    metadata: dict[str, str]
    user: str | None
    usage: ResponseUsage | None
    timings: Timings = _absent(description="extension: where the time went (as the chat route's)")


class ResponseDeleted(_Out):
    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


EVENTS = ("response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
          "response.output_text.delta", "response.output_text.done", "response.content_part.done",
          "response.function_call_arguments.delta", "response.function_call_arguments.done",
          "response.output_item.done", "response.completed", "response.incomplete", "response.failed", "error")


class ResponseStreamEvent(_Out):
    """One event of a streamed response (`event:` names its `type`). Lifecycle events carry the
    `response`; item events `output_index` and `item`; text events `item_id`, `content_index` and
    `delta` / `text`; argument events `delta` / `arguments`; `error` its `code`, `message`, `param`."""

    type: Literal[EVENTS]  # type: ignore[valid-type]
    sequence_number: int = Field(ge=0)
    response: ResponseObject = _absent()
    output_index: int = _absent(ge=0)
    item: ResponseOutputMessage | ResponseOutputFunctionCall = _absent()
    item_id: str = _absent()
    content_index: int = _absent(ge=0)
    part: ResponseOutputTextPart = _absent()
    delta: str = _absent()
    text: str = _absent()
    arguments: str = _absent()
    name: str = _absent()
    logprobs: list[dict] = _absent(max_length=0)
    code: str | None = _absent()
    message: str = _absent()
    param: str | None = _absent()


ANSWERS = (ResponseObject, ResponseDeleted, ResponseStreamEvent)
