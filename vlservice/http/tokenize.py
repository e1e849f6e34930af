"""HTTP glue for `/tokenize` and `/detokenize` (also served under `/v1/`), in vLLM's and llama.cpp's
request shapes (vlservice/protocol/tokenize.py says which answer goes with which).

Texts are tokenized as the engine tokenizes a prompt: as text, a typed marker never a control token;
messages through the chat path (`parse_chat`, then the service's `prompt_ids`), images counted.
Behind the API key like every `/v1/` route (`auth.PROTECTED`).
"""

from __future__ import annotations

from flask import Blueprint, Response, g

from ..engine.output.logprobs import TokenText
from ..engine.prompt import encode
from ..engine.types import ChatRequest, Message
from ..errors import InvalidRequest
from ..protocol import parse_chat
from ..protocol.answers import answer
from ..protocol.completions import validate
from ..protocol.errors import _explain
from ..protocol.tokenize import (DetokenizeAnswer, DetokenizeRequest, LlamaTokenizeAnswer, Piece, TokenizeAnswer,
                                 TokenizeContent, TokenizeMessages, TokenizeRequest, explain_tokenize)
from .appstate import current
from .completions import read_json

bp = Blueprint("tokenize", __name__)


def _explain_tokenize(err: dict, model):
    return explain_tokenize(err, model) or _explain(err, model)


def _json(model) -> Response:
    return Response(answer(model), mimetype="application/json")


@bp.post("/tokenize")
@bp.post("/v1/tokenize")
def tokenize():
    ctx = current()
    svc = ctx.service
    body = read_json()
    r = validate(TokenizeRequest, body, _explain_tokenize).root
    if isinstance(r, TokenizeMessages):  # the chat path reads them, as a chat request's
        chat = {k: body[k] for k in ("messages", "tools", "mm_processor_kwargs") if k in body}
        req, _ = parse_chat({**chat, "max_tokens": 1}, ctx.settings, svc.generation_defaults, ctx.fetch_remote)
        req.tenant = g.get("tenant", "")
        ids = svc.prompt_ids(req)
        if not r.add_generation_prompt:
            ids = _without_generation_prompt(svc, ids)
    else:
        text = r.content if isinstance(r, TokenizeContent) else r.prompt
        ids = svc.prompt_ids(ChatRequest(messages=[Message("user", [text])], raw_prompt=text))
    if isinstance(r, TokenizeContent):
        pieces = TokenText(svc.tokenizer)
        return _json(LlamaTokenizeAnswer(tokens=[Piece(id=t, piece=_piece(*pieces(t))) for t in ids]
                                         if r.with_pieces else ids))
    strs = svc.tokenizer.convert_ids_to_tokens(ids) if r.return_token_strs else None
    return _json(TokenizeAnswer(count=len(ids), max_model_len=ctx.settings.max_context_tokens, tokens=ids,
                                token_strs=strs))


def _piece(text: str, raw: list[int]) -> str | list[int]:
    """llama.cpp's piece: the token's text, or its bytes when they are not whole UTF-8."""
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _without_generation_prompt(svc, ids: list[int]) -> list[int]:
    """The prompt without the assistant turn's opening the chat template ends it with (vLLM's
    `add_generation_prompt: false`): the template's own difference of the two renderings."""
    chat = [{"role": "user", "content": "x"}]
    with_it = svc.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    without = svc.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
    opening = encode(svc.tokenizer, [(with_it[len(without):], True)]) if with_it.startswith(without) else []
    return ids[:len(ids) - len(opening)] if opening and ids[len(ids) - len(opening):] == opening else ids


@bp.post("/detokenize")
@bp.post("/v1/detokenize")
def detokenize():
    svc = current().service
    r = validate(DetokenizeRequest, read_json())
    vocab = len(svc.tokenizer)
    for i, t in enumerate(r.tokens):
        if t >= vocab:
            raise InvalidRequest(f"`tokens[{i}]` must be a token id between 0 and {vocab - 1}, got {t}",
                                 param=f"tokens[{i}]", code="invalid_value")
    text = svc.tokenizer.decode(r.tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return _json(DetokenizeAnswer(prompt=text, content=text))
