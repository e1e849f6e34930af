"""The OpenAI Responses API (`POST /v1/responses`), the part a vision model can serve: its request
models (the answers' are in `responses_answers`), and the request written as the Chat Completions
body the chat route validates.

A Responses request is not a second pipeline: `chat_body` turns it (with the stored turns of its
`previous_response_id` chain) into the same JSON `/v1/chat/completions` takes, so `parse_chat`,
the media checks, the grammars, the caches, the queue and the tenant rules are the chat route's
own. What only the Responses shape can get wrong (an item of a type we do not serve, a built-in
tool, `background`) is refused here first, naming the field; what the chat path refuses comes back
with its `param` renamed into this request's words (`messages[2].content[0]` -> `input[1].content[0]`,
`response_format.json_schema.schema` -> `text.format.schema`), by `Origins.rename`.

Served: `input` (a string, or items: messages with `input_text` / `input_image` / `output_text`
parts and the chat route's video parts, `function_call`, `function_call_output`), `instructions`,
`max_output_tokens`, the chat route's sampling options, `text.format` (`json_object`,
`json_schema`), function `tools`, `tool_choice`, `parallel_tool_calls`, `previous_response_id`,
`store`, `stream`, `metadata`, `user`. Refused when they ask for something: built-in tools,
`reasoning`, `background`, `include`, `conversation`, `prompt`, `top_logprobs`, `max_tool_calls`,
`truncation: "auto"`; items of other types (reasoning, item references, built-in tool calls) and
`input_file` parts. No engine import here: protocol models only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from ..config import Settings
from ..errors import brief
from .base import _In, _IntegralIn, _pick
from .errors import _param
from .messages import InputVideoPart, VideoPart
from .request import _refused, _unsupported_schema, request_model
from .tools import NAME

INTEGERS = ("max_output_tokens", "top_k", "seed", "min_tokens")
SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty", "frequency_penalty", "presence_penalty", "seed",
            "min_tokens")
MAX_TOOLS = 128
MAX_METADATA = 16  # OpenAI's bound: 16 pairs, keys of 64 characters, values of 512
REFUSED_ITEMS = ("reasoning", "item_reference", "file_search_call", "web_search_call", "computer_call",
                 "computer_call_output", "image_generation_call", "code_interpreter_call", "local_shell_call",
                 "local_shell_call_output", "shell_call", "shell_call_output", "mcp_call", "mcp_list_tools",
                 "mcp_approval_request", "mcp_approval_response", "custom_tool_call", "custom_tool_call_output",
                 "apply_patch_call", "apply_patch_call_output", "compaction", "tool_search_call", "tool_search_output")
ITEMS = {"message": "Message", "function_call": "FunctionCall", "function_call_output": "FunctionCallOutput"}
PARTS = {"input_text": "InputText", "output_text": "OutputText", "refusal": "Refusal", "input_image": "InputImage",
         "video_url": "VideoPart", "input_video": "InputVideoPart"}
REFUSED_PARTS = ("input_file", "input_audio")


# --------------------------------------------------------------------------- request

class ResponseInputText(_In):
    type: Literal["input_text"]
    text: str


class ResponseOutputText(_In):
    """An earlier answer's text, as `response.output` holds it (`annotations` and `logprobs` ignored)."""

    type: Literal["output_text"]
    text: str


class ResponseRefusal(_In):
    type: Literal["refusal"]
    refusal: str


class ResponseInputImage(_In):
    type: Literal["input_image"]
    image_url: str = Field(description=(
        "the image as a data URL (`data:image/<png|jpeg|webp|bmp|gif>;base64,...`), or an https URL when the server "
        "allows remote images (VL_REMOTE_IMAGES), exactly as the chat route's `image_url.url`"))
    detail: Literal["low", "auto", "high"] | None = Field(None, description="resolution budget; null means auto")

    @model_validator(mode="before")
    @classmethod
    def _url_or_file(cls, v):
        if isinstance(v, dict) and v.get("image_url") is None and v.get("file_id"):
            raise PydanticCustomError("unsupported_value", "`file_id` is not served (this server has no Files API): "
                                      "send the image as `image_url`, a data URL")
        return v


