"""Tool calling: `tools`, `tool_choice`, `parallel_tool_calls` as OpenAI defines them.

The tools go to the model through its own chat template (engine/prompt.py); its calls are read
back from the answer (engine/output/toolcalls.py). `tool_choice` "auto" lets the model choose; "none"
leaves the tools out of the prompt and the answer as text; "required" and a named function force
calls through a grammar (engine/output/constrain.py), so the answer is only calls, each with arguments
valid against its function's `parameters`.
"""

from typing import Annotated, Any, Literal, Union

from pydantic import Field, Tag
from pydantic_core import PydanticCustomError

from ..engine.interface import SchemaRefused, tool_grammar
from ..errors import brief
from .base import _In, _pick

NAME = r"^[a-zA-Z0-9_.-]{1,64}$"  # OpenAI's function names (the dot as vLLM and llama.cpp allow)


class FunctionDefinition(_In):
    name: str = Field(pattern=NAME, description="a-z, A-Z, 0-9, _ . - ; at most 64 characters")
    description: str | None = Field(None, description="what the function does, for the model")
    parameters: dict[str, Any] | None = Field(None, description=(
        "a JSON Schema of its arguments (an object); absent: any object. With `tool_choice` \"required\" or a "
        "named function, every call's arguments validate against it (a schema that cannot be compiled: 400)"))
    strict: bool | None = Field(None, description="accepted; forced calls always follow `parameters`")


class Tool(_In):
    type: Literal["function"]
    function: FunctionDefinition


class _Name(_In):
    name: str


class NamedToolChoice(_In):
    type: Literal["function"]
    function: _Name


ToolChoice = Annotated[Union[Annotated[Literal["none", "auto", "required"], Tag("Mode")],
                             Annotated[NamedToolChoice, Tag("Named")]],
                       _pick(lambda v: "Mode" if isinstance(v, str) else "Named" if isinstance(v, dict) else None,
                             "tool_choice_type")]
TOOL_CHOICE = ("\"auto\" (default with tools): the model answers in text or calls functions; \"none\": text only "
               "(the tools are left out of the prompt); \"required\": one or more calls; {\"type\": \"function\", "
               "\"function\": {\"name\": ...}}: a call of that function. \"required\" and named calls are enforced by "
               "grammar-constrained decoding")


def _error(param: str, message: str, code: str = "invalid_value") -> PydanticCustomError:
    return PydanticCustomError(code, message, {"param": param})


def check_tools(r) -> None:
    """What the fields cannot say alone: unique names, a named choice among the tools, a forced
    call not combined with a `response_format` (one grammar per answer), compilable schemas."""
    tools = r.tools or []
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _error(f"tools[{i}].function.name", f"two tools are named {brief(name)}")
    choice = r.tool_choice
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise _error("tool_choice.function.name", f"`tool_choice` names {brief(choice.function.name)}, which is not "
                     "one of `tools`" if tools else "`tool_choice` names a function but `tools` is empty")
    if choice == "required" and not tools:
        raise _error("tool_choice", "`tool_choice` \"required\" needs `tools`")
    if forced(r) and r.response_format is not None and getattr(r.response_format, "type", "text") != "text":
        raise _error("response_format", "`response_format` cannot be combined with `tool_choice` \"required\" or a "
                     "named function: the answer is the calls")
    if forced(r):
        grammar_of_tools(r)  # compiled once: kept on the request for `parse_chat`


def forced(r) -> bool:
    return bool(r.tools) and (r.tool_choice == "required" or isinstance(r.tool_choice, NamedToolChoice))


def offered(r) -> bool:
    """The tools go into the prompt and the answer is read for calls."""
    return bool(r.tools) and r.tool_choice != "none"


def grammar_of_tools(r) -> str | None:
    """The grammar of a forced answer (None when the model chooses), built and compiled once per
    request (kept on it as `_tool_grammar`); a function's schema that cannot be compiled is
    refused, naming that function's `parameters` (found one function at a time, only then)."""
    if not forced(r):
        return None
    if getattr(r, "_tool_grammar", None) is not None:
        return r._tool_grammar
    named = r.tool_choice.function.name if isinstance(r.tool_choice, NamedToolChoice) else None
    chosen = [(i, t.function) for i, t in enumerate(r.tools) if named is None or t.function.name == named]
    parallel = r.parallel_tool_calls is not False
    try:
        grammar = tool_grammar([(f.name, f.parameters) for _, f in chosen], parallel and named is None)
    except SchemaRefused as whole:
        for i, f in chosen:
            try:
                tool_grammar([(f.name, f.parameters)])
            except SchemaRefused as exc:
                raise PydanticCustomError("invalid_schema", "`tools[{i}].function.parameters` cannot be used: "
                                          "{reason}", {"param": f"tools[{i}].function.parameters", "i": i,
                                                       "reason": str(exc)}) from None
        raise _error("tools", f"`tools` cannot be used together: {whole}", "invalid_schema") from None
    r._tool_grammar = grammar
    return grammar


def tools_for_template(r) -> list[dict]:
    """The tools as the chat template renders them (OpenAI's objects, unset fields left out)."""
    if not offered(r):
        return []
    return [t.model_dump(exclude_none=True) for t in r.tools]
