"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), declared once:
the request (with the running `Settings`' bounds) here; the answer, the stream's events and the
error in `anthropic_answers`.

A request is read as the chat request it means (`chat_body`): `system` becomes a system message,
`image` blocks `image_url` parts, `tool_use` blocks an assistant turn's `tool_calls`, `tool_result`
blocks `tool` messages, `tools` / `tool_choice` OpenAI's; the chat path (`parse_chat`) then checks
and runs it, so caches, limits, grammars and tenants are the chat's own. `Renames` turns the chat's
field paths in an error back into this API's. No engine import here: the HTTP layer runs it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any, Literal, Union, cast

from pydantic import BaseModel, BeforeValidator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from ..config import Settings
from .base import MAX_STOP, MAX_STOP_CHARS, _In, _IntegralIn, _pick
from .errors import _explain
from .tools import NAME

MAX_TOOLS = 128
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # Anthropic's four


def _error(param: str, message: str, code: str = "invalid_value") -> PydanticCustomError:
    return PydanticCustomError(code, message, {"param": param})


# --------------------------------------------------------------------------- request

class TextBlock(_In):
    type: Literal["text"]
    text: str


class Base64Source(_In):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(description="the image's bytes in base64 (the declared type must match them)")


class URLSource(_In):
    type: Literal["url"]
    url: str = Field(description="an https URL, fetched only when the server allows remote images "
                                 "(VL_REMOTE_IMAGES), under the same rules as chat's image URLs")


def _source_tag(v):
    if isinstance(v, dict) and isinstance(v.get("type"), str):
        return {"base64": "Base64", "url": "URL"}.get(v["type"])


class ImageBlock(_In):
    type: Literal["image"]
    source: Annotated[Union[Annotated[Base64Source, Tag("Base64")], Annotated[URLSource, Tag("URL")]],
                      _pick(_source_tag, "source_type")]


class ToolUseBlock(_In):
    """A call an earlier answer made (sent back in an assistant message)."""

    type: Literal["tool_use"]
    id: str = Field(max_length=256)
    name: str = Field(min_length=1, max_length=64)
    input: dict[str, Any] = Field(description="the call's arguments")


class ToolResultBlock(_In):
    """What a call returned (in a user message): text only."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=256)
    content: Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[TextBlock], Tag("Blocks")]],
                       _pick(lambda v: "Text" if isinstance(v, str) else "Blocks" if isinstance(v, list) else None,
                             "tool_result_content")] | None = None
    is_error: bool | None = None


def _block_tag(allowed: dict):
    return lambda v: allowed.get(v["type"]) if isinstance(v, dict) and isinstance(v.get("type"), str) else None


UserBlock = Annotated[Union[Annotated[TextBlock, Tag("Text")], Annotated[ImageBlock, Tag("Image")],
                            Annotated[ToolResultBlock, Tag("ToolResult")]],
                      _pick(_block_tag({"text": "Text", "image": "Image", "tool_result": "ToolResult"}), "user_block_type")]
AssistantBlock = Annotated[Union[Annotated[TextBlock, Tag("Text")], Annotated[ToolUseBlock, Tag("ToolUse")]],
                           _pick(_block_tag({"text": "Text", "tool_use": "ToolUse"}), "assistant_block_type")]


def _content_tag(v):
    return "Text" if isinstance(v, str) else "Blocks" if isinstance(v, list) else None


class AnthropicUserMessage(_In):
    role: Literal["user"]
    content: Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[UserBlock], Tag("Blocks")]],
                       _pick(_content_tag, "content_type")] = Field(
        description="text, or blocks: text, image, tool_result")


class AnthropicAssistantMessage(_In):
    role: Literal["assistant"]
    content: Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[AssistantBlock], Tag("Blocks")]],
                       _pick(_content_tag, "content_type")] = Field(
        description="text, or blocks: text, tool_use (an earlier answer's content)")


InputMessage = Annotated[Union[Annotated[AnthropicUserMessage, Tag("User")],
                               Annotated[AnthropicAssistantMessage, Tag("Assistant")]],
                         _pick(lambda v: {"user": "User", "assistant": "Assistant"}.get(v["role"])
                               if isinstance(v, dict) and isinstance(v.get("role"), str) else None, "anthropic_role")]


def _custom_only(v):
    """Anthropic's server tools (web search, code execution, ...) have a `type` of their own."""
    if isinstance(v, dict) and v.get("type") not in (None, "custom"):
        raise PydanticCustomError("unsupported_tool", "only custom tools (`name`, `input_schema`) are served; "
                                  "server tools such as {kind} are not", {"kind": repr(v.get("type"))[:60]})
    return v


class ToolDefinition(_In):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=NAME, description="a-z, A-Z, 0-9, _ . - ; at most 64 characters")
    description: str | None = None
    input_schema: dict[str, Any] = Field(description=(
        "a JSON Schema of the arguments (an object). With `tool_choice` any or tool, each call's input validates "
        "against it (a schema the grammar compiler cannot use: 400)"))


