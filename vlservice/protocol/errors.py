"""A pydantic validation error in the words of the API: message, `param`, `code`."""


from collections.abc import Mapping
from typing import Any

from annotated_types import Ge, Gt, Le

from ..errors import brief

_KINDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "a boolean",
          "list_type": "a list", "model_type": "an object", "dict_type": "an object", "missing": "present"}


KEY_CHARS = 64  # a client's JSON key in a `param` path is cut to this many characters


def _param(loc, tags: bool = True) -> str:
    """('messages', 0, 'UserMessage', 'content', ...) -> 'messages[0].content...' (union tags dropped:
    ours are CamelCase, field names never are; `tags=False` for a path of JSON keys, which may be)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (tags and part[:1].isupper()):
            out += ("." if out else "") + (part if len(part) <= KEY_CHARS else part[:KEY_CHARS] + "…")
    return out


def _bounds(model, name: str) -> tuple:
    lo: Any = None
    hi: Any = None
    strict_lo = False
    for m in model.model_fields[name].metadata:
        if isinstance(m, Ge):
            lo = m.ge
        elif isinstance(m, Gt):
            lo, strict_lo = m.gt, True
        elif isinstance(m, Le):
            hi = m.le
    return lo, hi, strict_lo


def _explain(err: Mapping[str, Any], model) -> tuple[str, str, str]:
    """One pydantic error -> (message, param, code), in the words of the old hand-written validator."""
    value: Any
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    p = _param(err["loc"])
    if "param" in ctx:  # our own checks know their field and their words
        return err["msg"], ctx["param"], kind
    if kind == "message_role":
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return (f"`{p}.role` must be one of system, developer, user, assistant, tool, got {brief(value.get('role'))}",
                f"{p}.role", "invalid_value")
    if kind in ("part_type", "text_part_type"):
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        if value.get("type") in ("image_url", "video_url", "input_video"):
            return f"images and videos are accepted in user messages only (`{p}`)", p, "invalid_value"
        allowed = '"text", "image_url", "video_url" or "input_video"' if kind == "part_type" else '"text"'
        return f"`{p}.type` must be {allowed}, got {brief(value.get('type'))}", f"{p}.type", "invalid_value"
    if kind == "response_format_type":
        if not isinstance(value, dict):
            return f"`{p}` must be an object", p, "invalid_type"
        return (f"`{p}.type` must be \"text\", \"json_object\" or \"json_schema\", got {brief(value.get('type'))}",
                f"{p}.type", "invalid_value")
    if kind == "content_type":
        return f"`{p}` must be a string or a list of parts", p, "invalid_type"
    if kind == "input_video_type":
        return f"`{p}` must be an object with `data` or `url`, or the base64 as a string", p, "invalid_type"
    if kind == "image_url_type":
        return f"`{p}` must be an object with a string `url`, or the URL as a string", p, "invalid_type"
    if kind == "stop_type":
        return f"`{p}` must be a string or a list of strings, got {brief(value)}", p, "invalid_type"
    if kind == "missing":
        return f"`{p}` is required", p, "invalid_type"
    if kind in _KINDS:
        return f"`{p}` must be {_KINDS[kind]}, got {brief(value)}", p, "invalid_type"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"`{p}` must be a non-empty list", p, "empty"
    if kind == "too_long":
        return f"`{p}` takes at most {ctx['max_length']} items, got {ctx.get('actual_length')}", p, "invalid_value"
    if kind == "string_too_long":
        return (f"`{p}` must be at most {ctx['max_length']} characters long, got {len(value)}", p,
                "invalid_value")
    if kind == "literal_error":
        return f"`{p}` must be {ctx['expected']}, got {brief(value)}", p, "invalid_value"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than") and p in model.model_fields:
        lo, hi, strict_lo = _bounds(model, p)
        if lo == hi:
            return f"`{p}` must be {lo}, got {brief(value)}", p, "invalid_value"
        if strict_lo:
            return f"`{p}` must be greater than {lo} and at most {hi}, got {brief(value)}", p, "invalid_value"
        return f"`{p}` must be between {lo} and {hi}, got {brief(value)}", p, "invalid_value"
    if kind == "finite_number":
        return f"`{p}` must be a finite number, got {brief(value)}", p, "invalid_value"
    return f"`{p}`: {brief(err['msg'], 300, quote=False)}", p, "invalid_value"
