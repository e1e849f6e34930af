"""Tool calls in the model's own format, both ways.

Qwen3-VL's chat template lists the tools in the system turn and asks for each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (`<tool_call>` and
`</tool_call>` are single added tokens). `split_calls` reads an answer into its text and its calls;
`CallStream` does the same while the answer streams, holding back only what may still become a
call. A block whose JSON is not a call (no string `name`, `arguments` not an object) stays text,
as vLLM's and llama.cpp's Hermes-style parsers leave it.

`grammar` is the llguidance grammar that forces one call (or several, one per line) of the named
functions with arguments valid against their `parameters` schema: what `tool_choice` "required"
and a named function ask for.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
# Compact, as the template's own example and `json.dumps` write a call (see constrain.JSON_OPTIONS).
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI sends it
    id: str = ""

    def __post_init__(self):
        self.id = self.id or "call_" + uuid.uuid4().hex[:24]

    def to_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def split_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the answer's text without its call blocks, the calls in order)."""
    calls: list[ToolCall] = []

    def take(m: re.Match) -> str:
        call = _call(m.group(1))
        if call is None:
            return m.group(0)
        calls.append(call)
        return ""

    rest = _BLOCK.sub(take, text)
    return (rest.strip() if calls else rest), calls


class CallStream:
    """Feeds streamed text; yields ("text", str) and ("call", ToolCall) in answer order. Text that
    could be the start of `<tool_call>` waits for the next piece; a block is held until it closes.
    `finish` returns what is held (an unclosed block, cut by `max_tokens`, is text)."""

    def __init__(self):
        self.held = ""
        self.space = ""  # blank text after a call waits: it is written only if text follows
        self.calls = 0

    def feed(self, text: str) -> list[tuple[str, object]]:
        self.held += text
        out: list[tuple[str, object]] = []
        while self.held:
            start = self.held.find(OPEN)
            if start < 0:
                keep = _partial(self.held, OPEN)
                if len(self.held) > keep:
                    out.append(("text", self.held[:len(self.held) - keep]))
                    self.held = self.held[len(self.held) - keep:]
                break
            if start:
                out.append(("text", self.held[:start]))
                self.held = self.held[start:]
            end = self.held.find(CLOSE)
            if end < 0:
                break
            block, self.held = self.held[:end + len(CLOSE)], self.held[end + len(CLOSE):]
            m = _BLOCK.fullmatch(block)
            call = _call(m.group(1)) if m else None
            if call is None:
                out.append(("text", block))
            else:
                self.calls += 1
                out.append(("call", call))
        return self._spaced(out)

    def _spaced(self, out: list) -> list:
        spaced: list[tuple[str, object]] = []
        for kind, value in out:
            if kind == "text" and self.calls and not str(value).strip():
                self.space += str(value)
            elif kind == "text":
                spaced.append((kind, self.space + str(value)))
                self.space = ""
            else:
                spaced.append((kind, value))
        return [(k, v) for k, v in spaced if k == "call" or v]

    def finish(self) -> str:
        held, self.held = self.held, ""
        space, self.space = self.space, ""
        return space + held if held.strip() else ""


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _rebased(params: dict | None, i: int, defs: dict) -> dict:
    """Function `i`'s parameters schema as a reference into the grammar schema's `$defs` (its own
    `$defs` / `definitions` moved there under a prefix, its references rewritten): a `#/...`
    reference inside it then still means its own root, beside the other functions'."""
    if not params:
        return {"type": "object"}
    own = f"f{i}"
    moved = [k for k in ("$defs", "definitions") if isinstance(params.get(k), dict)]
    body = {k: v for k, v in params.items() if k not in moved}

    def rebase(node):
        if isinstance(node, list):
            return [rebase(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: rebase(v) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            for prefix in ("#/$defs/", "#/definitions/"):
                if ref.startswith(prefix):
                    out["$ref"] = f"#/$defs/{own}_" + ref[len(prefix):]
                    break
            else:
                out["$ref"] = f"#/$defs/{own}" + ref[1:]
        return out

    defs[own] = rebase(body)
    for key in moved:
        for name, sub in params[key].items():
            defs[f"{own}_{name}"] = rebase(sub)
    return {"$ref": f"#/$defs/{own}"}


def grammar(functions: list[tuple[str, dict | None]], parallel: bool = True) -> str:
    """The llguidance (Lark) grammar of an answer that is only calls of `functions` ((name,
    parameters schema) pairs), in the template's layout: one call, or with `parallel` one or more,
    a line apart; each call's `arguments` valid against its function's schema."""
    defs: dict = {}
    options = [{"type": "object", "properties": {"name": {"const": name}, "arguments": _rebased(params, i, defs)},
                "required": ["name", "arguments"], "additionalProperties": False}
               for i, (name, params) in enumerate(functions)]
    schema = {"x-guidance": _LAYOUT, "$defs": defs, **(options[0] if len(options) == 1 else {"anyOf": options})}
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    # `<tool_call>` unquoted: the added token itself, never its characters spelled as text
    return f'{start}\ncall: {OPEN} "\\n" %json {json.dumps(schema)} "\\n" {CLOSE}\n'