class ToolChoice(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, description="with type tool: the tool to call")
    disable_parallel_tool_use: bool | None = Field(None, description="true: at most one call where calls are forced")


class JsonOutputFormat(_In):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description=(
        "a JSON Schema the answer's text validates against, enforced by grammar-constrained decoding (chat's "
        "`response_format` json_schema); one it cannot compile: 400"))


class OutputConfig(_In):
    format: JsonOutputFormat | None = Field(None, description="structured output (what the client's `parse` sends)")
    effort: str | None = Field(None, description="accepted and ignored")


class Metadata(_In):
    user_id: str | None = Field(None, max_length=256, description="an id of the end user: the session key "
                                                                  "when no X-Session-Id header is sent")


class Thinking(_In):
    type: Literal["disabled"] = Field(description="extended thinking is not served by this model")


def _asks(m) -> bool:
    """A user message with text or an image (or nothing): not only tool results."""
    return m.role == "user" and (isinstance(m.content, str) or not m.content
                                 or any(not isinstance(b, ToolResultBlock) for b in m.content))


# JSON Schema's words for `_asks` (in `messages`' schema: a request the schema allows is one served)
ASKS: dict[str, Any] = {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}, "content": {"anyOf": [
    {"type": "string"}, {"type": "array", "maxItems": 0},
    {"type": "array", "contains": {"type": "object", "required": ["type"], "properties": {
        "type": {"enum": ["text", "image"]}}}}]}}}


def _check_messages(r) -> None:
    """A user message that asks something (tool results alone are answers, not a question, and the
    chat path needs a user turn), and the last message a user one: continuing (prefilling) an
    assistant message is not served, since the chat template closes an assistant turn."""
    if not any(_asks(m) for m in r.messages):
        raise _error("messages", "`messages` must hold a user message with text or an image (tool results alone "
                     "are not a question)")
    if r.messages[-1].role == "assistant":
        raise _error(f"messages[{len(r.messages) - 1}]", "the last message must be a user message: continuing "
                     "(prefilling) an assistant message is not served")


class _CountFields(_IntegralIn):
    """What `count_tokens` and `messages` share: the conversation, the system prompt, the tools."""

    model: str | None = Field(None, description="accepted and ignored: this server serves one model")
    messages: list[InputMessage] = Field(
        min_length=1, description="the conversation, ending with a user message; at least one user message with text "
                                  "or an image", json_schema_extra={"contains": ASKS})
    system: Annotated[Union[Annotated[str, Tag("Text")], Annotated[list[TextBlock], Tag("Blocks")]],
                      _pick(lambda v: "Text" if isinstance(v, str) else "Blocks" if isinstance(v, list) else None,
                            "system_type")] | None = None
    tools: list[Annotated[ToolDefinition, BeforeValidator(_custom_only)]] | None = Field(
        None, max_length=MAX_TOOLS, description=f"custom tools (at most {MAX_TOOLS}); the answer's calls come back as "
                                                 "`tool_use` blocks with `stop_reason` tool_use")
    tool_choice: ToolChoice | None = Field(None, description=(
        "auto (default): text, calls or both; any: one or more calls; tool (with `name`): a call of that tool; "
        "none: text only (the tools are left out of the prompt). any and tool are enforced by grammar-constrained "
        "decoding"))
    thinking: Thinking | None = Field(
        None, description="only {\"type\": \"disabled\"}: this model has no extended thinking")

    @model_validator(mode="after")
    def _shared_checks(self):
        _check_messages(self)
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise _error("tool_choice.name", "`tool_choice` of type tool needs `name`")
        return self


