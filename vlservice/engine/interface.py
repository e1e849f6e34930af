"""The engine as the protocol layer sees it: one narrow, named seam.

`vlservice.protocol` validates what clients send and converts it into the engine's one request;
for that it needs the request's types, a look at uploaded media before they are queued (`probe`,
`sniff`: format and size, no decode) and the grammar compiler that refuses a schema the model's
sampler cannot serve. It imports those from here and nothing else of the engine (tests/unit/
test_imports.py), so what the engine shows the layer above is this file. The grammar functions load
the compiler (llguidance, torch) on first use, not when the protocol's models are imported.
"""

from __future__ import annotations

from .media.images import probe
from .media.video import sniff
from .types import ChatRequest, ImageInput, Message, Sampling, VideoInput


class SchemaRefused(ValueError):
    """A schema the grammar compiler cannot serve; its text is the reason, worded for a client."""


def grammar_for(kind: str, schema: dict | None = None) -> str:
    """The grammar of `json_object` (any JSON object) or of a `json_schema`; `SchemaRefused` for a
    schema that cannot be compiled."""
    from .output.constrain import GrammarError, explain
    from .output.constrain import grammar_for as compile_grammar

    try:
        return compile_grammar(kind, schema)
    except GrammarError as exc:
        raise SchemaRefused(explain(exc)) from None


def tool_grammar(functions: list[tuple[str, dict | None]], parallel: bool = True) -> str:
    """The grammar of an answer that is only calls of `functions`; `SchemaRefused` when a
    function's parameters cannot be compiled."""
    from .output.constrain import GrammarError, explain
    from .output.constrain import tool_grammar as compile_tools

    try:
        return compile_tools(functions, parallel)
    except GrammarError as exc:
        raise SchemaRefused(explain(exc)) from None


__all__ = ["ChatRequest", "ImageInput", "Message", "Sampling", "SchemaRefused", "VideoInput", "grammar_for",
           "probe", "sniff", "tool_grammar"]
