"""Several choices per request (OpenAI's `n`, issue 42 item 3): one prefill, then the choices
decoded together in the batch, choice i answering what the same request alone with `seed` + i
answers; n choices hold n slots, and a cancel frees them all. On the real tiny checkpoint through
the real engine."""

from __future__ import annotations

import threading

import pytest

from conftest import png_bytes, scene, wait_until
from vlservice.engine.batching import policy
from vlservice.engine.output.constrain import grammar_for
from vlservice.engine.batching.sequence import choice_seed
from vlservice.errors import InvalidRequest
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling

SLOTS = 4


def request(choices=1, picture=3, text="What is in this image?", **sampling):
    parts = [ImageInput(png_bytes(scene(100 + 4 * (picture % 5), 160, seed=picture))), text]
    return ChatRequest([Message("user", parts)], Sampling(**sampling), result_cache=False, choices=choices)


@pytest.fixture(scope="module")
def svc(settings_for):
    from vlservice.engine.service import load_service

    service = load_service(settings_for(max_batch=SLOTS, queue_size=8, warmup=False, disk_cache_mb=0))
    yield service
    service.close()


class PassCounter:
    """Records the prompt chunks the model's passes carry (and calls through to the real pass)."""

    def __init__(self, lean):
        self.lean, self.chunks = lean, 0

    def __getattr__(self, name):
        return getattr(self.lean, name)

    def step(self, tokens, kvs, pos, chunk=None):
        self.chunks += chunk is not None
        return self.lean.step(tokens, kvs, pos, chunk)


def same_tokens(a: dict, b: dict) -> bool:
    """Two answers hold the same tokens: each token's bytes, and its log probability (to a batch's
    float rounding)."""
    return ([e["bytes"] for e in a["logprobs"]] == [e["bytes"] for e in b["logprobs"]]
            and [e["logprob"] for e in a["logprobs"]] == pytest.approx([e["logprob"] for e in b["logprobs"]], abs=1e-3))


@pytest.mark.slow  # over 10 s: out of the --fast tier
def test_seeded_choices_are_the_request_alone_with_seed_plus_i_after_one_prefill(svc, monkeypatch):
    sampling = dict(max_tokens=14, temperature=1.0, top_p=0.95, seed=41, logprobs=1)
    counter = PassCounter(svc.lean)
    monkeypatch.setattr(svc.scheduler, "lean", counter)
    sizes_before = dict(svc.scheduler.batch_hist)
    together = svc.chat(request(choices=3, **sampling))
    prefills = counter.chunks
    monkeypatch.undo()

    assert prefills == 1  # the prompt went through the model once for the three choices
    assert svc.scheduler.batch_hist.get(3, 0) > sizes_before.get(3, 0)  # decoded together
    assert [c["index"] for c in together["choices"]] == [0, 1, 2]
    alone = [svc.chat(request(**{**sampling, "seed": 41 + i})) for i in range(3)]
    for i, (choice, one) in enumerate(zip(together["choices"], alone)):
        assert (choice["text"], choice["finish_reason"]) == (one["text"], one["finish_reason"]), i
        assert same_tokens(choice, one), i
    assert len({c["text"] for c in together["choices"]}) > 1  # three streams, not one thrice
    prompt, completion = alone[0]["usage"]["prompt_tokens"], sum(a["usage"]["completion_tokens"] for a in alone)
    assert together["usage"] == {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
    assert (together["text"], together["finish_reason"]) == (alone[0]["text"], alone[0]["finish_reason"])

    # the same request again: its prompt comes from the conversation cache, the choices are the same
    again = svc.chat(request(choices=3, **sampling))
    assert again["timings"]["cache_n"] > 0
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in together["choices"]]


