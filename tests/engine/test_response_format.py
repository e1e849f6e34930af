"""`response_format` (issue 33, item 1): grammar-constrained decoding per sequence, inside the
batched scheduler. The matcher's mask alone (the demo model's tokenizer), the sampler under random
logits (every answer parses and validates), then the engine on the bundled demo model: answers
parse and validate, constrained rows leave their unconstrained neighbours' greedy tokens as they
are alone, `max_tokens` cuts with `finish_reason` "length", streaming is unchanged."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch

from conftest import png_bytes, scene
from vlservice.engine.output.constrain import Grammars, grammar_for
from vlservice.engine.output.sampling import Sampler
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

SHAPES = {"type": "object", "properties": {
    "shape": {"type": "string", "maxLength": 16},
    "count": {"type": "integer", "minimum": 0, "maximum": 9},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}},
    "required": ["shape", "count", "color", "tags"], "additionalProperties": False}
CAPTION = {"type": "object", "properties": {"caption": {"type": "string", "maxLength": 40},
                                            "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
           "required": ["caption"], "additionalProperties": False}
NESTED = {"type": "object", "$defs": {"item": {"type": "object", "properties": {
    "label": {"enum": ["circle", "square", "star", "triangle"]}, "x": {"type": "integer", "minimum": 0,
                                                                      "maximum": 999}},
    "required": ["label", "x"], "additionalProperties": False}},
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 3},
                   "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
    "required": ["items", "note"], "additionalProperties": False}
SCHEMAS = [SHAPES, CAPTION, NESTED]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from vlservice.engine.model.checkpoints import bundled_demo_path

    return AutoTokenizer.from_pretrained(str(bundled_demo_path()))


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                tokenizer.convert_tokens_to_ids("<|endoftext|>")])


# --------------------------------------------------------------------------- the mask alone

def test_mask_covers_the_logits_row_and_the_end_waits_for_the_grammar(tokenizer, grammars):
    c = grammars.constraint(grammar_for("json_schema", CAPTION))
    n = len(tokenizer) + 70  # the model's logits row is wider than the tokenizer's vocabulary
    ok = c.allowed(n)
    assert ok.shape == (n,) and not ok[len(tokenizer):].any()  # ids the tokenizer lacks: never
    assert not ok[c.eos].any()  # nothing written yet: no end
    allowed = [i for i in range(len(tokenizer)) if ok[i]]
    assert allowed and all(tokenizer.decode([i]).startswith("{") for i in allowed)  # compact: no blank first
    for piece in tokenizer.encode('{"caption": "a"}', add_special_tokens=False):
        assert c.allowed(n)[piece]
        c.advance(piece)
    ok = c.allowed(n)
    assert ok[c.eos].all() and c.accepting  # complete: the end tokens, and only them
    assert int(ok.sum()) == len(c.eos)
    masked = c.apply(torch.zeros(n))
    assert torch.isinf(masked).sum() == n - len(c.eos) and masked[c.eos].eq(0).all()


def test_compiled_grammars_are_cached_and_matchers_are_independent(grammars):
    g = grammar_for("json_schema", SHAPES)
    assert grammar_for("json_schema", json.loads(json.dumps(SHAPES))) is g  # by schema (LRU)
    before = grammars.hits
    a, b = grammars.constraint(g), grammars.constraint(g)
    assert grammars.hits >= before + 1
    a.advance(a.allowed(2000).nonzero()[0].item())  # '{' into a only
    assert not torch.equal(a.allowed(2000), b.allowed(2000))


def _run(sampler: Sampler, tokenizer, width: int, seed: int, limit: int = 400) -> tuple[list[int], bool]:
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    eos = set(sampler.constraint.eos.tolist())
    for _ in range(limit):
        token = sampler(torch.randn(width, generator=gen) * 4, out)
        if token in eos:
            return out, True
        out.append(token)
    return out, False


@pytest.mark.parametrize("schema", SCHEMAS + [None], ids=["shapes", "caption", "nested", "json_object"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampled_under_random_logits_every_answer_parses_and_validates(tokenizer, grammars, schema, temperature):
    g = grammar_for("json_object") if schema is None else grammar_for("json_schema", schema)
    for seed in range(4):
        s = Sampling(temperature=temperature, seed=seed, max_tokens=400, repetition_penalty=1.1,
                     presence_penalty=0.3, min_tokens=3)
        sampler = Sampler(s, grammars.constraint(g))
        ids, ended = _run(sampler, tokenizer, len(tokenizer) + 30, seed)
        if schema is None and not ended:
            continue  # an unbounded object may run on under random logits; bounded schemas end
        assert ended, tokenizer.decode(ids)
        assert all(i < len(tokenizer) for i in ids)
        value = json.loads(tokenizer.decode(ids))
        assert isinstance(value, dict)
        if schema is not None:
            jsonschema.validate(value, schema)


# --------------------------------------------------------------------------- through the engine

@pytest.fixture(scope="module")
def svc(settings_for):
    from vlservice.engine.service import load_service

    service = load_service(settings_for(model="demo", max_batch=4, kv_cache_mb=0, queue_size=16, warmup=False,
                                        disk_cache_mb=0))
    yield service
    service.close()


def request(picture: int, schema=None, text="Describe this image.", json_object=False, **sampling):
    grammar = grammar_for("json_object") if json_object else grammar_for("json_schema", schema) if schema else None
    parts = [ImageInput(png_bytes(scene(100 + 4 * (picture % 5), 160, seed=picture))), text]
    return ChatRequest([Message("user", parts)], Sampling(grammar=grammar, **sampling), result_cache=False)


def together(svc, reqs: list) -> list[dict]:
    gens = [svc.submit(r) for r in reqs]
    results: list = [None] * len(gens)

    def run(i):
        results[i] = gens[i].result()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(gens))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_schema_answers_parse_and_validate_and_neighbours_are_as_alone(svc):
    free_alone = [svc.chat(request(p, max_tokens=24, logprobs=0)) for p in (1, 2)]
    schema_alone = [svc.chat(request(p, schema, max_tokens=120)) for p, schema in zip((3, 4), (SHAPES, NESTED))]
    for result, schema in zip(schema_alone, (SHAPES, NESTED)):
        assert result["finish_reason"] == "stop", result["text"]
        jsonschema.validate(json.loads(result["text"]), schema)
        assert result["timings"]["grammar_mask_ms"] >= 0 and result["timings"]["grammar_compile_ms"] >= 0
    # four rows in one batch: two unconstrained, two constrained by different schemas
    mixed = together(svc, [request(1, max_tokens=24, logprobs=0), request(3, SHAPES, max_tokens=120),
                           request(2, max_tokens=24, logprobs=0), request(4, NESTED, max_tokens=120)])
    for got, want in zip((mixed[0], mixed[2]), free_alone):  # the constraints did not leak into their rows
        assert got["text"] == want["text"]
        assert [e["bytes"] for e in got["logprobs"]] == [e["bytes"] for e in want["logprobs"]]
        assert "grammar_mask_ms" not in got["timings"]
    for got, want in zip((mixed[1], mixed[3]), schema_alone):  # greedy constrained rows: as alone too
        assert got["text"] == want["text"] and got["finish_reason"] == "stop"
    jsonschema.validate(json.loads(mixed[3]["text"]), NESTED)


def test_several_schemas_and_json_object_sampled_in_one_batch(svc):
    reqs = [request(5 + i, schema, max_tokens=160, temperature=0.8, seed=i) for i, schema in enumerate(SCHEMAS)]
    reqs.append(request(9, json_object=True, text="Describe this image as JSON.", max_tokens=160, temperature=0.8,
                        seed=7))
    results = together(svc, reqs)
    for result, schema in zip(results, SCHEMAS):
        assert result["finish_reason"] == "stop", result["text"]
        jsonschema.validate(json.loads(result["text"]), schema)
    last = results[-1]
    if last["finish_reason"] == "stop":
        assert isinstance(json.loads(last["text"]), dict)
    else:  # an object without bounds may run to max_tokens: then it says so
        assert last["finish_reason"] == "length" and last["text"].startswith("{")


def test_max_tokens_cut_says_length_and_streaming_is_unchanged(svc):
    cut = svc.chat(request(6, SHAPES, max_tokens=5))
    assert cut["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 5
    assert cut["text"].startswith("{") and cut["text"] == svc.chat(request(6, SHAPES, max_tokens=120))["text"][
        :len(cut["text"])]
    gen = svc.submit(request(7, NESTED, max_tokens=120))
    events = list(gen.events())
    deltas = "".join(ev.text for ev in events if ev.kind == "delta")
    done = [ev for ev in events if ev.kind == "done"]
    whole = svc.chat(request(7, NESTED, max_tokens=120))
    assert done and deltas == whole["text"] and whole["finish_reason"] == "stop"
    jsonschema.validate(json.loads(deltas), NESTED)


def test_constrained_answers_are_not_served_to_free_requests_from_the_result_cache(svc):
    a = ChatRequest(request(8).messages, Sampling(max_tokens=20), result_cache=True)
    b = ChatRequest(request(8).messages, Sampling(max_tokens=20, grammar=grammar_for("json_schema", CAPTION)),
                    result_cache=True)
    free, constrained = svc.chat(a), svc.chat(b)
    assert constrained["text"].startswith("{") and free["text"] != constrained["text"]
