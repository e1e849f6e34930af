"""Issue 40, errors: a bad value is echoed to at most ~100 characters, with "…" and its full length,
never whole (a 200 KB value came back whole in the 400's message before)."""

from __future__ import annotations

import json

import pytest

from vlservice.config import Settings
from vlservice.errors import ECHO_CHARS, InvalidRequest, brief
from vlservice.protocol.parse import parse_chat

BIG = "x" * 200_000
HI = [{"role": "user", "content": "hi"}]
TOOL = [{"type": "function", "function": {"name": "f"}}]
CASES = {
    "a string for a number": {"messages": HI, "temperature": BIG},
    "an unknown role": {"messages": [{"role": BIG, "content": "hi"}]},
    "an unknown part type": {"messages": [{"role": "user", "content": [{"type": BIG}]}]},
    "an unknown response_format type": {"messages": HI, "response_format": {"type": BIG}},
    "a stop that is an object": {"messages": HI, "stop": {"k": BIG}},
    "a literal": {"messages": HI, "tool_choice": BIG, "tools": TOOL},
    "a tool_choice naming no tool": {"messages": HI, "tools": TOOL,
                                     "tool_choice": {"type": "function", "function": {"name": BIG}}},
    "an image URL scheme": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": BIG + ":x"}}]}]},
    "a number of 300 digits": {"messages": HI, "max_tokens": int("9" * 300)},
    "a list for a string": {"messages": [{"role": "user", "content": [{"type": "text", "text": [BIG]}]}]},
}


@pytest.mark.parametrize("name", CASES)
def test_a_huge_bad_value_comes_back_as_a_short_prefix(name):
    with pytest.raises(InvalidRequest) as info:
        parse_chat(json.loads(json.dumps(CASES[name])), Settings())
    body = json.dumps(info.value.to_dict())
    assert len(body) < 600, body[:800]
    assert info.value.status == 400
    if "x" * ECHO_CHARS in body or "9" * ECHO_CHARS in body:
        assert "…" in info.value.message and "characters)" in info.value.message


def test_brief():
    assert brief("abc") == "'abc'"
    cut = brief("y" * 5000)
    assert cut.startswith("'yyy") and cut.endswith("… (5002 characters)") and len(cut) < 130
    assert brief(5) == "5" and brief("z" * 500, 300, quote=False).endswith("(500 characters)")