def test_greedy_choices_are_all_the_greedy_answer(svc):
    alone = svc.chat(request(picture=5, max_tokens=10, temperature=0))
    together = svc.chat(request(choices=SLOTS, picture=5, max_tokens=10, temperature=0))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in together["choices"]] == \
        [(i, alone["text"], alone["finish_reason"]) for i in range(SLOTS)]
    assert together["usage"]["completion_tokens"] == SLOTS * alone["usage"]["completion_tokens"]
    assert together["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]


def test_without_a_seed_each_choice_draws_its_own_stream(svc):
    got = svc.chat(request(choices=3, picture=6, max_tokens=16, min_tokens=16, temperature=1.5))
    assert len({c["text"] for c in got["choices"]}) > 1


def test_each_choice_has_its_own_grammar_matcher(svc):
    grammar = grammar_for("json_object")
    sampling = dict(max_tokens=12, temperature=1.0, seed=5, grammar=grammar)
    together = svc.chat(request(choices=2, picture=7, **sampling))
    alone = [svc.chat(request(picture=7, **{**sampling, "seed": 5 + i})) for i in range(2)]
    assert [c["text"] for c in together["choices"]] == [a["text"] for a in alone]
    assert all(c["text"].startswith("{") for c in together["choices"])


def test_choices_hold_their_slots_and_a_cancel_frees_them_all(svc):
    """n = VL_MAX_BATCH takes every slot: a single request waits until the cancel, then runs."""
    big = svc.submit(request(choices=SLOTS, picture=8, max_tokens=400, min_tokens=400, temperature=0.8))
    answering: dict[int, int] = {}
    enough = threading.Event()
    last = []

    def consume():
        for ev in big.events():
            if ev.kind == "delta":
                answering[ev.choice] = answering.get(ev.choice, 0) + 1
                if len(answering) == SLOTS and min(answering.values()) >= 3:
                    enough.set()
            last[:] = [ev]

    t = threading.Thread(target=consume)
    t.start()
    assert enough.wait(120)  # every choice is decoding
    single = svc.submit(request(picture=9, max_tokens=3, min_tokens=3))
    seen = sum(answering.values())
    wait_until(lambda: sum(answering.values()) >= seen + 2 * SLOTS, "more of the choices' tokens", 60)
    assert svc.running() == SLOTS and svc.queue_depth() == 1  # the single one waits for a slot
    assert single.queue.queue[-1].kind == "queued"  # not started
    big.cancel()
    t.join(60)
    assert last[0].kind == "error" and last[0].error.code == "cancelled"
    assert single.result()["usage"]["completion_tokens"] == 3
    wait_until(lambda: svc.running() == 0, "every slot free again")
    assert svc.idle()


def test_more_choices_than_slots_are_refused(svc):
    with pytest.raises(InvalidRequest) as err:
        svc.submit(request(choices=SLOTS + 1, max_tokens=2))
    assert err.value.param == "n" and f"between 1 and {SLOTS}" in err.value.message
    assert svc.idle()


def test_choice_seeds_are_seed_plus_index_within_64_bits():
    assert [choice_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert choice_seed(2**63 - 1, 1) == -(2**63)
    assert choice_seed(None, 2) is None


def test_a_waiter_takes_all_its_slots_at_once_and_nobody_overtakes_it():
    def waiter(arrival, slots=1):
        return policy.Waiter(priority=1, arrival=arrival, t_submit=0.0, slots=slots)

    queue = [waiter(0, slots=3), waiter(1), waiter(2)]
    assert policy.admit(queue, 2, 0.0, 60.0).admit == []  # the first needs 3: the others wait behind it
    assert policy.admit(queue, 3, 0.0, 60.0).admit == [0]
    assert policy.admit(queue, 5, 0.0, 60.0).admit == [0, 1, 2]
    # the slots count for its tenant's fair share
    shared = [policy.Waiter(1, 0, 0.0, tenant="a", slots=2), policy.Waiter(1, 1, 0.0, tenant="b"),
              policy.Waiter(1, 2, 0.0, tenant="a")]
    assert policy.admit(shared, 4, 0.0, 60.0).admit == [0, 1, 2]
    assert policy.admit(shared, 4, 0.0, 60.0, running={"a": 1}).admit == [1, 0, 2]
    assert policy.admit(shared, 3, 0.0, 60.0, running={"a": 1}).admit == [1, 0]
