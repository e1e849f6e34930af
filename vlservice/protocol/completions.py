"""OpenAI's legacy Completions API (`POST /v1/completions`), declared once: the request (with the
running `Settings`' bounds) and the answers, streamed and not.

The prompt is raw text, fed to the model without the chat template and tokenized as text (a typed
`<|im_start|>` is characters, never a control token). Its sampling fields are the chat's and are
checked by the chat path (`chat_body` says which); what Completions asks for that this server does
not serve is refused with a 400 naming the field: `echo`, `suffix`, `best_of` > 1, `logit_bias`,
several prompts or token arrays. No engine import here: the HTTP layer runs it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, Tag, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ..config import Settings
from .answers import Timings, Usage, _absent, _Out
from ..errors import InvalidRequest
from .base import INTEGERS, _IntegralIn, _pick
from .errors import _explain
from .messages import Stop
from .parse import check_tree
from .request import StreamOptions, _refused, _unsupported_schema

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for completions
MAX_LOGPROBS = 5  # OpenAI's bound for completions


def _one_text(v):
    """`prompt`: a string, or a list holding one string; token arrays and batches are refused."""
    if isinstance(v, list):
        if any(isinstance(x, (int, list)) and not isinstance(x, bool) for x in v):
            raise PydanticCustomError("unsupported_value", "`prompt` as token ids is not served: send the text "
                                      "(POST /detokenize turns ids into text)", {"param": "prompt"})
        if len(v) > 1:
            raise PydanticCustomError("unsupported_value", f"one prompt per request, got a list of {len(v)}",
                                      {"param": "prompt"})
    return v


Text = Annotated[str, Field(min_length=1)]
Prompt = Annotated[Annotated[Union[Annotated[Text, Tag("Text")],
                                   Annotated[Annotated[list[Text], Field(min_length=1, max_length=1)], Tag("List")]],
                             _pick(lambda v: "Text" if isinstance(v, str) else "List" if isinstance(v, list) else None,
                                   "prompt_type")],
                   BeforeValidator(_one_text)]


def explain(err: dict, model) -> tuple[str, str, str]:
    """One pydantic error -> (message, param, code): the prompt's own, then the chat's words."""
    if err["type"] == "prompt_type":
        return "`prompt` must be a string (or a list of one string)", "prompt", "invalid_type"
    if err["type"] == "string_too_short" and err["loc"][:1] == ("prompt",):
        return "`prompt` must not be empty", "prompt", "empty"
    return _explain(err, model)


def validate(model: type[BaseModel], body, explain=_explain):
    """`body` (parsed JSON) validated by `model`, or the first fault as an `InvalidRequest` naming
    the field, the bound and the value (`explain` words it)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    check_tree(body)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param, code = explain(exc.errors(include_url=False)[0], model)
        raise InvalidRequest(message, param=param or None, code=code) from None