class CountTokensRequest(_CountFields):
    """Anthropic's token counting request: the prompt's tokens as the model would see them (the chat
    template, the tools, every image's tokens)."""


@lru_cache(maxsize=16)
def messages_model(settings: Settings) -> type[BaseModel]:
    """The Messages request with this server's bounds (built once per `Settings`)."""
    cap = settings.max_tokens_cap

    class MessagesRequest(_CountFields):
        """Anthropic Messages request. Unknown fields are ignored; the known ones are validated strictly
        (400 naming the field, the bound and the value)."""

        max_tokens: int = Field(ge=1, le=cap, description="answer length limit in tokens (required)")
        stop_sequences: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
            None, max_length=MAX_STOP, description=f"up to {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters; "
                                                  "the answer ends before the first one (`stop_reason` stop_sequence)")
        temperature: float | None = Field(None, ge=0.0, le=1.0, description="0 = greedy; default: the model's "
                                                                             "generation config")
        top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling")
        top_k: int | None = Field(None, ge=0, le=1_000_000, description="0 = off")
        stream: bool = Field(False, description="answer as Anthropic's server-sent events")
        metadata: Metadata | None = None
        output_config: OutputConfig | None = Field(None, description=(
            "`format` {\"type\": \"json_schema\", \"schema\": {...}}: the answer is JSON valid against the schema "
            "(not beside a forced tool call: one grammar per answer)"))
        result_cache: bool = Field(True, description="extension: false bypasses the cache of identical greedy "
                                                     "requests")

    return MessagesRequest


_KINDS = {"user_block_type": ('"text", "image" or "tool_result" (in a user message)', True),
          "assistant_block_type": ('"text" or "tool_use" (in an assistant message)', True),
          "source_type": ('"base64" or "url"', True), "content_type": ("a string or a list of blocks", False),
          "system_type": ("a string or a list of text blocks", False),
          "tool_result_content": ("a string or a list of text blocks", False)}


def explain(err: dict, model) -> tuple[str, str, str]:
    """One pydantic error -> (message, param, code): this API's unions, then the chat's words."""
    from .errors import _param

    kind, value = err["type"], err.get("input")
    if kind in _KINDS:
        p = _param(err["loc"])
        what, typed = _KINDS[kind]
        if typed and isinstance(value, dict):
            return f"`{p}.type` must be {what}, got {str(repr(value.get('type')))[:100]}", f"{p}.type", "invalid_value"
        return f"`{p}` must be {'an object' if typed else what}", p, "invalid_type"
    if kind == "anthropic_role":
        p = _param(err["loc"])
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return f"`{p}.role` must be \"user\" or \"assistant\", got {str(repr(value.get('role')))[:100]}", \
            f"{p}.role", "invalid_value"
    if kind == "unsupported_tool":
        p = _param(err["loc"])
        return err["msg"], p, "unsupported_parameter"
    return _explain(err, model)


# --------------------------------------------------------------------------- to the chat request