def _part_tag(v):
    if isinstance(v, dict) and isinstance(v.get("type"), str):
        return PARTS.get(v["type"])
    return None


def _content_tag(v):
    return "Text" if isinstance(v, str) else "Parts" if isinstance(v, list) else None


_Part = Annotated[Union[Annotated[ResponseInputText, Tag("InputText")], Annotated[ResponseOutputText, Tag("OutputText")],
                        Annotated[ResponseRefusal, Tag("Refusal")], Annotated[ResponseInputImage, Tag("InputImage")],
                        Annotated[VideoPart, Tag("VideoPart")], Annotated[InputVideoPart, Tag("InputVideoPart")]],
                  _pick(_part_tag, "response_part_type")]
Content = Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[_Part], Tag("Parts")]],
                    _pick(_content_tag, "content_type")]

class ResponseInputMessage(_In):
    """A message: `{"role", "content"}` (OpenAI's easy input message) or the same with `type: "message"`
    (an earlier answer's output message too; its `id` and `status` are ignored)."""

    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: Content = Field(description="text, or parts: `input_text`, `input_image` (user messages), "
                                         "`output_text` / `refusal` (assistant), and video as the chat route "
                                         "takes it (`video_url`, `input_video`)")


class ResponseFunctionCallItem(_In):
    """A call an earlier answer made (`response.output`'s `function_call` item)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256, description="the call's id, which its output names")
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="its arguments as the JSON text of an object")


class ResponseFunctionCallOutputItem(_In):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256, description="the call this answers")
    output: Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[ResponseInputText], Tag("Parts")]],
                      _pick(_content_tag, "output_type")] = Field(
        description="what the function returned: text, or `input_text` parts")


def _item_tag(v):
    if not isinstance(v, dict):
        return None
    kind = v.get("type")
    if kind is None and "role" in v:
        return "Message"
    return ITEMS.get(kind) if isinstance(kind, str) else None


Item = Annotated[Union[Annotated[ResponseInputMessage, Tag("Message")], Annotated[ResponseFunctionCallItem, Tag("FunctionCall")],
                       Annotated[ResponseFunctionCallOutputItem, Tag("FunctionCallOutput")]],
                 _pick(_item_tag, "response_item_type")]


class ResponseFunctionTool(_In):
    """Responses' flat function tool (no nested `function` object)."""

    type: Literal["function"]
    name: str = Field(pattern=NAME, description="a-z, A-Z, 0-9, _ . - ; at most 64 characters")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description=(
        "a JSON Schema of its arguments; with `tool_choice` \"required\" or naming it, forced calls validate "
        "against it (a schema that cannot be compiled: 400)"))
    strict: bool | None = Field(None, description="accepted; forced calls always follow `parameters`")


class ResponseNamedFunction(_In):
    type: Literal["function"]
    name: str


ToolChoice = Annotated[Union[Annotated[Literal["none", "auto", "required"], Tag("Mode")],
                             Annotated[ResponseNamedFunction, Tag("Named")]],
                       _pick(lambda v: "Mode" if isinstance(v, str)
                             else "Named" if isinstance(v, dict) and v.get("type") == "function" else None,
                             "response_tool_choice_type")]


class _Format(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class ResponseTextFormat(_Format):
    type: Literal["text"]


class ResponseJsonObjectFormat(_Format):
    type: Literal["json_object"]


class ResponseJsonSchemaFormat(_Format):
    """Responses' flat `json_schema` format (the chat route's `json_schema.json_schema` object, unnested)."""

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, description="the schema's name (not used)")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description=(
        "the JSON Schema the answer validates against (grammar-constrained decoding, as the chat route's "
        "`response_format`); absent: any JSON object"))
    description: str | None = None
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")


