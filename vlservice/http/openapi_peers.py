"""The OpenAPI description of the peers' APIs served beside chat: Anthropic Messages
(`/v1/messages`, `/v1/messages/count_tokens`), OpenAI's legacy Completions (`/v1/completions`) and
the tokenizer routes (`/tokenize`, `/detokenize`, also under `/v1/`). `openapi.py` adds these to
its document: the request and answer schemas come from the protocol models the routes validate
and answer with; written by hand here: only the paths, the SSE framing and the error responses.
"""

from __future__ import annotations

from typing import Any, cast

from ..protocol import anthropic, anthropic_answers, completions, tokenize

JSON = "application/json"
SSE = "text/event-stream"
REF = "#/components/schemas/{model}"
TOKENIZE_PATHS = ("/tokenize", "/v1/tokenize")
DETOKENIZE_PATHS = ("/detokenize", "/v1/detokenize")


def modes(settings) -> list:
    """(model, JSON Schema mode) of every request (validation) and answer (serialization) here."""
    requests = [anthropic.messages_model(settings), anthropic.CountTokensRequest, completions.completion_model(settings),
                tokenize.TokenizeRequest, tokenize.DetokenizeRequest]
    answers = [*anthropic_answers.ANSWERS, *completions.ANSWERS, *tokenize.ANSWERS]
    return [(m, "validation") for m in requests] + [(m, "serialization") for m in answers]


def vocab_of(app) -> int | None:
    """The served tokenizer's size (None for a document built without a service)."""
    service = getattr(app.extensions["vlservice"], "service", None)
    tokenizer = getattr(service, "tokenizer", None)
    return len(tokenizer) if tokenizer is not None else None


def schemas(schemas: dict, vocab: int | None) -> dict:
    """`schemas` with the stream framings added; the detokenize ids bounded by the vocabulary when known."""
    events = [cast(Any, m.model_fields["type"].annotation).__args__[0] for m in anthropic_answers.STREAM_EVENTS]
    schemas["AnthropicServerSentEvent"] = {
        "type": "object", "required": ["event", "data"],
        "description": ("one event of a streamed Anthropic message: `event` is its type, `data` the JSON event "
                        "(`message_start`, `ping`, per content block `content_block_start` / `content_block_delta` "
                        "/ `content_block_stop`, `message_delta` with the stop reason and usage, `message_stop`; "
                        "`error` when the request fails once streaming). Comment lines (`: prefill`, ...) may come "
                        "between. Closing the connection cancels the generation."),
        "properties": {
            "event": {"enum": events},
            "data": {"type": "string", "pattern": "^\\{", "contentMediaType": JSON, "contentSchema": {"anyOf": [
                {"$ref": REF.format(model=m.__name__)} for m in anthropic_answers.STREAM_EVENTS]}}},
    }
    schemas["CompletionServerSentEvent"] = {
        "type": "object", "required": ["data"],
        "description": ("one event of a streamed completion: `data` is a JSON `Completion` chunk (text in "
                        "`choices[0].text`, the last with `finish_reason`, then with `stream_options.include_usage` "
                        "one with empty `choices` and `usage`), or a JSON `Error` if the request fails once "
                        "streaming; the last event is `data: [DONE]`. Comment lines keep the connection alive."),
        "properties": {"data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "pattern": "^\\{", "contentMediaType": JSON, "contentSchema": {"anyOf": [
                {"$ref": REF.format(model="Completion")}, {"$ref": REF.format(model="Error")}]}}]}},
    }
    if vocab:
        schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] = vocab - 1
    return schemas


