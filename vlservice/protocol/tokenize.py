"""`/tokenize` and `/detokenize` (also under `/v1/`) in the request shapes of vLLM and llama.cpp.

vLLM: `{"prompt": text}` or `{"messages": [...], "add_generation_prompt": true}` -> `{"count",
"max_model_len", "tokens", "token_strs"}`; `{"tokens": [...]}` -> `{"prompt": text}`. llama.cpp:
`{"content": text}` -> `{"tokens": [...]}` (with `with_pieces`, `[{"id", "piece"}]`); `{"tokens":
[...]}` -> `{"content": text}`. Both peers detokenize the same body, so the answer carries both keys.
Text is tokenized as text, as everywhere in this server: a typed `<|im_start|>` is characters,
never a control token (llama.cpp's `parse_special` and the peers' `add_special_tokens` are accepted
and change nothing; Qwen's tokenizer adds no BOS). Messages go through the chat template with
their images' tokens, exactly as a chat request's prompt.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import AfterValidator, BeforeValidator, Field, RootModel, Tag, WithJsonSchema
from pydantic_core import PydanticCustomError

from .answers import _Out
from .base import _In, _integral_float, _pick
from .messages import ChatMessage
from .tools import Tool


class _Options(_In):
    model: str | None = Field(None, description="accepted and ignored: this server serves one model")
    add_special_tokens: bool | None = Field(None, description="accepted; Qwen's tokenizer adds no special tokens")
    add_special: bool | None = Field(None, description="llama.cpp's spelling of `add_special_tokens`; accepted")
    parse_special: bool | None = Field(None, description=(
        "llama.cpp's; accepted, but text is always tokenized as text (markers never become control tokens)"))
    return_token_strs: bool = Field(False, description="vLLM's: also each token's vocabulary string (`token_strs`)")
    with_pieces: bool = Field(False, description="llama.cpp's: `tokens` as [{\"id\", \"piece\"}] (llama.cpp shape)")


class TokenizePrompt(_Options):
    """vLLM's shape: one text."""

    prompt: str = Field(description="the text, tokenized as text (the raw prompt /v1/completions would run)")


class TokenizeContent(_Options):
    """llama.cpp's shape: one text, answered as `{"tokens": [...]}`."""

    content: str = Field(description="the text, tokenized as text")


def _not_served(v: bool) -> bool:
    if v:
        raise PydanticCustomError("unsupported_value", "`continue_final_message` is not served: the prompt ends "
                                  "with the template's own turns", {"param": "continue_final_message"})
    return v


class TokenizeMessages(_Options):
    """vLLM's chat shape: the prompt a chat request with these messages (and tools) would run."""

    messages: list[ChatMessage] = Field(
        min_length=1, description="as in chat completions (images counted as their tokens); at least one user "
                                  "message", json_schema_extra={"contains": {
                                      "type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}}})
    add_generation_prompt: bool = Field(True, description="end with the assistant turn's opening, as a chat "
                                                          "request's prompt does")
    continue_final_message: Annotated[bool, AfterValidator(_not_served), WithJsonSchema({"const": False})] = Field(
        False, description="not served (must be false)")
    tools: list[Tool] | None = Field(None, max_length=128, description="as in chat completions")


def _kind(v):
    if isinstance(v, dict):
        return "Messages" if "messages" in v else "Prompt" if "prompt" in v else "Content" if "content" in v else None


class TokenizeRequest(RootModel):
    """vLLM's `prompt` or `messages`, or llama.cpp's `content` (the first present of messages, prompt, content)."""

    root: Annotated[Union[Annotated[TokenizeMessages, Tag("Messages")], Annotated[TokenizePrompt, Tag("Prompt")],
                          Annotated[TokenizeContent, Tag("Content")]], _pick(_kind, "tokenize_shape")]


class DetokenizeRequest(_In):
    model: str | None = Field(None, description="accepted and ignored")
    tokens: list[Annotated[int, Field(ge=0), BeforeValidator(_integral_float)]] = Field(
        description="token ids of this model's vocabulary")


def explain_tokenize(err: dict, model) -> tuple[str, str, str] | None:
    """The words for the one error the shared explainer does not know."""
    if err["type"] == "tokenize_shape":
        if not isinstance(err.get("input"), dict):
            return "the request body must be a JSON object", "", "invalid_json"
        return "one of `prompt` (vLLM), `content` (llama.cpp) or `messages` is required", "prompt", "invalid_type"
    return None


class TokenizeAnswer(_Out):
    """vLLM's answer (to `prompt` and `messages`)."""

    count: int = Field(ge=0)
    max_model_len: int = Field(description="the server's context limit in tokens (VL_MAX_CONTEXT_TOKENS)")
    tokens: list[int]
    token_strs: list[str] | None = Field(description="with `return_token_strs`: each token's vocabulary string")


class Piece(_Out):
    id: int
    piece: str | list[int] = Field(description="the token's text, or its bytes when they are not whole UTF-8")


class LlamaTokenizeAnswer(_Out):
    """llama.cpp's answer (to `content`)."""

    tokens: list[int] | list[Piece]


class DetokenizeAnswer(_Out):
    """The text, under vLLM's key (`prompt`) and llama.cpp's (`content`)."""

    prompt: str
    content: str


ANSWERS = (TokenizeAnswer, LlamaTokenizeAnswer, DetokenizeAnswer)