FORMATS = {"text": "Text", "json_object": "JsonObject", "json_schema": "JsonSchema"}
Format = Annotated[Union[Annotated[ResponseTextFormat, Tag("Text")], Annotated[ResponseJsonObjectFormat, Tag("JsonObject")],
                         Annotated[ResponseJsonSchemaFormat, Tag("JsonSchema")]],
                   _pick(lambda v: FORMATS.get(v["type"]) if isinstance(v, dict) and isinstance(v.get("type"), str) else None,
                         "response_format_type")]


class ResponseTextConfig(_In):
    format: Format | None = Field(None, description="{\"type\": \"text\"} (default), {\"type\": \"json_object\"} or "
                                                    "{\"type\": \"json_schema\", \"name\", \"schema\", \"strict\"}")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="accepted and ignored")


def _tool_tag(v):
    return "Function" if isinstance(v, dict) and v.get("type") == "function" else None


@lru_cache(maxsize=16)
def responses_model(settings: Settings) -> type[BaseModel]:
    """The request model with this server's bounds; the sampling fields are the chat route's own."""
    chat = request_model(settings)
    cap, default_max = settings.max_tokens_cap, settings.default_max_tokens

    def same(name: str):
        return copy(chat.model_fields[name])

    class ResponseRequest(_IntegralIn):
        """OpenAI Responses request (the subset this server serves). Unknown fields are ignored; the
        known ones are validated strictly."""

        INTEGER_FIELDS: ClassVar[tuple[str, ...]] = INTEGERS

        input: Annotated[Union[Annotated[str, Tag("Text")], Annotated[Annotated[list[Item], Field(
            min_length=1, json_schema_extra={"contains": {"type": "object", "required": ["role"], "properties": {
                "role": {"const": "user"}, "type": {"const": "message"}}}})], Tag("Parts")]],
                         _pick(_content_tag, "input_type")] = Field(
            description="a user message as a string, or items: messages (`role`, `content`), `function_call` and "
                        "`function_call_output`; at least one user message (the schema says so; with "
                        "`previous_response_id` the stored turns may hold it instead)")
        instructions: str | None = Field(None, description="a system message before the input (not carried over "
                                                          "by `previous_response_id`)")
        model: str | None = Field(None, description="accepted and ignored: this server serves one model")
        max_output_tokens: int | None = Field(None, ge=1, le=cap, description=f"answer length limit in tokens "
                                                                              f"(default {default_max})")
        temperature: float | None = same("temperature")
        top_p: float | None = same("top_p")
        top_k: int | None = same("top_k")
        repetition_penalty: float | None = same("repetition_penalty")
        frequency_penalty: float | None = same("frequency_penalty")
        presence_penalty: float | None = same("presence_penalty")
        seed: int | None = same("seed")
        min_tokens: int | None = same("min_tokens")
        stream: bool = Field(False, description="answer as the Responses API's typed server-sent events")
        store: bool = Field(True, description="keep the answer for `previous_response_id` and GET (in this "
                                              "worker's memory, per API key, bounded)")
        previous_response_id: str | None = Field(None, max_length=256, description=(
            "continue the conversation of a stored response: its input and output come before this input"))
        tools: list[Annotated[Union[Annotated[ResponseFunctionTool, Tag("Function")]],
                              _pick(_tool_tag, "response_tool_type")]] | None = Field(
            None, max_length=MAX_TOOLS, description=f"function tools (at most {MAX_TOOLS}); built-in tools "
                                                    "(web_search, file_search, ...) are refused")
        tool_choice: ToolChoice | None = Field(None, description=(
            "\"auto\" (default with tools), \"none\", \"required\", or {\"type\": \"function\", \"name\"}; "
            "required and named calls are enforced by grammar-constrained decoding"))
        parallel_tool_calls: bool | None = Field(None, description="false: at most one call where calls are forced")
        text: ResponseTextConfig | None = None
        metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
            None, max_length=MAX_METADATA, description="up to 16 pairs (keys of at most 64 characters, values of 512), "
                                                        "echoed in the answer")
        user: str | None = Field(None, max_length=256, description="an id of the end user; the session key when "
                                                                  "no X-Session-Id header is sent")
        truncation: Literal["disabled"] | None = Field(None, description="\"disabled\" only: a prompt over the "
                                                                         "context is refused, never cut")
        result_cache: bool = Field(True, description="extension: false bypasses the cache of identical greedy "
                                                     "requests")
        background: Annotated[Any, _refused("background"), _unsupported_schema("answers are streamed or waited for")] = None
        reasoning: Annotated[Any, _refused("reasoning"), _unsupported_schema("not a reasoning model")] = None
        include: Annotated[Any, _refused("include"), _unsupported_schema("no extra output data")] = None
        conversation: Annotated[Any, _refused("conversation"), _unsupported_schema("use previous_response_id")] = None
        prompt: Annotated[Any, _refused("prompt"), _unsupported_schema("no stored prompts")] = None
        top_logprobs: Annotated[Any, _refused("top_logprobs"),
                                _unsupported_schema("use /v1/chat/completions for logprobs")] = None
        max_tool_calls: Annotated[Any, _refused("max_tool_calls"), _unsupported_schema("no built-in tool loop")] = None

    return ResponseRequest


