"""Work before admission is bounded by the body's size: the JSON shape check refuses too many
values or too deep a nesting before Python's parser builds a tree, in memory about the body's
size; the text bound refuses text that cannot fit the context before the chat template and the
tokenizer read it whole, and never refuses text that fits."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from vlservice.engine import prompt as P
from vlservice.errors import InvalidRequest
from vlservice.protocol import MAX_DEPTH, load_body
from vlservice.protocol.base import MAX_JSON_VALUES
from vlservice.protocol.parse import check_shape


def peak_of(fn, *args) -> tuple[int, object]:
    tracemalloc.start()
    try:
        try:
            out = fn(*args)
        except InvalidRequest as exc:
            out = exc
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("body", [
    b'{"x":[' + b"1," * 4_000_000 + b"1]}",  # 8 MiB of small numbers: 750 MiB once parsed
    b"[" + b'"",' * 3_000_000 + b'""]',  # 9 MiB of empty strings
    json.dumps([{"a": {}}] * 20_000).encode(),  # small objects
])
def test_a_body_of_too_many_values_is_refused_before_parsing_in_bounded_memory(body):
    peak, out = peak_of(load_body, body)
    assert isinstance(out, InvalidRequest) and f"more than {MAX_JSON_VALUES} JSON values" in out.message
    assert out.status == 400 and out.code == "invalid_json"
    assert peak < 4 * len(body) + 16 * 2**20, (peak, len(body))


def test_nesting_is_counted_outside_strings_only():
    check_shape(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    with pytest.raises(InvalidRequest, match=f"nested more than {MAX_DEPTH}"):
        check_shape(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    with pytest.raises(InvalidRequest, match=f"nested more than {MAX_DEPTH}"):  # deep, then shallow again
        check_shape(b'{"a":' + b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5) + b', "b": 1}')
    # brackets and commas inside strings, escaped quotes and backslashes included, are text
    text = '[[[[,,,, {{ \\" \\\\" ' * 10_000 + '"'
    body = json.dumps({"messages": [{"role": "user", "content": text}], "x": ["\\", '"[', "]\\\\"]}).encode()
    check_shape(body)
    assert load_body(body)["messages"][0]["content"] == text


def test_values_up_to_the_limit_pass_across_scan_chunks(monkeypatch):
    import vlservice.protocol.parse as parse

    monkeypatch.setattr(parse, "SCAN_BYTES", 7)  # strings and brackets split across chunks
    body = json.dumps({"a": ["x" * 5, [1, 2, {"b": "]]]\\\"[[["}]] * 100}).encode()
    check_shape(body)
    values = b"[" + b",".join([b"0"] * (MAX_JSON_VALUES - 1)) + b"]"
    monkeypatch.setattr(parse, "SCAN_BYTES", 1 << 20)
    check_shape(values)  # the array and its MAX_JSON_VALUES - 1 numbers
    with pytest.raises(InvalidRequest):
        check_shape(values[:-1] + b",0]")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from vlservice.engine.model.checkpoints import bundled_demo_path

    return AutoTokenizer.from_pretrained(bundled_demo_path())


def test_the_text_bound_never_exceeds_the_real_count_and_is_exact_where_text_has_spaces(tokenizer, monkeypatch):
    plain = P._vocab(tokenizer).plain
    words = ["hello", " world", "\n\n", "中文字符", "12345", "!!", "  ", "\t", " don't", " émigré", " x.y", "<|im_start|>"]
    rng = random.Random(7)
    monkeypatch.setattr(P, "SLICE_CHARS", 64)  # many slices per text
    exact_when_cut = 0
    for _ in range(200):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 150)))
        real = len(plain.encode(text, add_special_tokens=False).ids)
        bound = P.text_tokens_at_least(tokenizer, [text], 10**9)
        assert bound <= real, (bound, real, text)
        exact_when_cut += bound == real
    assert exact_when_cut > 60
    prose = " ".join(rng.choice(["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog."])
                     for _ in range(3000))
    assert P.text_tokens_at_least(tokenizer, [prose], 10**9) == len(plain.encode(prose).ids)


def test_the_text_bound_stops_early_and_costs_little_on_huge_text(tokenizer):
    text = "The quick brown fox jumps over the lazy dog. " * 200_000  # 9 MB
    peak, need = peak_of(P.text_tokens_at_least, tokenizer, [text], 8192)
    assert need > 8192
    assert peak < 2 * 2**20, peak  # nothing near the text's size: no copy, no token list


def test_a_long_key_in_an_error_path_is_cut():
    from vlservice.protocol import check_tree

    with pytest.raises(InvalidRequest) as exc:
        deep: list = ["x"]
        for _ in range(40):
            deep = [deep]
        check_tree({"k" * 200_000: deep})
    assert len(exc.value.message) < 400 and len(exc.value.param or "") < 200
