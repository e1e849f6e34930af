"""Issue 40, grammars: a client's schema that llguidance would compile slowly, accept and then fail
on (a `$ref` cycle, a self-reference that never ends, a `{4294967295}` repetition, huge counts, an
`allOf` of many patterns) is a 400 naming the field, fast; a forced call over 128 tools compiles
its grammar once; a matcher that fails mid-answer is the client's error (400), never a 500."""

from __future__ import annotations

import time

import llguidance
import pytest

from vlservice.config import Settings
from vlservice.engine.output import constrain
from vlservice.engine.output.constrain import GrammarError, Grammars, check_schema, grammar_for
from vlservice.errors import InvalidRequest
from vlservice.protocol.parse import parse_chat

PATTERNS = [{"type": "string", "pattern": "(a|b)*a(a|b){%d}" % k} for k in range(5, 21)]
# 13 of these cost llguidance's JSON compiler 3 s and 200 MB (16: 30 s and 2 GB) before it gives up
ALLOF = {"type": "object", "properties": {"s": {"allOf": PATTERNS}}}
ALLOF_BY_REF = {"$defs": {f"p{i}": p for i, p in enumerate(PATTERNS)}, "type": "object",
                "properties": {"s": {"allOf": [{"$ref": f"#/$defs/p{i}"} for i in range(len(PATTERNS))]}}}
BAD = {
    "ref cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "self reference": {"$ref": "#"},
    "an object that must hold itself": {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    "a cycle through anyOf": {"$defs": {"n": {"anyOf": [{"$ref": "#/$defs/n"}]}}, "$ref": "#/$defs/n"},
    "4294967295 repetition": {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{4294967295}$"}}},
    "nested repetition": {"type": "string", "pattern": "^((ab{100}){100}){100}$"},
    "huge minItems": {"type": "array", "minItems": 4294967295},
    "huge maxLength": {"type": "string", "maxLength": 10**12},
    "allOf of patterns": ALLOF,
    "allOf of patterns by $ref": ALLOF_BY_REF,
}
GOOD = {
    "a tree": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
               "required": ["kids"]},
    "a linked list": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["v", "next"]}}, "$ref": "#/$defs/node"},
    "a date pattern": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "maxLength": 10},
    "a uuid pattern": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    "two patterns": {"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]},
    "a const that looks like a schema": {"const": {"minItems": 10**9, "pattern": "a{99999}"}},
}


def body(schema=None, tools=None, choice="required"):
    b = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    if schema is not None:
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    if tools is not None:
        b["tools"], b["tool_choice"] = tools, choice
    return b


@pytest.mark.parametrize("name", BAD)
def test_bad_schemas_are_400_naming_the_field_fast(name):
    for b, param in ((body(BAD[name]), "response_format.json_schema.schema"),
                     (body(tools=[{"type": "function", "function": {"name": "ok", "parameters": {}}},
                                  {"type": "function", "function": {"name": "f", "parameters": BAD[name]}}]),
                      "tools[1].function.parameters")):
        t = time.perf_counter()
        with pytest.raises(InvalidRequest) as info:
            parse_chat(b, Settings())
        assert time.perf_counter() - t < 0.5
        assert info.value.param == param and info.value.code == "invalid_schema"
        assert info.value.status == 400 and len(info.value.message) < 400


@pytest.mark.parametrize("name", GOOD)
def test_ordinary_schemas_stay_accepted(name):
    check_schema(GOOD[name])
    grammar_for("json_schema", GOOD[name])


def test_the_allof_refused_costs_no_compilation():
    """What llguidance alone does with the 1 KB `allOf` (its emptiness proof, 13 patterns: about 3 s
    here), against the refusal (no llguidance at all)."""
    t = time.perf_counter()
    with pytest.raises(GrammarError, match="intersects 16 patterns"):
        grammar_for("json_schema", ALLOF)
    assert time.perf_counter() - t < 0.1


def test_a_forced_call_over_128_tools_compiles_once(monkeypatch):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"arg{i}": {"type": "integer"}}, "required": [f"arg{i}"]}}}
        for i in range(128)]
    seen = []
    real = llguidance.LLMatcher.validate_grammar_with_warnings

    def counting(grammar, *a, **kw):
        seen.append(grammar)
        return real(grammar, *a, **kw)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings", counting)
    constrain._lark.cache_clear()
    request, _ = parse_chat(body(tools=tools), Settings())
    assert len(seen) == 1 and request.sampling.grammar.startswith("start: call")


def test_compiler_exceptions_are_grammar_errors(monkeypatch):
    def boom(*a, **kw):
        raise RuntimeError("internal")

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings", boom)
    with pytest.raises(GrammarError):
        grammar_for("json_schema", {"type": "object", "properties": {"boom": {"type": "integer"}}})


@pytest.fixture(scope="module")
def grammars():
    from transformers import AutoTokenizer

    from vlservice.engine.model.checkpoints import bundled_demo_path

    tok = AutoTokenizer.from_pretrained(str(bundled_demo_path()))
    return Grammars(tok, [tok.convert_tokens_to_ids("<|im_end|>")])


def test_a_grammar_that_allows_nothing_is_refused_when_compiled(grammars):
    """llguidance accepts a `$ref` cycle and fails at the first mask: the engine's compile step
    finds it (the protocol's check refuses it earlier; this is the engine's own guard)."""
    cycle = llguidance.LLMatcher.grammar_from_json_schema({"$ref": "#"})
    with pytest.raises(GrammarError):
        grammars.matcher(cycle)


def test_a_matcher_failing_mid_answer_is_the_clients_error(grammars):
    """A limit of llguidance's reached after some tokens (here: a `{100000}` repetition, past
    its Earley items per step) is `InvalidRequest` naming the field, not a RuntimeError (500)."""
    lark = llguidance.LLMatcher.grammar_from_json_schema(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{100000}$"}}, "required": ["s"]})
    c = grammars.constraint(lark)
    with pytest.raises(InvalidRequest) as info:
        for _ in range(20):
            ok = c._allowed(c.vocab)
            c.advance(int(ok.nonzero()[0][0]))
    assert info.value.param == "response_format" and info.value.status == 400