# --------------------------------------------------------------------------- errors in this request's words

_REFUSED_TAGS = {"response_item_type": REFUSED_ITEMS, "response_part_type": REFUSED_PARTS}


def explain(err: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """A validation error of this request's own shapes as (message, param, code); None: the chat
    route's explanation fits (`protocol.errors._explain`)."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    p = _param(err["loc"])
    if "param" in ctx:
        return None
    kind_of = value.get("type") if isinstance(value, dict) else None
    if kind == "unsupported_value":
        return f"`{p}`: {err['msg']}", p, "unsupported_value"
    if kind in _REFUSED_TAGS and kind_of in _REFUSED_TAGS[kind]:
        return (f"`{p}`: {kind_of} {'items' if kind == 'response_item_type' else 'parts'} are not served by this "
                f"server", f"{p}.type", "unsupported_value")
    if kind == "response_tool_type" and isinstance(kind_of, str):
        return (f"`{p}`: the built-in tool {brief(kind_of)} is not served by this server: only function tools "
                "({\"type\": \"function\", \"name\", \"parameters\"})", f"{p}.type", "unsupported_value")
    allowed = {"response_item_type": '"message", "function_call" or "function_call_output"',
               "response_part_type": '"input_text", "input_image", "output_text", "refusal", "video_url" or '
                                     '"input_video"',
               "response_tool_type": '"function"'}
    if kind in allowed:
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return f"`{p}.type` must be {allowed[kind]}, got {brief(kind_of)}", f"{p}.type", "invalid_value"
    if kind == "response_tool_choice_type":
        if isinstance(value, dict) and isinstance(kind_of, str):
            return (f"`{p}`: tool_choice {brief(kind_of)} is not served: \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"name\"}", f"{p}.type", "unsupported_value")
        return f"`{p}` must be a string or an object", p, "invalid_type"
    if kind in ("input_type", "output_type"):
        return f"`{p}` must be a string or a list", p, "invalid_type"
    return None


@dataclass
class Origins:
    """Where each chat message of `chat_body` came from in this request: `input[i]` (with `parts`
    when its content was a list), `instructions`, or `previous_response_id` (a stored turn)."""

    messages: list[tuple[str, bool]] = field(default_factory=list)

    def rename(self, param: str | None) -> str | None:
        """A chat route's `param` in this request's words."""
        if not param:
            return param
        m = re.match(r"messages\[(\d+)\]", param)
        if m and int(m.group(1)) < len(self.messages):
            where, parts = self.messages[int(m.group(1))]
            return where + param[m.end():] if parts else where
        for old, new in (("response_format.json_schema.schema", "text.format.schema"),
                         ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
                         ("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
                         ("tool_choice.function.name", "tool_choice.name"), ("tool_choice.function", "tool_choice"),
                         ("messages", "input")):
            if param == old or param.startswith(old + ".") or param.startswith(old + "["):
                return new + param[len(old):]
        return re.sub(r"^tools\[(\d+)\]\.function", r"tools[\1]", param)

    def message(self, text: str, old: str | None, new: str | None) -> str:
        """An error message with the chat route's field names replaced by this request's."""
        if old and new and old != new:
            text = text.replace(old, new)
        return text.replace("max_tokens", "max_output_tokens").replace("`response_format", "`text.format")


# --------------------------------------------------------------------------- request -> items -> chat body

def items_of(r) -> list[dict]:
    """This request's input as stored items (the Responses shapes, plain JSON)."""
    if isinstance(r.input, str):
        return [{"type": "message", "role": "user", "content": r.input}]
    out = []
    for item in r.input:
        if isinstance(item, ResponseInputMessage):
            content = item.content if isinstance(item.content, str) else [
                p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in item.content]
            out.append({"type": "message", "role": item.role, "content": content})
        elif isinstance(item, ResponseFunctionCallItem):
            out.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                        "arguments": item.arguments})
        else:
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            out.append({"type": "function_call_output", "call_id": item.call_id, "output": output})
    return out