def _errors(model: str, unauthorized: str, max_bytes: int, queued: bool = True) -> dict:
    def one(desc: str) -> dict:
        return {"description": desc, "content": {JSON: {"schema": {"$ref": REF.format(model=model)}}}}

    out = {"400": one("invalid request: a field out of range or of the wrong type, a bad image, a feature this "
                      "server does not serve (named in the message), context length exceeded"),
           "401": one(unauthorized), "413": one(f"the request body is larger than {max_bytes} bytes")}
    if queued:
        retry = {"Retry-After": {"description": "seconds after which a retry is likely to be served",
                                 "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        out["429"] = {**one("the wait queue is full: retry later"), "headers": retry}
        out["499"] = one("cancelled before a non-streamed answer was complete")
        out["503"] = {**one("the model is not ready yet, or the request waited too long for it"), "headers": retry}
    return out


def _post(op_id: str, tag: str, summary: str, security: list, request: str, ok: dict, errors: dict,
          parameters: list | None = None) -> dict:
    return {"post": {"operationId": op_id, "tags": [tag], "summary": summary, "security": security,
                     **({"parameters": parameters} if parameters else {}),
                     "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": REF.format(
                         model=request)}}}},
                     "responses": {"200": ok, **errors}}}


def paths(settings, security: list, unauthorized: str, parameters: list, headers: dict) -> dict:
    """The paths of the peers' APIs (`parameters`, `headers`: the chat route's request and answer headers)."""
    limit = settings.max_request_bytes
    anthropic_unauthorized = unauthorized + "; `x-api-key: <key>` is accepted as well as the bearer"
    version = {"name": "anthropic-version", "in": "header", "required": False,
               "description": "accepted (any version)", "schema": {"type": "string"}}
    out = {
        "/v1/messages": _post(
            "createMessage", "anthropic", "Answer about images (Anthropic Messages API)", security, "MessagesRequest",
            {"description": "the message: JSON, or Anthropic's server-sent events when `stream` is true",
             "headers": headers, "content": {JSON: {"schema": {"$ref": REF.format(model="AnthropicMessage")}},
                                             SSE: {"schema": {"$ref": REF.format(model="AnthropicServerSentEvent")}}}},
            _errors("AnthropicError", anthropic_unauthorized, limit), [*parameters, version]),
        "/v1/messages/count_tokens": _post(
            "countMessageTokens", "anthropic", "The prompt's tokens (chat template, tools, images) without answering",
            security, "CountTokensRequest", {"description": "the count", "content": {JSON: {"schema": {
                "$ref": REF.format(model="CountTokensAnswer")}}}},
            _errors("AnthropicError", anthropic_unauthorized, limit, queued=False), [version]),
        "/v1/completions": _post(
            "createCompletion", "completions", "Continue a text (OpenAI Completions, legacy): no chat template",
            security, "CompletionRequest",
            {"description": "the completion: JSON, or `text_completion` chunks as server-sent events when `stream` "
                            "is true", "headers": headers,
             "content": {JSON: {"schema": {"$ref": REF.format(model="Completion")}},
                         SSE: {"schema": {"$ref": REF.format(model="CompletionServerSentEvent")}}}},
            _errors("Error", unauthorized, limit), parameters),
    }
    tokenized = {"description": "vLLM's answer (to `prompt`, `messages`) or llama.cpp's (to `content`)",
                 "content": {JSON: {"schema": {"anyOf": [{"$ref": REF.format(model="TokenizeAnswer")},
                                                         {"$ref": REF.format(model="LlamaTokenizeAnswer")}]}}}}
    text = {"description": "the text, under vLLM's key and llama.cpp's", "content": {JSON: {"schema": {
        "$ref": REF.format(model="DetokenizeAnswer")}}}}
    for i, path in enumerate(TOKENIZE_PATHS):
        out[path] = _post("tokenize" + ("V1" if i else ""), "tokenizer", "Token ids of a text or of a chat's prompt "
                          "(vLLM's and llama.cpp's shapes)", security, "TokenizeRequest", tokenized,
                          _errors("Error", unauthorized, limit, queued=False))
    for i, path in enumerate(DETOKENIZE_PATHS):
        out[path] = _post("detokenize" + ("V1" if i else ""), "tokenizer", "The text of token ids", security,
                          "DetokenizeRequest", text, _errors("Error", unauthorized, limit, queued=False))
    return out


TAGS = [{"name": "anthropic"}, {"name": "completions"}, {"name": "tokenizer"}]
