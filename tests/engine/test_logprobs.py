"""`logprobs` / `top_logprobs` (issue 33, item 3): the log probabilities of the distribution the
sampler drew from (after penalties and temperature), in OpenAI's shape, through the real engine
(the tiny checkpoint); batched answers equal answers alone, with or without log probabilities."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from conftest import png_bytes, scene
from vlservice.engine.output.sampling import Sampler
from vlservice.engine.types import ChatRequest, ImageInput, Message, Sampling


def request(picture, text="What is in this image?", **sampling):
    parts = [ImageInput(png_bytes(scene(100 + 4 * (picture % 5), 160, seed=picture))), text]
    return ChatRequest([Message("user", parts)], Sampling(**sampling), result_cache=False)


# --------------------------------------------------------------------------- the sampler alone

def test_greedy_logprobs_are_the_penalised_distribution_and_the_chosen_token_is_its_best():
    torch.manual_seed(0)
    logits = torch.randn(1000) * 3
    s = Sampler(Sampling(temperature=0, repetition_penalty=1.3, presence_penalty=0.5, logprobs=5))
    seen = [int(i) for i in torch.topk(logits, 3).indices]  # penalise the current favourites
    want = torch.log_softmax(s._penalised(logits, seen, None), -1)  # before the call counts its token
    first = s(logits, seen)
    token, lp, top = s.last
    assert token == first
    assert lp == pytest.approx(float(want.max()), abs=1e-6) and lp == pytest.approx(float(want[token]), abs=1e-6)
    assert [t for t, _ in top] == [int(i) for i in torch.topk(want, 5).indices]
    assert top[0] == (token, pytest.approx(lp, abs=1e-6))
    # the presence penalty now counts the first token: the next distribution is the penalised one
    want = torch.log_softmax(s._penalised(logits, seen + [first], None), -1)
    assert float(want[first]) < lp  # penalised once more
    s(logits, seen + [first])
    assert s.last[1] == pytest.approx(float(want[s.last[0]]), abs=1e-6)


def test_sampled_logprobs_are_after_the_temperature_and_forbidden_tokens_are_finite():
    torch.manual_seed(1)
    logits = torch.randn(50)
    s = Sampler(Sampling(temperature=0.7, top_k=5, seed=3, logprobs=20))
    forbid = {int(logits.argmax())}
    for _ in range(5):
        token = s(logits, [], forbid)
        assert token not in forbid
        masked = logits.clone()
        masked[list(forbid)] = -math.inf
        want = torch.log_softmax(masked / 0.7, -1)
        t, lp, top = s.last
        assert t == token and lp == pytest.approx(float(want[token]), abs=1e-5)
        values = [v for _, v in top]
        assert len(top) == 20 and values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        assert all(math.isfinite(v) for v in values)
    s = Sampler(Sampling(temperature=0, logprobs=50))  # the whole vocabulary: the forbidden one is -9999
    s(logits, [], forbid)
    assert dict(s.last[2])[next(iter(forbid))] == -9999.0


def test_without_logprobs_the_sampler_records_nothing_and_samples_the_same():
    logits = torch.randn(300, generator=torch.Generator().manual_seed(5))
    a, b = Sampler(Sampling(temperature=0.9, seed=11)), Sampler(Sampling(temperature=0.9, seed=11, logprobs=3))
    assert [a(logits, []) for _ in range(20)] == [b(logits, []) for _ in range(20)]
    assert a.last is None and b.last is not None


# --------------------------------------------------------------------------- through the engine

@pytest.fixture(scope="module")
def batched(settings_for):
    from vlservice.engine.service import load_service

    svc = load_service(settings_for(max_batch=4, kv_cache_mb=0, queue_size=16, warmup=False, disk_cache_mb=0))
    yield svc
    svc.close()


def check_entries(svc, result: dict, top: int) -> None:
    entries = result["logprobs"]
    assert len(entries) == result["usage"]["completion_tokens"]
    for e in entries:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and e["logprob"] <= 0
        assert len(e["top_logprobs"]) == top
        values = [t["logprob"] for t in e["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        if top:  # greedy: the answer's token is the most likely one
            assert e["logprob"] == pytest.approx(values[0], abs=1e-6)
            assert e["bytes"] == e["top_logprobs"][0]["bytes"]
    text = bytes(b for e in entries for b in e["bytes"]).decode("utf-8", errors="replace")
    assert text.startswith(result["text"]) or result["finish_reason"] == "stop"


def test_greedy_answers_with_logprobs_alone_and_batched(batched):
    svc = batched
    plain = svc.chat(request(1, max_tokens=12))
    alone = svc.chat(request(1, max_tokens=12, logprobs=5))
    assert alone["text"] == plain["text"] and "logprobs" not in plain
    check_entries(svc, alone, 5)
    zero = svc.chat(request(1, max_tokens=12, logprobs=0))
    assert [e["top_logprobs"] for e in zero["logprobs"]] == [[]] * len(zero["logprobs"])
    # four at once, two with log probabilities: each as alone
    reqs = [request(1, max_tokens=12, logprobs=5), request(2, max_tokens=12), request(1, max_tokens=12),
            request(3, max_tokens=12, logprobs=2)]
    gens = [svc.submit(r) for r in reqs]
    results = [None] * 4

    def run(i):
        results[i] = gens[i].result()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0]["text"] == results[2]["text"] == alone["text"]
    assert [e["bytes"] for e in results[0]["logprobs"]] == [e["bytes"] for e in alone["logprobs"]]
    for got, want in zip(results[0]["logprobs"], alone["logprobs"]):
        assert got["logprob"] == pytest.approx(want["logprob"], abs=1e-4)
        assert [t["bytes"] for t in got["top_logprobs"]] == [t["bytes"] for t in want["top_logprobs"]]
    assert results[3]["text"] == svc.chat(request(3, max_tokens=12))["text"]
    check_entries(svc, results[3], 2)


def test_streamed_deltas_carry_their_tokens_entries(batched):
    gen = batched.submit(request(4, max_tokens=10, logprobs=1))
    deltas = [ev for ev in gen.events() if ev.kind == "delta"]
    assert deltas and all("logprobs" in ev.data for ev in deltas)
    entries = [e for ev in deltas for e in ev.data["logprobs"]]
    again = batched.chat(request(4, max_tokens=10, logprobs=1))
    assert [e["bytes"] for e in entries] == [e["bytes"] for e in again["logprobs"]]
    for ev in deltas:  # each delta's text is what its tokens' bytes complete
        if ev.data["logprobs"] and "\ufffd" not in ev.text:
            assert ev.text in bytes(b for e in ev.data["logprobs"] for b in e["bytes"]).decode("utf-8", "replace") \
                or not ev.text