class Renames:
    """The chat request's field paths back to this API's (an error names the field the client wrote)."""

    STATIC = (("tool_choice.function.name", "tool_choice.name"), ("stop", "stop_sequences"),
              ("max_completion_tokens", "max_tokens"), ("response_format.json_schema.schema", "output_config.format.schema"),
              ("response_format", "output_config.format"))

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []

    def add(self, chat: str, ours: str) -> None:
        self.pairs.append((chat, ours))

    def param(self, p: str | None) -> str | None:
        if not p:
            return p
        for chat, ours in sorted(self.pairs, key=lambda x: -len(x[0])):
            if p == chat or p.startswith((chat + ".", chat + "[")):
                return ours + p[len(chat):]
        if p.startswith("tools[") and ".function." in p:
            return p.replace(".function.parameters", ".input_schema").replace(".function.name", ".name")
        return dict(self.STATIC).get(p, p)

    def message(self, message: str, old: str | None, new: str | None) -> str:
        return message.replace(f"`{old}`", f"`{new}`") if old and new and old != new else message


def _text(blocks) -> str:
    return blocks if isinstance(blocks, str) else "\n".join(b.text for b in blocks or [])


def _image_part(block: ImageBlock) -> dict:
    s = block.source
    url = f"data:{s.media_type};base64,{s.data}" if isinstance(s, Base64Source) else s.url
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(r, *, max_tokens: int = 1) -> tuple[dict, Renames]:
    """The chat request `r` (a Messages or CountTokens request) means, and the paths to rename."""
    names = Renames()
    messages: list[dict] = []
    if r.system:
        names.add(f"messages[{len(messages)}]", "system")
        messages.append({"role": "system", "content": _text(r.system)})
    for i, m in enumerate(r.messages):
        if isinstance(m.content, str):
            names.add(f"messages[{len(messages)}]", f"messages[{i}]")
            messages.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            names.add(f"messages[{len(messages)}]", f"messages[{i}]")
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(
                b.input, ensure_ascii=False)}} for b in m.content if isinstance(b, ToolUseBlock)]
            text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
            messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        else:
            messages.extend(_user_turn(m, i, len(messages), names))
    body: dict = {"messages": messages, "max_tokens": max_tokens, "model": r.model}
    if r.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description is not None else {}),
            "parameters": t.input_schema}} for t in r.tools]
    choice = r.tool_choice
    if choice is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or {
            "type": "function", "function": {"name": choice.name}}
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    for name in ("temperature", "top_p", "top_k", "result_cache"):
        if getattr(r, name, None) is not None:
            body[name] = getattr(r, name)
    if getattr(r, "stop_sequences", None):
        body["stop"] = list(r.stop_sequences)
    output = getattr(r, "output_config", None)
    if output is not None and output.format is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                           "schema": output.format.schema_}}
    metadata = getattr(r, "metadata", None)
    if metadata is not None and metadata.user_id:
        body["user"] = metadata.user_id
    return body, names


def _user_turn(m: AnthropicUserMessage, i: int, start: int, names: Renames) -> list[dict]:
    """A user message's blocks: each `tool_result` a `tool` message, the text and images around
    them user messages, in order."""
    out: list[dict] = []
    parts: list[dict] = []

    def flush() -> None:
        if parts:
            out.append({"role": "user", "content": list(parts)})
            parts.clear()

    for j, b in enumerate(cast("list[UserBlock]", m.content)):  # a string went the short way (chat_body)
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, ToolResultBlock):
            flush()
            text = _text(b.content) if b.content is not None else ""
            names.add(f"messages[{start + len(out)}]", where)
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": ("Error: " + text) if b.is_error else text})
            continue
        at = f"messages[{start + len(out)}].content[{len(parts)}]"
        if isinstance(b, ImageBlock):
            names.add(at + ".image_url", where + ".source")
            parts.append(_image_part(b))
        else:
            parts.append({"type": "text", "text": b.text})
        names.add(at, where)
    flush()
    if not out:  # an empty list of blocks: an empty user message, as chat reads it
        names.add(f"messages[{start}]", f"messages[{i}]")
        out.append({"role": "user", "content": ""})
    return out
