"""`TextStream` with the tiny checkpoint's real Qwen tokenizer (byte-level BPE): a character whose
UTF-8 bytes are split across tokens is never sent in halves, and a stop string is held back while
it may still be forming, then cut."""

from __future__ import annotations

import pytest

from vlservice.engine.output.textstream import TextStream

# An emoji and a rare CJK ideograph: each is encoded as several byte-level pieces.
TEXT = "A parrot 🦜 said 𠀀 twice."


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def ids_of(tok, *pieces: str) -> list[int]:
    """Token ids of each piece tokenised alone, concatenated (so a piece boundary is a token boundary)."""
    return [i for p in pieces for i in tok.encode(p, add_special_tokens=False)]


def stream(tok, ids, stop=()) -> tuple[list[str], TextStream]:
    ts = TextStream(tok, stop=stop)
    deltas = []
    for i in ids:
        deltas.append(ts.push(i))
        if ts.stopped:
            break
    deltas.append(ts.flush())
    return deltas, ts


def test_a_character_split_across_tokens_is_never_sent_in_halves(tok):
    ids = ids_of(tok, TEXT)
    halves = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert len(halves) >= 4  # the premise: both characters really are split across tokens
    deltas, ts = stream(tok, ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == TEXT == ts.text_sent()
    assert "" in deltas[:-1]  # some tokens carried only part of a character: nothing was sent for them


def test_a_partial_stop_string_is_held_until_the_next_token_decides(tok):
    we, en, ough, d = ids_of(tok, "We", " EN", "ough", "D")  # one token each
    ts = TextStream(tok, stop=("END",))
    assert ts.push(we) == "We"
    assert ts.push(en) == " "  # "EN" may be the start of "END": held back
    assert ts.push(ough) == "ENough" and not ts.stopped  # it was not: sent
    ts = TextStream(tok, stop=("END",))
    assert [ts.push(we), ts.push(en), ts.push(d)] == ["We", " ", ""]  # it was: never sent
    assert ts.stopped and ts.text_sent() == "We " and ts.flush() == ""


def test_a_stop_string_split_across_tokens_stops_and_is_cut(tok):
    ids = ids_of(tok, "Ready", " E", "N", "D", " and more")
    assert len(ids) >= 5  # the stop string arrives in pieces
    deltas, ts = stream(tok, ids, stop=("END",))
    assert ts.stopped
    assert "".join(deltas) == "Ready " == ts.text_sent()
    assert "END" not in "".join(deltas) and "more" not in "".join(deltas)


def test_a_stop_string_inside_one_token_is_cut(tok):
    deltas, ts = stream(tok, ids_of(tok, "Hello world, again"), stop=("wor",))
    assert ts.stopped and "".join(deltas) == "Hello "


def test_no_stop_string_sends_everything(tok):
    deltas, ts = stream(tok, ids_of(tok, "We EN"), stop=("END",))
    assert not ts.stopped and "".join(deltas) == "We EN"  # the end of the answer releases the held tail