def _chat_part(part: dict) -> dict:
    kind = part["type"]
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        image = {"url": part["image_url"], **({"detail": part["detail"]} if part.get("detail") else {})}
        return {"type": "image_url", "image_url": image}
    return part  # video_url / input_video: the chat route's own shapes


def chat_body(r, earlier: list[dict], items: list[dict]) -> tuple[dict, Origins]:
    """The Chat Completions body of request `r` continuing the stored `earlier` items (oldest
    first) with this request's `items`, and where each of its messages came from."""
    origins = Origins()
    messages: list[dict] = []

    def add(message: dict, where: str, parts: bool) -> None:
        messages.append(message)
        origins.messages.append((where, parts))

    if r.instructions:
        add({"role": "system", "content": r.instructions}, "instructions", False)
    here = [(item, "previous_response_id", False) for item in earlier]
    here += [(item, "input" if isinstance(r.input, str) else f"input[{i}]",
              not isinstance(r.input, str) and isinstance(item.get("content"), list)) for i, item in enumerate(items)]
    for item, where, parts in here:
        kind = item["type"]
        if kind == "message" and item["role"] == "assistant":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(_chat_part(p).get("text", "") for p in content)
            add({"role": "assistant", "content": text}, where, False)
        elif kind == "message":
            content = item["content"]
            add({"role": item["role"], "content": content if isinstance(content, str) else
                 [_chat_part(p) for p in content]}, where, parts)
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                add({"role": "assistant", "content": None, "tool_calls": [call]}, where, False)
        else:
            add({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}, where, False)
    body: dict[str, Any] = {"messages": messages, "result_cache": r.result_cache}
    if r.max_output_tokens is not None:
        body["max_tokens"] = r.max_output_tokens
    for name in SAMPLING:
        if getattr(r, name) is not None:
            body[name] = getattr(r, name)
    if r.user is not None:
        body["user"] = r.user
    if r.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in r.tools]
    if r.tool_choice is not None:
        body["tool_choice"] = r.tool_choice if isinstance(r.tool_choice, str) else {
            "type": "function", "function": {"name": r.tool_choice.name}}
    if r.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = r.parallel_tool_calls
    fmt = r.text.format if r.text is not None else None
    if isinstance(fmt, ResponseJsonObjectFormat):
        body["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, ResponseJsonSchemaFormat):
        body["response_format"] = {"type": "json_schema", "json_schema": fmt.model_dump(
            by_alias=True, exclude_none=True, exclude={"type"})}
    return body, origins


def echo_format(r) -> dict:
    """The answer's `text.format`: the request's, or {"type": "text"}."""
    fmt = r.text.format if r.text is not None else None
    return fmt.model_dump(by_alias=True, exclude_none=True) if fmt is not None else {"type": "text"}


def echo_tools(r) -> list[dict]:
    return [t.model_dump(exclude_none=True) for t in r.tools or []]