@lru_cache(maxsize=16)
def completion_model(settings: Settings) -> type[BaseModel]:
    """The Completions request with this server's bounds (built once per `Settings`)."""
    cap = settings.max_tokens_cap

    class CompletionRequest(_IntegralIn):
        """OpenAI Completions request (legacy). Fields this server does not know are ignored; the known
        ones are validated strictly (400 naming the field, the bound and the value)."""

        INTEGER_FIELDS: ClassVar[tuple[str, ...]] = (*INTEGERS, "logprobs", "best_of")

        prompt: Prompt = Field(description=(
            "the text the model continues, as it is (no chat template; control-token markers in it are text); a "
            "list of one string is read as that string"))
        model: str | None = Field(None, description="accepted and ignored: this server serves one model")
        max_tokens: int | None = Field(None, ge=1, le=cap, description=f"answer length limit in tokens (default "
                                                                       f"{DEFAULT_MAX_TOKENS}, as OpenAI's)")
        min_tokens: int | None = Field(None, ge=0, le=cap, description="the end-of-sequence token is forbidden "
                                                                       "before this many tokens; at most max_tokens")
        temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy; default: the model's "
                                                                             "generation config")
        top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling")
        top_k: int | None = Field(None, ge=0, le=1_000_000, description="0 = off")
        repetition_penalty: float | None = Field(None, ge=0.01, le=10.0, description="1 = off; over prompt and "
                                                                                     "answer (vLLM, llama.cpp)")
        frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="as in chat")
        presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="as in chat")
        seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="sampling seed")
        stop: Stop | None = Field(None, description="up to 4 strings of at most 64 characters; the answer ends "
                                                    "before the first one")
        stream: bool = Field(False, description="answer as server-sent events (`text_completion` chunks), ending "
                                                "with `data: [DONE]`")
        stream_options: StreamOptions | None = None
        logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description=(
            "each answer token's log probability and this many most likely alternatives (`choices[].logprobs`: "
            "tokens, token_logprobs, top_logprobs, text_offset)"))
        n: int | None = Field(1, ge=1, le=settings.max_batch, description=(
            f"how many choices to answer, at most {settings.max_batch} (VL_MAX_BATCH: each takes a batch slot): one "
            "prefill, the choices decoded together; with a seed, choice i is what the request alone with seed + i "
            "answers"))
        best_of: int | None = Field(None, ge=1, le=1, description="only 1 is served")
        echo: Annotated[Any, _refused("echo"), _unsupported_schema("the prompt is not repeated in the answer")] = None
        suffix: Annotated[Any, _refused("suffix"), _unsupported_schema("no insertion")] = None
        logit_bias: Annotated[Any, _refused("logit_bias"), _unsupported_schema("no logit biases")] = None
        user: str | None = Field(None, max_length=256, description="an id of the end user; the session key when no "
                                                                  "X-Session-Id header is sent")
        result_cache: bool = Field(True, description="extension: false bypasses the cache of identical greedy "
                                                     "requests")

        @model_validator(mode="after")
        def _text(self):
            limit = self.max_tokens or DEFAULT_MAX_TOKENS
            if self.min_tokens is not None and self.min_tokens > limit:
                raise PydanticCustomError("invalid_value", f"`min_tokens` must be between 0 and max_tokens "
                                          f"({limit}), got {self.min_tokens}", {"param": "min_tokens"})
            return self

        @property
        def text(self) -> str:
            return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    return CompletionRequest


SAMPLING = ("min_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "frequency_penalty",
            "presence_penalty", "seed", "stop", "result_cache", "user", "model")


def chat_body(r) -> dict:
    """The chat request whose sampling `r` asks for; its one user message holds the prompt (the HTTP
    layer then sends the text as the raw prompt instead of the chat template)."""
    body: dict = {"messages": [{"role": "user", "content": r.text}],
                  "max_tokens": r.max_tokens or DEFAULT_MAX_TOKENS}
    body.update({name: getattr(r, name) for name in SAMPLING if getattr(r, name) is not None})
    if r.logprobs is not None:
        body.update(logprobs=True, top_logprobs=r.logprobs)
    if r.n is not None:
        body["n"] = r.n
    return body


def rename(param: str | None) -> str | None:
    """A chat field path as this API names it."""
    if param and param.startswith("messages"):
        return "prompt"
    return {"top_logprobs": "logprobs"}.get(param or "", param)


# --------------------------------------------------------------------------- answers

class CompletionLogprobs(_Out):
    """OpenAI's legacy `logprobs`: per answer token its text, its log probability, the most likely
    alternatives ({text: log probability}) and its character offset in the answer."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int = Field(ge=0)
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = Field(description="null unless the request set `logprobs`")


class Completion(_Out):
    """The answer of `POST /v1/completions`, and (object `text_completion` too, as OpenAI's) each chunk of a
    streamed one: text in `choices[0].text`, the last with `finish_reason`; with
    `stream_options.include_usage` a final chunk with empty `choices`, `usage` and `timings`."""

    id: str = Field(pattern="^cmpl-")
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = _absent()
    timings: Timings = _absent()
    system_fingerprint: str = _absent()


ANSWERS = (Completion,)
